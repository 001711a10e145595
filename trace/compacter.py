"""The compacter: a trio task that turns finished WAL segments into batches, then merges.

It runs in its own thread with its own trio loop, so the engine's synchronous API
never waits for it. It wakes when the log finishes a segment (an event set from the
log's writer thread, not a polling sleep) and every ``interval`` seconds, and runs
one pass in a worker thread (``trio.to_thread``): the pass does blocking file, blob
and metadata I/O. A failed pass is logged and retried at the next wake; the error is
kept in ``last_error`` for tools and tests.

Segments finish by size (the log rolls them) and by age: a pass that finds durable
records that have sat unfinished for ``interval`` finishes the segment first
(:class:`SegmentAge`), so a quiet relation does not wait for 64 MiB of other traffic.
The loop runs on the clock passed in (:mod:`sediment.clock`: real by default; tests use
``ManualClock`` or ``trio.testing.MockClock``), which must also serve as a trio clock.

This module also holds the pure part of WAL compaction: where the cut goes, and when
a segment is old enough to finish.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import trio

from sediment.clock import Clock, MonotonicClock

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WalCut:
    """What one WAL-to-batch pass may take: every record below ``safe`` (in finished
    segments, and before the first record of any open transaction)."""

    safe: int


def plan_wal_cut(finished_lsn: int, open_txn_first_lsns: Iterable[int]) -> WalCut:
    """Records below the finished LSN never change; a transaction still open may yet
    commit records that belong before its BEGIN's successors, so the cut stops there."""
    return WalCut(min([finished_lsn, *open_txn_first_lsns]))


def trim_point(cut: int, needed: Iterable[int]) -> int:
    """The LSN below which the log may be discarded: nothing still needed lies below it."""
    return min([cut, *needed])


def new_upper(trace_upper: int, progress_times: Iterable[int]) -> int:
    """The trace's upper after absorbing ``close t`` records: one past the greatest t."""
    return max([trace_upper, *(t + 1 for t in progress_times)])


@dataclass(frozen=True)
class PendingSplit:
    """How one pass treats the pending runs (unsealed updates already out of the WAL) once
    the trace's upper moves to ``upper``: runs wholly below it are ``folded`` into the new
    batch, runs across it are ``split`` (the part below into the batch, the rest rewritten
    as a run), runs wholly at or above it are ``kept`` as they are, unread. Indices into
    the pending tuple, ascending."""

    folded: tuple[int, ...]
    split: tuple[int, ...]
    kept: tuple[int, ...]


def split_pending(spans: Iterable[tuple[int, int]], upper: int) -> PendingSplit:
    """Pure: each run's ``[lower, upper)`` time span against the new trace upper. A pass reads
    only the runs whose times became sealed, so the total work of a stream is linear in it
    whether or not its times are sealed yet."""
    folded, split, kept = [], [], []
    for i, (lo, hi) in enumerate(spans):
        (folded if hi <= upper else kept if lo >= upper else split).append(i)
    return PendingSplit(tuple(folded), tuple(split), tuple(kept))


class SegmentAge:
    """When the log's unfinished part must be finished because its data is old.

    Pure: the caller passes the log's positions and the clock's time at each wake. Data
    first seen unfinished at a wake arrived after the previous wake, so its age is
    counted from that previous wake (an over-estimate, never an under-estimate). With
    wakes at most ``interval`` apart (the compacter's timer; finish notifications only
    add wakes), the first wake at least ``interval`` after that previous one comes less
    than ``2 * interval`` after the data arrived: every durable record is in a finished
    segment, and in a batch after that same pass, within ``2 * interval`` plus the
    passes' run time. ``started`` (when the compacter started) counts as a wake, so records
    written before the engine opened count from the opening. A segment finished by size in between does not
    reset the age while records remain unfinished (they may be as old): at most one
    extra small segment per interval on a busy log, and never a delayed record."""

    def __init__(self, started: float | None = None) -> None:
        self.since: float | None = None  # the unfinished part holds no record older than this
        self.last_wake = started

    def due(self, finished_lsn: int, end_lsn: int, now: float, interval: float | None) -> bool:
        """Whether to finish the active segment now (call once per wake)."""
        previous, self.last_wake = self.last_wake, now
        if interval is None or end_lsn <= finished_lsn:
            self.since = None
            return False
        if self.since is None:
            self.since = previous if previous is not None else now
        return now - self.since >= interval

    def finished(self) -> None:
        """The segment was finished: records appended later start a new age."""
        self.since = None


class Compacter:
    """Runs ``run_pass()`` in the background on wake-ups. ``notify()`` is thread-safe."""

    def __init__(self, run_pass: Callable[[], None], interval: float | None = 5.0, name: str = "compacter",
                 clock: Clock | None = None):
        self._run_pass = run_pass
        self._interval = interval
        self.clock = clock if clock is not None else MonotonicClock()
        self._done = threading.Condition()
        self._token: trio.lowlevel.TrioToken | None = None
        self._wake: trio.Event | None = None
        self._stopping = False
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._thread_main, name=name, daemon=True)
        self.passes = 0
        self.last_error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()
        self._started.wait()

    def _thread_main(self) -> None:
        trio.run(self._main, clock=self.clock)

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._wake = trio.Event()
        self._started.set()
        while not self._stopping:
            if self._interval is None:
                await self._wake.wait()
            else:
                with trio.move_on_after(self._interval):
                    await self._wake.wait()
            self._wake = trio.Event()
            if self._stopping:
                break
            try:
                await trio.to_thread.run_sync(self._run_pass)
                self.last_error = None
            except Exception as exc:  # noqa: BLE001 - keep running; the next wake retries
                self.last_error = exc
                log.warning("compaction pass failed (will retry): %s", exc)
            with self._done:
                self.passes += 1
                self._done.notify_all()
        with self._done:
            self._done.notify_all()

    def wait_passes(self, count: int, timeout: float) -> bool:
        """Block until ``count`` passes have run (or the compacter stopped, or ``timeout``
        real seconds passed); whether they ran. For tools and tests that must not sleep."""
        with self._done:
            return self._done.wait_for(lambda: self.passes >= count or not self._thread.is_alive()
                                       or self._stopping, timeout) and self.passes >= count

    def notify(self, *_args: object) -> None:
        """Wake the task (called from the log's writer thread, or from another trio loop's
        thread such as the replicated log's, when a segment finishes). Never blocks."""
        self._soon(self._set_wake)

    def tick(self) -> None:
        """Let the loop look at its clock again without waking the task: for a clock moved
        from outside trio (``MockClock.jump`` in a test), whose sleepers trio cannot know
        are due until something wakes the loop."""
        self._soon(lambda: None)

    def _soon(self, fn: Callable[[], None]) -> None:
        token = self._token
        if token is None or self._stopping:
            return
        try:
            token.run_sync_soon(fn)
        except trio.RunFinishedError:
            pass

    def _set_wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def stop(self) -> None:
        """Finish the pass under way (if any) and stop the task."""
        if not self._thread.is_alive():
            return
        self._stopping = True
        if self._token is not None:
            try:
                self._token.run_sync_soon(self._set_wake)
            except trio.RunFinishedError:
                pass
        self._thread.join()
