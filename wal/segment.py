"""Segment files: ``<first LSN, 19 digits>.seg`` data and ``.idx`` index (Waltz layout).

Both files start with the same 128-byte header (docs/formats.md, "Segment files"). A data
file's body is a sequence of record frames (wal/record.py); an index file's body is one
little-endian u64 per record: the byte offset of record ``first_lsn + i`` in the data file.

This module reads and checks segments; wal/segment_writer.py writes them.
"""

from __future__ import annotations

import mmap
import os
import struct
import uuid
from array import array
from collections.abc import Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass, field

from sediment._fs import fsync_dir
from sediment.errors import WalCorruption
from sediment.wal import record as rec

SEG_MAGIC = b"SDSG"
IDX_MAGIC = b"SDIX"
VERSION = 1
HEADER = struct.Struct("<4sIq16sIIqQ")  # magic, version, created, key, partition, flags, first, checkpoint
CRC_OFFSET = 124  # crc32c of bytes [0, 124): the whole header, reserved bytes included
HEADER_SIZE = 128
NAME_DIGITS = 19
_MAGIC_BYTES = struct.pack("<H", rec.MAGIC)
FLAG_RECYCLED = 1  # the data file held an earlier segment: stale frames may lie past the end
END_MARK = bytes(rec.HEADER_SIZE)  # written after every group commit: where the records end
RECYCLED_SUFFIX = ".recycled"


def segment_name(first_lsn: int) -> str:
    return f"{first_lsn:0{NAME_DIGITS}d}.seg"


def index_name(first_lsn: int) -> str:
    return f"{first_lsn:0{NAME_DIGITS}d}.idx"


def recycled_name(first_lsn: int) -> str:
    """A trimmed data file kept for reuse (``<first LSN>.seg.recycled``): not a segment."""
    return segment_name(first_lsn) + RECYCLED_SUFFIX


def parse_name(name: str) -> tuple[int, str] | None:
    """(first LSN, extension) for ``0000000000000000042.seg``-style names, else None."""
    stem, dot, ext = name.partition(".")
    if dot and ext in ("seg", "idx") and len(stem) == NAME_DIGITS and stem.isdigit():
        return int(stem), ext
    return None


@dataclass(frozen=True)
class SegmentHeader:
    magic: bytes
    version: int
    created_ns: int
    cluster_key: uuid.UUID
    partition: int
    first_lsn: int
    checkpoint: int
    flags: int = 0

    @property
    def recycled(self) -> bool:
        return bool(self.flags & FLAG_RECYCLED)

    def pack(self) -> bytes:
        raw = HEADER.pack(self.magic, self.version, self.created_ns, self.cluster_key.bytes, self.partition,
                          self.flags, self.first_lsn, self.checkpoint).ljust(CRC_OFFSET, b"\0")
        return raw + struct.pack("<I", rec.crc32c(raw))


def parse_header(buf: bytes | memoryview) -> SegmentHeader | None:
    """The header, or None when short, of the wrong format, or failing its CRC."""
    if len(buf) < HEADER_SIZE:
        return None
    magic, version, created, key, part, flags, first, ckpt = HEADER.unpack_from(buf, 0)
    if magic not in (SEG_MAGIC, IDX_MAGIC) or version != VERSION:
        return None
    (crc,) = struct.unpack_from("<I", buf, CRC_OFFSET)
    if rec.crc32c(bytes(buf[:CRC_OFFSET])) != crc:
        return None
    return SegmentHeader(magic, version, created, uuid.UUID(bytes=key), part, first, ckpt, flags)


@dataclass
class SegmentScan:
    """What reading one data file found."""

    path: str
    first_lsn: int
    offsets: array = field(default_factory=lambda: array("Q"))
    end: int = HEADER_SIZE  # byte offset just past the last good record
    file_size: int = 0
    bad_offset: int = -1  # where non-zero bytes failed to parse (-1: none)
    reason: str = ""
    valid_after_bad: bool = False  # a good record lies beyond bad_offset: damage, not a torn tail
    resume: tuple[int, int] | None = None  # (offset, LSN) of the first valid frame after bad_offset
    sealed: dict[int, int] = field(default_factory=dict)  # greatest "close t" per relation seen
    heads: bytes = b""  # with keep_heads: the verified 64-byte header of every record, in order
    bodies: dict[int, bytes] = field(default_factory=dict)  # with keep_heads: COMMIT and FRONTIERS bodies by LSN
    finished: bool = False  # in a recovery plan (wal/log_reader.py): kept as a finished segment

    @property
    def next_lsn(self) -> int:
        return self.first_lsn + len(self.offsets)

    @property
    def clean(self) -> bool:
        return self.bad_offset < 0


_ZEROS = bytes(1 << 20)


def _all_zero(data: bytes | memoryview, start: int, end: int) -> bool:
    base = data.obj if isinstance(data, memoryview) else data  # views here start at offset 0 of their buffer
    if isinstance(base, (bytes, bytearray)):
        return base.count(0, start, end) == end - start
    for at in range(start, end, len(_ZEROS)):  # a mapping: its slices are bytes, compared with memcmp
        n = min(end - at, len(_ZEROS))
        if base[at:at + n] != _ZEROS[:n]:
            return False
    return True


def next_valid_record(view: memoryview, start: int, min_lsn: int, *,
                      older_ends: bool = False) -> tuple[int, int] | None:
    """(offset, LSN) of the first complete, checksum-valid frame with lsn >= min_lsn after
    ``start``, found by its magic: where reading can resume after damage. With
    ``older_ends`` (a recycled file) the first checksum-valid header with a lower LSN is
    returned instead: stale frames lie past everything this segment wrote."""
    data = view.obj if isinstance(view.obj, bytes) and len(view) == len(view.obj) else bytes(view)
    pos = start
    while True:
        pos = data.find(_MAGIC_BYTES, pos + 1)
        if pos < 0:
            return None
        at = pos - 4
        if at < start:
            continue
        head = rec.decode_header(view, at)
        if head is None:
            continue
        if head.lsn < min_lsn:  # an older frame (a recycled file's stale data): hop over it whole
            if older_ends:
                return at, head.lsn
            pos = at + head.frame_size + 3
            continue
        body = view[at + rec.HEADER_SIZE : at + head.frame_size]
        if rec.body_ok(head, body):
            return at, head.lsn


def _written_extent(fd: int, size: int) -> int:
    """How much of a preallocated file can hold non-zero bytes: up to its first hole when no
    data lies beyond it (ext4 reports fallocated, never-written extents as holes), else all."""
    try:
        hole = os.lseek(fd, 0, os.SEEK_HOLE)
    except OSError:
        return size
    try:
        os.lseek(fd, hole, os.SEEK_DATA)
    except OSError:
        return hole
    finally:
        os.lseek(fd, 0, os.SEEK_SET)
    return size


class ReadBuffer:
    """One buffer reused for every segment an open reads. An anonymous mapping: unlike a
    bytearray it is not zeroed up front (64 MiB of memset per growth), and only the pages a
    read touches are ever faulted in, once for all the segments."""

    def __init__(self) -> None:
        self._map: mmap.mmap | None = None

    def view(self, n: int) -> memoryview:
        if self._map is None or len(self._map) < n:  # finished segments differ by up to a record: room
            self._map = mmap.mmap(-1, max(n + n // 8, 1 << 20))
        return memoryview(self._map)[:n]


def _pread_all(fd: int, n: int, offset: int) -> bytes:
    parts = []
    while n > 0:
        chunk = os.pread(fd, min(n, 1 << 30), offset)
        if not chunk:
            break
        parts.append(chunk)
        n -= len(chunk)
        offset += len(chunk)
    return b"".join(parts)


_WINDOW = 8 << 20  # bytes read at a time: the frames are checked while they are still in the CPU's cache


SPAN_GAP = 256 << 10  # bytes of unwanted frames a range read reads through rather than read again
SPAN_MOST = 8 << 20  # bytes one range read takes at most


def read_spans(offsets: Sequence[int], end: int, indices: Sequence[int]) -> list[tuple[int, int, list[int]]]:
    """The byte ranges (start, stop, indices in them) that cover the frames at ``indices``
    (ascending) of a segment whose frames start at ``offsets`` and whose last ends at
    ``end``: neighbours join one range unless the gap or the range grows too large."""
    spans: list[tuple[int, int, list[int]]] = []
    n = len(offsets)
    for i in indices:
        lo, hi = offsets[i], offsets[i + 1] if i + 1 < n else end
        if spans and lo - spans[-1][1] <= SPAN_GAP and hi - spans[-1][0] <= SPAN_MOST:
            spans[-1][2].append(i)
            spans[-1] = (spans[-1][0], hi, spans[-1][2])
        else:
            spans.append((lo, hi, [i]))
    return spans


def framed_record(data: bytes, at: int, lsn: int, path: str, offset: int) -> rec.Record | None:
    """The record at ``lsn`` whose frame (at ``offset`` in ``path``) starts at ``data[at:]``,
    or None when ``data`` ends inside it; WalCorruption when its header or body is damaged."""
    if len(data) < at + rec.HEADER_SIZE:
        return None
    head = rec.decode_header(data, at)
    if head is None or head.lsn != lsn:
        raise WalCorruption(f"{path}: record header at offset {offset} (LSN {lsn}) is damaged; run "
                            "`sediment verify`", path=path, offset=offset, reason="bad header on read")
    if len(data) < at + head.frame_size:
        return None
    body = data[at + rec.HEADER_SIZE:at + head.frame_size]
    if not rec.body_ok(head, body):
        raise WalCorruption(f"{path}: record body at offset {offset} (LSN {lsn}) fails its checksum; run "
                            "`sediment verify`", path=path, offset=offset, reason="bad body on read")
    return rec.record_of(head, body)


def pread_all(fd: int, n: int, offset: int) -> bytes:
    """``n`` bytes at ``offset`` (fewer only at the end of the file), in as few reads as the
    kernel allows."""
    return _pread_all(fd, n, offset)


class _Window:
    """A sliding window over one file: ``view`` holds the file's bytes [lo, hi). Refilled
    from a frame's start, so a frame is always whole in it (grown for a frame bigger than
    the window); reading in cache-sized pieces costs about a third less CPU per GiB than
    one read of the whole file followed by the checks. It ends at the file's written extent
    (past it: zeros), and the kernel is told the file is read sequentially."""

    def __init__(self, f, buf: ReadBuffer | None, file_size: int) -> None:
        self.f, self.buf, self.size = f, buf or ReadBuffer(), _written_extent(f.fileno(), file_size)
        self.lo = self.hi = 0
        self.view = memoryview(b"")
        with suppress(OSError, AttributeError):
            os.posix_fadvise(f.fileno(), 0, self.size, os.POSIX_FADV_SEQUENTIAL)

    def fill(self, pos: int, need: int) -> None:
        """Read from ``pos`` at least ``need`` bytes (fewer only at the end of the extent)."""
        n = min(max(_WINDOW, need), self.size - pos)
        self.view = view = self.buf.view(n)
        self.f.seek(pos)
        got = 0
        while got < n:
            k = self.f.readinto(view[got:])
            if not k:
                break
            got += k
        self.lo, self.hi = pos, pos + got
        if got < n:  # the file shrank under us: what is left reads as its end
            self.size = self.hi


def prefetch(path: str) -> None:
    """Ask the kernel to start reading ``path`` into the page cache (the next segment, while
    this one is checked); a no-op where the hint is not supported."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    except (OSError, AttributeError):
        pass
    finally:
        os.close(fd)


_CHECK = rec.check_header
_CRC = rec.crc32c_raw
_H = rec.HEADER_SIZE
_PROGRESS = int(rec.RecordKind.PROGRESS)
_FRONTIERS = int(rec.RecordKind.FRONTIERS)
_COMMIT = int(rec.RecordKind.COMMIT)


def _judge_rest(scan: SegmentScan, fd: int, size: int, pos: int, expected: int, reason: str,
                recycled: bool = False) -> None:
    """A frame at ``pos`` failed: the rest of the file decides whether that is a clean end
    (only zeros follow), a torn tail or damage (and where the next valid frame lies). In a
    recycled file (FLAG_RECYCLED) stale frames of an earlier segment follow the end, so the
    end is the writer's end mark (a zero header) or a stale frame, and only a valid frame
    of this segment (LSN >= expected) beyond it means damage."""
    span = size - pos
    if not recycled:
        rest = _pread_all(fd, span, pos)
        if _all_zero(rest, 0, len(rest)):
            return
        found = next_valid_record(memoryview(rest), 0, expected)
    else:  # read on only until the first stale frame: nothing of this segment lies past it
        n = min(span, _WINDOW)
        while True:
            rest = _pread_all(fd, n, pos)
            found = next_valid_record(memoryview(rest), 0, expected, older_ends=True)
            if found is not None or n >= span:
                break
            n = min(span, 4 * n)
        if found is not None and found[1] < expected:
            found = None
        if found is None and _ends_here(rest, scan.first_lsn):
            return
    scan.bad_offset = pos
    scan.reason = reason
    scan.resume = None if found is None else (pos + found[0], found[1])
    scan.valid_after_bad = scan.resume is not None


def _ends_here(rest: bytes, first_lsn: int) -> bool:
    """Whether a recycled file's bytes at the failed frame are its end: the end mark, or a
    whole stale frame of an earlier segment (always below this segment's first LSN)."""
    if len(rest) < rec.HEADER_SIZE:
        return _all_zero(rest, 0, len(rest))
    if rest[:rec.HEADER_SIZE] == END_MARK:
        return True
    head = rec.decode_header(rest, 0)
    return head is not None and head.lsn < first_lsn


def scan_segment(path: str, first_lsn: int, *, start: int = HEADER_SIZE, keep_heads: bool = False,
                 buf: ReadBuffer | None = None) -> SegmentScan:
    """Read every record frame of a data file, checking each header, LSN and body CRC, in
    one pass over cache-sized windows (CRCs over slices, no copies). Stops at the first
    frame that fails (see :func:`_judge_rest`). ``start``: resume at this offset, whose frame carries
    ``first_lsn``; ``keep_heads``: keep every verified header and COMMIT and FRONTIERS body, so an open
    applies what it verified without a second read; ``buf``: a reusable read buffer.
    """
    scan = SegmentScan(path, first_lsn, end=start)
    offsets = scan.offsets
    sealed = scan.sealed
    heads = bytearray() if keep_heads else None
    bodies: dict[int, bytes] = {}
    pos = start
    expected = first_lsn
    reason = ""
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        scan.file_size = os.fstat(fd).st_size
        if scan.file_size <= HEADER_SIZE:
            return scan
        header = parse_header(os.pread(fd, HEADER_SIZE, 0))  # does not parse: the scan judges it
        recycled = header is not None and header.recycled
        w = _Window(f, buf, scan.file_size)
        data, lo, hi = w.view, 0, 0
        while pos < w.size:
            end = pos + _H
            if end > hi:
                w.fill(pos, _H)
                data, lo, hi = w.view, w.lo, w.hi
            if end > hi:
                reason = "bad record header (checksum, magic or length)"
                break
            at = pos - lo
            u = _CHECK(data, at)
            if u is None:
                reason = "bad record header (checksum, magic or length)"
                break
            _hcrc, _magic, _version, kind, body_len, body_crc, lsn, rel, _txn, _t_lo, t_hi, _count, _r = u
            if lsn != expected:
                reason = f"record LSN {lsn} where {expected} was expected"
                break
            nxt = end + body_len
            if nxt > hi and nxt <= w.size:
                w.fill(pos, _H + body_len)
                data, lo, hi = w.view, w.lo, w.hi
                at = 0
            if nxt > hi:
                reason = f"record of {_H + body_len} bytes runs past the end of the file"
                break
            body = data[at + _H:at + _H + body_len]
            if _CRC(body) != body_crc:
                reason = "record body fails its checksum"
                break
            offsets.append(pos)
            if kind == _PROGRESS:
                if t_hi > sealed.get(rel, -1):
                    sealed[rel] = t_hi
            elif kind == _FRONTIERS:
                for r, t in rec.decode_frontiers(bytes(body)).items():
                    sealed[r] = max(sealed.get(r, -1), t)
            if heads is not None:
                heads += data[at:at + _H]
                if (kind == _COMMIT or kind == _FRONTIERS) and body_len:
                    bodies[lsn] = bytes(body)
            pos = nxt
            expected += 1
        if reason:
            _judge_rest(scan, fd, w.size, pos, expected, reason, recycled)
    if heads is not None:
        scan.heads = bytes(heads)
        scan.bodies = bodies
    scan.end = pos if scan.bad_offset < 0 else scan.bad_offset
    return scan


_READ_CHUNK = 8 << 20


def read_frames(path: str, first_lsn: int, pos: int, first: int, n: int, end: int) -> Iterator[rec.Record]:
    """The records ``first`` to ``n - 1`` of the segment at ``path`` (its ``first_lsn``), the
    first at offset ``pos``, its frames ending by ``end``: read in chunks of 8 MiB, each header
    and body checked (WalCorruption, naming the file, offset and LSN, on damage)."""
    with open(path, "rb", buffering=0) as f:
        buf = b""
        buf_at = pos
        lsn = first_lsn + first
        while lsn < first_lsn + n:
            at = pos - buf_at
            if len(buf) - at < rec.HEADER_SIZE:
                buf, buf_at, at = _refill(f, pos, end)
            head = rec.decode_header(buf, at)
            if head is None or head.lsn != lsn:
                raise WalCorruption(f"{path}: damaged record header at offset {pos} (LSN {lsn})",
                                    path=path, offset=pos, reason="bad header on scan")
            if len(buf) - at < head.frame_size:
                buf, buf_at, at = _refill(f, pos, end, head.frame_size)
            body = buf[at + rec.HEADER_SIZE : at + head.frame_size]
            if not rec.body_ok(head, body):
                raise WalCorruption(f"{path}: record body at offset {pos} (LSN {lsn}) fails its checksum",
                                    path=path, offset=pos, reason="bad body on scan")
            yield rec.record_of(head, body)
            pos += head.frame_size
            lsn += 1


def _refill(f, pos: int, end: int, need: int = 0) -> tuple[bytes, int, int]:  # noqa: ANN001 - a raw file
    f.seek(pos)
    return f.read(min(max(_READ_CHUNK, need), max(end - pos, need))), pos, 0


def remove_segment_files(directory: str, segments: list) -> None:
    """Delete the ``.seg`` and ``.idx`` files of ``segments`` (objects with ``path`` and
    ``idx_path``), then make the deletions durable."""
    for seg in segments:
        for path in (seg.path, seg.idx_path):
            with suppress(FileNotFoundError):
                os.unlink(path)
    if segments:
        fsync_dir(directory)


def read_index(path: str) -> tuple[SegmentHeader | None, array]:
    """The index header and its checkpointed entries (entries past the checkpoint are not trusted)."""
    entries = array("Q")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None, entries
    header = parse_header(data)
    if header is None or header.magic != IDX_MAGIC:
        return None, entries
    n = min(header.checkpoint, (len(data) - HEADER_SIZE) // 8)
    entries.frombytes(data[HEADER_SIZE : HEADER_SIZE + 8 * n])
    return header, entries
