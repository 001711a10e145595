"""Threads that run Python without blocking, beside the code under test.

pyarrow and syscalls let go of the interpreter lock; beside such threads, a call that lets
go waits up to the switch interval (5 ms) to get it back, so a path that makes such a call
per item takes seconds where it takes milliseconds alone (docs/architecture.md, "The
interpreter lock")."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def threads_running_python(n: int) -> Iterator[None]:
    """``n`` threads that hold the interpreter lock whenever they can, as busy writers or an
    application's own threads do."""
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    spinners = [threading.Thread(target=spin) for _ in range(n)]
    for th in spinners:
        th.start()
    try:
        yield
    finally:
        stop.set()
        for th in spinners:
            th.join()
