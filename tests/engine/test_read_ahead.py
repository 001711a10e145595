"""The read-ahead pool (sediment/read_ahead.py): results in order, at most ``ahead`` pieces
worked on beyond the one taken, errors in order, and an early close leaves no task running
(a read's file is closed right after), nor starts one later."""

from __future__ import annotations

import threading

import pytest

from sediment import read_ahead
from sediment.read_ahead import ordered_map

needs_two = pytest.mark.skipif(read_ahead.pool_workers() < 2, reason="one core: ordered_map is plain map")


def test_results_come_in_order_whatever_order_tasks_finish_in():
    gates = [threading.Event() for _ in range(40)]

    def fn(i: int) -> int:
        if i % 2 == 0 and i + 1 < len(gates):
            gates[i + 1].wait(10)  # an even item finishes only after the odd one after it has started
        gates[i].set()
        return i * i

    assert list(ordered_map(fn, range(40), ahead=3)) == [i * i for i in range(40)]


@needs_two
def test_at_most_ahead_items_are_taken_before_the_first_result():
    taken: list[int] = []
    release = threading.Event()

    def items():
        for i in range(100):
            taken.append(i)
            yield i

    def fn(i: int) -> int:
        release.wait(10)
        return i

    out = ordered_map(fn, items(), ahead=3)
    release.set()
    assert next(out) == 0
    assert len(taken) == 4  # the one taken and 3 ahead
    assert list(out) == list(range(1, 100))


@needs_two
def test_an_error_comes_after_the_results_before_it_and_stops_the_rest():
    started: list[int] = []

    def fn(i: int) -> int:
        started.append(i)
        if i == 5:
            raise ValueError("piece 5 is damaged")
        return i

    got = []
    with pytest.raises(ValueError, match="piece 5"):
        for x in ordered_map(fn, range(1000), ahead=2):
            got.append(x)
    assert got == [0, 1, 2, 3, 4]
    assert max(started) <= 5 + 2  # nothing submitted past the error's window


@needs_two
def test_closing_early_waits_for_running_tasks_and_cancels_the_rest():
    finish = threading.Event()
    lock = threading.Lock()
    state = {"inside": 0, "ran": []}

    def fn(i: int) -> int:
        with lock:
            state["inside"] += 1
            state["ran"].append(i)
        if i > 0:
            finish.wait(10)
        with lock:
            state["inside"] -= 1
        return i

    out = ordered_map(fn, range(50), ahead=4)
    assert next(out) == 0
    closer = threading.Thread(target=out.close)
    closer.start()
    closer.join(0.3)  # not a wait for something to happen: the close must still be waiting
    assert closer.is_alive(), "close returned while tasks were still running"
    finish.set()
    closer.join(10)
    assert not closer.is_alive()
    with lock:
        assert state["inside"] == 0
        assert all(i <= 4 for i in state["ran"])  # none past the window, none started after the close
        assert len(state["ran"]) <= 1 + read_ahead.pool_workers()  # the queued ones were cancelled


@needs_two
def test_a_forked_child_gets_a_pool_of_its_own(tmp_path):
    """Threads do not survive a fork: a child (Spark's Python workers fork) makes its own pool."""
    import os
    import signal

    assert list(ordered_map(lambda i: i + 1, range(4), ahead=2)) == [1, 2, 3, 4]  # the parent's pool exists
    out = tmp_path / "child"
    pid = os.fork()
    if pid == 0:  # the child: exit without running the parent's test machinery
        signal.signal(signal.SIGALRM, signal.SIG_DFL)  # not the test timeout's handler: the kernel ends it
        signal.alarm(20)  # an inherited pool has no threads: its tasks would never run
        try:
            got = list(ordered_map(lambda i: i * 2, range(20), ahead=3))
            out.write_text(",".join(map(str, got)))
        finally:
            os._exit(0)
    _pid, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert out.read_text() == ",".join(str(i * 2) for i in range(20))


def test_pieces_in_flight_keep_to_the_byte_budget():
    budget = read_ahead.AHEAD_BYTES
    assert read_ahead.pieces_in_flight(1024) == 2 * read_ahead.pool_workers()  # narrow: the most
    assert read_ahead.pieces_in_flight(budget // 3, most=8) == 3
    assert read_ahead.pieces_in_flight(budget, most=8) == 1
    assert read_ahead.pieces_in_flight(budget + 1, most=8) == 0  # one piece alone passes it: none ahead
    assert read_ahead.pieces_in_flight(0, most=1) == 1
