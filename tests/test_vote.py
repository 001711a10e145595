"""The recovery vote (wal/vote.py): the seed's worked example, a brute-force reference, properties."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sediment.wal.vote import quorum_size, resolve_closing_hwm

HC, HA, HB = 10, 20, 30  # the seed's figure: HC < HA < HB


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
