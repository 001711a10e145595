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
