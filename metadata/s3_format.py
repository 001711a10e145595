"""Object names and bodies of the S3 metadata store (layout in docs/formats.md).

A key is a sequence of immutable *slots*: ``<root><key>/<slot as 20 digits>``, each
created once with ``If-None-Match: *``. Slot numbers only grow (a delete is a tombstone
slot, a re-create the slot after it), while the key's protocol version restarts at 0 on
re-create, so every slot body records both. ``<root><key>/hint`` holds a recent slot
number, so a reader can list forward from it instead of from slot 0.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from sediment.errors import MetadataCorruption

SLOT_DIGITS = 20
HINT_NAME = "hint"
VALUE, TOMBSTONE = 0, 1
FORMAT_VERSION = 1
NO_TOKEN = bytes(16)

_MAGIC = b"SDMV"
_HINT_MAGIC = b"SDMH"
# magic, format version, kind, slot, version, writer token, predecessor's token
_HEADER = struct.Struct(">4sBBQQ16s16s")
_LENGTH = struct.Struct(">I")
_CRC = struct.Struct(">I")
_HINT = struct.Struct(">4sBQ")
TOMBSTONE_SIZE = _HEADER.size + _CRC.size
"""A tombstone body's exact size; a value body is at least 4 bytes longer (its length
field), so a listing tells a deleted key from a live one by size alone."""


@dataclass(frozen=True)
class Slot:
    """One decoded slot body. ``version`` is the key's protocol version (for a tombstone,
    the version it deleted); ``token`` is unique to the write that created the slot and
    ``prev_token`` names the slot it followed, so a writer can tell its own bytes and its
    successor's ancestry apart from anyone else's."""

    kind: int
    slot: int
    version: int
    token: bytes
    prev_token: bytes
    value: bytes = b""

    @property
    def live(self) -> bool:
        return self.kind == VALUE


def slot_name(key: str, slot: int) -> str:
    """The object name (below the store's root) of ``key``'s slot ``slot``."""
    return f"{key}/{slot:0{SLOT_DIGITS}d}"


def hint_name(key: str) -> str:
    return f"{key}/{HINT_NAME}"


def parse_name(name: str) -> tuple[str, int | None] | None:
    """(key, slot) for a slot object, (key, None) for a hint, None for anything else."""
    key, slash, last = name.rpartition("/")
    if not slash or not key:
        return None
    if len(last) == SLOT_DIGITS and last.isascii() and last.isdigit():
        return key, int(last)
    if last == HINT_NAME:
        return key, None
    return None


def encode_slot(slot: Slot) -> bytes:
    head = _HEADER.pack(_MAGIC, FORMAT_VERSION, slot.kind, slot.slot, slot.version, slot.token, slot.prev_token)
    if slot.kind == VALUE:
        head += _LENGTH.pack(len(slot.value)) + slot.value
    return head + _CRC.pack(zlib.crc32(head))


def decode_slot(data: bytes, where: str) -> Slot:
    """Decode and check one slot body; MetadataCorruption names ``where`` on any damage."""
    def bad(what: str) -> MetadataCorruption:
        return MetadataCorruption(f"S3 metadata object {where} {what}; restore it from a backup or delete "
                                  "the key's objects")

    if len(data) < TOMBSTONE_SIZE or data[:4] != _MAGIC:
        raise bad(f"is not a slot body ({len(data)} bytes, magic {data[:4]!r})")
    if _CRC.unpack_from(data, len(data) - _CRC.size)[0] != zlib.crc32(data[: -_CRC.size]):
        raise bad("fails its checksum")
    _, fmt, kind, number, version, token, prev = _HEADER.unpack_from(data)
    if fmt != FORMAT_VERSION or kind not in (VALUE, TOMBSTONE):
        raise bad(f"has format version {fmt} kind {kind}; this build reads version {FORMAT_VERSION}")
    value = b""
    if kind == VALUE:
        (length,) = _LENGTH.unpack_from(data, _HEADER.size)
        value = data[_HEADER.size + _LENGTH.size : -_CRC.size]
        if len(value) != length:
            raise bad(f"declares a {length}-byte value but holds {len(value)} bytes")
    elif len(data) != TOMBSTONE_SIZE:
        raise bad(f"is a tombstone of {len(data)} bytes, not {TOMBSTONE_SIZE}")
    return Slot(kind, number, version, token, prev, value)


def encode_hint(slot: int) -> bytes:
    head = _HINT.pack(_HINT_MAGIC, FORMAT_VERSION, slot)
    return head + _CRC.pack(zlib.crc32(head))


def decode_hint(data: bytes) -> int | None:
    """The slot a hint names, or None when it is damaged (a hint is only a starting point)."""
    if len(data) != _HINT.size + _CRC.size or _CRC.unpack_from(data, _HINT.size)[0] != zlib.crc32(data[:_HINT.size]):
        return None
    magic, fmt, slot = _HINT.unpack_from(data)
    return slot if magic == _HINT_MAGIC and fmt == FORMAT_VERSION else None
