"""The WAL record: what a record says, and its byte frame.

One frame format serves every WAL backend (file segments, the device ring, and
replica storage): a 64-byte header with its own CRC32C, then the body with a
second CRC32C. The header's CRC lets a reader trust ``body_len`` before it reads
the body, which is how a torn tail is told from damage. The field table is in
docs/formats.md, "WAL record frame" (``HEADER`` below packs it, little-endian).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from operator import itemgetter

import crc32c as _crc32c

from sediment.errors import InvalidArgument

MAGIC = 0x5344
VERSION = 1
HEADER = struct.Struct("<IHBBIIQQQqqII")
HEADER_SIZE = HEADER.size
assert HEADER_SIZE == 64
MAX_BODY = 1 << 30
FRONTIER_ENTRY = struct.Struct("<Qq")
_unpack_from = HEADER.unpack_from
HEADER_TAIL = struct.Struct("<" + HEADER.format[2:])  # the header after its CRC field
HEADER_CRC = struct.Struct("<I")  # the header's first field: the CRC32C of HEADER_TAIL's bytes


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC32C (Castagnoli), the checksum of every byte sediment writes."""
    return _crc32c.crc32c(data, value)


crc32c_raw = _crc32c.crc32c  # the same function without the wrapper's call, for tight loops


class RecordKind(IntEnum):
    UPDATES = 1  # Arrow IPC record batch(es) of (columns..., time, diff)
    PROGRESS = 2  # "close t": no more updates at times <= t for relation_id
    BEGIN = 3  # a transaction starts; its records carry txn_id
    COMMIT = 4  # the transaction's records take effect, all at once
    ABORT = 5  # the transaction's records are discarded
    FRONTIERS = 6  # every relation's sealed frontier, at a segment boundary
    PADDING = 7  # device ring: fills the gap before wrapping; carries nothing


@dataclass(slots=True)
class Record:
    """One WAL record. ``lsn`` is assigned by the log when the record is appended."""

    kind: RecordKind
    relation_id: int = 0
    txn_id: int = 0
    t_lo: int = 0
    t_hi: int = 0
    count: int = 0
    body: bytes = b""  # any buffer (bytes, pyarrow.Buffer, memoryview)
    lsn: int = -1
    schema_version: int = 0  # UPDATES: the schema version the body's columns are in
    appends: int = field(default=1, compare=False)  # in memory only: appends joined in it (wal/group_records.py)

    @property
    def frame_size(self) -> int:
        return HEADER_SIZE + len(self.body)

    @property
    def body_len(self) -> int:
        return len(self.body)


class HeadRecord(tuple):
    """A record as an open verified it: its decoded 64-byte header (the fields of ``HEADER``,
    in order), plus the body only where applying the record needs it (a COMMIT's list of
    transactions, a FRONTIERS record's frontiers); also what :func:`decode_header` returns
    (no body). What the engine replays at open;
    reading an UPDATES record's rows goes back to the log, which checks its checksum
    again. A tuple made straight from ``HEADER.iter_unpack``: an open builds one per
    record, so no per-field Python work."""

    __slots__ = ()

    kind = property(lambda self: _KIND_OF[self[3]])
    body_len = property(itemgetter(4))
    body_crc = property(itemgetter(5))
    lsn = property(itemgetter(6))
    relation_id = property(itemgetter(7))
    txn_id = property(itemgetter(8))
    t_lo = property(itemgetter(9))
    t_hi = property(itemgetter(10))
    count = property(itemgetter(11))
    schema_version = property(itemgetter(12))
    body = property(lambda self: self[13] if len(self) > 13 else b"")
    frame_size = property(lambda self: HEADER_SIZE + self[4])


APPENDABLE = frozenset(k for k in RecordKind if k != RecordKind.PADDING)  # the kinds an append may carry
_FIELDS = struct.Struct("<QQqqII")  # relation, txn, t_lo, t_hi, count, schema version: the header's types


def check_appendable(records: Sequence[Record], where: str) -> None:
    """Refuse, before anything is queued, an append the frame cannot carry: a field out of
    its header range or not an integer, an unknown kind, PADDING (the ring's own), an
    oversized body, or no record at all. Found later, in a backend's writer, the same fault
    would fail the whole log for every caller instead of this one call. The header's own
    struct checks the integer fields, in one call per record: this runs for every append."""
    if not records:
        raise InvalidArgument(f"{where}: an append needs at least one record; nothing was appended")
    pack = _FIELDS.pack
    for i, r in enumerate(records):
        try:
            if r.kind in APPENDABLE and len(r.body) <= MAX_BODY:
                pack(r.relation_id, r.txn_id, r.t_lo, r.t_hi, r.count, r.schema_version)
                continue
        except struct.error:
            pass
        raise InvalidArgument(
            f"{where}: record {i} of the append cannot be written (kind {r.kind!r}, relation {r.relation_id!r}, "
            f"txn {r.txn_id!r}, t_lo {r.t_lo!r}, t_hi {r.t_hi!r}, count {r.count!r}, {len(r.body)}-byte body): "
            "kinds 1-6, u64 relation and transaction ids, i64 times, a u32 count and schema version and bodies of at "
            f"most {MAX_BODY} bytes; nothing was appended")


def encode_header(record: Record, lsn: int, body_crc: int | None = None) -> bytes:
    """The 64-byte header of the record's frame at ``lsn``; the body follows it unchanged.
    Pass ``body_crc`` when it was computed earlier (outside the writer's critical section).
    Packs the 60 bytes after the CRC once and checksums them in place: this runs for every
    record written."""
    body = record.body
    size = len(body)
    if size > MAX_BODY:
        raise ValueError(f"record body of {size} bytes exceeds the {MAX_BODY}-byte limit")
    if body_crc is None:
        body_crc = crc32c_raw(body)
    tail = HEADER_TAIL.pack(MAGIC, VERSION, record.kind, size, body_crc, lsn, record.relation_id, record.txn_id,
                             record.t_lo, record.t_hi, record.count, record.schema_version)
    return HEADER_CRC.pack(crc32c_raw(tail)) + tail


def encode(record: Record, lsn: int, body_crc: int | None = None) -> bytes:
    """The record's whole frame (header and body) at ``lsn``."""
    return encode_header(record, lsn, body_crc) + bytes(record.body)


def check_header(buf: bytes | bytearray | memoryview, offset: int = 0) -> tuple | None:
    """The header fields at ``offset`` as ``HEADER`` unpacks them, or None when the header is
    short, has a wrong magic, version or kind, a body over MAX_BODY, or fails its CRC. The one
    frame check every reader runs (segments, the ring, replica payloads); a plain tuple,
    because recovery runs it once per record (:func:`decode_header` names the fields)."""
    if len(buf) - offset < HEADER_SIZE:
        return None
    u = _unpack_from(buf, offset)
    if (u[1] != MAGIC or u[2] != VERSION or u[3] not in _KINDS or u[4] > MAX_BODY
            or crc32c_raw(buf[offset + 4:offset + HEADER_SIZE]) != u[0]):
        return None
    return u


def check_frame(buf: memoryview, pos: int = 0, end: int | None = None) -> tuple[tuple | None, str]:
    """The header fields (see :func:`check_header`) of the whole frame at ``pos`` when it ends
    by ``end`` (default: the end of ``buf``) and its body matches its CRC, else (None, why not):
    how a reader of frames held in memory (replica payloads, S3 objects) checks each one."""
    u = check_header(buf, pos)
    if u is None or pos + HEADER_SIZE + u[4] > (len(buf) if end is None else end):
        return None, "is damaged or cut short"
    if crc32c_raw(buf[pos + HEADER_SIZE:pos + HEADER_SIZE + u[4]]) != u[5]:
        return None, f"(LSN {u[6]}) fails its body checksum"
    return u, ""


def record_of(u: tuple, body: bytes | memoryview) -> Record:
    """The record whose header :func:`check_header` unpacked as ``u``, with ``body``."""
    return Record(RecordKind(u[3]), u[7], u[8], u[9], u[10], u[11], bytes(body), u[6], u[12])


def decode_header(buf: bytes | bytearray | memoryview, offset: int = 0) -> HeadRecord | None:
    """The header at ``offset`` (see :func:`check_header`), or None. Never raises on garbage."""
    u = check_header(buf, offset)
    return None if u is None else tuple.__new__(HeadRecord, u)


def body_ok(header: HeadRecord, body: bytes | bytearray | memoryview) -> bool:
    return len(body) == header.body_len and crc32c(body) == header.body_crc


def encode_frontiers(frontiers: dict[int, int]) -> bytes:
    """FRONTIERS body: (relation_id u64, sealed i64) pairs sorted by relation id."""
    return b"".join(FRONTIER_ENTRY.pack(r, t) for r, t in sorted(frontiers.items()))


def decode_frontiers(body: bytes) -> dict[int, int]:
    return {r: t for r, t in FRONTIER_ENTRY.iter_unpack(body)}


TXN_ID = struct.Struct("<Q")


def encode_txn_ids(ids: list[int]) -> bytes:
    """COMMIT body: the ids (u64 each) of further transactions this one record commits."""
    return b"".join(TXN_ID.pack(i) for i in ids)


def committed_txn_ids(record: Record) -> list[int]:
    """Every transaction a COMMIT record commits: its own id, then those in its body."""
    body = bytes(record.body)
    if len(body) % TXN_ID.size:
        raise ValueError(f"COMMIT record at LSN {record.lsn} has a {len(body)}-byte body, not a list of u64 "
                         "transaction ids")
    return [record.txn_id, *(i for (i,) in TXN_ID.iter_unpack(body))]


_KINDS = frozenset(int(k) for k in RecordKind)
_KIND_OF = {int(k): k for k in RecordKind}


def head_records(heads: bytes, bodies: dict[int, bytes]) -> Iterator[HeadRecord]:
    """The records whose verified 64-byte headers lie back to back in ``heads``; ``bodies``:
    the kept bodies by LSN (empty for the others)."""
    new = tuple.__new__
    if not bodies:
        return (new(HeadRecord, t) for t in HEADER.iter_unpack(heads))
    return (new(HeadRecord, t + (bodies[t[6]],) if t[6] in bodies else t) for t in HEADER.iter_unpack(heads))
