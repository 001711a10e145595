"""Waiting in tests on what other threads do, without polling: the thread that changes
something calls ``changed()`` after the change, and ``wait_for`` re-checks its predicate
on each call (under the condition's lock, so no change between check and wait is missed)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Progress:
    """A condition that worker threads signal after each change a test waits for."""

    def __init__(self) -> None:
        self._cond = threading.Condition()

    def changed(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[], object], timeout: float, what: str) -> None:
        """Return once ``predicate()`` holds; fail the test after ``timeout`` seconds."""
        with self._cond:
            if not self._cond.wait_for(predicate, timeout):
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def poll_until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    """Re-check ``predicate`` every few milliseconds until it holds, for state that no thread
    signals (a client's pump, another process); fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.005)


def until(predicate: Callable[[], object], timeout: float = 10.0) -> bool:
    """:func:`poll_until` for a test that asserts on the outcome itself (or expects the
    predicate never to hold): True once ``predicate()`` holds, False after ``timeout``."""
    try:
        poll_until(predicate, timeout, "")
    except AssertionError:
        return False
    return True
