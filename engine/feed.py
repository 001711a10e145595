"""Feeds: a relation's changes delivered to subscribers as they become durable.

Waltz serves each partition with a real-time feed (from an in-memory cache of
recent transactions) and a catch-up feed (from storage) for clients that fall
behind. Here every relation with subscribers keeps a *feed log*: the sequence of
its visible events (committed UPDATES records, by LSN, and progress records) in
the order they became visible. Each subscriber's queue is its window of that one
log, from its cursor to the head: an event is recorded once, decoded once (by the first
subscriber to reach it, from the record's body still in the engine's memory when it can, while
the others wait for it; kept in a shared, bounded cache of recent events, each a
:class:`FeedEvent` that also keeps its wire encoding once made) and handed to every
subscriber as the same object.

The writer never waits for a subscriber. Appending an event costs the writer a list
append and, when subscribers sleep, at most two wake-ups: the sleepers join the feed's
*relay* (engine/feed_relay.py), which wakes :data:`_CHAINS` of them, and each one woken wakes
the next sleeper once it has taken its events (one at most :data:`_TAKE_FIRST` behind; one
further behind, catching up, or one that finds a subscriber far behind decoding many records,
wakes it first, so a long catch-up holds no one up). Taking
before waking means the next one finds the event decoded and the interpreter lock about to
be let go: woken before the take, it waited for the decode and for the lock, and with the
writer appending back to back a turn of 100 subscribers took three times as long.
Subscribers read the log without a lock. A subscriber that falls behind catches up in
bulk (consecutive updates in one event, shared by the subscribers behind by the same
updates) and reads records the cache no longer holds again from the WAL, which is kept
until the slowest cursor has passed: it gets exactly the events it missed, in order,
with no repeat.

The policy for slow subscribers: each one's queue is bounded by ``max_lag`` events
(:data:`MAX_LAG` unless given to ``subscribe``). A subscriber more than that far
behind is dropped from the feed log (checked every :data:`CHECK_EVERY` events), so
neither the log's memory nor the WAL it pins grows for it; its next read raises
:class:`~sediment.errors.FeedOverrun`, which names the last progress time it
delivered (before any, the ``as_of`` it started at: never the current frontier, which
would skip the updates in between). It then catches up from the trace and the log with the resume protocol
below, where consolidating through any PROGRESS(t) still gives ``snapshot(t)``.

A subscription starts with a snapshot at ``as_of``, then one UPDATES event with
every stored update after ``as_of`` (appended earlier at future times), then a
PROGRESS event for the sealed frontier, then the live events. Consolidating the
stream up to any PROGRESS(t) event gives exactly ``snapshot(t)``. A live UPDATES event is
one WAL record's rows: one append's, or, when the file log joined a group of concurrent
small appends into one record (wal/group_records.py), every append of the run, in the
order they were queued.

Subscriptions may also be read from asyncio (``async for``, :meth:`Subscription.next_async`):
many of them in one event loop cost the writer one wake-up of the loop per batch of events
(:mod:`sediment.engine.feed_async`), where each subscriber thread costs a wake-up of its own.

To resume after a disconnect, keep your state as of the last PROGRESS(t) you saw,
drop updates received after it, and subscribe again with ``as_of=t, resume=True``
(no snapshot is sent): nothing is lost or repeated.
"""

from __future__ import annotations

import asyncio
import threading
import time as _time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from sediment.engine.feed_async import AsyncIterating, Loops, Seat, doze
from sediment.engine.feed_bells import Bell, Bells
from sediment.engine.feed_relay import CHAINS, Relay, on_main_thread, release
from sediment.errors import EngineClosed, FeedOverrun, UnknownRelation
from sediment.interrupts import WaitingIterator, wait_slices

_MAX_BATCHED = 1024  # UPDATES records merged into one event for a subscriber that is behind
MAX_LAG = 1 << 18  # events a subscriber may fall behind before it is dropped (about 100 B each)
CHECK_EVERY = 1024  # events between checks of the subscribers' lag (and trims of the log)
_NBYTES = "nbytes"  # FeedEvent.encoded key of a table's size
_CHAINS = CHAINS  # subscribers of the relay woken at once
_TAKE_FIRST = 64  # a woken subscriber at most this many events behind takes them before it wakes the next
SNAPSHOT = "snapshot"
# decoded events kept beside the byte bound: each is a few Python objects, and with one-row
# records 64 MiB held half a million of them, which every full collection of Python's garbage
# collector walked (pauses of 30-60 ms, growing with the feed's age)
CACHE_EVENTS = 1024
BULK_EVENTS = 256  # merged catch-up events kept, likewise
UPDATES = "updates"
PROGRESS = "progress"
SCHEMA = "schema"  # an alter: later updates come in the new schema (engine/schema_history.py)
Loader = Callable[[int, int, int], pa.Table]  # (lsn, schema version to deliver in, version written) -> table
ManyLoader = Callable[[list[tuple[int, int]], int], list[tuple[pa.Table, int]]]  # ([(lsn, written)], version) -> [(table, bytes)]


@dataclass(frozen=True)
class FeedEvent:
    """``snapshot``: the relation as of ``time`` (columns + diff). ``updates``: updates
    (columns + time + diff). ``progress``: ``close time``. ``schema``: the relation was
    altered to schema version ``time``; ``table`` is an empty table of its new update schema,
    and the updates after this event come in it. A live event is one object
    shared by every subscriber; :meth:`encoded` keeps what is derived from it (the
    server's wire batches) so that it is made once, not once per subscriber."""

    kind: str
    time: int
    table: pa.Table | None = None
    records: int = 1  # the feed's entries it stands for: more than one for a catch-up in bulk
    _memo: dict[Hashable, Any] = field(default_factory=dict, compare=False, repr=False)
    _making: threading.RLock = field(default_factory=threading.RLock, compare=False, repr=False)

    def encoded(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """``make()``, made once per event and key: subscribers the relay wakes together ask
        at the same moment, and a racing caller waits for the first one's result rather than
        encoding the change again."""
        got = self._memo.get(key)
        if got is None:
            with self._making:
                got = self._memo.get(key)
                if got is None:
                    got = self._memo[key] = make()
        return got


class FeedLog:
    """One relation's visible events while it has subscribers.

    ``window`` is ``(seq of its first entry, entries)``, entries being ``(kind, lsn, time,
    written)`` tuples (``written``: an UPDATES record's schema version, -1 when not known); it is only appended to in place, and replaced whole when trimmed, so a reader
    holding an older window still reads valid entries. ``changed`` guards registration,
    trims and drops (taken inside the engine lock by writers)."""

    def __init__(self, cache_bytes: int = 64 << 20):
        self.changed = threading.Condition(threading.Lock())
        self.window: tuple[int, list[tuple[str, int, int, int]]] = (0, [])
        self.next_seq = 0
        self.subs: dict[int, Subscription] = {}
        self.relay = Relay()  # subscribers about to sleep join its pending list, without a lock
        self._next_check = CHECK_EVERY
        self._events: dict[int, FeedEvent] = {}  # lsn -> decoded event, oldest first
        self._cache_bytes = 0
        self._cache_limit = cache_bytes
        self._cache_lock = threading.Lock()
        self._load_lock = threading.Lock()  # one decode of a record at a time: the others wait for it
        self.long_decode = False  # a subscriber far behind decodes many records under that lock now
        self._bulk: dict[tuple[int, int], FeedEvent] = {}  # (first seq, end seq) -> merged event, oldest first
        self._bulk_bytes = 0
        self._progress: tuple[int, FeedEvent] | None = None  # (lsn, event) of the latest progress taken
        self.loops = Loops()  # event loops with async subscribers
        self.bells = Bells()  # threads asleep on this feed among others (a server's shared streams)
        self.closed = False
        self.dropped_as: str | None = None  # the relation's name, once it was dropped under its subscribers

    @property
    def active(self) -> bool:
        return bool(self.subs)

    @property
    def cursors(self) -> dict[int, int]:
        """Subscriber id -> the seq of the next event it will read."""
        return {sub_id: sub.cursor for sub_id, sub in list(self.subs.items())}

    @property
    def entries(self) -> list[tuple[str, int, int, int]]:
        return self.window[1]

    def add(self, kind: str, lsn: int, time: int = 0, written: int = -1) -> None:
        """A new visible event (called under the engine lock, from the log's writer thread;
        ``written``: an UPDATES record's own schema version, which lets a subscriber decode it
        from the engine's memory instead of reading it back from the log). Without subscribers
        only the sequence moves: subscribers register under the engine lock too, so none can
        appear while this runs."""
        if not self.subs:
            self.next_seq += 1
            return
        self.window[1].append((kind, lsn, time, written))
        self.next_seq += 1
        if self.next_seq >= self._next_check:
            self._check()
        if self.relay.pending or self.relay.direct:
            self.relay.start(_CHAINS)
        if self.loops:
            self._wake_loops()
        if self.bells:
            self.bells.ring()

    def _wake_loops(self) -> None:
        """One resume per event loop that has async subscribers asleep; a closed loop is forgotten."""
        self.loops.poke()

    @property
    def waiting(self) -> list[Subscription]:
        """Subscribers asleep (or about to be) since the last event."""
        return self.relay.pending

    def settle(self, sub: Subscription, forget: bool = False) -> None:
        """``sub`` stopped waiting: :meth:`Relay.settle <sediment.engine.feed_relay.Relay.settle>`
        (a wake-up of the relay is handed on, whatever ended the wait). One closed or dropped
        leaves the sleepers as one that timed out does: it never sleeps again, and an idle
        feed would keep it there."""
        self.relay.settle(sub, forget or sub.closed or sub.dropped_at is not None)

    def _check(self) -> None:
        """Drop subscribers more than their ``max_lag`` behind, and trim what every cursor
        has passed."""
        self._next_check = self.next_seq + CHECK_EVERY
        with self.changed:
            for sub in [s for s in self.subs.values() if self.next_seq - s.cursor > s.max_lag]:
                sub.dropped_at = sub.cursor
                del self.subs[sub.id]
                release(sub.wake)
                sub.seat.poke()
            self.loops.forget_closed()
            self._trim()

    def _trim(self) -> None:
        """Drop entries every cursor has passed (call with ``changed`` held)."""
        base, items = self.window
        low = min((s.cursor for s in self.subs.values()), default=self.next_seq)
        if low > base:
            self.window = (low, items[low - base:])

    def skip(self, n: int) -> None:
        """``n`` events that became visible before anyone could subscribe (an open's replay,
        on feeds made by that open): the sequence moves as ``n`` calls of :meth:`add` would."""
        with self.changed:
            self.next_seq += n

    def register(self, sub: Subscription) -> None:
        """Start ``sub`` at the head (the caller holds the engine lock: no event slips between
        its view and its cursor)."""
        with self.changed:
            if not self.subs:
                self.window = (self.next_seq, [])
            sub.cursor = self.next_seq
            self.subs[sub.id] = sub

    def leave(self, sub: Subscription) -> None:
        """Forget ``sub``. Only the writer trims a window others still read; once no one is
        left, the entries and the decoded events are let go (the next registration starts a
        fresh window; a relation's feed lives as long as the relation)."""
        with self.changed:
            self.subs.pop(sub.id, None)
            if not self.subs:
                self.window = (self.next_seq, [])
                with self._cache_lock:
                    self._events, self._bulk, self._progress = {}, {}, None
                    self._cache_bytes = self._bulk_bytes = 0
            self.loops.forget_closed()
            release(sub.wake)

    def close(self, dropped_as: str | None = None) -> None:
        """End the feed: its subscribers' reads raise EngineClosed, or with ``dropped_as`` (the
        relation was dropped) UnknownRelation, rather than waiting for events that never come."""
        with self.changed:
            self.dropped_as = dropped_as
            self.closed = True
            # every subscriber, not only the relay's sleepers: one whose wake-up was cut short
            # (Ctrl-C in a writer) sleeps outside the relay
            for sub in [*self.relay.everyone(), *self.subs.values()]:
                release(sub.wake)
            self.loops.poke()
            self.bells.ring()

    def oldest_lsn(self) -> int | None:
        """The LSN of the oldest event a subscriber has yet to read: the WAL is kept from there."""
        with self.changed:
            base, items = self.window
            low = min((s.cursor for s in self.subs.values()), default=self.next_seq)
            return items[low - base][1] if low - base < len(items) else None

    def event(self, lsn: int, version: int, written: int, load: Loader) -> FeedEvent:
        """The UPDATES event of the record at ``lsn`` (written under schema ``written``, -1: not
        known, delivered in schema ``version``): decoded once and shared while the cache holds
        it, read again from the WAL after. Subscribers woken together miss the same record
        together: the first decodes it and the others wait for it (each decoding its own copy
        cost every one of them the interpreter lock for the read and the decode)."""
        got = self._events.get(lsn)
        if got is not None:
            return got
        with self._load_lock:
            got = self._events.get(lsn)
            if got is not None:
                return got
            return self._keep(lsn, load(lsn, version, written))

    def events(self, items: list[tuple[str, int, int, int]], version: int, load: Loader,
               load_many: ManyLoader | None) -> list[FeedEvent]:
        """The UPDATES events of ``items`` (feed entries of one schema, delivered in ``version``),
        those the cache no longer holds decoded together by ``load_many``. Why: a subscriber
        catching up took each record alone, several pyarrow calls a record, and beside busy
        threads each call waits for the interpreter lock again (3,000 records of 16 columns beside
        four busy threads: 6.8 s, now 0.75 s)."""
        got = [self._events.get(item[1]) for item in items]
        if load_many is None or sum(g is None for g in got) < 2:
            return [g if g is not None else self.event(item[1], version, item[3], load)
                    for item, g in zip(items, got, strict=True)]
        with self._load_lock:
            got = [self._events.get(item[1]) for item in items]
            missing = [(item[1], item[3]) for item, g in zip(items, got, strict=True) if g is None]
            self.long_decode = len(missing) > _TAKE_FIRST
            try:
                made = iter([self._keep(lsn, table, size) for (lsn, _w), (table, size) in
                             zip(missing, load_many(missing, version), strict=True)])
            finally:
                self.long_decode = False
        return [g if g is not None else next(made) for g in got]

    def _keep(self, lsn: int, table: pa.Table, size: int | None = None) -> FeedEvent:
        """The event of the record at ``lsn`` (``table``, its rows; ``size``, its bytes when
        known), kept in the cache."""
        got = FeedEvent(UPDATES, int(table.column("time")[0].as_py()) if table.num_rows else 0, table)
        if size is not None:
            got.encoded(_NBYTES, lambda: size)
        with self._cache_lock:
            self._events[lsn] = got
            self._cache_bytes += _nbytes(got)
            while len(self._events) > 1 and (self._cache_bytes > self._cache_limit or len(self._events) > CACHE_EVENTS):
                old = self._events.pop(next(iter(self._events)))
                self._cache_bytes -= _nbytes(old)
        return got

    def progress(self, lsn: int, time: int) -> FeedEvent:
        """The PROGRESS event of the record at ``lsn``: the latest one is shared by the
        subscribers that take it (woken together, they mostly do), not made once each."""
        got = self._progress
        if got is None or got[0] != lsn or got[1].time != time:
            got = self._progress = (lsn, FeedEvent(PROGRESS, time))
        return got[1]

    def bulk(self, start: int, end: int, events: Callable[[], list[FeedEvent]]) -> FeedEvent:
        """One UPDATES event for events ``start`` to ``end`` (seqs, consecutive updates of one
        schema), shared by the subscribers that catch up over the same range: the relay wakes
        subscribers that slept at the same head, so they mostly take the same range. The
        merged events kept hold at most a quarter of the cache's bytes (they keep their
        records' tables alive), and are at most ``BULK_EVENTS``."""
        key = (start, end)
        got = self._bulk.get(key)
        if got is not None:
            return got
        parts = events()
        got = FeedEvent(UPDATES, parts[0].time, pa.concat_tables([e.table for e in parts]), records=end - start)
        size, limit = sum(map(_nbytes, parts)), self._cache_limit // 4  # a merged table's nbytes costs ms
        got.encoded(_NBYTES, lambda: size)
        if size > limit:
            return got
        with self._cache_lock:
            kept = self._bulk.setdefault(key, got)
            if kept is got:
                self._bulk_bytes += size
                while self._bulk_bytes > limit or len(self._bulk) > BULK_EVENTS:
                    old = self._bulk.pop(next(iter(self._bulk)))
                    self._bulk_bytes -= _nbytes(old)
        return kept


def _nbytes(event: FeedEvent) -> int:
    """The bytes of an UPDATES event's table, counted once per event."""
    return event.encoded(_NBYTES, lambda: event.table.nbytes if event.table is not None else 0)


def resume_advice(last_progress: int | None, as_of: int | None) -> str:
    """How a dropped subscriber resumes without losing updates: from the last progress it
    read, else from the time its subscription started at (its snapshot's), never from the
    current frontier (``as_of=None``), which would skip the updates in between."""
    if last_progress is not None:
        return (f"subscribe again with as_of={last_progress} and resume=True after dropping the updates "
                "received since that progress")
    if as_of is not None:
        return (f"no progress was read: subscribe again with as_of={as_of} (the time this subscription started "
                "at) and resume=True after dropping every update received")
    return ("no progress was read: subscribe again with resume=True and as_of = the time this subscription "
            "started at (the sealed frontier when it subscribed) after dropping every update received")


class Subscription(WaitingIterator[FeedEvent], AsyncIterating):
    """An iterator of FeedEvents, also asynchronous (``async for``, :meth:`next_async`: read
it from one thread or one event loop). Created by ``Engine.subscribe``; close it when done."""

    _ids = 0
    _ids_lock = threading.Lock()

    def __init__(self, feed: FeedLog, initial: list[FeedEvent],
                 load: Loader, engine_open: Callable[[], bool], *,
                 name: str = "", max_lag: int | None = None, load_many: ManyLoader | None = None):
        with Subscription._ids_lock:
            Subscription._ids += 1
            self.id = Subscription._ids
        self._feed = feed
        self._pending = deque(initial)
        self._load = load
        self._load_many = load_many
        self._engine_open = engine_open
        self._name = name
        self._closed = False
        self.max_lag = MAX_LAG if max_lag is None else max_lag
        self.cursor = 0
        self.dropped_at: int | None = None
        self.wake = threading.Lock()
        self.wake.acquire()
        self.sleeping = False  # set before it joins the feed's sleepers; cleared by whoever wakes it
        self.direct = False  # asleep on the main thread: woken on its own, never in the relay's chain
        self.last_progress: int | None = None
        self.as_of: int | None = None
        self.seat = Seat(feed.loops)  # its place among the sleepers of the event loop it is read in
        feed.register(self)

    def add_initial(self, events: list[FeedEvent], as_of: int | None = None) -> None:
        """Events that come before any the feed delivers: the snapshot and stored updates,
        computed after the subscription registered its cursor; ``as_of``, the time they
        start from, is where a subscriber dropped before any progress resumes."""
        self.as_of = as_of
        self._pending.extend(events)

    def next(self, timeout: float | None = None) -> FeedEvent | None:
        """The next event, waiting up to ``timeout`` seconds (None: forever). Returns None
        on timeout or once the subscription is closed."""
        if self._pending and self._initial_due():
            return self._note(self._pending.popleft())
        feed = self._feed
        deadline = None if timeout is None else _time.monotonic() + timeout
        while True:
            got = self._poll(feed)
            if got is not False:
                return None if got is True else got
            if deadline is not None and deadline - _time.monotonic() <= 0:
                return None
            self.sleeping = True
            self.direct = on_main_thread()
            (feed.relay.direct if self.direct else feed.relay.pending).append(self)  # then look again
            base, items = feed.window
            wait = -1 if deadline is None else deadline - _time.monotonic()
            if self.cursor - base >= len(items) and not self._closed and self.dropped_at is None \
                    and not feed.closed and (deadline is None or wait > 0):  # a close wakes only the sleepers it saw
                woken = carry = False
                try:
                    for part in wait_slices(None if wait < 0 else wait):  # Ctrl-C ends it (sediment/interrupts.py)
                        if self.wake.acquire(timeout=-1 if part is None else part):
                            woken = True
                            break
                    carry = woken and feed.next_seq - self.cursor <= _TAKE_FIRST and not feed.long_decode
                finally:
                    if not carry:
                        feed.settle(self, forget=not woken)
                if carry:  # near the head: take first, so the next sleeper finds the event decoded
                    try:
                        got = self._poll(feed)
                    finally:
                        feed.settle(self)
                    if got is not False:
                        return None if got is True else got
                continue
            feed.settle(self, forget=deadline is not None and wait <= 0)
            if deadline is not None and wait <= 0 and self.cursor - base >= len(items):
                return None

    async def next_async(self, timeout: float | None = None) -> FeedEvent | None:
        """:meth:`next` for asyncio: the task sleeps as a future of its event loop, which the
        feed wakes once per batch of events for all its sleeping subscriptions (see
        :mod:`sediment.engine.feed_async`). Returns None on timeout or once closed; raises
        FeedOverrun and EngineClosed as :meth:`next` does. Cancelling the awaiting task
        leaves the subscription as it was: read or close it after."""
        if self._pending and self._initial_due():
            return self._note(self._pending.popleft())
        feed = self._feed
        loop = deadline = None
        while True:
            got = self._poll(feed)
            if got is not False:
                return None if got is True else got
            if loop is None:
                loop = asyncio.get_running_loop()
                deadline = None if timeout is None else loop.time() + timeout
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return None
            fut = self.seat.waiters_in(loop).sleep()  # then look again: an event may have come meanwhile
            base, items = feed.window
            if self.cursor - base < len(items) or self._closed or self.dropped_at is not None \
                    or feed.closed or not self._engine_open():
                continue
            await doze(fut, left)

    def _initial_due(self) -> bool:
        """Whether an initial event still queued is read: not once this subscription is
        closed (the read returns None); once the engine is closed, the relation dropped or
        this subscriber dropped, the read raises as for the live events (and as a remote
        subscription's does)."""
        if self._closed:
            return False
        self._check_live(self._feed)
        return True

    def _poll(self, feed: FeedLog) -> FeedEvent | bool:
        """The next event if the feed has one for this subscriber; True once closed, False if
        there is none yet. Raises FeedOverrun, UnknownRelation (dropped) or EngineClosed."""
        while True:
            if self._closed:
                return True
            self._check_live(feed)
            base, items = feed.window
            if self.cursor >= base:  # else trimmed past: dropped, as the next look says
                break
        return self._take(items, self.cursor - base) if self.cursor - base < len(items) else False

    def _check_live(self, feed: FeedLog) -> None:
        if self.dropped_at is not None:
            raise FeedOverrun(
                f"the feed of {self._name!r} dropped this subscriber: it fell more than {self.max_lag} events "
                f"behind (at event {self.dropped_at}); {resume_advice(self.last_progress, self.as_of)}")
        if feed.dropped_as is not None:
            raise UnknownRelation(f"relation {feed.dropped_as!r} was dropped under this subscription; its feed has "
                                  "ended (subscribe again once the relation exists)")
        if not self._engine_open() or feed.closed:
            raise EngineClosed("the engine was closed; subscribe again after reopening it")

    def _take(self, items: list[tuple[str, int, int, int]], i: int) -> FeedEvent:
        kind, lsn, t, written = items[i]
        if kind == PROGRESS:
            self.cursor += 1
            return self._note(self._feed.progress(lsn, t))
        if kind == SCHEMA:
            self.cursor += 1
            return FeedEvent(SCHEMA, t, self._load(-1, t, t))
        end = i + 1
        stop = min(len(items), i + _MAX_BATCHED)
        while end < stop and items[end][0] == UPDATES and items[end][2] == t:  # catch up in bulk, one schema
            end += 1
        feed = self._feed
        if end == i + 1:
            event = feed.event(lsn, t, written, self._load)
        else:
            event = feed.bulk(self.cursor, self.cursor + end - i,
                              lambda: feed.events(items[i:end], t, self._load, self._load_many))
        self.cursor += end - i  # after the read: the WAL is kept until the cursor passes
        return event

    def _note(self, event: FeedEvent) -> FeedEvent:
        if event.kind == PROGRESS:
            self.last_progress = event.time
        return event

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def lag(self) -> int:
        """Events written but not yet read by this subscriber."""
        return self._feed.next_seq - self.cursor

    def close(self) -> None:
        """Stop reading (from any thread): a waiting ``next`` or ``next_async`` returns None."""
        self._closed = True
        self._feed.leave(self)
        self.seat.close()
        self._feed.bells.ring()

    def hang(self, bell: Bell) -> None:
        """Ring ``bell`` at this subscription's next event, close or drop (and maybe at
        other subscribers' closes: a sleeper looks before it sleeps again)."""
        self._feed.bells.hang(bell)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
