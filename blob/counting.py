"""A blob store that counts its requests for the engine's metrics.

The wrapper declares the capabilities of the store it wraps and nothing else: a local
store (:class:`sediment.blob.protocol.LocalBlobStore`) gets the counting local wrapper, any
other store the plain one, chosen once by :func:`counting` when the engine opens its store.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sediment.blob.protocol import BlobStore, LocalBlobStore
from sediment.metrics import EngineMetrics


class CountingBlobStore:
    """A blob store that counts its requests (``sediment_blob_requests_total{op}``) and failures
    (``sediment_errors_total{where="blob"}``) and passes each one to the store it wraps.
    :func:`counting` picks this class or, for a local store, :class:`CountingLocalBlobStore`,
    so the wrapper declares exactly the capabilities of what it wraps."""

    def __init__(self, inner: BlobStore, metrics: EngineMetrics) -> None:
        self.inner = inner
        self._metrics = metrics

    def _call(self, op: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self._metrics.blob_requests.labels(op=op).inc()
        try:
            return method(*args, **kwargs)
        except Exception as exc:
            self._metrics.error("blob", exc)
            raise

    def get(self, key: str) -> bytes:
        return self._call("get", self.inner.get, key)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return self._call("get_range", self.inner.get_range, key, start, length)

    def size(self, key: str) -> int:
        return self._call("size", self.inner.size, key)

    def put(self, key: str, data: bytes) -> None:
        self._call("put", self.inner.put, key, data)

    def put_if_absent(self, key: str, data: bytes) -> None:
        self._call("put_if_absent", self.inner.put_if_absent, key, data)

    def delete(self, key: str) -> None:
        self._call("delete", self.inner.delete, key)

    def list(self, prefix: str = "") -> list[str]:
        return self._call("list", self.inner.list, prefix)

    def close(self) -> None:
        self.inner.close()

    def __repr__(self) -> str:
        return repr(self.inner)


class CountingLocalBlobStore(CountingBlobStore):
    """:class:`CountingBlobStore` around a :class:`LocalBlobStore`, with its capabilities."""

    inner: LocalBlobStore

    def local_path(self, key: str) -> str:
        return self._call("get", self.inner.local_path, key)  # a whole-object read through the file

    def put_file(self, key: str, path: str, *, if_absent: bool = False) -> None:
        self._call("put_file", self.inner.put_file, key, path, if_absent=if_absent)

    def spill_path(self) -> str:
        return self.inner.spill_path()

    def sweep_temporaries(self, min_age_seconds: float = 0.0) -> list[str]:
        return self.inner.sweep_temporaries(min_age_seconds)


def counting(inner: BlobStore, metrics: EngineMetrics) -> CountingBlobStore:
    """``inner`` with its requests counted, local capabilities kept (checked here, once)."""
    cls = CountingLocalBlobStore if isinstance(inner, LocalBlobStore) else CountingBlobStore
    return cls(inner, metrics)
