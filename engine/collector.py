"""Garbage collection: blobs a compaction replaced, and the log below the trim point, are
deleted only once no reader may still need them.

Why its own component: compaction produces garbage and reads pin it, so neither may
delete on its own; this one place knows both (reads in progress, read plans' leases,
merges under way) and deletes when all are done.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from sediment.clock import Clock

log = logging.getLogger(__name__)


class ReaderPins:
    """Readers that may still need the batches and log records a compaction replaces: reads
    in progress (:meth:`pin` / :meth:`unpin`) and read plans' leases, each until released or
    until its deadline on the clock. Replaced objects are deleted, and the log trimmed, only
    while :attr:`idle`."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.pins = 0
        self.leases: dict[int, float] = {}  # lease id -> deadline (clock seconds)
        self._last_lease = 0

    def pin(self) -> None:
        self.pins += 1

    def unpin(self) -> None:
        self.pins -= 1

    def lease(self, seconds: float) -> int:
        """A new lease, held for ``seconds`` from now; its id."""
        self._last_lease += 1
        self.leases[self._last_lease] = self.clock.current_time() + seconds
        return self._last_lease

    def release(self, lease: int) -> bool:
        """End a lease; False if it had already ended (released, or expired)."""
        return self.leases.pop(lease, None) is not None

    def expire(self) -> list[int]:
        """End every lease whose deadline has come; their ids."""
        now = self.clock.current_time()
        ended = [lease for lease, deadline in self.leases.items() if deadline <= now]
        for lease in ended:
            del self.leases[lease]
        return ended

    @property
    def idle(self) -> bool:
        return not self.pins and not self.leases


class Collector:
    """What waits to be deleted: replaced blobs (``discard``) and the log below the trim
    point (``trim_below``). ``traces`` deletes blobs, ``log`` is trimmed; ``lock`` is the
    engine lock."""

    def __init__(self, lock: threading.RLock, readers: ReaderPins, traces: Any, log_: Any) -> None:
        self.lock = lock
        self.readers = readers
        self.traces = traces
        self.log = log_
        self.garbage: list[str] = []
        self.merging = 0  # merges under way: replaced blobs wait for them
        self.trim_to: int | None = None

    def discard(self, keys: Iterable[str | None]) -> None:
        """Blobs no trace refers to any more (under the lock)."""
        self.garbage += [k for k in keys if k]

    def trim_below(self, lsn: int) -> None:
        """The log below ``lsn`` is no longer needed (under the lock)."""
        self.trim_to = max(self.trim_to or 0, lsn)

    @contextmanager
    def merge_running(self) -> Iterator[None]:
        """While a merge runs it may read blobs a pass replaces: they wait (the trim does not)."""
        with self.lock:
            self.merging += 1
        try:
            yield
        finally:
            with self.lock:
                self.merging -= 1
            self.collect()

    def pin(self) -> None:
        """A read starts (under the lock)."""
        self.readers.pin()

    def unpin(self) -> None:
        """A read ended: collect what it held back."""
        with self.lock:
            self.readers.unpin()
        self.collect()

    def lease(self, seconds: float) -> int:
        with self.lock:
            return self.readers.lease(seconds)

    def release(self, lease: int) -> None:
        with self.lock:
            if not self.readers.release(lease):
                return
        self.collect()

    def collect(self) -> None:
        """Delete replaced blobs and trim the log, once no reader may still need them. A trim
        that fails (the disk refused the manifest's write, say) is logged and retried at the next
        collection: the read or pass that happened to trigger it still succeeds."""
        with self.lock:
            self.readers.expire()
            if not self.readers.idle:
                return
            garbage = []
            if not self.merging:  # a merge under way may still read a replaced blob; it reads no WAL
                garbage, self.garbage = self.garbage, []
            trim, self.trim_to = self.trim_to, None
        try:
            self.traces.delete(garbage)
        except Exception as exc:  # noqa: BLE001 - orphans are swept at the next start
            log.warning("could not delete replaced batches (swept at next start): %s", exc)
        if trim is not None:
            try:
                self.log.trim(trim)
            except Exception as exc:  # noqa: BLE001 - the records stay; a read or pass must not fail for it
                with self.lock:
                    self.trim_to = max(self.trim_to or 0, trim)  # retried at the next collection
                log.warning("could not trim the WAL below LSN %d (its records are kept; retried at the next "
                            "collection): %s: %s", trim, type(exc).__name__, exc)
