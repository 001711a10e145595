"""Waits that Ctrl-C can end, and the iteration over them that both kinds of subscription share.

Why: a signal sent to the process may be handed by the kernel to any of its threads; the
Python handler (KeyboardInterrupt) then runs only once the main thread executes bytecode
again. A main thread blocked in one endless lock or queue wait never does, so `sediment
tail` could ignore Ctrl-C. The main thread therefore waits in short slices; other threads,
which never run signal handlers, wait in one piece.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

SLICE = 0.2  # seconds the main thread blocks at a time


def wait_slices(timeout: float | None) -> Iterator[float | None]:
    """The timeouts for successive blocking calls that together wait up to ``timeout``
    seconds (None: no limit): the whole of it once off the main thread, slices of at most
    :data:`SLICE` on it. The caller stops iterating once its call succeeds."""
    if threading.current_thread() is not threading.main_thread():
        yield timeout
        return
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        left = SLICE if end is None else min(SLICE, end - time.monotonic())
        if left <= 0:
            return
        yield left


class WaitingIterator(Generic[T]):
    """The iterator protocol over ``next(timeout)``, a wait (in slices on the main thread)
    that returns None once its source is closed: ``for event in source`` then waits for
    each event, Ctrl-C ends the wait, and the loop stops at the close."""

    def next(self, timeout: float | None = None) -> T | None:
        raise NotImplementedError

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        event = self.next()
        if event is None:
            raise StopIteration
        return event
