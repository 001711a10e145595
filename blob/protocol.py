"""The one interface every blob store implements.

Blob stores hold immutable objects under string keys (``/``-separated, no leading
slash). Only whole-object writes exist, as the Materialize design asks: no append,
no rename. Every implementation raises :class:`sediment.errors.BlobNotFound` and
:class:`sediment.errors.BlobAlreadyExists` with the key in the message, and
:class:`sediment.errors.BlobError` for anything else once its retries are spent.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class BlobStore(Protocol):
    """Key-value object storage: memory, local files, or S3."""

    def get(self, key: str) -> bytes:
        """The whole object. Raises BlobNotFound."""
        ...

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes from ``start`` (fewer at the end of the object). Raises BlobNotFound."""
        ...

    def size(self, key: str) -> int:
        """The object's length in bytes. Raises BlobNotFound."""
        ...

    def put(self, key: str, data: bytes) -> None:
        """Create or replace the object atomically: readers see the old or the new bytes, never a mix."""
        ...

    def put_if_absent(self, key: str, data: bytes) -> None:
        """Create the object only if no object has that key. Raises BlobAlreadyExists."""
        ...

    def delete(self, key: str) -> None:
        """Remove the object. Deleting a missing key is not an error (deletes are retried)."""
        ...

    def list(self, prefix: str = "") -> list[str]:
        """Every key starting with ``prefix``, sorted as text."""
        ...

    def close(self) -> None:
        """Release connections; the store is unusable afterwards."""
        ...


@runtime_checkable
class LocalBlobStore(BlobStore, Protocol):
    """A blob store whose objects are files on this machine (FileBlobStore). Its extra
    capabilities let batches skip a copy through Python: read through the file itself,
    written by linking a spilled file into place. Callers check for it once, when they are
    given the store (``isinstance(store, LocalBlobStore)``), and fall back to the plain
    methods otherwise."""

    def local_path(self, key: str) -> str:
        """The file holding ``key`` (it may vanish once the object is deleted)."""
        ...

    def spill_path(self) -> str:
        """A fresh temporary file name on the store's file system, for :meth:`put_file`."""
        ...

    def put_file(self, key: str, path: str, *, if_absent: bool = False) -> None:
        """Store the local file ``path`` under ``key`` without reading it into memory."""
        ...

    def sweep_temporaries(self, min_age_seconds: float = 0.0) -> list[str]:
        """Delete temporaries that interrupted writes left; their paths."""
        ...
