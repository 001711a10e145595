"""The one interface every metadata store implements.

Metadata (the catalog of relations, each trace's state, replicated partitions'
state) lives in small values under ``/``-separated keys, each with a version.
Every change is a compare-and-set on that version, which is what lets a trace
commit atomically and lets a superseded coordinator be fenced. Implementations:
in memory (tests), a local journal plus snapshot (the embedded default), and
ZooKeeper (znode versions).

Versions: a key's first version is 0, and each successful write adds one. This
matches ZooKeeper's znode ``version``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Versioned:
    """A stored value and the version it was read at."""

    value: bytes
    version: int


@runtime_checkable
class MetadataStore(Protocol):
    """Versioned key-value metadata with compare-and-set."""

    def get(self, key: str) -> Versioned | None:
        """The value and version at ``key``, or None when absent."""
        ...

    def compare_and_set(self, key: str, value: bytes, expected_version: int | None) -> int:
        """Write ``value`` if the key is at ``expected_version`` (None: only if absent).

        Returns the new version. Raises MetadataConflict when the key's version (or its
        existence) differs. Durable on return.
        """
        ...

    def delete(self, key: str, expected_version: int | None = None) -> None:
        """Remove the key; with ``expected_version``, only at that version (MetadataConflict
        otherwise). Deleting a missing key without an expected version is not an error."""
        ...

    def list(self, prefix: str) -> list[str]:
        """Every key that starts with ``prefix``, sorted."""
        ...

    def close(self) -> None:
        """Release files or sessions."""
        ...
