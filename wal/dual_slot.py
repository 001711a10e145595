"""Two checksummed copies of a small record; the valid copy with the higher sequence wins.

The control file's partition states, the log manifest's durable end and the device ring's
header each live in two alternating slots. A new copy overwrites the older slot in place,
so a write torn by a crash damages only that copy: it fails its CRC32C and the other, older
copy still describes a state that was once durable. The layouts around the slots differ
(docs/formats.md); the sealing, the choice and the slot arithmetic are here, once.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterable
from typing import TypeVar

from sediment._fs import pwrite_all
from sediment.wal.record import crc32c

CRC = struct.Struct("<I")
T = TypeVar("T")


def seal(body: bytes) -> bytes:
    """``body`` followed by its CRC32C (u32, little-endian): one copy as it is stored."""
    return body + CRC.pack(crc32c(body))


def unseal(copy: bytes | memoryview, body_size: int) -> bytes | None:
    """The first ``body_size`` bytes of a stored copy when the CRC after them matches, else
    None (torn, damaged or never written)."""
    if len(copy) < body_size + CRC.size:
        return None
    body = bytes(copy[:body_size])
    return body if CRC.unpack_from(copy, body_size)[0] == crc32c(body) else None


def newest(copies: Iterable[T | None], sequence: Callable[[T], object]) -> tuple[T | None, int]:
    """The valid copy (not None) with the highest ``sequence``, and how many copies were valid."""
    valid = [c for c in copies if c is not None]
    return (max(valid, key=sequence) if valid else None), len(valid)  # type: ignore[type-var]


def slot_offset(first: int, slot_size: int, sequence: int) -> int:
    """Where copy number ``sequence`` is written: slots alternate, so it replaces the older copy."""
    return first + (sequence % 2) * slot_size


def overwrite(path: str, copy: bytes, offset: int) -> None:
    """Write one copy in place and make it durable: one pwrite, one fdatasync."""
    fd = os.open(path, os.O_WRONLY)
    try:
        pwrite_all(fd, copy, offset)
        os.fdatasync(fd)
    finally:
        os.close(fd)
