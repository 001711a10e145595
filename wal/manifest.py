"""The log manifest: what a file log must find when it opens (RocksDB tracks its WAL files
in its MANIFEST for the same reason). Layout and write rules: docs/formats.md, "Log manifest".

Without it a deleted segment, a deleted active segment or an active segment cut at a
record boundary looks exactly like a shorter, healthy log. Structural changes rewrite the
file whole; the durable end changes at every index checkpoint and close, so it lives in
two alternating slots overwritten in place (wal/dual_slot.py): a slot torn by a crash
fails its CRC and the other, older slot is a valid lower bound.
"""

from __future__ import annotations

import os
import struct
import uuid
from dataclasses import dataclass, field

from sediment._fs import replace_durably
from sediment.errors import WalCorruption, WalMissing
from sediment.wal.dual_slot import newest, overwrite, seal, slot_offset, unseal
from sediment.wal.record import crc32c

MAGIC = b"SDWM"
VERSION = 1
HEADER = struct.Struct("<4sI16sIIqqQ")  # magic, version, key, partition, count, start, active, generation
HEADER_CRC = 56
SLOT = struct.Struct("<QqQ")  # sequence, durable end, reserved; then crc u32 + 4 zero bytes
SLOT_SIZE = 32
SLOTS_AT = 64
TABLE_AT = 128
ENTRY = struct.Struct("<qqQ")  # first LSN, last LSN, length in bytes


def manifest_name(partition: int) -> str:
    return f"sediment-wal-{partition}.manifest"


@dataclass(frozen=True)
class FinishedSegment:
    first_lsn: int
    last_lsn: int
    length: int


@dataclass
class Manifest:
    """The decoded manifest. ``durable_end`` is the greater valid slot (0: none written)."""

    cluster_key: uuid.UUID
    partition: int
    start_lsn: int = 0
    active_first: int = 0
    generation: int = 0
    finished: list[FinishedSegment] = field(default_factory=list)
    durable_end: int = 0
    end_sequence: int = 0


def _pack_slot(sequence: int, end: int) -> bytes:
    return seal(SLOT.pack(sequence, end, 0)) + bytes(4)


def _unpack_slot(buf: bytes) -> tuple[int, int] | None:
    body = unseal(buf, SLOT.size)
    return None if body is None else SLOT.unpack(body)[:2]


def pack(m: Manifest) -> bytes:
    """The whole file. Both end slots carry the current durable end."""
    table = b"".join(ENTRY.pack(f.first_lsn, f.last_lsn, f.length) for f in m.finished)
    head = HEADER.pack(MAGIC, VERSION, m.cluster_key.bytes, m.partition, len(m.finished), m.start_lsn,
                       m.active_first, m.generation)
    head += struct.pack("<I", crc32c(head + table)) + bytes(4)
    slot = _pack_slot(m.end_sequence, m.durable_end)
    return head + slot + slot + table


def unpack(data: bytes, path: str) -> Manifest:
    """Decode a manifest; WalCorruption (naming the file and offset) when it fails its checks."""
    def bad(reason: str, offset: int) -> WalCorruption:
        return WalCorruption(f"log manifest {path}: {reason} (offset {offset}); the log cannot be checked "
                             "against it: restore it from a copy", path=path, offset=offset, reason=reason)

    if len(data) < TABLE_AT:
        raise bad(f"shorter than its {TABLE_AT}-byte header", len(data))
    magic, version, key, partition, count, start, active, generation = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise bad(f"bad magic {magic!r}", 0)
    if version != VERSION:
        raise bad(f"format version {version}, this build reads {VERSION}", 4)
    end = TABLE_AT + count * ENTRY.size
    if len(data) < end:
        raise bad(f"table of {count} segments runs past the end of the file ({len(data)} bytes)", len(data))
    if data[HEADER_CRC + 4:SLOTS_AT] != bytes(SLOTS_AT - HEADER_CRC - 4):
        raise bad("reserved header bytes are not zero", HEADER_CRC + 4)
    (crc,) = struct.unpack_from("<I", data, HEADER_CRC)
    if crc32c(data[:HEADER_CRC] + data[TABLE_AT:end]) != crc:
        raise bad("header or segment table fails its checksum", HEADER_CRC)
    finished = [FinishedSegment(*ENTRY.unpack_from(data, TABLE_AT + i * ENTRY.size)) for i in range(count)]
    best, _ = newest((_unpack_slot(data[SLOTS_AT + i * SLOT_SIZE: SLOTS_AT + (i + 1) * SLOT_SIZE])
                      for i in range(2)), lambda s: s)
    seq, durable = best or (0, 0)
    return Manifest(uuid.UUID(bytes=key), partition, start, active, generation, finished, durable, seq)


def read(directory: str, partition: int) -> Manifest:
    path = os.path.join(directory, manifest_name(partition))
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise WalMissing(f"log manifest {path} is missing: the log cannot tell which segments it must hold; "
                         "restore it (or run `sediment verify --repair --force` to rebuild it from the segments)",
                         path=path, reason="manifest missing") from None
    return unpack(data, path)


def write(directory: str, m: Manifest) -> None:
    """Replace the manifest whole and durably (temporary file, fsync, rename, directory fsync)."""
    m.generation += 1
    replace_durably(os.path.join(directory, manifest_name(m.partition)), pack(m))


def write_end(directory: str, m: Manifest, end: int) -> None:
    """Record a new durable end in the older slot, in place: one pwrite and one fdatasync."""
    if end <= m.durable_end:
        return
    m.end_sequence += 1
    m.durable_end = end
    overwrite(os.path.join(directory, manifest_name(m.partition)), _pack_slot(m.end_sequence, end),
              slot_offset(SLOTS_AT, SLOT_SIZE, m.end_sequence))


def record_rollover(directory: str, m: Manifest, finished: FinishedSegment) -> None:
    """A segment was finished and the next one's file is durable: record both (the local log
    and a storage node's replica roll over the same way)."""
    m.finished.append(finished)
    m.active_first = finished.last_lsn + 1
    write(directory, m)


def record_start(directory: str, m: Manifest, start: int) -> None:
    """A trim's new start, recorded before any file goes: segments below it become garbage."""
    m.start_lsn = start
    m.finished = [f for f in m.finished if f.first_lsn >= start]
    write(directory, m)
