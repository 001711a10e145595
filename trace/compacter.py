"""The compacter: a trio task that turns finished WAL segments into batches, then merges.

It runs in its own thread with its own trio loop, so the engine's synchronous API
never waits for it. It wakes when the log finishes a segment (an event set from the
log's writer thread, not a polling sleep) and every ``interval`` seconds, and runs
one pass in a worker thread (``trio.to_thread``): the pass does blocking file, blob
and metadata I/O. A failed pass is logged and retried at the next wake; the error is
kept in ``last_error`` for tools and tests.

This module also holds the pure part of WAL compaction: where the cut goes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import trio

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


class Compacter:
    """Runs ``run_pass()`` in the background on wake-ups. ``notify()`` is thread-safe."""

    def __init__(self, run_pass: Callable[[], None], interval: float | None = 5.0, name: str = "compacter"):
        self._run_pass = run_pass
        self._interval = interval
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
        trio.run(self._main)

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
                self.passes += 1
                self.last_error = None
            except Exception as exc:  # noqa: BLE001 - keep running; the next wake retries
                self.last_error = exc
                log.warning("compaction pass failed (will retry): %s", exc)

    def notify(self, *_args: object) -> None:
        """Wake the task (called from the log's writer thread when a segment finishes)."""
        token = self._token
        if token is None or self._stopping:
            return
        try:
            trio.from_thread.run_sync(self._set_wake, trio_token=token)
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
        self.notify()
        if self._token is not None:
            try:
                trio.from_thread.run_sync(self._set_wake, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        self._thread.join()
