"""An in-process blob store, for tests and ephemeral engines.

Named stores (``memory://name``) share one object map per name within the process,
so an engine can be closed and reopened against the same data, as with a real bucket.
"""

from __future__ import annotations

import threading

from sediment.errors import BlobAlreadyExists, BlobError, BlobNotFound

from .keys import open_key, validate_range


class _Objects:
    """The object map and the lock guarding it; shared between stores of one name."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.data: dict[str, bytes] = {}


_named: dict[str, _Objects] = {}
_named_lock = threading.Lock()


class MemoryBlobStore:
    """A dict of immutable ``bytes`` behind a lock; every operation is atomic.

    ``MemoryBlobStore()`` is private to its instance; ``MemoryBlobStore(name="x")``
    shares its objects with every other store of that name in this process.
    """

    def __init__(self, name: str | None = None) -> None:
        self.name = name
        self._closed = False
        with _named_lock:
            self._objects = _Objects() if name is None else _named.setdefault(name, _Objects())

    def __repr__(self) -> str:
        return f"MemoryBlobStore(name={self.name!r})"

    def _where(self, key: str) -> str:
        return f"key {key!r} in memory store {self.name or '(anonymous)'}"

    def _check(self, key: str) -> None:
        open_key(self._closed, self._where(key), key)

    def get(self, key: str) -> bytes:
        self._check(key)
        with self._objects.lock:
            try:
                return self._objects.data[key]
            except KeyError:
                raise BlobNotFound(f"no object at {self._where(key)}") from None

    def get_range(self, key: str, start: int, length: int) -> bytes:
        validate_range(key, start, length)
        return self.get(key)[start : start + length]

    def size(self, key: str) -> int:
        return len(self.get(key))

    def put(self, key: str, data: bytes) -> None:
        self._check(key)
        value = bytes(data)
        with self._objects.lock:
            self._objects.data[key] = value

    def put_if_absent(self, key: str, data: bytes) -> None:
        self._check(key)
        value = bytes(data)
        with self._objects.lock:
            if key in self._objects.data:
                raise BlobAlreadyExists(
                    f"an object already exists at {self._where(key)}; put_if_absent never replaces one"
                )
            self._objects.data[key] = value

    def delete(self, key: str) -> None:
        self._check(key)
        with self._objects.lock:
            self._objects.data.pop(key, None)

    def list(self, prefix: str = "") -> list[str]:
        if self._closed:
            raise BlobError(f"list of prefix {prefix!r} in memory store: the store is closed; open a new one")
        with self._objects.lock:
            return sorted(k for k in self._objects.data if k.startswith(prefix))

    def close(self) -> None:
        self._closed = True

    @staticmethod
    def forget(name: str) -> None:
        """Drop the shared objects of a named store (tests use it to free memory)."""
        with _named_lock:
            _named.pop(name, None)
