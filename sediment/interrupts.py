"""Waits that Ctrl-C can end.

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
