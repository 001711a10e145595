"""The recovery vote (wal/replication/vote.py): the seed's worked example, a brute-force reference, properties."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sediment.wal.replication.vote import Decision, decide, quorum_size

HC, HA, HB = 10, 20, 30  # the seed's figure: HC < HA < HB


def resolve_closing_hwm(reported: dict[str, int], replica_count: int) -> int | None:
    """Every reporter votes, nobody is new: the closing mark, or None while undecidable."""
    if len(reported) > replica_count:
        raise ValueError(f"{len(reported)} replicas reported but the partition has {replica_count}")
    return decide(list(reported.values()), [], replica_count - len(reported), quorum_size(replica_count)).resolved


def test_seed_example_all_online_resolves_to_ha() -> None:
    assert resolve_closing_hwm({"A": HA, "B": HB, "C": HC}, 3) == HA


def test_seed_example_b_offline_is_undecidable() -> None:
    # HA has one vote (A, and B is offline): 1 + 1 offline reaches the quorum of two.
    assert resolve_closing_hwm({"A": HA, "C": HC}, 3) is None


def test_seed_example_becomes_decidable_when_b_returns_or_c_catches_up() -> None:
    assert resolve_closing_hwm({"A": HA, "B": HB, "C": HC}, 3) == HA
    assert resolve_closing_hwm({"A": HA, "C": HA}, 3) == HA  # C caught up with A, B still offline


def test_empty_log_and_too_few_reports() -> None:
    assert resolve_closing_hwm({"A": -1, "B": -1}, 3) == -1
    assert resolve_closing_hwm({"A": -1}, 3) is None  # B and C might both hold records
    assert resolve_closing_hwm({"A": -1}, 2) == -1  # a quorum of two needs A, which is empty
    assert resolve_closing_hwm({"A": 0}, 3) is None
    assert resolve_closing_hwm({}, 1) is None
    assert resolve_closing_hwm({"A": 3}, 4) is None
    assert resolve_closing_hwm({"A": 5}, 1) == 5
    with pytest.raises(ValueError):
        resolve_closing_hwm({"A": 1, "B": 2}, 1)
    with pytest.raises(ValueError):
        quorum_size(0)


def reference(reported: dict[str, int], n: int, domain: range) -> int | None:
    """The true closing mark if every way the offline replicas could answer gives the same one."""
    q = n // 2 + 1
    offline = n - len(reported)
    answers = set()
    for rest in itertools.product(domain, repeat=offline):
        marks = list(reported.values()) + list(rest)
        answers.add(max(h for h in range(-1, max(marks) + 1) if sum(x >= h for x in marks) >= q))
    return answers.pop() if len(answers) == 1 else None


def test_brute_force_all_small_cases() -> None:
    values = range(-1, 4)
    domain = range(-1, 5)  # offline replicas may hold more than anyone reachable
    for n in range(1, 5):
        for online in range(0, n + 1):
            for marks in itertools.product(values, repeat=online):
                reported = {f"r{i}": m for i, m in enumerate(marks)}
                assert resolve_closing_hwm(reported, n) == reference(reported, n, domain), (reported, n)


@st.composite
def cases(draw):
    n = draw(st.integers(1, 7))
    marks = draw(st.lists(st.integers(-1, 50), min_size=0, max_size=n))
    return {f"r{i}": m for i, m in enumerate(marks)}, n


@settings(max_examples=400, deadline=None)
@given(cases())
def test_result_is_held_by_a_quorum_and_nothing_higher_could_be(case) -> None:
    reported, n = case
    result = resolve_closing_hwm(reported, n)
    q = quorum_size(n)
    if result is None:
        return
    offline = n - len(reported)
    if result >= 0:
        assert sum(m >= result for m in reported.values()) >= q  # a quorum of reporters holds it
    assert sum(m > result for m in reported.values()) + offline < q  # no higher mark can have a quorum


@settings(max_examples=400, deadline=None)
@given(cases(), st.integers(-1, 50))
def test_monotone_as_a_replica_comes_online(case, newcomer: int) -> None:
    reported, n = case
    if len(reported) == n:
        return
    before = resolve_closing_hwm(reported, n)
    after = resolve_closing_hwm({**reported, "new": newcomer}, n)
    if before is not None:
        assert after == before  # a decided mark never changes when more replicas report
    assert (after is None) <= (before is None)  # more reports never make it undecidable


@settings(max_examples=200, deadline=None)
@given(cases())
def test_all_online_is_always_decidable_and_is_the_quorum_th_largest(case) -> None:
    reported, _ = case
    n = len(reported)
    if n == 0:
        return
    marks = sorted(reported.values(), reverse=True)
    assert resolve_closing_hwm(reported, n) == marks[quorum_size(n) - 1]


# --- Waltz's rule with voting and non-voting replicas (decide) -------------------------------


def test_issue_example_only_the_two_at_120_vote() -> None:
    """{120, 120, 110, 105, 105}, only the two at 120 vote: nothing is decided (110 is below
    the lowest voting mark), the lower replicas are caught up, then 120 resolves."""
    q = quorum_size(5)
    assert decide([120, 120], [110, 105, 105], 0, q) == Decision(catch_up=True)
    assert decide([120, 120], [120, 105, 105], 0, q) == Decision(resolved=120)  # one caught up is enough
    assert decide([120, 120], [120, 120, 120], 0, q) == Decision(resolved=120)


def test_undecidable_until_the_situation_changes() -> None:
    # the seed's figure with B offline: HA has 1 vote + 1 absent = the quorum of 2
    assert decide([HA, HC], [], 1, 2) == Decision(undecidable=True, catch_up=True)
    assert decide([HA, HA], [], 1, 2) == Decision(resolved=HA)  # C caught up with A
    assert decide([], [], 3, 2) == Decision(undecidable=True)
    assert decide([], [7, 7], 1, 2) == Decision(undecidable=True)  # the absent one may be a voter
    assert decide([], [7, 7], 0, 2) == Decision(resolved=7)  # non-voters hold committed records only
    assert decide([], [7, 3], 0, 2) == Decision(catch_up=True)  # never below the top when nobody votes


def test_never_below_a_stored_low_water_mark_a_reporter_holds() -> None:
    """Seed 4541: b and d stored low-water mark 273 (an earlier recovery resolved it, its
    metadata update never landed); a votes 272, c was truncated to 170. 272 has a quorum of
    3 of 4 but the nodes never lower their marks: catch up to 273 instead."""
    q = quorum_size(4)
    assert decide([272, 273, 273], [170], 0, q) == Decision(resolved=272)
    assert decide([272, 273, 273], [170], 0, q, floor=273) == Decision(catch_up=True)
    assert decide([273, 273, 273], [170], 0, q, floor=273) == Decision(resolved=273)
    assert decide([272, 273], [170], 1, q, floor=273) == Decision(catch_up=True)
    assert decide([273, 273], [273], 1, q, floor=273) == Decision(resolved=273)
    assert decide([5, 5], [5], 0, 2, floor=3) == Decision(resolved=5)  # a floor below the top changes nothing


def waltz_reference(voting: tuple[int, ...], non_voting: tuple[int, ...], absent: int, q: int) -> int | None:
    """Waltz's recovery manager, literally: each reporting replica evaluates the sorted marks
    down to its own, counting supports group by group; the first quorum not preceded by an
    undecidable group resolves. Every replica's evaluation must agree (order independence)."""
    states = sorted(voting + non_voting, reverse=True)
    if states and not voting and absent:
        return None  # Waltz's lowest voting mark is "infinite" until a voter reports
    min_voting = min(voting) if voting else (states[0] if states else 0)
    found: set[int] = set()
    for own in states:
        supports, undecidable = 0, False
        for i, mark in enumerate(states):
            if mark < own:
                break
            if min_voting <= own:
                supports += 1
                if i == len(states) - 1 or mark > states[i + 1]:
                    if mark == -1 and absent < q:  # the empty prefix: every replica, absent ones too, holds it
                        supports += absent
                    if supports < q <= supports + absent:
                        undecidable = True
                    if not undecidable and supports >= q:
                        found.add(mark)
                        break
    assert len(found) <= 1, (voting, non_voting, absent, found)
    return found.pop() if found else None


def highest_possibly_acknowledged(voting, absent_marks, q) -> int:
    """The highest LSN a write quorum of the last session's replicas (voters and the absent)
    could have acknowledged."""
    marks = list(voting) + list(absent_marks)
    return max((h for h in range(-1, max(marks, default=-1) + 1) if sum(m >= h for m in marks) >= q), default=-1)


def small_cases():
    values = range(-1, 3)
    for n_voting in range(0, 4):
        for n_non in range(0, 4 - n_voting):
            for absent in range(0, 4 - n_voting - n_non):
                if n_voting + n_non + absent == 0:
                    continue
                q = quorum_size(n_voting + n_non + absent)
                for voting in itertools.product(values, repeat=n_voting):
                    for non_voting in itertools.product(values, repeat=n_non):
                        yield voting, non_voting, absent, q


def catch_up_fixpoint(voting, non_voting, absent, q) -> tuple[Decision, int]:
    """Run the rule, raising every replica below the top to the top while it asks for catch-up."""
    d = decide(voting, non_voting, absent, q)
    rounds = 0
    while d.resolved is None and d.catch_up:
        top = max(voting + non_voting)
        voting, non_voting = tuple(top for _ in voting), tuple(top for _ in non_voting)
        d = decide(voting, non_voting, absent, q)
        rounds += 1
        assert rounds <= 1, "one catch-up to the top always decides or waits for the absent"
    return d, rounds


def test_brute_force_against_waltz_and_safety_over_all_small_cases() -> None:
    domain = range(-1, 4)
    checked = 0
    for voting, non_voting, absent, q in small_cases():
        d = decide(voting, non_voting, absent, q)
        assert d.resolved == waltz_reference(voting, non_voting, absent, q), (voting, non_voting, absent)
        final, _ = catch_up_fixpoint(voting, non_voting, absent, q)
        assert final.resolved is not None or final.undecidable  # never stuck without a reason to wait
        if final.undecidable:
            assert absent > 0
        if d.resolved is None:
            continue
        r = d.resolved
        checked += 1
        assert r == -1 or sum(m >= r for m in voting + non_voting) >= q  # durable on a quorum now
        if voting:
            assert r >= min(voting)  # never below a replica that voted
        else:
            assert r == max(non_voting, default=-1) or r == -1 and not non_voting
        consistent = not voting or max(non_voting, default=-1) <= min(voting)
        for rest in itertools.product(domain, repeat=absent):
            if consistent:  # whatever the absent hold, nothing they could have acknowledged is cut
                assert highest_possibly_acknowledged(voting, rest, q) <= r, (voting, non_voting, rest)
            # the answer does not depend on who reports first: later reports confirm it
            for k in range(absent + 1):
                later = decide(voting + rest[:k], non_voting, absent - k, q)
                assert later.resolved == r, (voting, non_voting, rest[:k])
    assert checked > 200


def test_brute_force_a_stored_low_water_mark_floor() -> None:
    """Over all small cases and every floor a reporter holds: never resolved below it, a
    floor the vote already clears changes nothing, and one catch-up to the top decides or
    waits for the absent (no hang)."""
    checked = 0
    for voting, non_voting, absent, q in small_cases():
        marks = voting + non_voting
        plain = decide(voting, non_voting, absent, q)
        for f in range(-1, max(marks, default=-1) + 1):
            d = decide(voting, non_voting, absent, q, floor=f)
            if d.resolved is not None:
                checked += 1
                assert d.resolved >= f, (voting, non_voting, absent, f)
            if plain.resolved is not None and plain.resolved >= f:
                assert d == plain, (voting, non_voting, absent, f)
            if voting and f <= min(voting):
                assert d == plain, (voting, non_voting, absent, f)
            if d.resolved is None and d.catch_up:
                top = max(marks)
                up = decide(tuple(top for _ in voting), tuple(top for _ in non_voting), absent, q, floor=f)
                assert up.resolved == top or up.undecidable and absent > 0, (voting, non_voting, absent, f)
    assert checked > 200


def test_decide_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        decide([1], [], -1, 1)
    with pytest.raises(ValueError):
        decide([1], [], 0, 0)



def test_a_new_replica_assignment_takes_the_next_generation():
    from sediment.wal.replication.partition_meta import PartitionMeta, ReplicaState
    from sediment.wal.replication.replicated_log import assignment_generation

    fresh = PartitionMeta()
    assert assignment_generation(fresh, ["a:1", "b:1", "c:1"]) == 0
    meta = PartitionMeta(3, 5, {r: ReplicaState(5, 0) for r in ("a:1", "b:1", "c:1")})
    assert assignment_generation(meta, ["c:1", "a:1", "b:1"]) == 3  # the same set, in any order
    assert assignment_generation(meta, ["a:1", "b:1", "d:1"]) == 4  # one replaced
    assert assignment_generation(meta, ["a:1", "b:1"]) == 4  # one removed
    assert assignment_generation(meta, ["a:1", "b:1", "c:1", "d:1", "e:1"]) == 4  # added
