"""A blob as a seekable read-only file, so Parquet can read a stored object through a blob
store's ranged reads: the footer first, then one column chunk at a time, never the whole
object (S3's ``GetObject`` with a ``Range``, a file's ``pread``, a slice in memory)."""

from __future__ import annotations

import io
from typing import Any

from sediment.blob.protocol import BlobStore


class BlobReader(io.RawIOBase):
    """A seekable read-only file over ``store.get_range``: Parquet fetches the footer
    and then one column chunk at a time, never the whole object."""

    def __init__(self, store: BlobStore, key: str, size: int | None = None, tail: bytes = b"") -> None:
        super().__init__()
        self._store = store
        self._key = key
        self._size = store.size(key) if size is None else size
        self._pos = 0
        self._tail = tail  # the object's last bytes, already fetched (the footer)

    def _fetch(self, pos: int, n: int) -> bytes:
        start = self._size - len(self._tail)
        if self._tail and pos >= start:
            return self._tail[pos - start: pos - start + n]
        return self._store.get_range(self._key, pos, n)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buf: Any) -> int:
        n = min(len(buf), max(0, self._size - self._pos))
        if n == 0:
            return 0
        data = self._fetch(self._pos, n)
        buf[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = max(0, self._size - self._pos)
        size = min(size, max(0, self._size - self._pos))
        if size == 0:
            return b""
        data = self._fetch(self._pos, size)
        self._pos += len(data)
        return data
