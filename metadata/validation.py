"""Key and value rules shared by every metadata store.

All stores accept exactly the same keys and value sizes, so code tested against the
in-memory store cannot write a key that ZooKeeper would later refuse. The character
rules are ZooKeeper's path rules; the size limit keeps a value (plus the znode header
and path) under ZooKeeper's default 1 MiB packet limit (``jute.maxbuffer``).
"""

from __future__ import annotations

from sediment.errors import InvalidMetadataRequest, MetadataConflict
from sediment.metadata.protocol import Versioned

MAX_KEY_BYTES = 1024
MAX_VALUE_BYTES = 1_000_000


def _bad_char(ch: str) -> bool:
    o = ord(ch)
    return o < 0x20 or 0x7F <= o <= 0x9F or 0xD800 <= o <= 0xF8FF or 0xFFF0 <= o <= 0xFFFF


def _check_chars(text: str, what: str) -> None:
    for i, ch in enumerate(text):
        if _bad_char(ch):
            raise InvalidMetadataRequest(
                f"metadata {what} {text!r} has a disallowed character {ch!r} at index {i}; "
                "use printable characters only"
            )


def _check_relative(text: str, what: str, segments: list[str]) -> None:
    """The rules a key and a prefix share: printable, relative, no empty, '.' or '..' segment."""
    _check_chars(text, what)
    if text.startswith("/"):
        raise InvalidMetadataRequest(f"metadata {what} {text!r} starts with '/'; keys and prefixes are relative "
                                     "paths like 'trace/17'")
    if any(segment in ("", ".", "..") for segment in segments):
        raise InvalidMetadataRequest(f"metadata {what} {text!r} has an empty, '.' or '..' segment; keys are "
                                     "'/'-separated names like 'catalog/relations/orders'")


def validate_key(key: str) -> str:
    """Check ``key`` is a relative ``/``-separated path and return it.

    Rejected: non-str, empty, a leading ``/``, empty segments (``a//b``, trailing
    ``/``), ``.`` or ``..`` segments, control characters, more than MAX_KEY_BYTES.
    """
    if not isinstance(key, str) or not key:
        raise InvalidMetadataRequest(f"metadata key must be a non-empty str, got {key!r}")
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise InvalidMetadataRequest(
            f"metadata key {key[:64]!r}... is longer than {MAX_KEY_BYTES} bytes; use a shorter key"
        )
    _check_relative(key, "key", key.split("/"))
    return key


def validate_prefix(prefix: str) -> str:
    """Check a ``list`` prefix: a key's leading characters (may be empty or end in ``/``)."""
    if not isinstance(prefix, str):
        raise InvalidMetadataRequest(f"metadata prefix must be a str, got {prefix!r}")
    if not prefix:
        return prefix
    _check_relative(prefix, "prefix", prefix.split("/")[:-1])
    return prefix


def validate_value(key: str, value: bytes) -> bytes:
    """Check ``value`` is bytes within MAX_VALUE_BYTES and return it as ``bytes``."""
    if not isinstance(value, bytes | bytearray | memoryview):
        raise InvalidMetadataRequest(f"metadata value for {key!r} must be bytes, got {type(value).__name__}")
    value = bytes(value)
    if len(value) > MAX_VALUE_BYTES:
        raise InvalidMetadataRequest(
            f"metadata value for {key!r} is {len(value)} bytes, over the {MAX_VALUE_BYTES}-byte "
            "limit; store large data as a blob and keep its key here"
        )
    return value


def validate_expected(key: str, expected_version: int | None) -> None:
    """Check an ``expected_version`` argument: None or a non-negative int."""
    if expected_version is None:
        return
    if isinstance(expected_version, bool) or not isinstance(expected_version, int) or expected_version < 0:
        raise InvalidMetadataRequest(
            f"expected_version for {key!r} must be None or an int >= 0, got {expected_version!r}"
        )


def next_version(key: str, found: int | None, expected_version: int | None, where: str) -> int:
    """The version a compare-and-set of ``key`` writes when the store holds it at ``found``
    (None: absent): 0 for a new key, expected + 1 for a matching one, else MetadataConflict.
    One rule for every store that checks versions itself (``where`` names the store)."""
    if expected_version is None:
        if found is not None:
            raise MetadataConflict(f"metadata key {key!r} already exists at version {found} ({where}); "
                                   "re-read it and retry with that version")
        return 0
    if found != expected_version:
        raise MetadataConflict(f"metadata key {key!r} is {_found(found)}, expected version {expected_version} "
                               f"({where}); re-read it and retry")
    return expected_version + 1


def check_delete(key: str, found: int | None, expected_version: int | None, where: str) -> None:
    """MetadataConflict unless a delete of ``key`` held at ``found`` (None: absent) may go ahead."""
    if expected_version is not None and found != expected_version:
        raise MetadataConflict(f"cannot delete metadata key {key!r}: it is {_found(found)}, expected version "
                               f"{expected_version} ({where}); re-read it and retry")


def version_of(current: Versioned | None) -> int | None:
    return None if current is None else current.version


def _found(version: int | None) -> str:
    return "absent" if version is None else f"at version {version}"
