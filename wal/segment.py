"""Segment files: ``<first LSN, 19 digits>.seg`` data and ``.idx`` index (Waltz layout).

Both files start with the same 128-byte header (docs/formats.md, "Segment files"):
magic (``SDSG`` data, ``SDIX`` index), format version, creation time, cluster key,
partition id, first LSN, and for the index the number of entries known flushed
(its checkpoint), then a CRC32C of the header. A data file's body is a sequence of
record frames (wal/record.py); an index file's body is one little-endian u64 per
record: the byte offset of record ``first_lsn + i`` in the data file.

This module reads and checks segments; the log (wal/file_log.py) writes them.
"""

from __future__ import annotations

import os
import struct
import uuid
from array import array
from dataclasses import dataclass, field

from sediment._fs import fsync_dir
from sediment.wal import record as rec

SEG_MAGIC = b"SDSG"
IDX_MAGIC = b"SDIX"
VERSION = 1
HEADER = struct.Struct("<4sIq16sIIqQ")  # magic, version, created, key, partition, reserved, first, checkpoint
CRC_OFFSET = 124  # crc32c of bytes [0, 124): the whole header, reserved bytes included
HEADER_SIZE = 128
NAME_DIGITS = 19
_MAGIC_BYTES = struct.pack("<H", rec.MAGIC)


def segment_name(first_lsn: int) -> str:
    return f"{first_lsn:0{NAME_DIGITS}d}.seg"


def index_name(first_lsn: int) -> str:
    return f"{first_lsn:0{NAME_DIGITS}d}.idx"


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
    checkpoint: int = 0

    def pack(self) -> bytes:
        raw = HEADER.pack(self.magic, self.version, self.created_ns, self.cluster_key.bytes, self.partition, 0,
                          self.first_lsn, self.checkpoint).ljust(CRC_OFFSET, b"\0")
        return raw + struct.pack("<I", rec.crc32c(raw))


def parse_header(buf: bytes | memoryview) -> SegmentHeader | None:
    """The header, or None when short, of the wrong format, or failing its CRC."""
    if len(buf) < HEADER_SIZE:
        return None
    magic, version, created, key, part, _res, first, ckpt = HEADER.unpack_from(buf, 0)
    if magic not in (SEG_MAGIC, IDX_MAGIC) or version != VERSION:
        return None
    (crc,) = struct.unpack_from("<I", buf, CRC_OFFSET)
    if rec.crc32c(bytes(buf[:CRC_OFFSET])) != crc:
        return None
    return SegmentHeader(magic, version, created, uuid.UUID(bytes=key), part, first, ckpt)


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

    @property
    def next_lsn(self) -> int:
        return self.first_lsn + len(self.offsets)

    @property
    def clean(self) -> bool:
        return self.bad_offset < 0


def _all_zero(data: bytes, start: int, end: int) -> bool:
    return data.count(0, start, end) == end - start


def next_valid_record(view: memoryview, start: int, min_lsn: int) -> tuple[int, int] | None:
    """(offset, LSN) of the first complete, checksum-valid frame with lsn >= min_lsn after
    ``start``, found by its magic: where reading can resume after damage."""
    data = view.obj if isinstance(view.obj, bytes) else bytes(view)
    pos = start
    while True:
        pos = data.find(_MAGIC_BYTES, pos + 1)
        if pos < 0:
            return None
        at = pos - 4
        if at < start:
            continue
        head = rec.decode_header(view, at)
        if head is None or head.lsn < min_lsn:
            continue
        body = view[at + rec.HEADER_SIZE : at + head.frame_size]
        if rec.body_ok(head, body):
            return at, head.lsn


def _valid_record_after(view: memoryview, start: int, min_lsn: int) -> bool:
    return next_valid_record(view, start, min_lsn) is not None


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


def scan_segment(path: str, first_lsn: int, *, want_records: bool = False, start: int = HEADER_SIZE):
    """Read every record frame of a data file, checking each header, LSN and body CRC.

    Returns a SegmentScan, plus the list of records when ``want_records``. Stops at the
    first frame that fails; the rest of the file decides whether that is a clean end
    (only zeros follow), a torn tail (garbage with no valid frame after it) or damage.
    ``start``: read from this offset (whose frame must carry ``first_lsn``), as when
    resuming after damage; ``resume`` then says where the next valid frame lies.
    """
    scan = SegmentScan(path, first_lsn, end=start)
    records: list[rec.Record] = []
    size = os.path.getsize(path)
    scan.file_size = size
    if size <= HEADER_SIZE:
        return (scan, records) if want_records else scan
    with open(path, "rb") as f:
        data = f.read(_written_extent(f.fileno(), size))
    size = len(data)  # past the written extent the file reads as zeros
    view = memoryview(data)
    pos = start
    expected = first_lsn
    while pos < size:
        head = rec.decode_header(view, pos)
        reason = ""
        if head is None:
            reason = "bad record header (checksum, magic or length)"
        elif head.lsn != expected:
            reason = f"record LSN {head.lsn} where {expected} was expected"
        elif pos + head.frame_size > size:
            reason = f"record of {head.frame_size} bytes runs past the end of the file"
        else:
            body = view[pos + rec.HEADER_SIZE : pos + head.frame_size]
            if not rec.body_ok(head, body):
                reason = "record body fails its checksum"
        if reason:
            if _all_zero(data, pos, size):
                break
            scan.bad_offset = pos
            scan.reason = reason
            scan.resume = next_valid_record(view, pos, expected)
            scan.valid_after_bad = scan.resume is not None
            break
        scan.offsets.append(pos)
        if head.kind == rec.RecordKind.PROGRESS:
            scan.sealed[head.relation_id] = max(scan.sealed.get(head.relation_id, -1), head.t_hi)
        elif head.kind == rec.RecordKind.FRONTIERS:
            for rel, t in rec.decode_frontiers(bytes(body)).items():
                scan.sealed[rel] = max(scan.sealed.get(rel, -1), t)
        if want_records:
            records.append(rec.to_record(head, bytes(body)))
        pos += head.frame_size
        expected += 1
    scan.end = pos if scan.bad_offset < 0 else scan.bad_offset
    return (scan, records) if want_records else scan


def remove_segment_files(directory: str, segments: list) -> None:
    """Delete the ``.seg`` and ``.idx`` files of ``segments`` (objects with ``path`` and
    ``idx_path``), then make the deletions durable."""
    for seg in segments:
        for path in (seg.path, seg.idx_path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
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
