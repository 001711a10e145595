"""Feeds: a relation's changes delivered to subscribers as they become durable.

Waltz serves each partition with a real-time feed (from an in-memory cache of
recent transactions) and a catch-up feed (from storage) for clients that fall
behind. Here every relation with subscribers keeps a *feed log*: the sequence of
its visible events (committed UPDATES records, by LSN, and progress records) in
the order they became visible. Each subscriber's queue is its window of that one
log, from its cursor to the head: an event is recorded once, decoded once (a shared,
bounded cache of recent events, each a :class:`FeedEvent` that also keeps its wire
encoding once made) and handed to every subscriber as the same object.

The writer never waits for a subscriber. Appending an event costs the writer a list
append and the release of the locks of the subscribers that sleep (beyond a few, a
fan-out thread of the feed releases the rest). Subscribers read the log without a
lock. A subscriber that falls behind catches up in bulk (consecutive updates in one
event) and reads records the cache no longer holds again from the WAL, which is kept
until the slowest cursor has passed: it gets exactly the events it missed, in order,
with no repeat.

The policy for slow subscribers: each one's queue is bounded by ``max_lag`` events
(:data:`MAX_LAG` unless given to ``subscribe``). A subscriber more than that far
behind is dropped from the feed log (checked every :data:`CHECK_EVERY` events), so
neither the log's memory nor the WAL it pins grows for it; its next read raises
:class:`~sediment.errors.FeedOverrun`, which names the last progress time it
delivered. It then catches up from the trace and the log with the resume protocol
below, where consolidating through any PROGRESS(t) still gives ``snapshot(t)``.

A subscription starts with a snapshot at ``as_of``, then one UPDATES event with
every stored update after ``as_of`` (appended earlier at future times), then a
PROGRESS event for the sealed frontier, then the live events. Consolidating the
stream up to any PROGRESS(t) event gives exactly ``snapshot(t)``.

To resume after a disconnect, keep your state as of the last PROGRESS(t) you saw,
drop updates received after it, and subscribe again with ``as_of=t, resume=True``
(no snapshot is sent): nothing is lost or repeated.
"""

from __future__ import annotations

import threading
import time as _time
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from sediment.errors import EngineClosed, FeedOverrun

_MAX_BATCHED = 1024  # UPDATES records merged into one event for a subscriber that is behind
MAX_LAG = 1 << 18  # events a subscriber may fall behind before it is dropped (about 100 B each)
CHECK_EVERY = 1024  # events between checks of the subscribers' lag (and trims of the log)
_DIRECT_WAKES = 4  # sleeping subscribers the writer wakes itself; the fan-out thread wakes the rest
SNAPSHOT = "snapshot"
UPDATES = "updates"
PROGRESS = "progress"
SCHEMA = "schema"  # an alter: later updates come in the new schema (engine/schema_history.py)


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
    _memo: dict[Hashable, Any] = field(default_factory=dict, compare=False, repr=False)

    def encoded(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """``make()``, made once per event and key (two racing callers may both make it;
        both results are equal and one is kept)."""
        got = self._memo.get(key)
        if got is None:
            got = self._memo.setdefault(key, make())
        return got


class FeedLog:
    """One relation's visible events while it has subscribers.

    ``window`` is ``(seq of its first entry, entries)``, entries being ``(kind, lsn, time)``
    tuples; it is only appended to in place, and replaced whole when trimmed, so a reader
    holding an older window still reads valid entries. ``changed`` guards registration,
    trims and drops (taken inside the engine lock by writers)."""

    def __init__(self, cache_bytes: int = 64 << 20):
        self.changed = threading.Condition(threading.Lock())
        self.window: tuple[int, list[tuple[str, int, int]]] = (0, [])
        self.next_seq = 0
        self.subs: dict[int, Subscription] = {}
        self._waiting: list[threading.Lock] = []
        self._next_check = CHECK_EVERY
        self._events: dict[int, FeedEvent] = {}  # lsn -> decoded event, oldest first
        self._cache_bytes = 0
        self._cache_limit = cache_bytes
        self._cache_lock = threading.Lock()
        self._fanout: deque[list[threading.Lock]] = deque()
        self._fanout_kick = threading.Lock()
        self._fanout_kick.acquire()
        self._fanout_thread: threading.Thread | None = None
        self.closed = False

    @property
    def active(self) -> bool:
        return bool(self.subs)

    @property
    def cursors(self) -> dict[int, int]:
        """Subscriber id -> the seq of the next event it will read."""
        return {sub_id: sub.cursor for sub_id, sub in list(self.subs.items())}

    @property
    def entries(self) -> list[tuple[str, int, int]]:
        return self.window[1]

    def add(self, kind: str, lsn: int, time: int = 0) -> None:
        """A new visible event (called under the engine lock, from the log's writer thread).
        Without subscribers only the sequence moves: subscribers register under the engine
        lock too, so none can appear while this runs."""
        if not self.subs:
            self.next_seq += 1
            return
        self.window[1].append((kind, lsn, time))
        self.next_seq += 1
        if self.next_seq >= self._next_check:
            self._check()
        if self._waiting:
            self._wake()

    def _wake(self) -> None:
        waiting, self._waiting = self._waiting, []
        if len(waiting) > _DIRECT_WAKES:
            self._fanout.append(waiting[_DIRECT_WAKES:])
            waiting = waiting[:_DIRECT_WAKES]
            if self._fanout_thread is None:
                self._fanout_thread = threading.Thread(target=self._fan_out, name="sediment-feed-fanout",
                                                       daemon=True)
                self._fanout_thread.start()
            _release(self._fanout_kick)
        for lock in waiting:
            _release(lock)

    def _fan_out(self) -> None:
        """Wake the sleeping subscribers the writer handed over, off the writer's thread."""
        while not self.closed:
            self._fanout_kick.acquire()
            while self._fanout:
                for lock in self._fanout.popleft():
                    _release(lock)

    def _check(self) -> None:
        """Drop subscribers more than their ``max_lag`` behind, and trim what every cursor
        has passed."""
        self._next_check = self.next_seq + CHECK_EVERY
        with self.changed:
            for sub in [s for s in self.subs.values() if self.next_seq - s.cursor > s.max_lag]:
                sub.dropped_at = sub.cursor
                del self.subs[sub.id]
                _release(sub.wake)
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
        left, the entries are let go (the next registration starts a fresh window)."""
        with self.changed:
            self.subs.pop(sub.id, None)
            if not self.subs:
                self.window = (self.next_seq, [])
            _release(sub.wake)

    def close(self) -> None:
        with self.changed:
            self.closed = True
            for lock in self._waiting:
                _release(lock)
            _release(self._fanout_kick)

    def oldest_lsn(self) -> int | None:
        """The LSN of the oldest event a subscriber has yet to read: the WAL is kept from there."""
        with self.changed:
            base, items = self.window
            low = min((s.cursor for s in self.subs.values()), default=self.next_seq)
            return items[low - base][1] if low - base < len(items) else None

    def event(self, lsn: int, version: int, load: Callable[[int, int], pa.Table]) -> FeedEvent:
        """The UPDATES event of the record at ``lsn`` (written under schema ``version``):
        decoded once and shared while the cache holds it, read again from the WAL after."""
        got = self._events.get(lsn)
        if got is not None:
            return got
        table = load(lsn, version)
        got = FeedEvent(UPDATES, int(table.column("time")[0].as_py()) if table.num_rows else 0, table)
        with self._cache_lock:
            kept = self._events.setdefault(lsn, got)
            if kept is not got:
                return kept
            self._cache_bytes += table.nbytes
            while self._cache_bytes > self._cache_limit and len(self._events) > 1:
                old = self._events.pop(next(iter(self._events)))
                self._cache_bytes -= old.table.nbytes if old.table is not None else 0
        return got


def _release(lock: threading.Lock) -> None:
    try:
        lock.release()
    except RuntimeError:  # already released: the sleeper was woken twice
        pass


class Subscription:
    """An iterator of FeedEvents. Created by ``Engine.subscribe``; close it when done."""

    _ids = 0
    _ids_lock = threading.Lock()

    def __init__(self, feed: FeedLog, initial: list[FeedEvent],
                 load: Callable[[int, int], pa.Table], engine_open: Callable[[], bool], *,
                 name: str = "", max_lag: int | None = None):
        with Subscription._ids_lock:
            Subscription._ids += 1
            self.id = Subscription._ids
        self._feed = feed
        self._pending = deque(initial)
        self._load = load
        self._engine_open = engine_open
        self._name = name
        self._closed = False
        self.max_lag = MAX_LAG if max_lag is None else max_lag
        self.cursor = 0
        self.dropped_at: int | None = None
        self.wake = threading.Lock()
        self.wake.acquire()
        self.last_progress: int | None = None
        feed.register(self)

    def add_initial(self, events: list[FeedEvent]) -> None:
        """Events that come before any the feed delivers: the snapshot and stored updates,
        computed after the subscription registered its cursor."""
        self._pending.extend(events)

    def __iter__(self) -> Iterator[FeedEvent]:
        return self

    def __next__(self) -> FeedEvent:
        event = self.next()
        if event is None:
            raise StopIteration
        return event

    def next(self, timeout: float | None = None) -> FeedEvent | None:
        """The next event, waiting up to ``timeout`` seconds (None: forever). Returns None
        on timeout or once the subscription is closed."""
        if self._pending:
            return self._note(self._pending.popleft())
        feed = self._feed
        deadline = None if timeout is None else _time.monotonic() + timeout
        while True:
            if self._closed:
                return None
            self._check_live(feed)
            base, items = feed.window
            if self.cursor < base:
                continue  # trimmed past: dropped, as the next look says
            if self.cursor - base < len(items):
                return self._take(items, self.cursor - base)
            feed._waiting.append(self.wake)  # then look again: an event may have come meanwhile
            base, items = feed.window
            if self.cursor - base < len(items) or self._closed or self.dropped_at is not None:
                continue
            wait = -1 if deadline is None else deadline - _time.monotonic()
            if deadline is not None and wait <= 0:
                return None
            self.wake.acquire(timeout=wait)

    def _check_live(self, feed: FeedLog) -> None:
        if self.dropped_at is not None:
            raise FeedOverrun(
                f"the feed of {self._name!r} dropped this subscriber: it fell more than {self.max_lag} events "
                f"behind (at event {self.dropped_at}); subscribe again with as_of={self.last_progress} and "
                "resume=True after dropping the updates received since that progress")
        if not self._engine_open() or feed.closed:
            raise EngineClosed("the engine was closed; subscribe again after reopening it")

    def _take(self, items: list[tuple[str, int, int]], i: int) -> FeedEvent:
        kind, lsn, t = items[i]
        if kind == PROGRESS:
            self.cursor += 1
            return self._note(FeedEvent(PROGRESS, t))
        if kind == SCHEMA:
            self.cursor += 1
            return FeedEvent(SCHEMA, t, self._load(-1, t))
        end = i + 1
        stop = min(len(items), i + _MAX_BATCHED)
        while end < stop and items[end][0] == UPDATES and items[end][2] == t:  # catch up in bulk, one schema
            end += 1
        feed = self._feed
        events = [feed.event(entry[1], t, self._load) for entry in items[i:end]]
        self.cursor += end - i
        if len(events) == 1:
            return events[0]
        table = pa.concat_tables([e.table for e in events])
        return FeedEvent(UPDATES, events[0].time, table)

    def _note(self, event: FeedEvent) -> FeedEvent:
        if event.kind == PROGRESS:
            self.last_progress = event.time
        return event

    @property
    def lag(self) -> int:
        """Events written but not yet read by this subscriber."""
        return self._feed.next_seq - self.cursor

    def close(self) -> None:
        self._closed = True
        self._feed.leave(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
