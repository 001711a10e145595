"""The WAL backlog bound: bytes of durable updates the compacter has not yet taken out of the log.

Without a bound, a writer that outruns compaction grows the log, the restart time (open
replays the whole backlog) and the tail every snapshot decodes, without limit. With one,
an append that would take the backlog past ``max_wal_backlog`` waits, under the engine
lock's condition, until a compaction pass takes records out of the log (a notify, never a
polling sleep), and after ``wal_backlog_timeout`` seconds fails with
:class:`sediment.errors.WalBacklogFull` having written nothing.

The count is kept by the engine as records become durable (UPDATES, in a relation's tail
or in an open transaction) and leave (compacted, aborted, dropped), so checking it costs
an addition per append. Appends admitted together may overshoot by what they carry: the
check is against the durable backlog plus the one append, not the others in flight.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from sediment.clock import Clock, MonotonicClock
from sediment.errors import EngineClosed, WalBacklogFull

DEFAULT_MAX_WAL_BACKLOG = 1 << 30
DEFAULT_WAL_BACKLOG_TIMEOUT = 60.0


class WalBacklog:
    """The backlog's byte count and the appenders waiting for it to shrink. Every method is
    called with ``lock`` (the engine lock) held."""

    def __init__(self, lock: threading.RLock, bound: int | None, timeout: float,
                 clock: Clock | None = None) -> None:
        self.bytes = 0
        self.bound = bound
        self.timeout = timeout
        self.waiting = 0
        self.waits = 0  # appends that had to wait, ever
        self._watchers = 0
        self._cond = threading.Condition(lock)
        self._clock = clock if clock is not None else MonotonicClock()

    def add(self, n: int) -> None:
        self.bytes += n

    def remove(self, n: int) -> None:
        self.bytes = max(0, self.bytes - n)
        if self.waiting or self._watchers:
            self._cond.notify_all()

    def wake_all(self) -> None:
        """For close: waiters re-check and find the engine closed."""
        self._cond.notify_all()

    def must_wait(self, n: int) -> bool:
        """Whether an append of ``n`` bytes is over the bound now. An append into an empty
        backlog always goes through, so one larger than the bound is not refused for ever."""
        return self.bound is not None and self.bytes > 0 and self.bytes + n > self.bound

    def admit(self, n: int, *, where: str, closed: Callable[[], bool], wake_compacter: Callable[[], None]) -> None:
        """Return once an append of ``n`` bytes fits under the bound; raise WalBacklogFull
        (nothing written) after the timeout, EngineClosed if the engine closes meanwhile."""
        if not self.must_wait(n):
            return
        deadline = self._clock.current_time() + self.timeout
        self.waiting += 1
        self.waits += 1
        self._cond.notify_all()  # watchers of ``waiting`` (stats readers, tests) see the change
        try:
            wake_compacter()
            while self.must_wait(n):
                if closed():
                    raise EngineClosed(f"the engine on {where} closed while an append waited for the WAL backlog")
                left = deadline - self._clock.current_time()
                if left <= 0:
                    raise WalBacklogFull(
                        f"{where}: the WAL backlog (durable updates not yet compacted) is {self.bytes} bytes; an "
                        f"append of {n} bytes would pass max_wal_backlog={self.bound} and compaction did not make "
                        f"room within {self.timeout:g} s. Nothing was written: retry later, check "
                        "Engine.compaction_errors() and open transactions (their records cannot be compacted "
                        "before they end), or open with a larger max_wal_backlog",
                        backlog=self.bytes, bound=self.bound)
                self._cond.wait(left)
        finally:
            self.waiting -= 1
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Block (lock held) until ``predicate()`` holds, re-checked whenever the backlog
        shrinks or an appender starts or stops waiting; for tools and tests that must not sleep."""
        self._watchers += 1
        try:
            return self._cond.wait_for(predicate, timeout)
        finally:
            self._watchers -= 1


class BodyCache:
    """The bodies of recently appended UPDATES records, by LSN, up to ``cap`` bytes, so that
    compaction and feeds decode them from memory instead of reading the log back.

    Large group commits are written with O_DIRECT, past the page cache: reading them back
    went to the disk and competed with the appends for it (issue 15: 0.69x of compaction off).
    The oldest records are the next to be compacted, so when full the cache keeps what it
    has and skips new records (they are read from the log as before). Guarded by the engine
    lock."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.bytes = 0
        self._bodies: dict[int, object] = {}

    def put(self, lsn: int, body: object, size: int) -> None:
        if self.bytes + size <= self.cap:
            self._bodies[lsn] = body
            self.bytes += size

    def get(self, lsn: int) -> object | None:
        """The body, left in the cache: a feed decodes a record just made durable from here
        (engine/feed.py) rather than reading it back from the log. A dict lookup, safe
        without the engine lock."""
        return self._bodies.get(lsn)

    def take(self, lsn: int) -> object | None:
        """The body, removed from the cache: a pass takes what it decodes, so the room is free
        for the records appended meanwhile (a pass that falls behind would otherwise find the
        cache full of what it already holds, and read the next records from the disk)."""
        body = self._bodies.pop(lsn, None)
        if body is not None:
            self.bytes -= len(memoryview(body))  # type: ignore[arg-type]
        return body

    def drop_below(self, lsn: int) -> None:
        """Forget every body below ``lsn`` (compacted, or trimmed with the log)."""
        if not self._bodies:
            return
        for key in [k for k in self._bodies if k < lsn]:
            self.bytes -= len(memoryview(self._bodies.pop(key)))  # type: ignore[arg-type]
