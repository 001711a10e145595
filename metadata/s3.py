"""Metadata in S3 by conditional writes: a deployment's shared catalog with no ZooKeeper.

Each key is a sequence of immutable slots ``<key>/<20-digit slot>`` (format in
docs/formats.md). A compare-and-set reads the newest slot and creates the next one with
``If-None-Match: *``; S3 lets exactly one creator of an object win, so of two writers
that read the same slot, one gets 412 and reports MetadataConflict. The newest slot is
found by listing (strongly consistent) forward from a hint, never by probing, and a
delete writes a tombstone slot, so a stale writer can never resurrect a key.

What S3 really does is handled here:

* A PUT that landed but whose answer was lost is resent by botocore and gets 412: every
  slot carries the write's unique token, so a 412 on our own bytes is our success.
* 409 ConditionalRequestConflict is retried (``put_conditional``); a timeout or 5xx past
  botocore's budget is outcome-unknown and resolved by reading the slot.
* Garbage collection keeps each key's newest ``keep`` slots. A writer stalled between
  its read and its PUT may later fill a slot GC removed (SlateDB issue 352); that slot
  lies at least ``keep`` below the newest, so readers never take it for the newest, and
  the writer itself checks after every PUT that its slot is the newest, or that the
  slot after it names its token as predecessor; otherwise it was fenced and gets
  MetadataConflict.

One key sustains about 15 compare-and-sets per second on S3 Standard (each is four
requests in sequence, one of them a conditional PUT that S3 serializes per object):
keep hot state on separate keys.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from sediment._s3 import Bucket, PreconditionFailed, read_object
from sediment.errors import (
    EngineClosed,
    InvalidMetadataRequest,
    MetadataConflict,
    MetadataUnavailable,
)
from sediment.metadata import s3_format as fmt
from sediment.metadata import validation as valid
from sediment.metadata.protocol import Versioned

log = logging.getLogger(__name__)

S3_MAX_NAME_BYTES = 1024
HINT_EVERY = 8
_DELETE_ROUNDS = 64


class S3MetadataStore:
    """A :class:`~sediment.metadata.protocol.MetadataStore` under ``s3://bucket/prefix``.

    ``endpoint_url`` as for the S3 blob store (None: ``AWS_ENDPOINT_URL`` or AWS). ``keep``
    slots per key survive garbage collection (at least 1: the newest is never deleted).
    ``sleep`` paces the retries of 409 conflicts (``conflict_attempts`` in all).
    """

    def __init__(self, bucket: str, prefix: str = "", endpoint_url: str | None = None, region: str = "us-east-1",
                 *, keep: int = 4, connect_timeout: float = 5.0, read_timeout: float = 10.0, max_attempts: int = 5,
                 conflict_attempts: int = 6, sleep: Callable[[float], None] = time.sleep) -> None:
        if not bucket:
            raise InvalidMetadataRequest("S3 metadata bucket name is empty; use s3://bucket/prefix")
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise InvalidMetadataRequest(f"S3 metadata keep must be an int >= 1 (the newest slot stays), got {keep!r}")
        self._s3 = Bucket(bucket, prefix, endpoint_url, region, connect_timeout=connect_timeout,
                          read_timeout=read_timeout, max_attempts=max_attempts, conflict_attempts=conflict_attempts,
                          sleep=sleep)
        self.bucket, self.root, self._client = bucket, self._s3.prefix, self._s3.client
        self.endpoint_url: str = self._s3.endpoint_url
        self.keep = keep
        self._hints: dict[str, int] = {}
        self._lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"S3MetadataStore(s3://{self.bucket}/{self.root}, endpoint={self.endpoint_url})"

    # --- plumbing ---------------------------------------------------------------------------

    def _where(self, name: str) -> str:
        return f"s3://{self.bucket}/{self.root}{name} at {self.endpoint_url}"

    def _unavailable(self, op: str, name: str, e: Exception) -> MetadataUnavailable:
        return MetadataUnavailable(f"S3 metadata {op} of {self._where(name)} failed: {type(e).__name__}: {e}; "
                                   "check the endpoint, credentials and bucket, then retry")

    def _check(self, key: str) -> str:
        valid.validate_key(key)
        if self._closed:
            raise EngineClosed(f"the S3 metadata store s3://{self.bucket}/{self.root} was closed; open a new one")
        if len((self.root + fmt.slot_name(key, 0)).encode("utf-8", "surrogatepass")) > S3_MAX_NAME_BYTES:
            raise InvalidMetadataRequest(
                f"metadata key {key[:64]!r}... is too long for the S3 store: with the prefix {self.root!r} and "
                f"the slot suffix its object names exceed S3's {S3_MAX_NAME_BYTES} bytes; use a shorter key")
        return key

    def _read(self, name: str) -> bytes | None:
        """The object's bytes, or None when it does not exist."""
        try:
            return read_object(self._client, self.bucket, self.root + name)
        except (ClientError, BotoCoreError) as e:
            raise self._unavailable("get", name, e) from e

    def _list(self, prefix: str, start_after: str = "", delimiter: str = "") -> list[dict[str, Any]]:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.root + prefix}
        if start_after:
            kwargs["StartAfter"] = self.root + start_after
        if delimiter:
            kwargs["Delimiter"] = delimiter
        try:
            out: list[dict[str, Any]] = []
            for page in self._client.get_paginator("list_objects_v2").paginate(**kwargs):
                out.extend(page.get("Contents", ()))
            return out
        except (ClientError, BotoCoreError) as e:
            raise self._unavailable("list", prefix + "*", e) from e

    def _slots(self, key: str, start: int) -> list[int]:
        """Every slot of ``key`` numbered ``start`` or above, ascending."""
        after = fmt.slot_name(key, start - 1) if start > 0 else ""
        found = []
        for obj in self._list(key + "/", after, "/"):
            parsed = fmt.parse_name(obj["Key"][len(self.root):])
            if parsed is not None and parsed[0] == key and parsed[1] is not None:
                found.append(parsed[1])
        return sorted(found)

    def _hint(self, key: str) -> int:
        with self._lock:
            cached = self._hints.get(key)
        if cached is not None:
            return cached
        data = self._read(fmt.hint_name(key))
        return (fmt.decode_hint(data) or 0) if data is not None else 0

    def _remember(self, key: str, slot: int) -> None:
        with self._lock:
            if self._hints.get(key, -1) < slot:
                self._hints[key] = slot

    # --- reading ----------------------------------------------------------------------------

    def _newest(self, key: str) -> tuple[fmt.Slot | None, list[int]]:
        """The newest slot of ``key`` (None if it has none) and the slots listed from the hint.

        The hint is only where listing starts: slots are never removed from the top, so
        every slot at or above a hint is listed and the largest is the newest. If GC removes
        the listed newest before it is read, newer slots exist: list again.
        """
        start = self._hint(key)
        for _ in range(8):
            slots = self._slots(key, start)
            if not slots and start > 0:
                start = 0
                slots = self._slots(key, 0)
            if not slots:
                return None, []
            name = fmt.slot_name(key, slots[-1])
            data = self._read(name)
            if data is not None:
                self._remember(key, slots[-1])
                return fmt.decode_slot(data, self._where(name)), slots
            start = slots[-1]
        raise MetadataUnavailable(f"S3 metadata key {key!r} ({self._where(key + '/')}) changed on every read; "
                                  "its writers outpace this reader: retry")

    def get(self, key: str) -> Versioned | None:
        newest, _ = self._newest(self._check(key))
        return Versioned(newest.value, newest.version) if newest is not None and newest.live else None

    def list(self, prefix: str) -> list[str]:
        valid.validate_prefix(prefix)
        if self._closed:
            raise EngineClosed(f"the S3 metadata store s3://{self.bucket}/{self.root} was closed; open a new one")
        newest: dict[str, tuple[int, int]] = {}
        for obj in self._list(prefix):
            parsed = fmt.parse_name(obj["Key"][len(self.root):])
            if parsed is None or parsed[1] is None or not parsed[0].startswith(prefix):
                continue
            key, slot = parsed[0], parsed[1]
            if slot >= newest.get(key, (-1, 0))[0]:
                newest[key] = (slot, int(obj["Size"]))
        return sorted(k for k, (_, size) in newest.items() if size != fmt.TOMBSTONE_SIZE)

    # --- writing ----------------------------------------------------------------------------

    def compare_and_set(self, key: str, value: bytes, expected_version: int | None) -> int:
        self._check(key)
        valid.validate_expected(key, expected_version)
        value = valid.validate_value(key, value)
        current, slots = self._newest(key)
        found = current.version if current is not None and current.live else None
        version = valid.next_version(key, found, expected_version, self._where(key + "/"))
        self._write(key, current, fmt.VALUE, version, value, slots)
        return version

    def delete(self, key: str, expected_version: int | None = None) -> None:
        """Write a tombstone slot (never remove the key's objects: a stalled writer could then
        recreate an old slot as the newest). Without ``expected_version``, retried until the
        key is deleted or absent."""
        self._check(key)
        valid.validate_expected(key, expected_version)
        for _ in range(_DELETE_ROUNDS):
            current, slots = self._newest(key)
            found = current.version if current is not None and current.live else None
            valid.check_delete(key, found, expected_version, self._where(key + "/"))
            if found is None:
                return
            try:
                self._write(key, current, fmt.TOMBSTONE, current.version, b"", slots)
                return
            except MetadataConflict:
                if expected_version is not None:
                    raise
        raise MetadataUnavailable(f"deleting metadata key {key!r} ({self._where(key + '/')}) lost "
                                  f"{_DELETE_ROUNDS} races in a row; retry")

    def _write(self, key: str, current: fmt.Slot | None, kind: int, version: int, value: bytes,
               listed: list[int]) -> None:
        number = current.slot + 1 if current is not None else 0
        prev = current.token if current is not None else fmt.NO_TOKEN
        body = fmt.encode_slot(fmt.Slot(kind, number, version, uuid.uuid4().bytes, prev, value))
        name = fmt.slot_name(key, number)
        self._create(name, body)
        self._confirm(key, number, body)
        self._remember(key, number)
        self._after_write(key, number, listed)

    def _create(self, name: str, body: bytes) -> None:
        """Create slot ``name`` with ``body``, or raise MetadataConflict if another write holds it.

        An outcome left unknown (timeout, connection cut, 5xx past the retry budget) is
        resolved by reading the slot: our bytes mean success, other bytes a conflict, none
        a retry of the same PUT (whose 412, should the first land meanwhile, is compared).
        """
        retried = False
        for _ in range(2):
            try:
                self._s3.put_conditional(Key=self.root + name, Body=body, IfNoneMatch="*")
                return
            except PreconditionFailed as e:
                if (e.retried or retried) and self._read(name) == body:
                    log.info("S3 metadata: an earlier attempt of the write of %s landed", self._where(name))
                    return
                raise self._lost(name) from None
            except (ClientError, BotoCoreError) as e:
                unknown: Exception = e
            stored = self._read(name)
            if stored == body:
                return
            if stored is not None:
                raise self._lost(name)
            retried = True
        raise MetadataUnavailable(f"S3 metadata write of {self._where(name)} has an unknown outcome "
                                  f"({type(unknown).__name__}: {unknown}); re-read the key before retrying")

    def _lost(self, name: str) -> MetadataConflict:
        return MetadataConflict(f"metadata slot {self._where(name)} was written by another writer first; "
                                "re-read the key and retry")

    def _confirm(self, key: str, number: int, body: bytes) -> None:
        """Check our new slot is in the key's history, not a GC'd slot a stall let us refill.

        GC removes a slot only once the key has ``keep`` slots above it, so while fewer lie
        above ours it cannot have been refilled. Otherwise the slot after ours tells: its
        predecessor token is ours exactly when it was written after reading our slot.
        """
        later = self._slots(key, number + 1)
        if not later or later[-1] < number + self.keep:
            return
        mine = fmt.decode_slot(body, self._where(fmt.slot_name(key, number)))
        data = self._read(fmt.slot_name(key, number + 1))
        if data is None:
            raise MetadataUnavailable(f"S3 metadata write of {self._where(fmt.slot_name(key, number))}: the key moved "
                                      f"{later[-1] - number} slots on meanwhile and the next slot is gone, so "
                                      "whether this write counted is unknown; re-read the key")
        successor = fmt.decode_slot(data, self._where(fmt.slot_name(key, number + 1)))
        if successor.prev_token == mine.token:
            return
        self._delete_object(fmt.slot_name(key, number))
        raise MetadataConflict(f"metadata key {key!r}: this writer stalled past {later[-1] - number} newer writes "
                               f"and filled a garbage-collected slot ({self._where(fmt.slot_name(key, number))}); "
                               "its write did not count: re-read the key and retry")

    def _after_write(self, key: str, number: int, listed: list[int]) -> None:
        """Every ``HINT_EVERY`` slots move the hint up; every ``keep`` slots delete, in one
        request, the slots that fell out of the newest ``keep`` (and older ones listed).
        Both are best effort: a failure leaves garbage or a longer listing, never a wrong
        answer. At most ``2 * keep - 1`` slots stay besides garbage."""
        if number % HINT_EVERY == 0:
            try:
                self._client.put_object(Bucket=self.bucket, Key=self.root + fmt.hint_name(key),
                                        Body=fmt.encode_hint(number))
            except (ClientError, BotoCoreError) as e:
                log.warning("S3 metadata: hint of %s not updated: %s", self._where(key + "/"), e)
        if number % self.keep or number < self.keep:
            return
        doomed = {old for old in listed if old <= number - self.keep}
        doomed.update(range(max(0, number - 2 * self.keep + 1), number - self.keep + 1))
        objects = [{"Key": self.root + fmt.slot_name(key, old)} for old in sorted(doomed)]
        try:
            self._client.delete_objects(Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True})
        except (ClientError, BotoCoreError) as e:
            log.warning("S3 metadata: old slots of %s not deleted: %s", self._where(key + "/"), e)

    def _delete_object(self, name: str) -> None:
        try:
            self._client.delete_object(Bucket=self.bucket, Key=self.root + name)
        except (ClientError, BotoCoreError) as e:
            log.warning("S3 metadata: could not delete %s: %s", self._where(name), e)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._client.close()
