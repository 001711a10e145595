"""The coordinator's cache of the replicated log's tail: what it acknowledged (or read at
open) and the compacter has not yet trimmed.

Snapshots, replays, feeds and compaction read the uncompacted tail record by record; on a
replicated log a read from the storage nodes is a network round trip per call (and fails
while the nodes are partitioned away), although the coordinator held every one of these
records when it acknowledged them. Past ``max_bytes`` the oldest are dropped and read from
the nodes again. Thread-safe: filled from the log's trio thread, read by any thread.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable

from sediment.wal.record import Record

DEFAULT_MAX_BYTES = 256 << 20


class TailCache:
    """Acknowledged records by LSN, at most ``max_bytes`` of frames, oldest evicted first."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max(0, int(max_bytes))
        self._records: OrderedDict[int, Record] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def add(self, records: Iterable[Record]) -> None:
        """Remember records in LSN order (a record already held is kept as it is)."""
        with self._lock:
            for r in records:
                if r.lsn < 0 or r.lsn in self._records:
                    continue
                if self._records and r.lsn < next(reversed(self._records)):
                    continue  # out of order: only ever a re-read of something evicted; not worth holding
                self._records[r.lsn] = r
                self._bytes += r.frame_size
            while self._bytes > self.max_bytes and self._records:
                _lsn, old = self._records.popitem(last=False)
                self._bytes -= old.frame_size

    def get(self, lsn: int) -> Record | None:
        with self._lock:
            r = self._records.get(lsn)
            if r is None:
                self.misses += 1
            else:
                self.hits += 1
            return r

    def trim(self, lsn: int) -> None:
        """Forget records below ``lsn`` (the log was trimmed there)."""
        with self._lock:
            while self._records:
                first = next(iter(self._records))
                if first >= lsn:
                    break
                self._bytes -= self._records.pop(first).frame_size

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._records)
