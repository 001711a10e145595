"""The S3 side of the log on S3: creating, reading, listing and deleting slot objects, and
the recovery rules (docs/formats.md, "Log on S3") shared by
:class:`~sediment.wal.s3_log.S3Log` and ``sediment verify``.

What S3 really does is handled in :meth:`SlotStore.create`: a PUT whose answer was lost but
which landed is resent by botocore and answers 412, so a 412 after a resend is compared
with our own bytes (each object carries a random token, so equal bytes are our write);
409 ConditionalRequestConflict is retried; a timeout or 5xx past botocore's budget leaves
the outcome unknown and is resolved by reading the slot.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from sediment._s3 import Bucket, PreconditionFailed, read_object
from sediment.errors import WalCorruption, WalError, WalFenced, WalMissing, WalOutcomeUnknown
from sediment.wal import s3_format as fmt

log = logging.getLogger(__name__)

OUTCOME_DEADLINE = 10.0  # seconds a PUT of unknown outcome is resolved for (SlotStore.create)
_READERS = 16
_WINDOW = 64  # objects read at a time by recovery


class SlotStore:
    """Slot objects of one log under ``s3://bucket/root``."""

    def __init__(self, bucket: str, prefix: str, endpoint_url: str | None, region: str = "us-east-1", *,
                 connect_timeout: float = 5.0, read_timeout: float = 10.0, max_attempts: int = 5,
                 conflict_attempts: int = 6, sleep: Callable[[float], None] = time.sleep,
                 outcome_deadline: float = OUTCOME_DEADLINE, now: Callable[[], float] = time.monotonic) -> None:
        self._sleep, self._now, self.outcome_deadline = sleep, now, outcome_deadline
        self._s3 = Bucket(bucket, prefix, endpoint_url, region, connect_timeout=connect_timeout,
                          read_timeout=read_timeout, max_attempts=max_attempts, conflict_attempts=conflict_attempts,
                          sleep=sleep, pool=_READERS + 4)
        self.bucket, self.root, self.client = bucket, self._s3.prefix, self._s3.client
        self.endpoint_url: str = self._s3.endpoint_url
        self.requests = {"put": 0, "get": 0, "list": 0, "delete": 0}
        self.sizes: dict[int, int] = {}  # slot -> object size, as the last listing saw it

    def where(self, name: str = "") -> str:
        return f"s3://{self.bucket}/{self.root}{name}"

    def _unavailable(self, op: str, name: str, e: Exception) -> WalError:
        return WalError(f"S3 log {op} of {self.where(name)} at {self.endpoint_url} failed: {type(e).__name__}: {e}; "
                        "check the endpoint, credentials and bucket, then reopen the engine")

    def get(self, name: str) -> bytes | None:
        """The object's bytes, or None when it does not exist."""
        self.requests["get"] += 1
        try:
            return read_object(self.client, self.bucket, self.root + name)
        except (ClientError, BotoCoreError) as e:
            raise self._unavailable("get", name, e) from e

    def slots(self, partition: int, start: int = 0) -> list[int]:
        """Every slot of ``partition`` numbered ``start`` or above, ascending."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": f"{self.root}{partition}/"}
        if start > 0:
            kwargs["StartAfter"] = self.root + fmt.slot_name(partition, start - 1)
        found = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(**kwargs):
                self.requests["list"] += 1
                for obj in page.get("Contents", ()):
                    slot = fmt.parse_name(obj["Key"][len(self.root):], partition)
                    if slot is not None:
                        found.append(slot)
                        self.sizes[slot] = int(obj.get("Size", -1))
        except (ClientError, BotoCoreError) as e:
            raise self._unavailable("list", f"{partition}/", e) from e
        return sorted(found)

    def create(self, name: str, body: bytes) -> bool | None:
        """Create ``name`` holding ``body``: True once it holds our bytes, False when another
        writer's object holds the slot, None when a resent PUT met 412 and the slot is empty
        again (deleted since: whether our first attempt landed is unknown).

        A PUT whose outcome is unknown (no answer, 5xx past botocore's budget) is resolved by
        reading the slot, and while S3 answers neither, by trying the PUT and the read again
        (backing off up to a second) for ``outcome_deadline`` seconds: an outage shorter than
        that costs the waiting appends time, not an unknown outcome and a reopen. The
        conditional PUT makes the retry safe: it lands only on an empty slot, and a slot
        holding our bytes (each object carries a random token) is our earlier attempt.
        WalOutcomeUnknown once the deadline passes with the outcome still unknown."""
        retried = False
        unknown: Exception | None = None
        read_failed: WalError | None = None
        deadline, pause = self._now() + self.outcome_deadline, 0.05
        while True:
            self.requests["put"] += 1
            try:
                self._s3.put_conditional(Key=self.root + name, Body=body, IfNoneMatch="*")
                return True
            except PreconditionFailed as e:
                if not (e.retried or retried):
                    return False
                unknown, taken = e, True  # a resend met 412: an earlier attempt of ours, or another's
            except (ClientError, BotoCoreError) as e:
                unknown, taken = e, False
            try:
                stored = self.get(name)
            except WalError as e:
                read_failed = e
            else:
                read_failed = None
                if stored is not None:
                    if taken and stored == body:
                        log.info("S3 log: an earlier attempt of the PUT of %s landed", self.where(name))
                    return stored == body
                if taken:
                    return None  # taken after our first attempt, and empty again: deleted since
                # empty after an error: our PUT has not landed (yet); PUT it again
            retried = True
            if self._now() >= deadline:
                raise self._outcome_unknown(name, unknown, read_failed)
            self._sleep(pause)
            pause = min(pause * 2, 1.0)

    def _outcome_unknown(self, name: str, put: Exception | None, read: Exception | None = None) -> WalOutcomeUnknown:
        also = f"; reading the slot back failed too ({read})" if read is not None else ""
        return WalOutcomeUnknown(f"S3 log PUT of {self.where(name)} at {self.endpoint_url} has an unknown outcome "
                                 f"({type(put).__name__}: {put}){also}: it may have landed; reopen the engine, whose "
                                 "recovery reads the log as it is, and read back before writing it again")

    def delete(self, names: list[str]) -> None:
        """Best effort: what is left is garbage the next open deletes."""
        for i in range(0, len(names), 1000):
            chunk = [{"Key": self.root + n} for n in names[i:i + 1000]]
            self.requests["delete"] += 1
            try:
                self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": chunk, "Quiet": True})
            except (ClientError, BotoCoreError) as e:
                log.warning("S3 log: could not delete %d objects under %s: %s", len(chunk), self.where(), e)

    def close(self) -> None:
        self.client.close()


@dataclass
class Loaded:
    """One object of the log as recovery read it."""

    head: fmt.ObjectHeader
    data: bytes
    offsets: list[int]


@dataclass
class Newest:
    """The log as a LIST and a few GETs show it: the slots listed, and ``head``, the newest
    object that knows the log's end (the newest, unless claims ahead are above it; every
    slot from the start to ``head`` is filled, the ones above it are claims ahead or empty)."""

    slots: list[int]
    head: fmt.ObjectHeader

    @property
    def slot(self) -> int:
        return self.slots[-1]

    @property
    def next_lsn(self) -> int:
        return self.head.next_lsn


@dataclass
class Range:
    """What reading the log from its start found: how many objects were good, and the slots
    listed below the start (a trim's leftovers, and CLAIMs and PLUGs)."""

    count: int = 0
    garbage: list[int] = field(default_factory=list)


def damaged(store: SlotStore, partition: int, slot: int, reason: str) -> WalCorruption:
    name = store.where(fmt.slot_name(partition, slot))
    return WalCorruption(f"{name}: {reason}; the log on S3 is damaged here. Restore the object, or run `sediment "
                         "verify` to see what the log holds", path=name, offset=slot, reason=reason)


def cut_short(store: SlotStore, partition: int, slot: int, reason: str) -> WalCorruption:
    """The newest object is shorter than its header says. S3 stores an object whole and answers
    its PUT only then, so this one was cut after it was written: its appends were acknowledged."""
    name = store.where(fmt.slot_name(partition, slot))
    reason = f"{reason}: S3 stores objects whole, so it was cut short after its appends were acknowledged"
    return WalCorruption(f"{name}: {reason}. Restore the object; to give up its records instead, delete it and "
                         "open again", path=name, offset=slot, reason=reason)


def no_log(store: SlotStore, partition: int) -> WalMissing:
    where = store.where(f"{partition}/")
    return WalMissing(f"{where}: the log on S3 has no objects; it was never created here or was deleted. Point wal= "
                      "at the log's prefix, or restore its objects", path=where, reason="no log")


def read_newest(store: SlotStore, partition: int, start: int = 0, end: int | None = None) -> Newest | None:
    """The newest object that knows the log's end (see :class:`Newest`) among the slots from
    ``start`` (below ``end``), or None when there are none: one LIST, then a GET of the newest
    slot and of each claim ahead below it. Only claims ahead in the whole log is damage; in a
    part of it (``start`` > 0), None."""
    for _ in range(8):
        slots = [s for s in store.slots(partition, start) if end is None or s < end]
        if not slots:
            return None
        for slot in reversed(slots):
            data = store.get(fmt.slot_name(partition, slot))
            if data is None:  # trimmed meanwhile: list again
                break
            head = fmt.decode_header(data)
            if head is None or head.slot != slot:
                below = "" if slot == slots[-1] else " below the claims ahead"
                raise damaged(store, partition, slot, f"the newest object's header{below} is damaged")
            _, why = fmt.frames(data, head)
            if why and len(data) < fmt.HEADER_SIZE + head.frames_len:
                raise cut_short(store, partition, slot, why)
            if why:
                raise damaged(store, partition, slot, why)
            if not head.ahead:
                return Newest(slots, head)
        else:
            if start > 0:
                return None
            raise damaged(store, partition, slots[0], "the log holds only claims ahead: none knows where it ends")
    raise WalError(f"{store.where(str(partition))}: the newest object kept vanishing while read; reopen")


def check_ahead(store: SlotStore, partition: int, newest: Newest) -> list[int]:
    """The claims ahead above ``newest.head``, each checked as an open settling them checks
    it (the slots between them are empty: an open under way, or one that stopped)."""
    ahead = [s for s in newest.slots if s > newest.head.slot]
    prev = newest.head
    for slot, data in zip(ahead, fetch(store, partition, ahead), strict=True):
        head = fmt.decode_header(data) if data is not None else None
        if head is None or head.slot != slot:
            raise damaged(store, partition, slot, "object header is damaged")
        check_follows(store, partition, prev, head)
        prev = effective(head, prev)
    return ahead


def effective(head: fmt.ObjectHeader, prev: fmt.ObjectHeader | None) -> fmt.ObjectHeader:
    """``head`` as the log reads it: a claim ahead takes the next LSN and the start of the
    object before it (its own are the ones its writer saw, maybe older)."""
    if head.ahead and prev is not None:
        return replace(head, first_lsn=prev.next_lsn, start_slot=prev.start_slot)
    return head


def read_range(store: SlotStore, partition: int, slots: list[int], start: int, end: int,
               on_object: Callable[[Loaded], None] = lambda loaded: None,
               known: dict[int, bytes] | None = None) -> Range:
    """Read and check every object in ``[start, end)`` (``known``: the bytes of some, already
    read), ``_WINDOW`` at a time in parallel, handing each good one to ``on_object`` in slot
    order with its :func:`effective` header (memory stays one window, however long the log);
    raise the typed error of the first problem in slot order. ``slots``: the listing, whose
    slots below ``start`` are the range's garbage."""
    out = Range(garbage=[s for s in slots if s < start])
    prev: fmt.ObjectHeader | None = None
    with ThreadPoolExecutor(max_workers=_READERS, thread_name_prefix="s3-log-read") as pool:
        for low in range(start, end, _WINDOW):
            wanted = list(range(low, min(end, low + _WINDOW)))
            for slot, data in zip(wanted, fetch(store, partition, wanted, known, pool), strict=True):
                loaded = _check_object(store, partition, slot, data, prev, start, end)
                if loaded is not None:
                    on_object(loaded)
                    out.count += 1
                    prev = loaded.head
    return out


def fetch(store: SlotStore, partition: int, slots: list[int], known: dict[int, bytes] | None = None,
          pool: ThreadPoolExecutor | None = None) -> list[bytes | None]:
    """The bytes of each of ``slots`` (None: no such object), ``_READERS`` GETs at a time (in
    ``pool``, else one of its own); those in ``known`` are not read again."""
    known = known or {}
    if pool is None:
        with ThreadPoolExecutor(max_workers=_READERS, thread_name_prefix="s3-log-read") as own:
            return fetch(store, partition, slots, known, own)
    return list(pool.map(lambda s: known[s] if s in known else store.get(fmt.slot_name(partition, s)), slots))


def _check_object(store: SlotStore, partition: int, slot: int, data: bytes | None,
                  prev: fmt.ObjectHeader | None, start: int, end: int) -> Loaded | None:
    """The object at ``slot`` checked against the one before it; None for a short one that an
    older version's CLAIM cut (``cut_slot``: it no longer cuts, see :func:`cut_short`)."""
    if data is None:
        name = store.where(fmt.slot_name(partition, slot))
        raise WalMissing(f"{name} is missing: the log on S3 holds slots {start}..{end - 1} and needs every one; "
                         "restore the object (its records are lost otherwise)", path=name, offset=slot,
                         reason="missing object", first_lsn=prev.next_lsn if prev else -1)
    head = fmt.decode_header(data)
    if head is None or head.slot != slot:
        raise damaged(store, partition, slot, "object header is damaged")
    offsets, why = fmt.frames(data, head)
    if why:
        after = store.get(fmt.slot_name(partition, slot + 1)) if slot + 1 < end else None
        following = fmt.decode_header(after) if after is not None else None
        if following is not None and following.claim and following.cut_slot == slot:
            return None  # a torn object a later open cut
        raise damaged(store, partition, slot, why)
    check_follows(store, partition, prev, head)
    return Loaded(effective(head, prev), data, offsets)


def check_follows(store: SlotStore, partition: int, prev: fmt.ObjectHeader | None, head: fmt.ObjectHeader) -> None:
    """WalCorruption unless ``head`` may follow ``prev`` (its :func:`effective` header): LSNs
    continue (a claim ahead's may lag), epochs never fall and grow only at a claim or a plug,
    whose epoch is its slot + 1, and nothing but a plug or a claim follows a plug."""
    if prev is None:
        return
    if head.ahead and head.first_lsn > prev.next_lsn:
        raise damaged(store, partition, head.slot, f"this claim ahead names LSN {head.first_lsn}, past the LSN "
                       f"{prev.next_lsn - 1} that slot {prev.slot} ends with")
    if not head.ahead and head.first_lsn != prev.next_lsn:
        raise damaged(store, partition, head.slot, f"its first LSN {head.first_lsn} does not follow the LSN "
                       f"{prev.next_lsn - 1} that slot {prev.slot} ends with")
    if head.epoch < prev.epoch or head.epoch > prev.epoch and not (head.claim or head.plug):
        raise damaged(store, partition, head.slot, f"epoch {head.epoch} after epoch {prev.epoch} without a claim")
    if (head.ahead or head.plug) and head.epoch != head.slot + 1:
        raise damaged(store, partition, head.slot, f"a {'plug' if head.plug else 'claim ahead'} of epoch "
                       f"{head.epoch}, not its slot + 1")
    if prev.plug and not (head.plug or head.claim):
        raise damaged(store, partition, head.slot, f"it follows the plug at slot {prev.slot}, past which the writer "
                       "the plug fenced cannot write")


def newer_writer(store: SlotStore, partition: int, epoch: int, start: int) -> WalFenced | None:
    """WalFenced when the newest object of ``partition`` from slot ``start`` on was written by a
    newer epoch than ``epoch`` (another writer claimed the log), else None: one LIST and one
    GET, then ``store`` is closed. The store's WalError when S3 does not answer."""
    try:
        later = store.slots(partition, start)
        data = store.get(fmt.slot_name(partition, later[-1])) if later else None
        head = fmt.decode_header(data) if data is not None else None
        if head is None or head.epoch <= epoch:
            return None
        return WalFenced(f"{store.where(fmt.slot_name(partition, head.slot))}: a newer writer (epoch {head.epoch}) "
                         f"claimed the log after this writer (epoch {epoch}) failed; stop this coordinator, the one "
                         "that took over serves the data")
    finally:
        store.close()
