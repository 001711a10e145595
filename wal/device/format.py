"""Bytes of the device ring's header area (pure: no I/O).

Two slots of one block each hold alternate copies of the ring header; the valid copy with
the higher sequence number describes the ring. Besides the geometry and the trim point, a
copy carries the *durable end* as of its writing (at creation, every trim, every header
checkpoint and a clean close): every record below it was acknowledged, so recovery that
finds the log ending earlier knows acknowledged records are gone instead of taking the
shortfall for a torn tail. See docs/formats.md ("Device WAL format").
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c as _crc32c

from sediment.wal.dual_slot import newest, seal, unseal

RING_MAGIC = b"SDMTRING"
FORMAT_VERSION = 2
SLOT_V1 = struct.Struct("<8sIIQQQQIIQ")
SLOT = struct.Struct("<8sIIQQQQIIQQ")
DEFAULT_BLOCK_SIZE = 4096  # the slot size of a ring opened without block_size (open, verify)
SHUTDOWN_RUNNING = 0
SHUTDOWN_CLEAN = 1
MIN_DATA_BYTES = 64 * 1024
READ_CHUNK = 8 * 1024 * 1024
ZERO_CHUNK = 4 * 1024 * 1024


HOLD_GIL_CRC_BYTES = 256 * 1024


def body_crc(body: bytes | bytearray | memoryview) -> int:
    """CRC32C of a record body, keeping the interpreter lock for bodies up to 256 KiB. The
    crc32c package lets it go from 32 KiB, and with several appenders taking it back
    costs a context switch and more time than the checksum (3 us for 64 KiB) saves."""
    return _crc32c.crc32c(body, 0, 0 if len(body) <= HOLD_GIL_CRC_BYTES else 1)


def align_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def align_down(x: int, a: int) -> int:
    return x // a * a


@dataclass(frozen=True, slots=True)
class RingHeader:
    """One copy of the ring header (docs/formats.md, "Header slots").

    ``durable_end``: every record below this logical offset was durable when the copy was
    written; recovery that stops earlier has lost acknowledged records."""

    block_size: int
    capacity: int
    trim: int
    seq: int
    window: int
    shutdown: int
    clean_end: int
    durable_end: int = 0

    def pack(self) -> bytes:
        body = SLOT.pack(
            RING_MAGIC, FORMAT_VERSION, self.block_size, self.capacity, self.trim, self.seq,
            self.window, self.shutdown, 0, self.clean_end, self.durable_end,
        )
        return seal(body)

    @classmethod
    def unpack(cls, buf: bytes | memoryview) -> RingHeader | None:
        """The header in ``buf``, or None when the magic, version or CRC is wrong. Version 1
        copies (no durable end field) are read with the clean end, if any, as durable end."""
        if len(buf) < SLOT_V1.size + 4 or bytes(buf[:8]) != RING_MAGIC:
            return None
        version = struct.unpack_from("<I", buf, 8)[0]
        layout = {1: SLOT_V1, FORMAT_VERSION: SLOT}.get(version)
        if layout is None:
            return None
        body = unseal(buf, layout.size)
        if body is None:
            return None
        fields = layout.unpack(body)
        (_m, _v, bs, cap, trim, seq, window, shutdown, _r, clean_end) = fields[:10]
        durable = fields[10] if version == FORMAT_VERSION else (clean_end if shutdown == SHUTDOWN_CLEAN else 0)
        return cls(bs, cap, trim, seq, window, shutdown, clean_end, durable)


def choose_header(raw: bytes, block_size: int) -> tuple[RingHeader | None, int]:
    """The copy that describes the ring (the valid one with the higher ``seq``) from the
    header area ``raw`` (two slots of ``block_size`` bytes), and how many copies are valid."""
    copies = [RingHeader.unpack(raw[i * block_size : (i + 1) * block_size]) for i in range(2)] if raw else []
    return newest(copies, lambda h: h.seq)
