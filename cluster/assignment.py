"""Which live member owns which partition, and under which generation.

The cluster manager calls :func:`plan_assignment` whenever membership changes and records
the result; members act on it. It is pure so that it can be checked exhaustively against a
brute-force model and driven by the seeded simulation: the same input always gives the same
plan. The generation is the fence: every change of owner bumps it, and the data stores
refuse writes made under an older one, so no two members ever write a partition under the
same generation.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from sediment.errors import InvalidAssignmentInput


@dataclass(frozen=True)
class PartitionOwner:
    """The member that serves a partition, and the generation it serves it under."""

    member: str
    generation: int


class Move(NamedTuple):
    """One change of owner: ``generation`` is the new owner's (or, when the partition is left
    unowned, the last owner's)."""

    partition: int
    from_member: str | None
    to_member: str | None
    generation: int


def _check_input(partitions: int, current: Mapping[int, PartitionOwner | None]) -> None:
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 0:
        raise InvalidAssignmentInput(f"plan_assignment: partitions={partitions!r}; pass the deployment's partition "
                                     "count, an int >= 0")
    for p, owner in current.items():
        if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < partitions:
            raise InvalidAssignmentInput(f"plan_assignment: the current assignment names partition {p!r}, outside "
                                         f"0..{partitions - 1}; pass the assignment recorded for this deployment")
        if owner is not None and (not isinstance(owner.generation, int) or owner.generation < 1):
            raise InvalidAssignmentInput(f"plan_assignment: partition {p} has generation {owner.generation!r}; "
                                         "generations start at 1")


def _targets(members: list[str], held: dict[str, list[int]], partitions: int) -> dict[str, int]:
    """Each member's count in the plan: the fair share ``q`` or ``q + 1``. The ``q + 1``
    slots go first to members already holding more than ``q`` (most first), which keeps
    the largest number of partitions where they are."""
    q, extra = divmod(partitions, len(members))
    order = sorted(members, key=lambda m: (-len(held[m]), m))
    return {m: q + (1 if i < extra else 0) for i, m in enumerate(order)}


def plan_assignment(
    partitions: int,
    live_members: Sequence[str],
    current: Mapping[int, PartitionOwner | None],
    leaving: Collection[str] = (),
) -> dict[int, PartitionOwner]:
    """The assignment the manager should record next.

    Every partition ``0..partitions-1`` gets one member of ``live_members`` not in ``leaving``;
    counts differ by at most one; a member keeps the partitions it holds unless it holds more
    than its share, and the plan moves the fewest partitions that any balanced assignment
    could; a moved partition's generation is the old one plus one (1 for a partition never
    owned), a kept one keeps its generation. Ties go to the lower member id, then the lower
    partition number.

    With no eligible member the result is ``{}``: nothing can be served. The caller must
    then keep its recorded assignment as it is (not store the empty plan), so the next plan
    still bumps each partition's last generation and no generation is ever reused.
    Raises :class:`InvalidAssignmentInput` for a negative count, a partition out of range
    or a generation below 1.
    """
    _check_input(partitions, current)
    gone = set(leaving)
    members = sorted(set(live_members) - gone)
    if not members:
        return {}
    held: dict[str, list[int]] = {m: [] for m in members}
    for p in range(partitions):
        owner = current.get(p)
        if owner is not None and owner.member in held:
            held[owner.member].append(p)
    target = _targets(members, held, partitions)
    plan: dict[int, PartitionOwner] = {}
    for m in members:
        for p in held[m][: target[m]]:
            plan[p] = current[p]  # type: ignore[assignment]
    orphans = [p for p in range(partitions) if p not in plan]
    slots = [m for m in members for _ in range(target[m] - min(len(held[m]), target[m]))]
    for p, m in zip(orphans, slots, strict=True):
        old = current.get(p)
        plan[p] = PartitionOwner(m, 1 if old is None else old.generation + 1)
    return dict(sorted(plan.items()))


def moves(old: Mapping[int, PartitionOwner | None], new: Mapping[int, PartitionOwner]) -> list[Move]:
    """The partitions whose owner differs between two assignments, by partition number,
    for logs and metrics. A partition in ``old`` but absent from ``new`` moves to ``None``."""
    out: list[Move] = []
    for p in sorted(set(old) | set(new)):
        before, after = old.get(p), new.get(p)
        was = before.member if before is not None else None
        now = after.member if after is not None else None
        if was != now:
            gen = after.generation if after is not None else before.generation  # type: ignore[union-attr]
            out.append(Move(p, was, now, gen))
    return out
