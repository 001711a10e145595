"""Garbage collection: blobs a compaction replaced, and the log below the trim point, are
deleted only once no reader may still need them.

Why its own component: compaction produces garbage and reads pin it, so neither may
delete on its own; this one place knows both (reads in progress, read plans' leases,
merges under way) and deletes when all are done.

Readers are told apart by generation, as in epoch-based reclamation: every discard and every
trim advances the generation, and every reader records the generation it started in. A reader
captures the trace and the WAL tail under the engine lock, in the same hold as its pin, and a
compaction swaps the trace before it discards (in that hold or a later one), so a reader needs
only garbage made after it started. Garbage of generation ``g`` is deleted once every reader
still held started at ``g`` or later: readers whose lifetimes always overlap hold back only
what was replaced while the oldest of them runs, not every deletion for as long as they overlap.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from sediment.clock import Clock

log = logging.getLogger(__name__)


class ReaderPins:
    """Readers that may still need the batches and log records a compaction replaces: reads
    in progress (:meth:`pin` / :meth:`unpin`) and read plans' leases, each until released or
    until its deadline on the clock, each with the generation it started in (:meth:`oldest`)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.generation = 0
        self.pins: Counter[int] = Counter()  # generation at the read's start -> reads in progress
        self.leases: dict[int, float] = {}  # lease id -> deadline (clock seconds)
        self._lease_starts: dict[int, int] = {}  # lease id -> generation at its start
        self._last_lease = secrets.randbelow(1 << 48)  # ids unique across opens: an old plan's release ends no new lease

    def pin(self) -> int:
        """A read starts; the generation it started in, for :meth:`unpin`."""
        self.pins[self.generation] += 1
        return self.generation

    def unpin(self, started: int) -> None:
        left = self.pins[started] - 1
        if left > 0:
            self.pins[started] = left
        else:
            del self.pins[started]

    def advance(self) -> int:
        """Garbage is made: the new generation it belongs to."""
        self.generation += 1
        return self.generation

    def lease(self, seconds: float) -> int:
        """A new lease, held for ``seconds`` from now; its id."""
        self._last_lease += 1
        self.leases[self._last_lease] = self.clock.current_time() + seconds
        self._lease_starts[self._last_lease] = self.generation
        return self._last_lease

    def release(self, lease: int) -> bool:
        """End a lease; False if it had already ended (released, or expired)."""
        self._lease_starts.pop(lease, None)
        return self.leases.pop(lease, None) is not None

    def expire(self) -> list[int]:
        """End every lease whose deadline has come; their ids."""
        now = self.clock.current_time()
        ended = [lease for lease, deadline in self.leases.items() if deadline <= now]
        for lease in ended:
            del self.leases[lease]
            del self._lease_starts[lease]
        return ended

    def oldest(self) -> int | None:
        """The generation the oldest reader still held started in; None when none is held."""
        starts = [*self.pins, *self._lease_starts.values()]
        return min(starts) if starts else None

    @property
    def idle(self) -> bool:
        return not self.pins and not self.leases


def _due(held: int | None, made: int) -> bool:
    """May garbage of generation ``made`` go, the oldest holder having started in ``held``?"""
    return held is None or made <= held


class Collector:
    """What waits to be deleted: replaced blobs (``discard``) and the log below the trim
    point (``trim_below``), each with its generation. ``traces`` deletes blobs, ``log`` is
    trimmed; ``lock`` is the engine lock."""

    def __init__(self, lock: threading.RLock, readers: ReaderPins, traces: Any, log_: Any) -> None:
        self.lock = lock
        self.readers = readers
        self.traces = traces
        self.log = log_
        self.garbage: list[tuple[int, str]] = []  # (generation made, blob key)
        self.trims: list[tuple[int, int]] = []  # (generation made, trim the log below this LSN)
        self.merges: Counter[int] = Counter()  # generation at a merge's start -> merges under way

    @property
    def trim_to(self) -> int | None:
        """The highest trim point waiting (for tests and operators)."""
        return max((lsn for _, lsn in self.trims), default=None)

    def discard(self, keys: Iterable[str | None]) -> None:
        """Blobs no trace refers to any more (under the lock, once the trace no longer names them)."""
        keys = [k for k in keys if k]
        if keys:
            made = self.readers.advance()
            self.garbage += [(made, k) for k in keys]

    def trim_below(self, lsn: int) -> None:
        """The log below ``lsn`` is no longer needed (under the lock, once no tail holds it)."""
        self.trims.append((self.readers.advance(), lsn))

    @contextmanager
    def merge_running(self) -> Iterator[None]:
        """While a merge runs it may read blobs replaced after it started: they wait (the trim
        does not: merges read no WAL)."""
        with self.lock:
            started = self.readers.generation
            self.merges[started] += 1
        try:
            yield
        finally:
            with self.lock:
                self.merges[started] -= 1
                if self.merges[started] <= 0:
                    del self.merges[started]
            self.collect()

    def pin(self) -> int:
        """A read starts (under the lock, in the hold that captures what it reads); pass what
        it returns to :meth:`unpin`."""
        return self.readers.pin()

    def unpin(self, started: int) -> None:
        """A read ended: collect what it held back."""
        with self.lock:
            self.readers.unpin(started)
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
            readers = self.readers.oldest()
            held = min([*([] if readers is None else [readers]), *self.merges], default=None)
            garbage = [key for made, key in self.garbage if _due(held, made)]
            if garbage:
                self.garbage = [(made, key) for made, key in self.garbage if not _due(held, made)]
            ready = [lsn for made, lsn in self.trims if _due(readers, made)]
            if ready:
                self.trims = [(made, lsn) for made, lsn in self.trims if not _due(readers, made)]
            trim = max(ready, default=None)
        if garbage:
            try:
                self.traces.delete(garbage)
            except Exception as exc:  # noqa: BLE001 - orphans are swept at the next start
                log.warning("could not delete replaced batches (swept at next start): %s", exc)
        if trim is not None:
            try:
                self.log.trim(trim)
            except Exception as exc:  # noqa: BLE001 - the records stay; a read or pass must not fail for it
                with self.lock:
                    self.trims.insert(0, (0, trim))  # due at once: retried at the next collection
                log.warning("could not trim the WAL below LSN %d (its records are kept; retried at the next "
                            "collection): %s: %s", trim, type(exc).__name__, exc)
