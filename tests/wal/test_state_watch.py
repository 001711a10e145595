"""StateWatch (wal/replication/state_watch.py): waits from another thread on state a trio
run changes, re-checked after each task step; what tests of the replicated log wait on."""

from __future__ import annotations

import threading
import time

import pytest
import trio

from sediment.wal.replication.state_watch import StateWatch


class Run:
    """A trio run in a thread whose ``count`` a task raises each time ``step`` is sent."""

    def __init__(self) -> None:
        self.watch = StateWatch()
        self.count = 0
        self.token: trio.lowlevel.TrioToken | None = None
        self.started = threading.Event()
        self.stop: trio.Event | None = None
        self.thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)
        self.thread.start()
        assert self.started.wait(10)

    async def _main(self) -> None:
        self.watch.started()
        self.token = trio.lowlevel.current_trio_token()
        self.stop = trio.Event()
        self.started.set()
        try:
            await self.stop.wait()
        finally:
            self.watch.finished()

    def step(self) -> None:
        def bump() -> None:
            self.count += 1

        assert self.token is not None
        self.token.run_sync_soon(bump)

    def end(self) -> None:
        assert self.token is not None and self.stop is not None
        self.token.run_sync_soon(self.stop.set)
        self.thread.join(10)


def test_a_wait_returns_on_the_change_it_waits_for() -> None:
    run = Run()
    try:
        results: list[bool] = []
        waiter = threading.Thread(target=lambda: results.append(run.watch.wait_for(lambda: run.count >= 3, 30)))
        waiter.start()
        for _ in range(3):
            run.step()
        waiter.join(30)
        assert results == [True] and run.count == 3
        assert run.watch.wait_for(lambda: run.count == 3, 5)  # already true: the first check says so
    finally:
        run.end()


def test_a_wait_is_bounded_and_leaves_no_instrument_behind() -> None:
    run = Run()
    try:
        started = time.monotonic()
        assert not run.watch.wait_for(lambda: run.count > 0, 0.2)
        assert 0.2 <= time.monotonic() - started < 5
        assert run.watch.wait_for(lambda: True, 5)
        assert not run.watch._waiters
    finally:
        run.end()


def test_a_predicate_error_is_raised_in_the_waiting_thread() -> None:
    run = Run()
    try:
        with pytest.raises(ZeroDivisionError):
            run.watch.wait_for(lambda: 1 / run.count, 5)
    finally:
        run.end()


def test_waits_end_with_the_run() -> None:
    run = Run()
    results: list[bool] = []
    checks: list[int] = []

    def never() -> bool:
        checks.append(run.count)
        return False

    waiter = threading.Thread(target=lambda: results.append(run.watch.wait_for(never, 60)))
    waiter.start()
    started = time.monotonic()
    assert run.watch.wait_for(lambda: bool(checks), 10)  # the other wait is installed
    run.end()
    waiter.join(30)
    assert results == [False] and time.monotonic() - started < 30  # not the 60 s timeout
    assert not run.watch.wait_for(never, 60)  # after the run: checked at once
    assert run.watch.wait_for(lambda: run.count == 0, 60)
