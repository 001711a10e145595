"""The background scheduler: compaction passes and merges on one trio loop of their own.

Passes take the WAL's finished records into the traces; only they free WAL backlog
(``max_wal_backlog``). Merges rewrite what is already in the traces and free none, and a
merge of a few GiB of runs takes seconds: run in one step with the passes, it held up the
next passes, the backlog filled and appends waited behind it (measured: two appends waiting
2 and 6 s in an 8 s stream of unsealed 1 KiB rows). So, as RocksDB keeps flushes and
compactions apart, the loop runs two tasks: the pass task wakes when the log finishes a
segment (an event set from the log's writer thread, not a polling sleep) and every
``interval`` seconds; after each pass it wakes the merge task, which merges beside the
next passes, whether the pass succeeded or not. Each runs its step in a worker thread
(``trio.to_thread``), as the steps do blocking file, blob and metadata I/O. A failed step is
logged and retried at the next wake (a failed pass's error is kept in ``last_error`` for
tools and tests; a relation's failing merge step backs off on the clock, see
engine/compaction.py).

The loop runs on the clock passed in (:mod:`sediment.clock`: tests pass ``ManualClock`` or
``trio.testing.MockClock``), which must also serve as a trio clock.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable

import trio

from sediment.clock import Clock

log = logging.getLogger(__name__)


class Scheduler:
    """Runs ``run_pass()`` on wake-ups and every ``interval`` seconds, and ``run_merge()``
    after each pass (coalescing wakes that come while one runs). Thread-safe wakes."""

    def __init__(self, run_pass: Callable[[], None], run_merge: Callable[[], None], interval: float | None,
                 clock: Clock, name: str = "sediment-compaction") -> None:
        self._run_pass = run_pass
        self._run_merge = run_merge
        self._interval = interval
        self.clock = clock
        self._done = threading.Condition()
        self._token: trio.lowlevel.TrioToken | None = None
        self._wake: trio.Event | None = None
        self._merge_wake: trio.Event | None = None
        self._merge_wanted = False
        self._merge_running = False
        self._stopping = False
        self._started = threading.Event()
        self._thread = threading.Thread(target=lambda: trio.run(self._main, clock=clock), name=name, daemon=True)
        self.passes = 0
        self.merges = 0
        self.last_error: BaseException | None = None
        self.cpu_seconds = {"pass": 0.0, "merge": 0.0}  # CPU time of the steps' own threads, for benchmarks

    def start(self) -> None:
        self._thread.start()
        self._started.wait()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._wake, self._merge_wake = trio.Event(), trio.Event()
        self._started.set()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._merge_loop)
            await self._pass_loop()
            self._merge_wake.set()
        with self._done:
            self._done.notify_all()

    async def _pass_loop(self) -> None:
        while not self._stopping:
            with trio.move_on_after(self._interval if self._interval is not None else float("inf")):
                await self._wake.wait()
            self._wake = trio.Event()
            if self._stopping:
                break
            try:
                await trio.to_thread.run_sync(self._timed, "pass", self._run_pass, thread_name="compaction-pass")
                self.last_error = None
            except Exception as exc:  # noqa: BLE001 - keep running; the next wake retries
                self.last_error = exc
                log.warning("compaction pass failed (will retry): %s", exc)
            self.merge_soon()  # merges do not depend on the pass: a failing one must not stop them
            with self._done:
                self.passes += 1
                self._done.notify_all()

    async def _merge_loop(self) -> None:
        while True:
            await self._merge_wake.wait()
            self._merge_wake = trio.Event()
            with self._done:
                if self._stopping:
                    self._merge_wanted = False
                    self._done.notify_all()
                    return
                self._merge_wanted, self._merge_running = False, True
            try:
                await trio.to_thread.run_sync(self._timed, "merge", self._run_merge,
                                             thread_name="compaction-merge")
            except Exception:  # noqa: BLE001 - logged; the next wake retries
                log.exception("background merge failed (retried at the next wake)")
            finally:
                with self._done:
                    self._merge_running = False
                    self.merges += 1
                    self._done.notify_all()

    def _timed(self, kind: str, step: Callable[[], None]) -> None:
        """Run ``step`` in this worker thread, adding its CPU time to ``cpu_seconds[kind]``
        (trio reuses worker threads for passes and merges alike, so a thread's own total
        cannot tell them apart)."""
        start = time.thread_time()
        try:
            step()
        finally:
            self.cpu_seconds[kind] += time.thread_time() - start

    def wait_passes(self, count: int, timeout: float) -> bool:
        """Block until ``count`` passes have run (or the scheduler stopped, or ``timeout`` real
        seconds passed); whether they ran. For tools and tests that must not sleep."""
        with self._done:
            return self._done.wait_for(lambda: self.passes >= count or not self._thread.is_alive()
                                       or self._stopping, timeout) and self.passes >= count

    def wait_merges_idle(self, timeout: float) -> bool:
        """Until no merge is wanted or running (tests and tools); False on timeout."""
        with self._done:
            return self._done.wait_for(lambda: not self._merge_wanted and not self._merge_running, timeout)

    def notify(self, *_args: object) -> None:
        """Wake the pass task (from the log's writer thread, or another trio loop's thread such
        as the replicated log's, when a segment finishes). Never blocks."""
        self._soon(lambda: self._wake.set())

    def merge_soon(self) -> None:
        """Wake the merge task (thread-safe; also called after every pass)."""
        with self._done:
            if self._stopping:
                return
            self._merge_wanted = True
        self._soon(lambda: self._merge_wake.set())

    def tick(self) -> None:
        """Let the loop look at its clock again without waking a task: for a clock moved from
        outside trio (``MockClock.jump`` in a test), whose sleepers trio cannot know are due
        until something wakes the loop."""
        self._soon(lambda: None)

    def _soon(self, fn: Callable[[], None]) -> None:
        token = self._token
        if token is None or self._stopping:
            return
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(fn)

    def stop(self) -> None:
        """Finish the steps under way (if any) and stop; idempotent."""
        if not self._thread.is_alive():
            return
        with self._done:
            self._stopping = True
        token = self._token
        if token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(lambda: self._wake.set())
        if self._thread is not threading.current_thread():
            self._thread.join()
