"""Metadata in a dict: for tests and for engines that need no durability.

It follows exactly the same key rules and version semantics as the durable stores,
so it can stand in for them in unit tests. The journal store (metadata/journal.py)
keeps the same dict and the same rules, and journals each change before applying it.
"""

from __future__ import annotations

import threading

from sediment.errors import EngineClosed
from sediment.metadata.protocol import Versioned
from sediment.metadata.validation import (
    check_delete,
    next_version,
    validate_expected,
    validate_key,
    validate_prefix,
    validate_value,
    version_of,
)


class MemoryMetadataStore:
    """A thread-safe in-memory :class:`~sediment.metadata.protocol.MetadataStore`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, Versioned] = {}
        self._closed = False

    def _place(self) -> str:
        """Where the store is, for messages."""
        return "in memory"

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosed(f"the metadata store {self._place()} was closed; open a new one")

    def _check_writable(self) -> None:
        self._check_open()

    def _record(self, key: str, version: int | None, value: bytes = b"") -> None:
        """Make a change durable before it is applied (version None: a delete); nothing here."""

    def _applied(self) -> None:
        """Called after each change, lock held."""

    def get(self, key: str) -> Versioned | None:
        validate_key(key)
        with self._lock:
            self._check_open()
            return self._data.get(key)

    def compare_and_set(self, key: str, value: bytes, expected_version: int | None) -> int:
        validate_key(key)
        validate_expected(key, expected_version)
        value = validate_value(key, value)
        with self._lock:
            self._check_writable()
            version = next_version(key, version_of(self._data.get(key)), expected_version, self._place())
            self._record(key, version, value)
            self._data[key] = Versioned(value, version)
            self._applied()
            return version

    def delete(self, key: str, expected_version: int | None = None) -> None:
        validate_key(key)
        validate_expected(key, expected_version)
        with self._lock:
            self._check_writable()
            current = self._data.get(key)
            check_delete(key, version_of(current), expected_version, self._place())
            if current is None:
                return
            self._record(key, None)
            del self._data[key]
            self._applied()

    def list(self, prefix: str) -> list[str]:
        validate_prefix(prefix)
        with self._lock:
            self._check_open()
            return sorted(k for k in self._data if k.startswith(prefix))

    def close(self) -> None:
        with self._lock:
            self._closed = True
