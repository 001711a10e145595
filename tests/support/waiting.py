"""Waiting in tests on what other threads do, without polling: the thread that changes
something calls ``changed()`` after the change, and ``wait_for`` re-checks its predicate
on each call (under the condition's lock, so no change between check and wait is missed)."""

from __future__ import annotations

import threading
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
