"""Optimistic locks on appends (Waltz's lock requests), as a fixed-size table of hashed ids.

A client reads as of some time (its *high-water mark*), decides, then appends with
lock requests on ``(name, id)`` pairs:

- a **write lock** or **read lock** fails the append with LockConflict if the id was
  written (by a write or append lock) at a time after the client's high-water mark:
  what the client read is stale;
- a **write lock** or **append lock** records the append's time for the id when the
  append is admitted, so later stale writers conflict.

Ids hash into ``slots`` cells holding the latest write time of any id in the cell.
Two ids sharing a cell can produce a false conflict (the client retries), never a
missed one. The false-conflict rate is the chance that one of a request's ids shares
a cell with an id written after the high-water mark: with ``w`` such ids and ``k``
checked ids it is about ``1 - (1 - w/slots)**k``; at the default 2**20 cells, 1,000
recent writes and 10 checked ids that is about 1%.

Pure: no I/O, no clock. The engine calls :meth:`check_and_record` under its lock, in
the same critical section that submits the append to the log.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from sediment.errors import InvalidArgument, LockConflict

DEFAULT_SLOTS = 1 << 20

LockId = tuple[str, Hashable]


@dataclass(frozen=True)
class Locks:
    """Lock requests carried by one append. ``high_water`` is the last time the client read."""

    high_water: int
    write: Sequence[LockId] = ()
    read: Sequence[LockId] = ()
    append: Sequence[LockId] = ()

    def __post_init__(self) -> None:
        """Checked here, where the caller builds it, so that a malformed lock is refused with a
        typed error before the append reaches the engine's critical section, not as a
        TypeError from a comparison inside it (and the same way when a server decodes one)."""
        hw = self.high_water
        if not isinstance(hw, int) or isinstance(hw, bool) or not -1 <= hw < 1 << 63:
            raise InvalidArgument(f"Locks.high_water must be the integer time the client last read, in "
                                  f"[-1, 2**63) (-1: nothing sealed yet), not {hw!r}")
        for kind in ("write", "read", "append"):
            locks = getattr(self, kind)
            if isinstance(locks, (str, bytes)) or not isinstance(locks, Sequence):
                raise InvalidArgument(f"Locks.{kind} must be a list of (name, id) pairs, e.g. "
                                      f"[('orders', 42)], not {locks!r}")
            for lock in locks:
                if not isinstance(lock, (tuple, list)) or len(lock) != 2 or not isinstance(lock[0], str):
                    raise InvalidArgument(f"Locks.{kind} holds {lock!r}: each lock is a (name, id) pair with a "
                                          f"string name, e.g. ('orders', 42)")


def slot_of(lock: LockId, slots: int) -> int:
    name, ident = lock
    digest = hashlib.blake2b(f"{name}\x00{ident!r}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % slots


class LockTable:
    """The latest write time per hashed lock id."""

    def __init__(self, slots: int = DEFAULT_SLOTS, floor: int = -1):
        if slots < 1:
            raise ValueError("a lock table needs at least one slot")
        self.slots = slots
        self._times = array("q", [floor]) * slots

    def check(self, locks: Locks) -> None:
        """Raise LockConflict for the first write or read lock written after the high-water mark."""
        for lock in (*locks.write, *locks.read):
            t = self._times[slot_of(lock, self.slots)]
            if t > locks.high_water:
                raise LockConflict(
                    f"lock {lock!r} was written at time {t}, after your high-water mark {locks.high_water}: "
                    "read again and retry", lock=lock, time=t)

    def record(self, locks: Locks, t: int) -> None:
        for lock in (*locks.write, *locks.append):
            i = slot_of(lock, self.slots)
            if self._times[i] < t:
                self._times[i] = t

    def check_and_record(self, locks: Locks, t: int) -> None:
        """All checks first, then the records: a failed check changes nothing."""
        self.check(locks)
        self.record(locks, t)
