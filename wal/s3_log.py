"""The log on S3 (``wal="s3://bucket/prefix"``): a WriteAheadLog whose group commits are
objects, for a deployment with nothing but object storage. Objects, writing, claiming
and recovery: docs/formats.md, "Log on S3".

One writer thread owns the log: appenders queue their records and wait; the writer takes
everything queued, writes it as one object at the next slot and wakes them when S3 has
answered. A PUT takes milliseconds, so batching is what keeps throughput: every append
queued while one PUT is in flight goes into the next object.

Opening claims the log past the newest object (wal/s3_claim.py: right after it, or ahead of
a writer still appending) and plugs each slot below the claim that writer did not reach, so
it finds its next slot taken and stops (WalFenced), within a bounded number of requests.
CLAIM and PLUG objects are never deleted by a trim: a fenced writer's next PUT is always
aimed at one, so keeping them keeps every fenced writer out, however long it stalled (the
hole of SlateDB issue 352, closed).
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

from sediment.clock import Clock
from sediment.errors import (
    InvalidArgument,
    OutcomeUnknown,
    RepairRefused,
    WalError,
    WalFenced,
    WalOutcomeUnknown,
    WalTakenOverInFlight,
)
from sediment.metadata.open_store import s3_endpoint_problem
from sediment.wal import record as rec
from sediment.wal import s3_claim
from sediment.wal import s3_format as fmt
from sediment.wal.protocol import (
    NO_PREAMBLE,
    OpenReport,
    PendingAppend,
    SegmentPreamble,
    check_trim,
    check_usable,
    notify,
)
from sediment.wal.s3_objects import Loaded, SlotStore, check_ahead, damaged, no_log, read_newest, read_range

log = logging.getLogger(__name__)

DEFAULT_SEGMENT_BYTES = 64 << 20
DEFAULT_OBJECT_BYTES = 16 << 20
DEFAULT_CACHE_BYTES = 64 << 20
TAKEOVER_POLL = 2.0  # seconds between looks for a newer writer (see S3Log.watch_takeover)
LINGER_MAX = 0.005  # seconds a group waits at most for more appends (see S3Log._linger)
CLOSE_TIMEOUT = 30.0  # seconds close() waits for the writer's PUTs before giving up on them (S3Log.close)
_TAKEN_OVER = (WalFenced, WalTakenOverInFlight)


def parse_spec(spec: str, s3_endpoint: str | None = None) -> tuple[str, str, str | None]:
    """(bucket, prefix, endpoint) of ``s3://bucket/prefix[?endpoint=http://host:port]``; the
    endpoint in the spec wins over ``s3_endpoint``. InvalidArgument when it is no such spec."""
    parts = urlsplit(spec)
    query = parse_qs(parts.query)
    if parts.scheme != "s3" or not parts.netloc or set(query) - {"endpoint"} or len(query.get("endpoint", [""])) != 1:
        raise InvalidArgument(f"wal {spec!r} is not s3://bucket/prefix[?endpoint=http://host:port]: name a bucket "
                              "and at most one endpoint")
    for endpoint, what in ((query.get("endpoint", [None])[0], f"the endpoint of wal {spec!r}"),
                           (s3_endpoint, "s3_endpoint")):
        problem = s3_endpoint_problem(endpoint, what) if endpoint is not None else None
        if problem is not None:
            raise InvalidArgument(problem)
    return parts.netloc, unquote(parts.path).strip("/"), query["endpoint"][0] if "endpoint" in query else s3_endpoint


def check_log(spec: str, s3_endpoint: str | None = None, partition: int = 0) -> tuple[int, list[str], int]:
    """What an open would find, read-only (``sediment verify``): (the log's end LSN, notes,
    objects checked). Raises the typed error an open would raise on the same damage."""
    bucket, prefix, endpoint = parse_spec(spec, s3_endpoint)
    store = SlotStore(bucket, prefix, endpoint)
    try:
        newest = read_newest(store, partition)
        if newest is None:
            raise no_log(store, partition)
        got = read_range(store, partition, newest.slots, newest.head.start_slot, newest.head.slot + 1)
        ahead = check_ahead(store, partition, newest)
        notes = [f"{store.where(f'{partition}/')}: {len(ahead)} claim(s) ahead at slots {ahead} and "
                 f"{newest.slot - newest.head.slot - len(ahead)} empty slot(s) above slot {newest.head.slot}: an open "
                 "under way, or one that stopped; the next open fills the empty slots"] if ahead else []
        return newest.next_lsn, notes, got.count + len(ahead)
    finally:
        store.close()


def peek_end(spec: str, s3_endpoint: str | None = None, partition: int = 0) -> int:
    """The end LSN of the log at ``spec`` (0: no records, or no log), read without claiming it:
    an open that would be refused must not fence the writer that holds the log."""
    bucket, prefix, endpoint = parse_spec(spec, s3_endpoint)
    store = SlotStore(bucket, prefix, endpoint)
    try:
        newest = read_newest(store, partition)
        return 0 if newest is None else newest.next_lsn
    finally:
        store.close()


@dataclass
class _Pending(PendingAppend):
    """An append in flight (also the caller's ticket), or a request for the writer:
    ``mark`` a trim's new start slot, ``finish`` a segment boundary."""

    mark: int = -1
    finish: bool = False

    @property
    def size(self) -> int:
        return sum(rec.HEADER_SIZE + len(r.body) for r in self.records)


class S3Log:
    """A WriteAheadLog over S3 objects. Create with :meth:`open`."""

    def __init__(self) -> None:
        raise TypeError("use S3Log.open(spec, ...)")

    @classmethod
    def open(cls, spec: str, *, partition: int = 0, s3_endpoint: str | None = None, create: bool = False,
             segment_bytes: int = DEFAULT_SEGMENT_BYTES, object_bytes: int = DEFAULT_OBJECT_BYTES,
             cache_bytes: int = DEFAULT_CACHE_BYTES, repair: bool = False, close_timeout: float = CLOSE_TIMEOUT,
             **s3_options) -> S3Log:
        """Open (and claim) the log of ``partition`` at ``spec``, ``s3://bucket/prefix``.

        A log with no objects is created only with ``create`` (else WalMissing: a deployment
        whose log vanished must not start over). Every object from the start to the claim is
        read and checked (the rules of wal/s3_objects.py) once this writer's CLAIM and PLUGs
        fence the old writer, so nothing it acknowledged can be missed. ``close_timeout``: how
        long :meth:`close` waits for the PUTs still to make. ``s3_options`` go to the slot store
        (``outcome_deadline``) and its boto3 client (``connect_timeout``, ``max_attempts``, ...)."""
        if repair:
            raise RepairRefused(f"{spec}: the log on S3 has no repair; restore the damaged objects (or delete the "
                                "ones you accept to lose, then the rest from that slot up) and reopen")
        bucket, prefix, endpoint = parse_spec(spec, s3_endpoint)
        self = object.__new__(cls)
        self.spec, self.partition = spec, partition
        self.segment_bytes = max(segment_bytes, 4096)
        self.object_bytes = max(object_bytes, 1 << 16)
        self.store = SlotStore(bucket, prefix, endpoint, **s3_options)
        self._new_store = lambda: SlotStore(bucket, prefix, endpoint, **s3_options)  # a client of its own
        self.dir = self.store.where(f"{partition}/")
        self.report = OpenReport()
        self._preamble: SegmentPreamble = NO_PREAMBLE
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._trim_lock = threading.Lock()
        self._queue: list[_Pending] = []
        self._closing = self._closed = self._abandoned = False
        self.close_timeout = close_timeout
        self._in_flight: list[_Pending] = []
        self._failed: BaseException | None = None
        self._listener: Callable[[int], None] | None = None
        self._fenced_callbacks: list[Callable[[BaseException], None]] = []
        self._cache: OrderedDict[int, tuple[bytes, list[int]]] = OrderedDict()
        self._cache_bytes, self._cache_limit = 0, cache_bytes
        self._last_put, self._last_group = 0.0, 0
        try:
            self._claim_and_recover(create)
        except BaseException:
            self.store.close()
            raise
        self._writer = threading.Thread(target=self._write_loop, name=f"s3-wal-writer-{partition}", daemon=True)
        self._writer.start()
        return self

    # --- claiming and recovery -----------------------------------------------------------------

    def _claim_and_recover(self, create: bool) -> None:
        newest = read_newest(self.store, self.partition)
        if newest is None and not create:
            raise no_log(self.store, self.partition)
        head = s3_claim.create(self.store, self.partition) if newest is None else None
        self.created = head is not None
        self.claim_rounds, self.plugs = 1, 0
        self._objects: list[fmt.ObjectHeader] = []  # every object kept, in slot order
        if head is None:
            newest = newest or read_newest(self.store, self.partition)  # (None: another open created it)
            if newest is None:
                raise no_log(self.store, self.partition)
            claimed = s3_claim.claim(self.store, self.partition, newest)
            self.claim_rounds, self.plugs = claimed.rounds, claimed.plugs
            got = read_range(self.store, self.partition, newest.slots, claimed.below.start_slot, claimed.head.slot,
                             self._recovered_object, claimed.known)
            # below the start: objects with frames are a trim's leftovers; header-only ones (CLAIMs,
            # PLUGs, and rarely a trim's mark) stay, as they are fences (see the module doc)
            garbage = [s for s in got.garbage if self.store.sizes.get(s, fmt.HEADER_SIZE) != fmt.HEADER_SIZE]
            if garbage:
                self.store.delete([fmt.slot_name(self.partition, s) for s in garbage])
            head = claimed.head
        self.epoch = head.epoch
        self._objects.append(head)
        self._start_slot = head.start_slot
        self._next_slot, self._next_lsn = head.slot + 1, head.first_lsn
        self._seg_first, self._seg_records, self._seg_bytes = self._segment_state()

    def _recovered_object(self, loaded: Loaded) -> None:
        self._objects.append(loaded.head)
        self.report.records += loaded.head.records
        self._remember(loaded)

    def _segment_state(self) -> tuple[int, int, int]:
        """(first LSN, records besides its boundary, bytes) of the segment the log continues."""
        i = len(self._objects) - 1
        while i > 0 and not self._objects[i].flags & fmt.SEGMENT:
            i -= 1
        first = self._objects[i].first_lsn
        boundary = 1 if self._objects[i].flags & fmt.SEGMENT else 0
        n = sum(o.records for o in self._objects[i:]) - boundary
        size = sum(len(self._cache[o.slot][0]) for o in self._objects[i:] if o.slot in self._cache)
        return first, n, size

    def _remember(self, loaded: Loaded) -> None:
        if not loaded.head.records:
            return
        self._cache[loaded.head.slot] = (loaded.data, loaded.offsets)
        self._cache_bytes += len(loaded.data)
        while self._cache_bytes > self._cache_limit and len(self._cache) > 1:
            _, (data, _) = self._cache.popitem(last=False)
            self._cache_bytes -= len(data)

    # --- writing -------------------------------------------------------------------------------

    def append(self, records: Sequence[rec.Record]) -> int:
        return self.submit(records).wait()

    def submit(self, records: Sequence[rec.Record],
               on_durable: Callable[[Sequence[rec.Record]], None] | None = None) -> _Pending:
        """Queue ``records`` (queue order is log order); the ticket's ``wait()`` returns once
        the object holding them is written."""
        rec.check_appendable(records, f"the write-ahead log at {self.dir}")
        return self._enqueue(_Pending(records, [rec.crc32c(r.body) for r in records], on_durable))

    def _enqueue(self, pending: _Pending) -> _Pending:
        with self._lock:
            self._check_open()
            self._queue.append(pending)
            self._wake.notify()
        return pending

    def _check_open(self) -> None:
        closed = self._closing or self._closed
        if not closed and isinstance(self._failed, _TAKEN_OVER):
            raise WalFenced(str(self._failed))
        check_usable(self.dir, closed, self._failed)

    def _linger(self) -> None:
        """Wait (lock held) a tenth of the last PUT's time, at most LINGER_MAX seconds, for the
        appenders the last PUT woke to queue again. Without it, while one group's PUT is in
        flight the next group forms from the other waiters only, so with W writers groups
        alternate between about W/2 appends each: half the throughput a PUT could carry."""
        want = len(self._queue) + self._last_group
        deadline = time.monotonic() + min(LINGER_MAX, self._last_put / 10)
        while len(self._queue) < want and not self._closing:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._wake.wait(left)

    def _take(self) -> tuple[list[_Pending], bool]:
        """The next group (appends up to ``object_bytes``, or one request) and whether closing."""
        with self._lock:
            while not self._queue and not self._closing:
                self._wake.wait()
            if self._last_group > 1:
                self._linger()
            if not self._queue:
                return [], True
            if self._queue[0].mark >= 0 or self._queue[0].finish:
                self._in_flight = [self._queue.pop(0)]
                return self._in_flight, self._closing
            n, size = 0, 0
            while n < len(self._queue) and not (self._queue[n].mark >= 0 or self._queue[n].finish) and \
                    (n == 0 or size + self._queue[n].size <= self.object_bytes):
                size += self._queue[n].size
                n += 1
            batch, self._queue = self._queue[:n], self._queue[n:]
            self._in_flight = batch
            return batch, self._closing

    def _write_loop(self) -> None:
        while True:
            batch, closing = self._take()
            if not batch and closing:
                return
            try:
                self._serve(batch)
            except BaseException as exc:  # noqa: BLE001 - every waiter must learn of the failure
                self._fail(batch, exc)

    def _serve(self, batch: list[_Pending]) -> None:
        first = batch[0]
        if first.finish:
            self._finish()
        elif first.mark >= 0:
            self._write_object(0, [], [], start_slot=first.mark)
            with self._lock:
                self._start_slot = first.mark
        else:
            self._write_group(batch)
        for p in batch:
            p.done.set()
        if first.mark < 0 and not first.finish and self._seg_bytes >= self.segment_bytes:
            self._finish()

    def _fail(self, batch: list[_Pending], exc: BaseException) -> None:
        with self._lock:
            if self._abandoned:  # close() gave up on the writer and answered what S3 had not
                late = [p for p in batch if not p.done.is_set()]  # answered by S3: a callback failed
                for p in late:
                    p.error = WalError(f"write to the log at {self.dir} failed after close: {exc}; not acknowledged")
                    p.done.set()
                return
        log.error("write-ahead log %s failed: %s", self.dir, exc)
        with self._lock:
            if self._failed is not None and not batch:
                return  # the writer (or the takeover watch) already failed it
            self._failed = self._failed or exc
            waiting, self._queue = self._queue, []
        err = exc if isinstance(exc, (*_TAKEN_OVER, OutcomeUnknown)) else \
            WalError(f"write to the log at {self.dir} failed: {exc}; not acknowledged")
        for p in [q for q in batch if not q.done.is_set()] + waiting:  # an answered one landed: it stays so
            p.error = err
            p.done.set()
        if isinstance(exc, _TAKEN_OVER):
            notify(list(self._fenced_callbacks), exc, "an on_fenced callback")

    def _write_group(self, batch: list[_Pending]) -> None:
        records = [r for p in batch for r in p.records]
        crcs = [c for p in batch for c in p.crcs]
        began = time.monotonic()
        self._write_object(0, records, crcs)
        self._last_put, self._last_group = time.monotonic() - began, len(batch)
        with self._lock:
            if self._abandoned:
                return  # its waiters were told the outcome is unknown: neither acknowledge nor apply
            self._in_flight = []  # answered: close() no longer counts it as unknown
        for p in batch:
            p.last_lsn = p.records[-1].lsn
            self._preamble.observe(p.records)
        callbacks: dict = {}
        for p in batch:  # one call per callback per object, records in log order
            if p.on_durable is not None:
                callbacks.setdefault(p.on_durable, []).extend(p.records)
        for callback, records_ in callbacks.items():
            callback(records_)

    def _write_object(self, flags: int, records: Sequence[rec.Record], crcs: list[int], *,
                      start_slot: int | None = None) -> None:
        """Write ``records`` as the object at the next slot; WalFenced if another writer has it."""
        lsn = self._next_lsn
        frames = bytearray()
        offsets = []
        for r, crc in zip(records, crcs, strict=True):
            r.lsn = lsn
            offsets.append(fmt.HEADER_SIZE + len(frames))
            frames += rec.encode_header(r, lsn, crc)
            frames += r.body
            lsn += 1
        slot = self._next_slot
        if self._abandoned:
            raise WalError(f"{self.dir}: the log was closed before slot {slot} was written")
        head = fmt.new_header(flags, self.epoch, slot, self._next_lsn, len(records),
                              self._start_slot if start_slot is None else start_slot)
        body = fmt.encode(head, frames)
        created = self.store.create(fmt.slot_name(self.partition, slot), body)
        if created is None:
            raise WalTakenOverInFlight(f"{self.store.where(fmt.slot_name(self.partition, slot))}: the log was taken "
                                       "over while this PUT was resent, and the slot was trimmed since: whether it "
                                       "landed first is unknown; read back through the coordinator that took over")
        if not created:
            raise WalFenced(f"{self.store.where(fmt.slot_name(self.partition, slot))}: another writer took this slot: "
                            f"the log was taken over (this writer's epoch {self.epoch} is superseded); nothing "
                            "more is written here: stop this coordinator, the one that took over serves the data")
        with self._lock:
            self._objects.append(head)
            self._next_slot, self._next_lsn = slot + 1, lsn
            self._seg_bytes += len(body)
            self._seg_records += len(records) - (1 if flags & fmt.SEGMENT else 0)
            if records:
                self._remember(Loaded(head, body, offsets))

    def _finish(self) -> None:
        if self._seg_records == 0:
            return
        record = self._preamble.record()
        with self._lock:
            first = self._next_lsn
            self._seg_first, self._seg_records, self._seg_bytes = first, 0, 0
        self._write_object(fmt.SEGMENT, [record], [rec.crc32c(record.body)])
        self._preamble.observe([record])
        notify([self._listener], first, "segment-finish listener")

    def finish_segment(self) -> None:
        self._enqueue(_Pending([], [], finish=True)).wait()

    def set_finish_listener(self, callback: Callable[[int], None] | None) -> None:
        self._listener = callback

    def set_preamble(self, preamble: SegmentPreamble | None) -> None:
        self._preamble = NO_PREAMBLE if preamble is None else preamble

    def on_fenced(self, callback: Callable[[BaseException], None]) -> None:
        """Call ``callback(WalFenced)`` (from the writer's thread; must not wait on the log)
        when a newer writer took the log over and this one stopped for good."""
        self._fenced_callbacks.append(callback)

    def watch_takeover(self, clock: Clock, interval: float = TAKEOVER_POLL) -> None:
        """Learn of a takeover without waiting for the next write: every ``interval`` seconds of
        ``clock`` list the slots from this writer's next one; an object there of a newer epoch
        (a claim) means another writer took the log over, and this one is fenced at once (one
        LIST per interval; a GET only when a slot is found)."""
        moved = threading.Event()
        if hasattr(clock, "on_advance"):
            clock.on_advance(moved.set)
        sleep_time = getattr(clock, "deadline_to_sleep_time", lambda d: d - clock.current_time())

        def poll() -> None:
            while not (self._closing or self._closed or self._failed is not None):
                deadline = clock.current_time() + interval
                while clock.current_time() < deadline and not self._closing:
                    moved.clear()
                    moved.wait(min(1.0, max(0.0, sleep_time(deadline))))
                if not self._closing:
                    self.look_for_takeover()

        threading.Thread(target=poll, name=f"s3-wal-takeover-{self.partition}", daemon=True).start()

    def look_for_takeover(self) -> None:
        """Fence this writer now if a newer one claimed the log (a failing read asks: why)."""
        try:
            later = self.store.slots(self.partition, self._next_slot)
            data = self.store.get(fmt.slot_name(self.partition, later[0])) if later else None
        except Exception as exc:  # noqa: BLE001 - an outage (or a close meanwhile): look again later
            log.warning("%s: could not look for a takeover: %s", self.dir, exc)
            return
        head = fmt.decode_header(data) if data is not None else None
        if head is not None and head.epoch > self.epoch:
            self._fail([], WalFenced(f"{self.store.where(fmt.slot_name(self.partition, head.slot))}: a newer writer "
                                     f"(epoch {head.epoch}) claimed the log; this writer (epoch {self.epoch}) writes "
                                     "nothing more: stop this coordinator, the one that took over serves the data"))

    def newer_writer_check(self) -> Callable[[], WalFenced | None]:
        """Whether another writer claimed the log since this one (``newer_writer``), asked after a
        failure or close: a failed coordinator's reopen would take the log back from it."""
        from sediment.wal.s3_objects import newer_writer

        return lambda: newer_writer(self._new_store(), self.partition, self.epoch, self._next_slot)

    # --- reading -------------------------------------------------------------------------------

    @property
    def start_lsn(self) -> int:
        with self._lock:
            return self._objects[0].first_lsn

    @property
    def end_lsn(self) -> int:
        with self._lock:
            return self._next_lsn

    @property
    def finished_lsn(self) -> int:
        with self._lock:
            return self._seg_first

    def _object_for(self, lsn: int) -> fmt.ObjectHeader:
        with self._lock:
            objects = self._objects
            i = bisect.bisect_right(objects, lsn, key=lambda o: o.first_lsn) - 1
            if i < 0 or lsn >= self._next_lsn or lsn < objects[0].first_lsn:
                raise WalError(f"LSN {lsn} is not in the log at {self.dir} (it holds "
                               f"[{objects[0].first_lsn}, {self._next_lsn}))")
            return objects[i]

    def _load(self, obj: fmt.ObjectHeader) -> tuple[bytes, list[int]]:
        with self._lock:
            cached = self._cache.get(obj.slot)
            if cached is not None:
                self._cache.move_to_end(obj.slot)
                return cached
        name = fmt.slot_name(self.partition, obj.slot)
        data = self.store.get(name)
        if data is None:
            raise WalError(f"{self.store.where(name)} is gone: it was trimmed while being read")
        head = fmt.decode_header(data)
        offsets, why = fmt.frames(data, head) if head is not None and head.slot == obj.slot else ([], "bad header")
        if why:
            raise damaged(self.store, self.partition, obj.slot, why)
        with self._lock:
            self._remember(Loaded(head, data, offsets))
        return data, offsets

    @staticmethod
    def _record(data: bytes, offset: int) -> rec.Record:
        head = rec.decode_header(data, offset)
        return rec.record_of(head, memoryview(data)[offset + rec.HEADER_SIZE:offset + head.frame_size])

    def read(self, lsn: int) -> rec.Record:
        obj = self._object_for(lsn)
        data, offsets = self._load(obj)
        return self._record(data, offsets[lsn - obj.first_lsn])

    def read_many(self, lsns: Sequence[int]) -> list[rec.Record]:
        # an object is fetched once and kept in the cache: the records after the first are in memory
        return [self.read(lsn) for lsn in lsns]

    def scan(self, start: int | None = None) -> Iterator[rec.Record]:
        with self._lock:
            objects = [o for o in self._objects if o.records]
        for obj in objects:
            if start is not None and obj.first_lsn + obj.records <= start:
                continue
            data, offsets = self._load(obj)
            skip = 0 if start is None else max(0, start - obj.first_lsn)
            for offset in offsets[skip:]:
                yield self._record(data, offset)

    # --- trimming and closing ------------------------------------------------------------------

    def trim(self, lsn: int) -> None:
        """Record a new start (the newest segment boundary at or below ``lsn`` and the finished
        LSN) in an object of its own, then delete the objects below it except CLAIMs and PLUGs."""
        check_trim(self.dir, lsn, self.end_lsn)
        with self._trim_lock:
            with self._lock:
                limit = min(lsn, self._seg_first)
                cut = 0
                for i, o in enumerate(self._objects):
                    if o.flags & fmt.SEGMENT and o.first_lsn <= limit:
                        cut = i
                if cut == 0:
                    return
                new_start = self._objects[cut].slot
            self._enqueue(_Pending([], [], mark=new_start)).wait()
            with self._lock:
                dropped = [o for o in self._objects if o.slot < new_start]
                self._objects = [o for o in self._objects if o.slot >= new_start]
                for o in dropped:
                    cached = self._cache.pop(o.slot, None)
                    self._cache_bytes -= len(cached[0]) if cached else 0
            self.store.delete([fmt.slot_name(self.partition, o.slot) for o in dropped
                               if not o.flags & (fmt.CLAIM | fmt.PLUG)])

    @property
    def requests(self) -> dict[str, int]:
        """S3 requests this log made, by kind (put, get, list, delete)."""
        return dict(self.store.requests)

    def close(self, timeout: float | None = None) -> None:
        """Write what is queued, then release the writer and the client. Bounded: when S3
        does not answer, one PUT can take minutes (botocore's attempts, timeouts and the
        read-backs of an unknown outcome), so after ``timeout`` seconds (default: the
        ``close_timeout`` given to :meth:`open`) close gives up on the writes still to make:
        their appends fail with WalOutcomeUnknown (a PUT in flight may yet land) and so does
        close, saying how many. The writer thread writes nothing after that."""
        with self._lock:
            if self._closed or self._closing:
                return
            self._closing = True
            self._wake.notify()
        self._writer.join(self.close_timeout if timeout is None else max(0.0, timeout))
        with self._lock:
            self._closed = True
            stuck = [] if not self._writer.is_alive() else \
                [p for p in self._in_flight + self._queue if not p.done.is_set()]
            if self._writer.is_alive():
                self._abandoned = True
                self._queue = []
        self.store.close()
        if stuck:
            self._give_up(stuck, self.close_timeout if timeout is None else timeout)

    def _give_up(self, stuck: list[_Pending], waited: float) -> None:
        appends = [p for p in stuck if p.records]
        lsns = [r.lsn for p in appends for r in p.records if r.lsn >= 0]
        where = f"LSNs {min(lsns)}-{max(lsns)}, " if lsns else ""
        err = WalOutcomeUnknown(
            f"{self.dir}: closed after {waited:g} s with {len(appends)} append(s) ({where}from slot "
            f"{self._next_slot}) not yet answered by S3 at {self.store.endpoint_url}: whether they landed is "
            "unknown; reopen the engine when S3 answers (its recovery reads the log as it is) and read back "
            "before writing them again")
        for p in stuck:
            p.error = err
            p.done.set()
        log.error("%s", err)
        raise err

