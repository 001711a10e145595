"""The nemesis campaign's checker (tests/support/nemesis_checker.py) on hand-made histories:
each violation it is for is counted, and a clean history counts none."""

from __future__ import annotations

from support.nemesis_checker import OK, REFUSED, UNKNOWN, Append, Call, History, Read, Sealed, check


def append(seq: int, keys: tuple[int, ...], outcome: str = OK, *, relation: str = "r0", time: int = 10,
           start: float = 0.0, end: float = 1.0) -> Append:
    return Append("c1", seq, relation, keys, time, start, end, outcome)


def read(keys: set[int], as_of: int, start: float, end: float, *, client: str = "c1", relation: str = "r0") -> Read:
    return Read(client, relation, as_of, frozenset(keys), start, end)


def clean() -> History:
    return History(
        appends=[append(1, (1, 2)), append(2, (3,), UNKNOWN, start=1.0, end=2.0),
                 append(3, (4,), REFUSED, start=2.0, end=3.0), append(4, (5,), time=20, start=3.0, end=4.0)],
        reads=[read({1, 2}, 10, 5.0, 5.5), read({1, 2}, 15, 6.0, 6.5), read({1, 2, 5}, 20, 7.0, 7.5)],
        sealed=[Sealed("c1", "r0", 10, 4.0, 4.5), Sealed("c2", "r0", 20, 4.6, 4.9), Sealed("c1", "r0", 20, 5.0, 5.1)],
        calls=[Call("append"), Call("append", "OutcomeUnknown"), Call("append", "TimeAlreadySealed")],
    )


FINAL = {"r0": {1: 1, 2: 1, 5: 1}}


def figures(history: History, final=None, members=None):
    final = FINAL if final is None else final
    return check(history, final, {"m-1": final} if members is None else members)


def test_a_clean_history_counts_nothing_and_an_unknown_append_may_be_absent_or_present_once():
    f = figures(clean())
    assert f.violations() == 0, f.examples
    assert f.outcomes == {OK: 2, UNKNOWN: 1, REFUSED: 1}
    assert f.errors == {"OutcomeUnknown": 1, "TimeAlreadySealed": 1}
    assert figures(clean(), {"r0": {**FINAL["r0"], 3: 1}}).violations() == 0


def test_lost_doubled_torn_refused_and_phantom_rows_are_counted():
    h = clean()
    h.appends.append(append(5, (6, 7), start=4.0, end=4.2))
    final = {"r0": {1: 1, 2: 2, 3: 2, 4: 1, 6: 1, 9: 1}, "r1": {5: 1}}
    f = figures(h, final, {})
    assert (f.lost, f.doubled, f.torn, f.refused_present, f.phantom) == (1, 2, 1, 1, 2), f.examples
    # key 5 was sent to r0: present in r1 only, it is lost from r0 and a phantom in r1;
    # append 5 half there is torn; 1+2 doubled by row 2, the unknown append 2 present twice
    assert any(line.startswith("lost: c1 #4") for line in f.examples)


def test_a_read_missing_what_an_earlier_read_showed_at_a_smaller_as_of_is_non_monotonic():
    h = clean()
    h.reads.append(read({1}, 12, 8.0, 8.5))  # after {1, 2} at 10: row 2 went missing
    assert figures(h).non_monotonic == 1
    h = clean()
    h.reads.append(read({1}, 9, 8.0, 8.5))  # a smaller as_of may show less
    assert figures(h).non_monotonic == 0
    h = clean()  # another client's read is not this client's history
    h.reads.append(read({1}, 12, 8.0, 8.5, client="c2"))
    assert figures(h).non_monotonic == 0


def test_a_frontier_seen_lower_after_a_higher_one_was_seen_is_non_monotonic():
    h = clean()
    h.sealed.append(Sealed("c3", "r0", 15, 6.0, 6.1))  # after c1 and c2 saw 20
    assert figures(h).non_monotonic == 1
    h = clean()
    h.sealed.append(Sealed("c3", "r0", 15, 4.8, 6.1))  # overlapping c2's call that saw 20: may come first
    assert figures(h).non_monotonic == 0
    h = clean()
    h.sealed.append(Sealed("c3", "r0", 15, 6.0, 6.1, at_least=True))  # a resent seal that found it past 15
    assert figures(h).non_monotonic == 0
    h = clean()
    h.sealed.append(Sealed("c3", "r0", 25, 6.0, 6.1, at_least=True))  # an acknowledged seal raises the bar
    h.sealed.append(Sealed("c1", "r0", 20, 6.2, 6.3))
    assert figures(h).non_monotonic == 1
    h = clean()
    h.sealed.append(Sealed("c3", "r1", 1, 6.0, 6.1))  # another relation
    assert figures(h).non_monotonic == 0


def test_a_read_missing_an_append_acknowledged_before_it_began_is_stale():
    h = clean()
    h.reads.append(read({1, 2}, 20, 8.0, 8.5))  # append 4 (t=20) was acknowledged at 4.0
    assert figures(h).stale == 1
    h = clean()
    h.reads.append(read({1, 2}, 20, 3.5, 8.5))  # began before append 4 was acknowledged: may miss it
    assert figures(h).stale == 0


def test_a_read_showing_rows_never_sent_or_later_than_its_as_of_is_a_phantom():
    h = clean()
    h.reads.append(read({1, 2, 5}, 15, 8.0, 8.5))  # row 5 is at time 20
    h.reads.append(read({1, 2, 99}, 15, 9.0, 9.5))  # never sent
    assert figures(h).phantom == 2


def test_members_that_disagree_hung_calls_and_untyped_errors_are_counted():
    h = clean()
    h.calls += [Call("snapshot", hung=True), Call("append", "KeyError", typed=False),
                Call("seal", "FlightUnavailableError", typed=False), Call("seal", "KeyError", typed=False)]
    f = figures(h, members={"m-1": FINAL, "m-2": {"r0": {1: 1, 2: 1}}, "m-3": {"r0": {1: 1, 2: 1, 5: 1}, "r1": {}}})
    assert f.divergent == 1 and f.hung == 1
    assert f.untyped == {"KeyError": 2, "FlightUnavailableError": 1}
    assert f.violations() == 5


def test_typed_errors_outside_the_expected_ones_are_counted():
    h = clean()
    h.calls.append(Call("snapshot", "BatchCorruption", message="batch 'x' is missing from the blob store"))
    expected = {"OutcomeUnknown", "TimeAlreadySealed"}
    f = check(h, FINAL, {}, expected)
    assert f.unexpected == {"BatchCorruption": 1} and f.violations() == 1
    assert any("BatchCorruption: batch 'x' is missing" in line for line in f.examples)
    assert check(h, FINAL, {}).violations() == 0  # no list given: every typed error is taken
