"""Segment bookkeeping of the device ring: where the open segment starts and how many
records it holds, the FRONTIERS records a trim may stop at, how far finished segments
reach, and the owner's preamble and finish listener. The ring writer holds one and calls
it under its lock; nothing here does I/O."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from sediment.wal.protocol import NO_PREAMBLE, SegmentPreamble, notify
from sediment.wal.record import Record


class Segments:
    """The segment state of one ring (not thread-safe: its writer serialises the calls)."""

    def __init__(self, segment_bytes: int, frontier_lsns: Sequence[int] = (), finished: int = 0,
                 seg_start: int = 0, seg_records: int = 0) -> None:
        self.segment_bytes = segment_bytes
        self.frontier_lsns: deque[int] = deque(frontier_lsns)
        self.finished = finished
        self.seg_start = seg_start
        self.seg_records = seg_records
        self.preamble: SegmentPreamble = NO_PREAMBLE
        self.listener: Callable[[int], None] | None = None
        self._notified = -1

    def boundary(self, records: Sequence[Record], force: bool, next_lsn: int, total: int) -> Record | None:
        """The FRONTIERS record to place after ``records`` (``total`` bytes from ``next_lsn``)
        when they finish the segment (or ``force`` and the segment holds a record), else None."""
        if self.seg_records + len(records) > 0 and (
            force or next_lsn + total - self.seg_start >= self.segment_bytes
        ):
            return self.preamble.record(records)
        return None

    def placed(self, records: Sequence[Record], boundary: Record | None, boundary_lsn: int = -1) -> None:
        """``records`` (and ``boundary``, placed at ``boundary_lsn``) now have their LSNs."""
        self.preamble.observe(records)
        if boundary is None:
            self.seg_records += len(records)
            return
        self.preamble.observe((boundary,))
        self.frontier_lsns.append(boundary_lsn)
        self.seg_start = boundary_lsn + boundary.frame_size
        self.seg_records = 0

    def notify(self, frontiers_end: int) -> bool:
        """A FRONTIERS record ending at ``frontiers_end`` is durable (called outside the
        writer's lock, in log order): tell the listener; whether it was news."""
        if frontiers_end <= self._notified:
            return False
        self._notified = frontiers_end
        notify([self.listener], frontiers_end, "WAL finish listener")
        return True

    def trim_target(self, lsn: int) -> int:
        """The start of the last finished FRONTIERS record at or below ``lsn``, or -1."""
        target = -1
        for f in self.frontier_lsns:
            if f > lsn or f >= self.finished:
                break
            target = f
        return target

    def forget_below(self, lsn: int) -> None:
        while self.frontier_lsns and self.frontier_lsns[0] < lsn:
            self.frontier_lsns.popleft()
