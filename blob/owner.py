"""The owner marker of a blob prefix: one engine per prefix.

An engine's start-up sweep deletes batches it wrote but never committed. Two engines on
one prefix (two data directories given the same ``s3://bucket/prefix``) would each take
the other's live batches for such garbage. So the first engine to open a prefix writes
this marker with ``put_if_absent``, naming its identity (a uuid kept in the engine's
storage record in the metadata store), and every later open compares identities before
writing or deleting anything there. Coordinators of one replicated cluster share the
metadata store and so the identity: a failover is not a takeover. Taking a prefix from
another identity is an explicit act that rewrites the marker and records whose it was.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from sediment.blob.protocol import BlobStore
from sediment.errors import BlobAlreadyExists, BlobNotFound, BlobPrefixOwned

OWNER_KEY = "sediment-owner"
OWNER_FORMAT = "sediment-blob-owner"
OWNER_FORMAT_VERSION = 1
TAG_CHARS = 16


@dataclass(frozen=True)
class OwnerMarker:
    """Who owns a blob prefix. ``taken_from`` is the identity a takeover replaced."""

    engine_id: str
    created: float
    data_dir: str = ""
    taken_from: str | None = None

    @property
    def tag(self) -> str:
        """The prefix of every batch nonce this engine writes, so its sweep can tell its own
        objects from anyone else's."""
        return owner_tag(self.engine_id)

    def encode(self) -> bytes:
        doc = {"format": OWNER_FORMAT, "format_version": OWNER_FORMAT_VERSION, "engine_id": self.engine_id,
               "created": self.created, "data_dir": self.data_dir, "taken_from": self.taken_from}
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes, where: str) -> OwnerMarker:
        try:
            doc = json.loads(data)
            if doc.get("format") != OWNER_FORMAT or doc.get("format_version") != OWNER_FORMAT_VERSION:
                raise ValueError(f"format {doc.get('format')!r} version {doc.get('format_version')!r}")
            marker = cls(str(doc["engine_id"]), float(doc["created"]), str(doc.get("data_dir") or ""),
                         doc.get("taken_from"))
            owner_tag(marker.engine_id)
            return marker
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
            raise BlobPrefixOwned(
                f"{where}: the owner marker {OWNER_KEY!r} is unreadable ({exc}); the prefix may belong to "
                "another engine. Check who uses it; if it is yours, open with take_over_blob_prefix=True "
                "(--take-over-blob-prefix) to rewrite the marker"
            ) from None


def owner_tag(engine_id: str) -> str:
    """The first 16 characters of an engine identity (lowercase hex uuid), checked."""
    tag = engine_id[:TAG_CHARS]
    if len(tag) != TAG_CHARS or not all(c in "0123456789abcdef" for c in tag):
        raise ValueError(f"engine identity {engine_id!r} is not a lowercase hex uuid")
    return tag


def read_owner(blobs: BlobStore, where: str) -> OwnerMarker | None:
    """The prefix's marker, or None when nobody has claimed it."""
    try:
        return OwnerMarker.decode(blobs.get(OWNER_KEY), where)
    except BlobNotFound:
        return None


def _refuse(where: str, owner: OwnerMarker, engine_id: str) -> BlobPrefixOwned:
    created = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(owner.created))
    return BlobPrefixOwned(
        f"blob prefix {where} belongs to engine {owner.engine_id} (data directory {owner.data_dir or '?'}, "
        f"claimed {created}), not to this engine {engine_id}; nothing was written or deleted. Give this "
        "data directory its own blob prefix, or, if that engine is gone for good, open with "
        "take_over_blob_prefix=True (--take-over-blob-prefix)"
    )


def check_owner(blobs: BlobStore, engine_id: str, where: str, *, take_over: bool = False) -> OwnerMarker | None:
    """Read-only check before an engine touches a prefix: raises BlobPrefixOwned if another
    identity owns it (unless ``take_over``). Returns the current marker (None if unclaimed)."""
    owner_tag(engine_id)
    owner = read_owner(blobs, where) if not take_over else None
    if owner is not None and owner.engine_id != engine_id:
        raise _refuse(where, owner, engine_id)
    return owner


def claim(blobs: BlobStore, engine_id: str, where: str, *, data_dir: str = "", take_over: bool = False) -> OwnerMarker:
    """Make this engine the prefix's owner: write the marker if absent (``put_if_absent``, so
    of two engines racing for a fresh prefix exactly one wins), accept our own, refuse
    another's -- or, with ``take_over``, replace it, naming the previous owner."""
    try:
        owner = read_owner(blobs, where)
    except BlobPrefixOwned:
        if not take_over:
            raise
        owner = None
    if owner is not None and owner.engine_id == engine_id:
        return owner
    if owner is not None and not take_over:
        raise _refuse(where, owner, engine_id)
    mine = OwnerMarker(engine_id, time.time(), data_dir, owner.engine_id if owner is not None else None)
    if take_over:
        blobs.put(OWNER_KEY, mine.encode())
        return mine
    try:
        blobs.put_if_absent(OWNER_KEY, mine.encode())
    except BlobAlreadyExists:
        winner = read_owner(blobs, where)
        if winner is None or winner.engine_id != engine_id:
            raise _refuse(where, winner or mine, engine_id) from None
        return winner
    return mine
