"""The background merger: batch and pending-run merges on a thread of their own.

Why: a compaction pass takes the WAL's finished records into the trace, and only that
frees WAL backlog (``max_wal_backlog``); a merge rewrites what is already in the trace
and frees none. When both ran in one pass, a merge of a few GiB of runs held up the next
passes for seconds, the backlog filled and appends waited behind a merge (measured: two
appends waiting 2 and 6 s in an 8 s stream of unsealed 1 KiB rows). As RocksDB keeps
flushes and compactions apart, the background compacter now only takes records out of the
WAL and wakes this merger; the merger plans from the trace it sees, merges without any
engine lock, and splices its result into the trace current at commit time (the commit is
dropped, and its output collected, when a pass changed those inputs meanwhile).
``Engine.compact()`` still merges in line, after its pass, so it returns a merged trace.

A relation with no history left (``since`` at its sealed time) that has had no new data for
``major_compaction_quiet`` seconds gets a major compaction here too: its batches become one,
read as stored (trace/planner.py ``plan_major_merge`` says when, and bounds the rewrites).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

DEFAULT_MAJOR_COMPACTION_QUIET = 10.0  # seconds without new data before a relation's batches become one


class BackgroundMerger:
    """Runs ``merge`` on its own thread each time it is notified (coalescing wakes that
    arrive while a merge runs into one more run); the thread starts on the first wake."""

    def __init__(self, merge: Callable[[], None]) -> None:
        self._merge = merge
        self._cond = threading.Condition()
        self._wanted = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._running = False
        self.passes = 0
        self.last_error: BaseException | None = None

    def notify(self) -> None:
        with self._cond:
            if self._stopping:
                return
            self._wanted = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sediment-merger", daemon=True)
                self._thread.start()
            self._cond.notify()

    def wait_idle(self, timeout: float) -> bool:
        """Until no merge is wanted or running (tests and tools); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._wanted and not self._running, timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._wanted or self._stopping)
                if self._stopping:
                    return
                self._wanted = False
                self._running = True
            try:
                self._merge()
                self.last_error = None
            except Exception as exc:  # noqa: BLE001 - logged and kept; the next wake retries
                self.last_error = exc
                log.exception("background merge failed (retried at the next wake)")
            finally:
                with self._cond:
                    self._running = False
                    self.passes += 1
                    self._cond.notify_all()

    def stop(self) -> None:
        """Stop after the merge under way, if any; idempotent."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
