"""Checksums of a batch object: the whole object's CRC32C and its footer's.

Parquet's own page checksums cover data pages only; the trace state records these two
so that a reader can verify a batch (footer included) before decoding it
(docs/formats.md, "Trace state").
"""

from __future__ import annotations

from typing import Any

import crc32c

from sediment.blob.protocol import BlobStore
from sediment.errors import BatchCorruption

PARQUET_MAGIC = b"PAR1"
TAIL_PREFETCH = 64 * 1024


def footer_checksum(tail: bytes | memoryview, where: str = "batch") -> tuple[int, int]:
    """(footer length, CRC32C of the footer plus its 8-byte trailer) from the last bytes of
    a batch object. Parquet's own checksums cover data pages only, so the trace state
    records this to cover the footer (schema, row-group offsets, sediment.* keys).
    Raises BatchCorruption if ``tail`` does not end in a Parquet trailer; returns length
    -1 if ``tail`` is too short to hold the whole footer (fetch more)."""
    if len(tail) < 12 or tail[-4:] != PARQUET_MAGIC:
        raise BatchCorruption(f"{where}: the object does not end in the Parquet magic {PARQUET_MAGIC!r}; "
                              "it is truncated or damaged")
    flen = int.from_bytes(tail[-8:-4], "little")
    if flen + 8 > len(tail):
        return -1, 0
    return flen, crc32c.crc32c(tail[-(flen + 8):])


def checksums(data: bytes | memoryview, where: str = "batch") -> tuple[int, int]:
    """(CRC32C of the whole object, CRC32C of its footer) of encoded batch bytes."""
    view = memoryview(data)
    flen, fcrc = footer_checksum(view, where)  # a view: no copy of the object, whatever its footer's size
    if flen < 0:
        raise BatchCorruption(f"{where}: the footer length runs past the start of the object; it is damaged")
    return crc32c.crc32c(view), fcrc


def file_checksums(source: str | Any, where: str | None = None) -> tuple[int, int]:
    """:func:`checksums` of a batch file on local disk (a path, or an open binary file such
    as ``pa.OSFile``, read from its start), streamed through one reused 1 MiB buffer."""
    if isinstance(source, str):
        with open(source, "rb", buffering=0) as f:
            return _stream_checksums(f, where or source)
    return _stream_checksums(source, where or "batch")


def _stream_checksums(f: Any, where: str) -> tuple[int, int]:
    crc = 0
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    f.seek(0)
    while n := f.readinto(buf):
        crc = crc32c.crc32c(view[:n], crc)
    size = f.tell()
    flen = -1
    n = TAIL_PREFETCH
    while flen < 0:
        f.seek(max(0, size - n))
        flen, fcrc = footer_checksum(f.read(n), where)
        if flen < 0 and n >= size:
            raise BatchCorruption(f"{where}: footer length runs past the start of the file")
        n = max(n * 2, flen + 8)
    return crc, fcrc


def object_checksum(store: BlobStore, key: str, size: int, *, chunk: int = 8 << 20) -> int:
    """CRC32C of a whole stored object, read in bounded ranges (for ``sediment verify``)."""
    crc, pos = 0, 0
    while pos < size:
        data = store.get_range(key, pos, min(chunk, size - pos))
        if not data:
            raise BatchCorruption(f"batch {key!r}: object ends at {pos} bytes, expected {size}")
        crc = crc32c.crc32c(data, crc)
        pos += len(data)
    return crc
