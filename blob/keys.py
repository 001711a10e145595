"""Key rules shared by every blob store.

The same key must mean the same object on every backend, and on the file store a key
becomes a path, so a key must never be able to escape the store's root. All stores
therefore accept exactly the same keys: ``/``-separated segments, each non-empty,
not ``.`` or ``..``, without backslashes or NUL bytes, and not ending in the file
store's temporary-file suffix.
"""

from __future__ import annotations

from sediment.errors import BlobError

TEMP_SUFFIX = ".sediment-tmp"
"""Suffix of the file store's in-flight temporary files; keys may not end a segment with it."""


def validate_key(key: str) -> str:
    """Return ``key`` unchanged if it is a legal key, else raise ValueError naming it."""
    if not isinstance(key, str):
        raise ValueError(f"blob key must be a str, got {type(key).__name__} {key!r}")
    if not key:
        raise ValueError("blob key is empty; use a non-empty '/'-separated key such as 'batches/0001'")
    if key.startswith("/"):
        raise ValueError(f"blob key {key!r} is absolute; keys are relative, drop the leading '/'")
    if "\\" in key or "\x00" in key:
        raise ValueError(f"blob key {key!r} contains a backslash or NUL byte; use '/' as the only separator")
    for segment in key.split("/"):
        if segment == "":
            raise ValueError(f"blob key {key!r} has an empty segment ('//' or a trailing '/')")
        if segment in (".", ".."):
            raise ValueError(f"blob key {key!r} contains a '{segment}' segment; keys are never path escapes")
        if segment.endswith(TEMP_SUFFIX):
            raise ValueError(
                f"blob key {key!r} has a segment ending in {TEMP_SUFFIX!r}, which is reserved for "
                "temporary files; choose another name"
            )
    return key


def open_key(closed: bool, where: str, key: str) -> str:
    """``key`` checked as :func:`validate_key` does, or BlobError when the store is closed:
    what every store does before it touches an object (``where`` names the object)."""
    if closed:
        raise BlobError(f"{where}: the store is closed; open a new one")
    return validate_key(key)


def validate_range(key: str, start: int, length: int) -> None:
    """Reject negative offsets or lengths for ``get_range`` (a caller bug, not a storage error)."""
    if start < 0 or length < 0:
        raise ValueError(
            f"get_range of key {key!r}: start ({start}) and length ({length}) must be >= 0"
        )
