"""The cluster manager's assignment (sediment.cluster.assignment) against a brute-force model.

Exhaustive over small clusters: every current assignment of up to 8 partitions over up to 4
members (plus unowned partitions), every set of live members, and every set of leaving ones at
the smaller sizes. Each plan is checked against the minimum number of moves that any balanced
assignment needs, found by enumerating every assignment. Then properties over long random
histories of joins, deaths and departures: balance, stickiness, generations that strictly grow
on a move and are never reused by another member.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Sequence
from functools import cache

import pytest

from sediment.cluster.assignment import Move, PartitionOwner, moves, plan_assignment
from sediment.errors import InvalidAssignmentInput

POOL = ("a", "b", "c", "d")


@cache
def fewest_moves(partitions: int, members: int, held: tuple[int, ...]) -> int:
    """Fewest partitions any balanced assignment moves, by enumerating every assignment of
    ``partitions`` to ``members``; ``held`` is how many each member holds now (the rest are
    unowned or held by members that cannot keep them). Only counts matter, so one current
    assignment with these counts stands for all of them."""
    now = [m for m, c in enumerate(held) for _ in range(c)]
    now += [None] * (partitions - len(now))
    best = partitions
    for plan in itertools.product(range(members), repeat=partitions):
        counts = Counter(plan)
        sizes = [counts.get(m, 0) for m in range(members)]
        if max(sizes) - min(sizes) <= 1:
            best = min(best, sum(1 for a, b in zip(now, plan, strict=True) if a != b))
    return best


def check_plan(partitions: int, live: Sequence[str], current: dict[int, PartitionOwner | None],
               leaving: Sequence[str] = ()) -> dict[int, PartitionOwner]:
    plan = plan_assignment(partitions, live, current, leaving)
    eligible = sorted(set(live) - set(leaving))
    if not eligible:
        assert plan == {}
        return plan
    assert sorted(plan) == list(range(partitions))
    counts = Counter(o.member for o in plan.values())
    assert set(counts) <= set(eligible)
    sizes = [counts.get(m, 0) for m in eligible]
    assert max(sizes) - min(sizes) <= 1, (current, plan)
    held = {m: [p for p, o in current.items() if o is not None and o.member == m] for m in eligible}
    share = partitions // len(eligible)
    for m, ps in held.items():
        if len(ps) <= share:
            assert all(plan[p].member == m for p in ps), f"{m} lost a partition within its share"
    for p, o in plan.items():
        old = current.get(p)
        if old is not None and old.member == o.member:
            assert o.generation == old.generation
        else:
            assert o.generation == (1 if old is None else old.generation + 1)
    moved = sum(1 for p in range(partitions) if (current.get(p) or PartitionOwner("", 0)).member != plan[p].member)
    profile = tuple(sorted((len(ps) for ps in held.values()), reverse=True))
    assert moved == fewest_moves(partitions, len(eligible), profile), (current, live, plan)
    assert moved == len(moves(current, plan))
    return plan


def every_current(partitions: int, members: Sequence[str], up_to_names: bool = False):
    """Every current assignment; with ``up_to_names``, one per renaming of the members: those
    whose members first own a partition in the order given (a before b before c ...), since
    a renaming moves only the ties, which test_ties_go_to_the_lower_member_... pins down."""
    owners = [None, *members]
    for choice in itertools.product(owners, repeat=partitions):
        if up_to_names:
            first = list(dict.fromkeys(m for m in choice if m is not None))
            if first != list(members[:len(first)]):
                continue
        yield {p: None if m is None else PartitionOwner(m, 1 + (p * 7 + len(m)) % 5) for p, m in enumerate(choice)}


def nonempty_subsets(members: Sequence[str]):
    for r in range(1, len(members) + 1):
        yield from itertools.combinations(members, r)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_every_current_and_live_set(k: int) -> None:
    """Every current assignment over k members (and unowned partitions), every non-empty set of
    live members: the dead members' partitions and the unowned ones are placed with the fewest
    moves; up to 8 partitions for k <= 2, 7 for k = 3, 6 for k = 4 (the next test covers 8).
    Current assignments up to a renaming of the members: every live set is tried with each, so
    every pair of a current assignment and a live set is covered up to a renaming."""
    pool = POOL[:k]
    largest = {1: 8, 2: 8, 3: 7, 4: 6}[k]
    for partitions in range(largest + 1):
        for current in every_current(partitions, pool, up_to_names=True):
            for live in nonempty_subsets(pool):
                check_plan(partitions, live, current)


@pytest.mark.slow
def test_eight_partitions_four_members_every_current() -> None:
    """Every current assignment of 8 partitions over four live members and unowned, up to a
    renaming of the members (all four are live, so a renaming maps the case to itself)."""
    for current in every_current(8, POOL, up_to_names=True):
        check_plan(8, POOL, current)


def test_every_leaving_set() -> None:
    """A member that is leaving (SIGTERM) gets nothing and its partitions move, with the fewest moves."""
    for partitions in range(6):
        for current in every_current(partitions, POOL[:3]):
            for live in nonempty_subsets(POOL[:3]):
                for leaving in itertools.chain([()], nonempty_subsets(live)):
                    check_plan(partitions, live, current, leaving)


def test_deterministic_whatever_the_order_of_members() -> None:
    rng = random.Random(29)
    for _ in range(300):
        partitions = rng.randrange(0, 30)
        live = rng.sample("abcdefgh", rng.randrange(1, 8))
        current = {p: PartitionOwner(rng.choice("abcdefghij"), rng.randrange(1, 9))
                   for p in range(partitions) if rng.random() < 0.8}
        first = plan_assignment(partitions, live, current)
        rng.shuffle(live)
        assert plan_assignment(partitions, live + live[:1], current) == first


def test_ties_go_to_the_lower_member_then_the_lower_partition() -> None:
    assert plan_assignment(3, ["b", "a"], {}) == {
        0: PartitionOwner("a", 1), 1: PartitionOwner("a", 1), 2: PartitionOwner("b", 1)}
    # a holds 3 of 4 with two members: it keeps its lowest two, the third moves to b.
    current = {p: PartitionOwner("a", 4) for p in (0, 2, 3)} | {1: PartitionOwner("b", 2)}
    assert moves(current, plan_assignment(4, ["a", "b"], current)) == [Move(3, "a", "b", 5)]


def test_no_eligible_member_plans_nothing() -> None:
    current = {0: PartitionOwner("a", 3)}
    assert plan_assignment(1, [], current) == {}
    assert plan_assignment(1, ["a"], current, leaving=["a"]) == {}
    assert moves(current, {}) == [Move(0, "a", None, 3)]


@pytest.mark.parametrize("partitions, current", [
    (-1, {}), (True, {}), (2, {2: PartitionOwner("a", 1)}), (2, {-1: None}),
    (2, {0: PartitionOwner("a", 0)}), (2, {"0": None}),
])
def test_bad_input_is_refused(partitions, current) -> None:
    with pytest.raises(InvalidAssignmentInput):
        plan_assignment(partitions, ["a"], current)


def test_random_histories_never_reuse_a_generation() -> None:
    """Long random histories of joins, deaths and departures (the caller keeps its record when a
    plan is empty): balance and the fewest moves hold at every step, a moved partition's
    generation is higher than every one it had before, and no (partition, generation) ever names
    two members."""
    for seed in range(40):
        rng = random.Random(seed)
        partitions = rng.randrange(1, 60)
        live: set[str] = set(rng.sample([f"m{i}" for i in range(12)], rng.randrange(1, 6)))
        record: dict[int, PartitionOwner | None] = {}
        owner_of: dict[tuple[int, int], str] = {}
        highest: dict[int, int] = {}
        for _ in range(60):
            event = rng.random()
            leaving: set[str] = set()
            if event < 0.35 and len(live) < 12:
                live.add(rng.choice([f"m{i}" for i in range(12)]))
            elif event < 0.7 and live:
                live.discard(rng.choice(sorted(live)))
            elif live:
                leaving = {rng.choice(sorted(live))}
            plan = plan_assignment(partitions, sorted(live), record, leaving)
            eligible = live - leaving
            if eligible:
                sizes = Counter(o.member for o in plan.values())
                assert max(sizes.values()) - min(sizes.get(m, 0) for m in eligible) <= 1
            for move in moves(record, plan):
                if move.to_member is not None:
                    assert move.generation > highest.get(move.partition, 0)
            for p, o in plan.items():
                assert owner_of.setdefault((p, o.generation), o.member) == o.member
                highest[p] = max(highest.get(p, 0), o.generation)
            if plan:
                record = dict(plan)
            live -= leaving
