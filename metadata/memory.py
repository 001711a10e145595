"""Metadata in a dict: for tests and for engines that need no durability.

It follows exactly the same key rules and version semantics as the durable stores,
so it can stand in for them in unit tests.
"""

from __future__ import annotations

import threading

from sediment.errors import EngineClosed, MetadataConflict
from sediment.metadata.protocol import Versioned
from sediment.metadata.validation import (
    validate_expected,
    validate_key,
    validate_prefix,
    validate_value,
)


class MemoryMetadataStore:
    """A thread-safe in-memory :class:`~sediment.metadata.protocol.MetadataStore`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, Versioned] = {}
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosed("the in-memory metadata store was closed; open a new one")

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
            self._check_open()
            current = self._data.get(key)
            if expected_version is None:
                if current is not None:
                    raise MetadataConflict(
                        f"metadata key {key!r} already exists at version {current.version}; "
                        "re-read it and retry with that version"
                    )
                version = 0
            else:
                if current is None or current.version != expected_version:
                    found = "absent" if current is None else f"at version {current.version}"
                    raise MetadataConflict(
                        f"metadata key {key!r} is {found}, expected version {expected_version}; "
                        "re-read it and retry"
                    )
                version = expected_version + 1
            self._data[key] = Versioned(value, version)
            return version

    def delete(self, key: str, expected_version: int | None = None) -> None:
        validate_key(key)
        validate_expected(key, expected_version)
        with self._lock:
            self._check_open()
            current = self._data.get(key)
            if expected_version is not None and (current is None or current.version != expected_version):
                found = "absent" if current is None else f"at version {current.version}"
                raise MetadataConflict(
                    f"cannot delete metadata key {key!r}: it is {found}, expected version "
                    f"{expected_version}; re-read it and retry"
                )
            self._data.pop(key, None)

    def list(self, prefix: str) -> list[str]:
        validate_prefix(prefix)
        with self._lock:
            self._check_open()
            return sorted(k for k in self._data if k.startswith(prefix))

    def close(self) -> None:
        with self._lock:
            self._closed = True
