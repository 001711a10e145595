"""Objects of the log on S3 (``wal="s3://bucket/prefix"``; layout in docs/formats.md, "Log on S3").

Each group commit is one immutable object ``<root><partition>/<slot as 20 digits>``, created
once with ``If-None-Match: *``: an 80-byte header (``HEADER``, then its CRC32C), then the
group's record frames exactly as in a segment (wal/record.py). Slots are numbered 0, 1, 2,
... with no gaps between the log's start and its newest object, so a writer that takes slot
``n`` first owns it and any other writer's PUT at ``n`` fails: that is how a new writer
fences an old one. A CLAIM object starts a writer's epoch; a SEGMENT object's first record
is a segment boundary; ``cut_slot`` names a short object an older version's CLAIM cut
(none is cut now: a short object is damage); the random ``token``
tells a resent PUT of our own bytes from another writer's.

Since session 32 an open may claim *ahead* of the newest object (CLAIM with AHEAD: it does
not know the log's end when it writes it) and fills each slot below the claim the old writer
has not written with a PLUG, a header-only fence (wal/s3_claim.py). Both are written with
epoch ``slot + 1``, above every epoch below them; older builds refuse both flags (the header
does not decode), so they never misread such a log.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass

from sediment.wal import record as rec

MAGIC = b"SDSL"
VERSION = 1
CLAIM = 1
SEGMENT = 2
AHEAD = 4  # with CLAIM only: written ahead; first_lsn and start_slot are those the claimer saw
PLUG = 8  # alone: a header-only fence in a slot a claim ahead left below it
NONE = (1 << 64) - 1
SLOT_DIGITS = 20
HEADER = struct.Struct("<4sHHQQQIIQQ16sI")
CRC = struct.Struct("<I")
HEADER_SIZE = HEADER.size + CRC.size
assert HEADER_SIZE == 80
_FLAGS = frozenset({0, CLAIM, SEGMENT, CLAIM | SEGMENT, CLAIM | AHEAD, PLUG})


@dataclass(frozen=True, slots=True)
class ObjectHeader:
    """One object's decoded header."""

    flags: int
    epoch: int
    slot: int
    first_lsn: int
    records: int
    frames_len: int
    start_slot: int
    cut_slot: int
    token: bytes

    @property
    def claim(self) -> bool:
        return bool(self.flags & CLAIM)

    @property
    def segment(self) -> bool:
        return bool(self.flags & SEGMENT)

    @property
    def ahead(self) -> bool:
        return bool(self.flags & AHEAD)

    @property
    def plug(self) -> bool:
        return bool(self.flags & PLUG)

    @property
    def next_lsn(self) -> int:
        return self.first_lsn + self.records


def slot_name(partition: int, slot: int) -> str:
    """The object name (below the log's root) of ``slot`` of ``partition``."""
    return f"{partition}/{slot:0{SLOT_DIGITS}d}"


def parse_name(name: str, partition: int) -> int | None:
    """The slot an object name (below the root) holds, or None if it is no slot of ``partition``."""
    head, _, tail = name.partition("/")
    if head != str(partition) or len(tail) != SLOT_DIGITS or not tail.isdigit():
        return None
    return int(tail)


def encode(head: ObjectHeader, frames: bytes | bytearray) -> bytes:
    """The whole object: header (with its CRC) and the frames."""
    raw = HEADER.pack(MAGIC, VERSION, head.flags, head.epoch, head.slot, head.first_lsn, head.records,
                      len(frames), head.start_slot, head.cut_slot, head.token, 0)
    return raw + CRC.pack(rec.crc32c(raw)) + bytes(frames)


def new_header(flags: int, epoch: int, slot: int, first_lsn: int, records: int, start_slot: int,
               cut_slot: int = NONE) -> ObjectHeader:
    """A header with a fresh token (its ``frames_len`` is filled in by :func:`encode`)."""
    return ObjectHeader(flags, epoch, slot, first_lsn, records, 0, start_slot, cut_slot, uuid.uuid4().bytes)


def decode_header(data: bytes | bytearray | memoryview) -> ObjectHeader | None:
    """The header of an object, or None if it is short, fails its CRC, or has a wrong magic,
    version, unknown flags or flags no writer combines (AHEAD without CLAIM, PLUG with any
    other; either with frames). Never raises on garbage."""
    if len(data) < HEADER_SIZE:
        return None
    view = memoryview(data)
    (magic, version, flags, epoch, slot, first, records, frames_len, start, cut, token,
     _reserved) = HEADER.unpack_from(view)
    (crc,) = CRC.unpack_from(view, HEADER.size)
    if magic != MAGIC or version != VERSION or flags not in _FLAGS or rec.crc32c(view[:HEADER.size]) != crc:
        return None
    if flags & (AHEAD | PLUG) and (records or frames_len):
        return None
    return ObjectHeader(flags, epoch, slot, first, records, frames_len, start, cut, bytes(token))


def frames(data: bytes, head: ObjectHeader) -> tuple[list[int], str]:
    """The offsets (into ``data``) of the object's frames, each header and body checked and
    its LSN the next one, and why reading stopped early ("" when every frame is whole)."""
    offsets: list[int] = []
    pos, lsn, end = HEADER_SIZE, head.first_lsn, HEADER_SIZE + head.frames_len
    if len(data) < end:
        return offsets, f"object holds {len(data) - HEADER_SIZE} bytes of frames, its header says {head.frames_len}"
    if len(data) > end:
        return offsets, f"object has {len(data) - end} bytes past its frames"
    view = memoryview(data)
    while len(offsets) < head.records:
        u, why = rec.check_frame(view, pos, end)
        if u is None or u[6] != lsn:
            return offsets, f"record at offset {pos} (LSN {lsn}) {why or f'has LSN {u[6]}'}"
        offsets.append(pos)
        pos += rec.HEADER_SIZE + u[4]
        lsn += 1
    if pos != end:
        return offsets, f"{end - pos} bytes follow the last of its {head.records} records"
    return offsets, ""
