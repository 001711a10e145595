"""The trio scheduler's randomness under a seeded simulation, kept to the simulation's thread.

Trio orders each batch of runnable tasks with one module-global ``random.Random``
(``trio._core._run._r``): every trio run in the process draws from it, whatever its
thread. A simulation that seeded that object shared it with any other trio run alive in
the process (a storage node, a replicated log or a server left running by another test,
in its own thread): their draws interleaved with the simulation's at the pace of real
time and of the OS scheduler, and the same seed took another schedule. Here the global
is replaced, while simulations run, by a stand-in that hands each thread running a
simulation its own seeded generator and every other thread trio's own, so nothing
outside a simulation's thread moves its schedule. A seed draws exactly what the shared
generator seeded with it drew, so every seed keeps its schedule.

Private trio API used: ``_r`` and ``_ALLOW_DETERMINISTIC_SCHEDULING`` (sort each batch by
task creation, then shuffle it with ``_r``).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import trio._core._run as trio_run


class PerThreadRandom:
    """Trio's scheduler generator, by thread: a simulation's own, else the shared one."""

    def __init__(self, shared: random.Random) -> None:
        self.shared = shared
        self.local = threading.local()

    def mine(self) -> random.Random:
        own = getattr(self.local, "rng", None)
        return self.shared if own is None else own

    def __getattr__(self, name: str) -> Any:
        return getattr(self.mine(), name)


_lock = threading.Lock()
_active = 0
_saved_flag = False


@contextmanager
def seeded_scheduler(seed: int) -> Iterator[random.Random]:
    """While this holds, the trio runs of the calling thread order their tasks by a
    generator seeded with ``seed`` (yielded), and no other thread draws from it."""
    global _active, _saved_flag
    with _lock:
        if _active == 0:
            _saved_flag = trio_run._ALLOW_DETERMINISTIC_SCHEDULING
            trio_run._r = PerThreadRandom(trio_run._r)
            trio_run._ALLOW_DETERMINISTIC_SCHEDULING = True
        _active += 1
        proxy = trio_run._r
    proxy.local.rng = rng = random.Random(seed)
    try:
        yield rng
    finally:
        proxy.local.rng = None
        with _lock:
            _active -= 1
            if _active == 0:
                trio_run._r = proxy.shared
                trio_run._ALLOW_DETERMINISTIC_SCHEDULING = _saved_flag
