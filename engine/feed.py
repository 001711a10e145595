"""Feeds: a relation's changes delivered to subscribers as they become durable.

Waltz serves each partition with a real-time feed (from an in-memory cache of
recent transactions) and a catch-up feed (from storage) for clients that fall
behind. Here every relation with subscribers keeps a *feed log*: the sequence of
its visible events (committed UPDATES records, by LSN, and progress records) in
the order they became visible. Each subscriber has a cursor into it. Writers only
append small references to the log and notify; they never wait for a subscriber.
A subscriber that keeps up gets its tables from a bounded cache of decoded recent
records (the real-time feed); one that falls behind reads the records again from
the WAL (the catch-up feed), which is kept until the slowest cursor has passed.

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
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa

from sediment.errors import EngineClosed

_MAX_BATCHED = 1024  # UPDATES records merged into one event for a subscriber that is behind
SNAPSHOT = "snapshot"
UPDATES = "updates"
PROGRESS = "progress"


@dataclass(frozen=True)
class FeedEvent:
    """``snapshot``: the relation as of ``time`` (columns + diff). ``updates``: updates
    (columns + time + diff). ``progress``: ``close time``."""

    kind: str
    time: int
    table: pa.Table | None = None


@dataclass(frozen=True, slots=True)
class _Entry:
    seq: int
    kind: str
    lsn: int  # UPDATES: the record; PROGRESS: the progress record
    time: int  # PROGRESS: t


class FeedLog:
    """One relation's visible events while it has subscribers. Guarded by its own lock
    (taken inside the engine lock by writers; readers never take the engine lock, so a
    hundred waking subscribers do not contend with appends)."""

    def __init__(self, cache_bytes: int = 64 << 20):
        self.changed = threading.Condition(threading.Lock())
        self.entries: deque[_Entry] = deque()
        self.next_seq = 0
        self.cursors: dict[int, int] = {}  # subscriber id -> next seq it will read
        self._cache: OrderedDict[int, pa.Table] = OrderedDict()  # lsn -> decoded table
        self._cache_bytes = 0
        self._cache_limit = cache_bytes
        self._cache_lock = threading.Lock()
        self.closed = False

    @property
    def active(self) -> bool:
        return bool(self.cursors)

    def add(self, kind: str, lsn: int, time: int = 0) -> None:
        """A new visible event (called under the engine lock, from the log's writer thread).
        Without subscribers only the sequence moves, without this feed's lock: cursors are
        registered under the engine lock too, so none can appear while this runs, and one
        that goes away meanwhile is handled under the lock as before."""
        if not self.cursors:
            self.next_seq += 1
            return
        with self.changed:
            if self.cursors:
                self.entries.append(_Entry(self.next_seq, kind, lsn, time))
                self.changed.notify_all()
            self.next_seq += 1

    def skip(self, n: int) -> None:
        """``n`` events that became visible before anyone could subscribe (an open's replay,
        on feeds made by that open): the sequence moves as ``n`` calls of :meth:`add` would."""
        with self.changed:
            self.next_seq += n

    def register(self, sub_id: int) -> None:
        with self.changed:
            self.cursors[sub_id] = self.next_seq

    def close(self) -> None:
        with self.changed:
            self.closed = True
            self.changed.notify_all()

    def trim(self) -> None:
        """Drop entries every cursor has passed (call with ``changed`` held)."""
        low = min(self.cursors.values(), default=self.next_seq)
        while self.entries and self.entries[0].seq < low:
            self.entries.popleft()

    def oldest_lsn(self) -> int | None:
        with self.changed:
            return self.entries[0].lsn if self.entries else None

    def cached(self, lsn: int, load: Callable[[int], pa.Table]) -> pa.Table:
        with self._cache_lock:
            table = self._cache.get(lsn)
            if table is not None:
                self._cache.move_to_end(lsn)
                return table
        table = load(lsn)
        with self._cache_lock:
            if lsn not in self._cache:
                self._cache[lsn] = table
                self._cache_bytes += table.nbytes
                while self._cache_bytes > self._cache_limit and self._cache:
                    _lsn, old = self._cache.popitem(last=False)
                    self._cache_bytes -= old.nbytes
        return table


class Subscription:
    """An iterator of FeedEvents. Created by ``Engine.subscribe``; close it when done."""

    _ids = 0
    _ids_lock = threading.Lock()

    def __init__(self, feed: FeedLog, initial: list[FeedEvent],
                 load: Callable[[int], pa.Table], engine_open: Callable[[], bool]):
        with Subscription._ids_lock:
            Subscription._ids += 1
            self.id = Subscription._ids
        self._feed = feed
        self._pending = deque(initial)
        self._load = load
        self._engine_open = engine_open
        self._closed = False
        feed.register(self.id)  # the caller holds the engine lock: no event slips between view and cursor
        self.last_progress: int | None = None

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
        with feed.changed:
            while True:
                if self._closed:
                    return None
                if not self._engine_open() or feed.closed:
                    raise EngineClosed("the engine was closed; subscribe again after reopening it")
                cursor = feed.cursors[self.id]
                if feed.entries and feed.entries[-1].seq >= cursor:
                    first = feed.entries[0].seq
                    entry = feed.entries[cursor - first]
                    taken = [entry]
                    if entry.kind == UPDATES:  # a subscriber that fell behind catches up in bulk
                        i = cursor - first + 1
                        while i < len(feed.entries) and len(taken) < _MAX_BATCHED \
                                and feed.entries[i].kind == UPDATES:
                            taken.append(feed.entries[i])
                            i += 1
                    feed.cursors[self.id] = cursor + len(taken)
                    if cursor == first:
                        feed.trim()
                    break
                if not feed.changed.wait(timeout):
                    return None
        if entry.kind == PROGRESS:
            return self._note(FeedEvent(PROGRESS, entry.time))
        tables = [feed.cached(e.lsn, self._load) for e in taken]
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
        return FeedEvent(UPDATES, int(table.column("time")[0].as_py()) if table.num_rows else 0, table)

    def _note(self, event: FeedEvent) -> FeedEvent:
        if event.kind == PROGRESS:
            self.last_progress = event.time
        return event

    @property
    def lag(self) -> int:
        """Events written but not yet read by this subscriber."""
        with self._feed.changed:
            return self._feed.next_seq - self._feed.cursors.get(self.id, self._feed.next_seq)

    def close(self) -> None:
        feed = self._feed
        with feed.changed:
            self._closed = True
            feed.cursors.pop(self.id, None)
            feed.trim()
            feed.changed.notify_all()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
