"""The room of a log's active data file: preallocated in doublings, and written with zeros a
stretch ahead of small appends.

Why preallocate: an fdatasync on a growing file also writes the file's new size (measured
about 1.8x slower here). Why zeros ahead: on ext4 a preallocated block that was never
written is an unwritten extent, and the first write into it converts the extent, which the
next fdatasync must write as well. A one-row append (some 450 bytes framed) enters a new
4 KiB block about every ninth append, and each of those paid that second write: 60-130 us
more than an append within a block (a bare ``pwrite`` + ``fdatasync`` loop, 450 B records),
which set the one-writer p99. Zeros written in the same ``pwritev``, :data:`ZERO_AHEAD`
bytes past a small write, convert that stretch at once: one such write per 256 KiB of small
appends, and a loop of them ran as fast as into a file zero-filled beforehand. Larger
writes gain too, since each of their syncs converts: a loop of synced 32, 64 and 128 KiB
writes took 0.74x, 0.83x and 0.90x the time with the zeros, 256 KiB the same, 1 MiB much
longer. So a write of :data:`SMALL_WRITE` bytes or more gets none, nor does a recycled file,
written whole before.

Readers are not affected: past the last record a file holds zeros either way (a never
written block reads as zeros), which the segment scan takes as the clean end, and a power
cut that loses some of the zeros loses nothing.
"""

from __future__ import annotations

import os

from sediment.wal import segment as sg
from sediment.wal.direct_io import allocate

ZERO_AHEAD = 256 << 10  # zeros written past a small write that enters blocks never written
SMALL_WRITE = 128 << 10  # writes at least this large get no zeros
_ZEROS = memoryview(bytes(ZERO_AHEAD))


class FileRoom:
    """The active data file's preallocated length (``allocated``) and how far its blocks are
    known written (``written``). Its writer owns it (one caller at a time, no lock)."""

    def __init__(self, fd: int, end: int, ceiling: int, least: int = 0) -> None:
        """``end``: where the next record goes; ``ceiling``: the most ever preallocated (the
        segment size); ``least``: preallocate at least this far now."""
        self.fd = fd
        self.ceiling = ceiling
        size = os.fstat(fd).st_size
        self.allocated = max(size, min(ceiling, least))
        if size < self.allocated:
            allocate(fd, self.allocated)
        head = sg.parse_header(os.pread(fd, sg.HEADER_SIZE, 0))
        self.written = size if head is not None and head.recycled else end

    def reserve(self, end: int) -> None:
        """Preallocate through ``end``, doubling up to the ceiling."""
        if end > self.allocated:
            self.allocated = max(end, min(2 * self.allocated, self.ceiling))
            allocate(self.fd, self.allocated)

    def pad(self, start: int, end: int) -> memoryview | None:
        """The zeros to write right after a write of bytes [``start``, ``end``) (reserved
        already), or None; the caller writes them with it, in the same call and sync."""
        if end <= self.written:
            return None
        if end - start >= SMALL_WRITE:
            self.written = end
            return None
        stop = min(end + ZERO_AHEAD, self.allocated)
        self.written = max(stop, end)
        return _ZEROS[:stop - end] if stop > end else None

    def wrote(self, end: int) -> None:
        """A write that got no zeros (an O_DIRECT one) reached ``end``."""
        self.written = max(self.written, end)
