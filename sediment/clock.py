"""Time, passed in: every part of sediment whose behaviour depends on elapsed time (read-plan
leases, the compacter's wake-ups and segment ages, the device ring's block ages and full
waits) reads a :class:`Clock` it was given instead of calling ``time.monotonic``, so a test
can hold time still and move it by hand (:class:`ManualClock`) and assert exact expiries.
Stamps written for people to read (a segment's creation time, an owner marker's claim
time) are calendar times, not durations: they read ``time.time`` where they are written.
A timeout that bounds one blocking wait (a feed's ``next(timeout)``, a ZooKeeper call, a
member's ``leave``) and a measured latency (metrics, the S3 log's linger) are real time:
the wait they bound is the operating system's, which a ManualClock cannot move.

A clock is anything with ``current_time() -> float`` (seconds, monotonic). The name is
trio's: a ``trio.testing.MockClock`` is a Clock, and both clocks here also implement
trio's ``start_clock`` / ``deadline_to_sleep_time``, so one object can drive a trio loop
(the compacter's) and the engine's own deadlines alike. Importing this module loads
nothing but the standard library.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """A monotonic source of seconds."""

    def current_time(self) -> float:
        """Seconds since an arbitrary, fixed origin; never decreases."""
        ...


class MonotonicClock:
    """The real clock (``time.monotonic``): every component's default."""

    def start_clock(self) -> None:
        pass

    def current_time(self) -> float:
        return time.monotonic()

    def deadline_to_sleep_time(self, deadline: float) -> float:
        return max(0.0, deadline - time.monotonic())


class ManualClock:
    """A clock that moves only when told (:meth:`advance`): for tests of timeouts, leases and
    ages that must assert exact times and never sleep. Thread-safe. Code that sleeps on
    a ManualClock cannot know it moved: :meth:`advance` calls the callbacks registered with
    :meth:`on_advance` (e.g. a compacter's ``tick``) so that it looks again."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []

    def start_clock(self) -> None:
        pass

    def current_time(self) -> float:
        with self._lock:
            return self._now

    def deadline_to_sleep_time(self, deadline: float) -> float:
        """For a trio loop on this clock: nothing is due until the clock is advanced to it."""
        return 0.0 if deadline <= self.current_time() else 86400.0

    def advance(self, seconds: float) -> float:
        """Move time forward by ``seconds`` (>= 0); returns the new time."""
        if not seconds >= 0:
            raise ValueError(f"a clock only moves forward, not by {seconds!r} seconds")
        with self._lock:
            self._now += seconds
            now = self._now
            listeners = list(self._listeners)
        for callback in listeners:
            callback()
        return now

    def on_advance(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after every :meth:`advance`."""
        with self._lock:
            self._listeners.append(callback)


MONOTONIC = MonotonicClock()
