"""The one writer of segment files: the local log (wal/file_log.py) and a storage node's
replica (wal/replication/node/partition_store.py) both append through it.

A :class:`Segment` is what a writer knows of one segment: its files and where each durable
record starts. The :class:`ActiveSegment` holds the data and index files of the segment
records are appended to. Frames go into the data file and are made durable first; only then
are their offsets added to the index file and to memory, so neither ever names a frame that
is not on disk. Finishing a segment cuts its data file to the records and syncs both files
before anyone records the segment as finished. Layout: docs/formats.md, "Segment files".
"""

from __future__ import annotations

import os
import threading
from array import array
from dataclasses import dataclass, field

from sediment._fs import pwrite_all
from sediment.wal import segment as sg
from sediment.wal.direct_io import pwritev_all


@dataclass
class Segment:
    first_lsn: int
    path: str
    idx_path: str
    offsets: array = field(default_factory=lambda: array("Q"))  # byte offset of each durable record
    end: int = sg.HEADER_SIZE  # byte offset just past the last durable record

    @classmethod
    def in_dir(cls, directory: str, first_lsn: int, offsets: array | None = None,
               end: int = sg.HEADER_SIZE) -> Segment:
        """The segment of ``directory`` whose first record is ``first_lsn``."""
        return cls(first_lsn, os.path.join(directory, sg.segment_name(first_lsn)),
                   os.path.join(directory, sg.index_name(first_lsn)),
                   array("Q") if offsets is None else offsets, end)

    @property
    def next_lsn(self) -> int:
        return self.first_lsn + len(self.offsets)


def finished_below(segments: list[Segment], lsn: int) -> int:
    """How many leading segments hold only records below ``lsn``: what a trim may drop (never
    the last, active one)."""
    n = 0
    while n < len(segments) - 1 and segments[n].next_lsn <= lsn:
        n += 1
    return n


class ActiveSegment:
    """The open data (``fd``) and index (``idx_fd``) files of the segment being appended to.
    Its owner serialises the calls (one writer at a time); ``lock`` guards what readers see."""

    def __init__(self, seg: Segment) -> None:
        self.seg = seg
        self.fd = os.open(seg.path, os.O_RDWR)
        try:
            self.idx_fd = os.open(seg.idx_path, os.O_RDWR | os.O_CREAT, 0o644)
        except BaseException:
            os.close(self.fd)
            raise

    def write(self, buffers: list, at: int) -> None:
        """Write the buffers back to back at ``at`` in the data file and make them durable."""
        pwritev_all(self.fd, buffers, at)
        os.fdatasync(self.fd)

    def add(self, offsets: array, end: int, lock: threading.Lock, index: bool = True) -> None:
        """Frames now durable in the data file start at ``offsets`` and end at ``end``: add them
        to memory and (``index``) to the index file, which is synced at checkpoints and at the
        finish; without ``index`` the owner writes them with :meth:`write_index` before it syncs."""
        seg = self.seg
        if index:
            pwrite_all(self.idx_fd, offsets.tobytes(), sg.HEADER_SIZE + 8 * len(seg.offsets))
        with lock:
            seg.offsets.extend(offsets)
            seg.end = end

    def write_index(self, first: int) -> None:
        """Write the index entries of the records from the ``first``-th of the segment on."""
        pwrite_all(self.idx_fd, self.seg.offsets[first:].tobytes(), sg.HEADER_SIZE + 8 * first)

    def finish(self) -> None:
        """Cut the data file to its records, make both files durable and close them: the
        segment is never written again, and may now be recorded as finished."""
        os.ftruncate(self.fd, self.seg.end)
        os.fsync(self.fd)
        os.fsync(self.idx_fd)
        self.close()

    def close(self) -> None:
        for fd in (self.fd, self.idx_fd):
            if fd >= 0:
                os.close(fd)
        self.fd = self.idx_fd = -1


def rewrite_index(seg: Segment, trusted: int, header: bytes, fresh: bool) -> None:
    """Make ``seg``'s index file name every record of ``seg.offsets`` (its first ``trusted``
    entries already do; ``fresh``: the file has no valid header and is cut first), cut to
    them: entries synced first, then ``header`` (whose checkpoint counts them) synced, so
    the header never vouches for entries that are not on disk."""
    fd = os.open(seg.idx_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if fresh:
            os.ftruncate(fd, 0)
        pwrite_all(fd, seg.offsets[trusted:].tobytes(), sg.HEADER_SIZE + 8 * trusted)
        os.ftruncate(fd, sg.HEADER_SIZE + 8 * len(seg.offsets))
        os.fdatasync(fd)
        pwrite_all(fd, header, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
