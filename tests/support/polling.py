"""Waiting in tests for a condition another thread brings about, with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable


def until(ok: Callable[[], object], seconds: float = 10.0) -> bool:
    """Poll ``ok()`` every millisecond until it is true (True) or ``seconds`` pass (False)."""
    deadline = time.monotonic() + seconds
    while not ok():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True
