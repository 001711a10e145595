"""Wait, from another thread, until a predicate over a trio thread's state holds.

A replicated log's coordinator changes its state only in steps of tasks on its trio
thread (replies, timers and calls from other threads all arrive as task steps). So a
predicate re-checked after every task step sees every change, and it runs on the trio
thread itself, where it reads the state between steps, never half-way through one. The
check is a trio instrument installed only while someone waits: nothing runs per step
otherwise. Tests use this instead of polling the coordinator with sleeps.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import suppress

import trio


class _Waiter(trio.abc.Instrument):
    """One wait: re-checks its predicate after each task step until it holds."""

    def __init__(self, predicate: Callable[[], object], active: set[_Waiter]) -> None:
        self.predicate = predicate
        self.active = active  # the watch's waiters with an instrument installed
        self.done = threading.Event()
        self.held = False
        self.error: BaseException | None = None

    def check(self) -> bool:
        """True (and the waiting thread woken) once the predicate held or raised."""
        try:
            held = bool(self.predicate())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the waiting thread
            self.error = exc
            self.done.set()
            return True
        if held:
            self.held = True
            self.done.set()
        return held

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if self.check():
            self.active.discard(self)
            trio.lowlevel.remove_instrument(self)


class StateWatch:
    """Bounded waits on predicates over the state of one trio run (see the module doc)."""

    def __init__(self) -> None:
        self._token: trio.lowlevel.TrioToken | None = None
        self._waiters: set[_Waiter] = set()
        self._finished = False

    def started(self) -> None:
        """Call on the trio thread when the run starts."""
        self._token = trio.lowlevel.current_trio_token()

    def finished(self) -> None:
        """Call on the trio thread as the run ends: waiters get a last check, then return
        (a predicate that does not hold now never will: nothing changes the state any more)."""
        self._finished = True
        for waiter in list(self._waiters):
            self._forget(waiter)
            if not waiter.check():
                waiter.done.set()

    def wait_for(self, predicate: Callable[[], object], timeout: float) -> bool:
        """Block until ``predicate()`` is true (checked on the trio thread after each task
        step) and return True; False once ``timeout`` seconds passed or the run ended
        without it holding. An exception the predicate raises is raised here."""
        waiter = _Waiter(predicate, self._waiters)
        token = self._token
        try:
            if token is None:
                raise trio.RunFinishedError("not started")
            token.run_sync_soon(self._install, waiter)
        except trio.RunFinishedError:
            waiter.check()  # the run is over: the state is final and no other thread writes it
            waiter.done.set()
        waiter.done.wait(timeout)
        if not waiter.done.is_set() and token is not None:
            with suppress(trio.RunFinishedError):
                token.run_sync_soon(self._forget, waiter)
        if waiter.error is not None:
            raise waiter.error
        return waiter.held

    def _install(self, waiter: _Waiter) -> None:
        if waiter.check() or waiter.done.is_set():
            return
        if self._finished:
            waiter.done.set()
            return
        self._waiters.add(waiter)
        trio.lowlevel.add_instrument(waiter)

    def _forget(self, waiter: _Waiter) -> None:
        self._waiters.discard(waiter)
        with suppress(KeyError):  # already removed: its predicate held
            trio.lowlevel.remove_instrument(waiter)
