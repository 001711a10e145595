"""The server's side of shared feed streams: the subscriptions of one client to one relation
served over one Flight stream.

With a stream per subscription, every event costs the server one woken thread and one gRPC
message per subscription; with 100 subscriptions that, not the feed, bounds delivery. A
shared stream (``do_get`` op ``feed_share``) carries the events of several subscriptions
of a client: one thread reads them all and sends each event once, tagged with the ids of
the subscriptions it is for. Each subscription is still the engine's own (its snapshot,
its position, its ``max_lag``), so live events the subscriptions share go out once, while
the initial events and a lagging one's catch-up go out for that one alone. More
subscriptions join the stream with the ``feed_join`` action and leave it with
``feed_leave``; cancelling the stream ends them all.

A message is one record batch of :data:`SHARE_SCHEMA`: zero or more rows, each an Arrow
IPC stream of part of the event's table, and app metadata ``{"kind", "time", "subs"}``
(``"error"`` with the error's detail for a subscription the server ended). A schema-free
encoding, so one stream goes on across the relation's alters (see docs/formats.md).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from sediment.arrow_codec import table_to_ipc
from sediment.engine.feed_bells import Bell
from sediment.errors import EngineClosed, InvalidArgument
from sediment.net.feed_streams import FeedStreams, StartGuard
from sediment.net.protocol import FEED_BATCH_ROWS, field
from sediment.net.wire_errors import error_detail, to_flight_error

SHARE_VERSION = 1  # the shared stream's message format (docs/formats.md "Messages")
SHARE_SCHEMA = pa.schema([("ipc", pa.large_binary())])
_IPC_KEY = ("shared-batches", SHARE_VERSION)
LEFT_KEPT = 1024  # leaves of a stream remembered for a join still on its way


def table_ipc(table: pa.Table | None) -> list[bytes]:
    """An event's table as Arrow IPC streams of up to FEED_BATCH_ROWS rows each (none for a
    progress event)."""
    if table is None:
        return []
    return [table_to_ipc(table.slice(start, FEED_BATCH_ROWS))
            for start in range(0, max(table.num_rows, 1), FEED_BATCH_ROWS)]


def share_batches(parts: list[bytes]) -> list[pa.RecordBatch]:
    """An event's IPC parts as the batches of its messages, one part each (a large snapshot is
    not one gRPC message; a progress event is one batch of no rows). The same for every stream
    that sends the event, so an update's are made once (:meth:`FeedEvent.encoded`)."""
    chunks = [[part] for part in parts] or [[]]
    return [pa.record_batch([pa.array(chunk, pa.large_binary())], schema=SHARE_SCHEMA) for chunk in chunks]


def share_message(meta: dict[str, Any], batch: pa.RecordBatch) -> tuple[pa.RecordBatch, bytes]:
    """One message of a shared stream: ``batch`` (IPC parts of the event's table as rows),
    ``meta`` as app metadata."""
    return batch, json.dumps(meta).encode()


def share_messages(meta: dict[str, Any], batches: list[pa.RecordBatch]) -> Iterator[tuple[pa.RecordBatch, bytes]]:
    """An event as messages of one batch each; every one but the last says ``"more": true``."""
    for batch in batches[:-1]:
        yield share_message({**meta, "more": True}, batch)
    yield share_message(meta, batches[-1])


class _Carrier:
    """An engine subscription and the subscriptions of the stream it delivers to: one at
    first; carriers that have reached the same place in the same feed merge (:meth:`_Share.merge`)."""

    __slots__ = ("sub", "sids", "idle", "feed")

    def __init__(self, sub: Any, sid: str) -> None:
        self.sub = sub
        self.sids = [sid]
        self.idle = False  # it had nothing to take once: its initial events are gone
        self.feed = id(getattr(sub, "_feed", sub))  # cursors are positions in one feed: merge only within it


class _Share:
    """One shared stream: its relation, its carriers, and the event loop its reader waits in
    (on every carrier at once, and on joins)."""

    def __init__(self, relation: str) -> None:
        self.relation = relation
        self.carriers: list[_Carrier] = []
        self.by_sid: dict[str, _Carrier] = {}
        self.left: dict[str, None] = {}  # left before their join was done (the join is undone), oldest first
        self.lock = threading.Lock()
        self.ended = False
        self.loop = asyncio.new_event_loop()
        self.joined = asyncio.Event()
        self.ringer = Bell()  # what the reader's wait on the feeds sleeps on
        self.bell: Bell | None = None  # the ringer while the reader sleeps on it

    def wake(self) -> None:
        """A carrier joined: the reader stops waiting and takes its initial events (any thread)."""
        self.ringer.ring()
        try:
            self.loop.call_soon_threadsafe(self.joined.set)
        except RuntimeError:  # the stream ended: its loop is closed
            pass

    def drop(self, carrier: _Carrier) -> list[str]:
        """Take ``carrier`` off the stream (lock held); the subscriptions it delivered to."""
        if carrier in self.carriers:
            self.carriers.remove(carrier)
        for sid in carrier.sids:
            self.by_sid.pop(sid, None)
        return list(carrier.sids)

    def merge(self) -> list[Any]:
        """Merge the idle carriers at one place of one feed (same feed, cursor and max_lag):
        from there on they would take the same events, so one engine subscription takes them
        for all. Returns the engine subscriptions merged away (to close)."""
        merged, at = [], {}
        with self.lock:
            for carrier in list(self.carriers):
                cursor = getattr(carrier.sub, "cursor", None)
                if not carrier.idle or cursor is None:
                    continue
                key = (carrier.feed, cursor, getattr(carrier.sub, "max_lag", None))
                into = at.setdefault(key, carrier)
                if into is not carrier:
                    into.sids.extend(carrier.sids)
                    self.by_sid.update((sid, into) for sid in carrier.sids)
                    self.carriers.remove(carrier)
                    merged.append(carrier.sub)
        return merged


class SharedFeeds:
    """The shared streams a server serves, by the client's stream id. ``subscribe(name,
    args)`` makes an engine subscription from a request's ``as_of``/``resume``/``max_lag``;
    every subscription is also held in ``streams`` so that the server's stop closes it.
    ``poll``: how often (seconds) an idle stream checks that its client is still there."""

    def __init__(self, streams: FeedStreams, subscribe: Callable[[str, dict[str, Any]], Any],
                 stopped: Callable[[], bool], poll: float = 1.0) -> None:
        self._streams = streams
        self._subscribe = subscribe
        self._stopped = stopped
        self._poll = poll
        self._lock = threading.Lock()
        self._shares: dict[str, _Share] = {}

    def open(self, name: str, args: dict[str, Any], context: flight.ServerCallContext,
             where: str) -> flight.FlightDataStream:
        """A new shared stream of ``name``, with its first subscription (the ticket's ``sub``)."""
        version = args.get("version")
        if version != SHARE_VERSION:
            raise InvalidArgument(f"feed_share version {version!r} is not served here (this server speaks "
                                  f"{SHARE_VERSION}); use the subscribe op")
        stream, sid = str(field(args, "stream", "feed_share ticket")), str(field(args, "sub", "feed_share ticket"))
        share = _Share(name)
        with self._lock:
            if stream in self._shares:
                share.loop.close()
                raise InvalidArgument(f"feed stream {stream!r} is already open on {where}; pick a new stream id")
            self._shares[stream] = share
        try:
            self._add(share, sid, args, where)
        except BaseException:
            self._end(stream, share)
            raise
        guard = StartGuard(lambda: self._end(stream, share))
        return flight.GeneratorStream(SHARE_SCHEMA, self._events(stream, share, context, guard))

    def join(self, args: dict[str, Any]) -> None:
        """Add subscription ``sub`` to the open stream ``stream``: its events follow on it."""
        stream, sid = str(field(args, "stream", "feed_join")), str(field(args, "sub", "feed_join"))
        with self._lock:
            share = self._shares.get(stream)
        if share is None:
            raise EngineClosed(f"feed stream {stream!r} has ended on this server (cancelled, or the server "
                               "restarted); subscribe again")
        self._add(share, sid, args, stream)

    def leave(self, args: dict[str, Any]) -> None:
        """End subscription ``sub`` of stream ``stream`` (the others go on); idempotent. A
        leave that comes before its join is done (the client gave up on the join) undoes it."""
        stream, sid = str(field(args, "stream", "feed_leave")), str(field(args, "sub", "feed_leave"))
        with self._lock:
            share = self._shares.get(stream)
        if share is None:
            return
        with share.lock:
            carrier = share.by_sid.pop(sid, None)
            if carrier is None:  # a join not done yet, or refused, or never sent: the newest few are kept
                share.left[sid] = None
                if len(share.left) > LEFT_KEPT:
                    del share.left[next(iter(share.left))]
                return
            carrier.sids.remove(sid)
            if carrier.sids:
                return
            share.drop(carrier)
        self._streams.release(carrier.sub)

    def _add(self, share: _Share, sid: str, args: dict[str, Any], where: str) -> None:
        sub = self._subscribe(share.relation, args)
        self._streams.track(sub, where)
        with share.lock:
            taken, left = sid in share.by_sid, share.left.pop(sid, 0) is None
            if not share.ended and not taken and not left:
                carrier = share.by_sid[sid] = _Carrier(sub, sid)
                share.carriers.append(carrier)
        if not (share.ended or taken or left):
            share.wake()
            return
        self._streams.release(sub)
        if taken:
            raise InvalidArgument(f"feed subscription id {sid!r} is already in use on this stream; pick a new one")
        raise EngineClosed(f"the feed stream on {where} ended while subscription {sid!r} joined it; subscribe again")

    def _end(self, stream: str, share: _Share) -> None:
        """The stream is over: forget it and release every engine subscription it held."""
        with self._lock:
            if self._shares.get(stream) is share:
                del self._shares[stream]
        with share.lock:
            share.ended = True
            carriers, share.carriers = share.carriers, []
            share.by_sid.clear()
        for carrier in carriers:
            self._streams.release(carrier.sub)
        share.loop.close()  # nothing runs in it now: the reader never started, or is finishing

    def _events(self, stream: str, share: _Share, context: flight.ServerCallContext,
                guard: StartGuard) -> Iterator[tuple[pa.RecordBatch, bytes]]:
        """Rounds of one event per carrier that has one; each distinct event goes out once,
        for every subscription of every carrier that takes it in that round."""
        if not guard.started():
            raise to_flight_error(EngineClosed("the feed stream started after it was let go; subscribe again"))
        try:
            while not self._stopped() and not context.is_cancelled():
                yield from self._round(share)
                for sub in share.merge():
                    self._streams.release(sub)
        except Exception as exc:  # noqa: BLE001 - every failure goes back typed
            raise to_flight_error(exc) from exc
        finally:
            self._end(stream, share)

    def _round(self, share: _Share) -> Iterator[tuple[pa.RecordBatch, bytes]]:
        share.joined.clear()  # before the carriers are looked at: a join after this wakes the wait
        share.ringer.arm()
        with share.lock:
            carriers = list(share.carriers)
        ready = [c for c in carriers if not c.idle or getattr(c.sub, "lag", 1) > 0]
        taken = [got for c in ready if (got := self._take(share, c)) is not None]
        if not taken and all(callable(getattr(c.sub, "hang", None)) for c in carriers):
            taken = self._sleep_on_feeds(share, carriers)  # all caught up: one sleep on every feed and on joins
        elif not taken:  # subscriptions without a place among a feed's sleepers: a wait each
            woke = dict(share.loop.run_until_complete(_first_events(share, carriers, self._poll)))
            taken = [got for c in carriers if (got := self._settle(share, c, woke[c]) if c in woke
                                               else self._take(share, c)) is not None]
        groups: dict[Any, tuple[Any, bool, list[str]]] = {}
        for event, initial, sids in taken:
            groups.setdefault(_group_key(event, initial), (event, initial, []))[2].extend(sids)
        for event, initial, sids in groups.values():
            if isinstance(event, BaseException):
                detail = json.loads(error_detail(event))
                yield share_message({"kind": "error", "time": None, "subs": sids, "error": detail}, share_batches([])[0])
                continue
            batches = share_batches(table_ipc(event.table)) if event.kind != "updates" else \
                event.encoded(_IPC_KEY, lambda event=event: share_batches(table_ipc(event.table)))
            meta = {"kind": event.kind, "time": event.time, "subs": sids}
            if event.records != 1:
                meta["records"] = event.records
            yield from share_messages({**meta, "initial": True} if initial else meta, batches)

    def _sleep_on_feeds(self, share: _Share, carriers: list[_Carrier]) -> list[tuple[Any, bool, list[str]]]:
        """Wait up to the poll interval for any of ``carriers`` to have an event (or for a join),
        then take one from each that has one. The thread sleeps on the stream's :class:`Bell`,
        hung on each carrier's feed, which the feed's writer rings when it adds events (and a
        join, a close or a drop rings too): one futex wake-up, where sleeping in an event loop
        cost the thread about 80 us of CPU per event and stream (docs/benchmarks.md, session 26). The bell
        was armed when the round began and is hung before the carriers are looked at again,
        so an event or a join that comes meanwhile is either taken by that look or rings it."""
        share.bell = share.ringer
        try:
            for carrier in carriers:
                carrier.sub.hang(share.ringer)
            taken = self._take_each(share, carriers)
            if taken:
                return taken
            share.ringer.wait(self._poll)
        finally:
            share.bell = None
        return self._take_each(share, carriers)

    def _take_each(self, share: _Share, carriers: list[_Carrier]) -> list[tuple[Any, bool, list[str]]]:
        """An event of each carrier that has one now; a carrier whose subscription the server
        closed (it is stopping) ends with EngineClosed."""
        taken = []
        for carrier in carriers:
            got = self._take(share, carrier)
            if got is None and getattr(carrier.sub, "closed", False):
                got = self._settle(share, carrier, (_stopping(), None))
            if got is not None:
                taken.append(got)
        return taken

    def _take(self, share: _Share, carrier: _Carrier) -> tuple[Any, bool, list[str]] | None:
        """``carrier``'s next event if it has one now (see :meth:`_settle`)."""
        cursor = getattr(carrier.sub, "cursor", None)
        try:
            got: Any = carrier.sub.next(timeout=0)
        except Exception as exc:  # noqa: BLE001 - goes to that carrier's subscriptions alone
            got = exc
        return self._settle(share, carrier, (got, cursor))

    def _settle(self, share: _Share, carrier: _Carrier, got: tuple[Any, int | None],
                ) -> tuple[Any, bool, list[str]] | None:
        """The event ``carrier`` took, whether it is one of its initial events (the cursor did
        not move: the engine's max_lag does not count those, nor does the client's), and the
        subscriptions it goes to; an error ends the carrier (it leaves the stream); None: nothing."""
        event, cursor = got
        if event is None:
            carrier.idle = True
            return None
        if isinstance(event, BaseException):
            with share.lock:
                sids = [sid for sid in carrier.sids if share.by_sid.get(sid) is carrier]  # not those that left
                share.drop(carrier)
            self._streams.release(carrier.sub)
            return (event, False, sids) if sids else None
        return event, cursor is not None and cursor == getattr(carrier.sub, "cursor", None), list(carrier.sids)


async def _first_events(share: _Share, carriers: list[_Carrier], timeout: float,
                        ) -> list[tuple[_Carrier, tuple[Any, int | None]]]:
    """Wait up to ``timeout`` seconds for the first of ``carriers`` to have an event (or a
    join): one sleep for all of them, however many feeds they are on; the waits not done are
    cancelled, which leaves their subscriptions as they were. Each carrier that took one,
    with it (or its error) and its cursor before."""
    cursors = {c: getattr(c.sub, "cursor", None) for c in carriers}
    waits = {asyncio.ensure_future(c.sub.next_async()): c for c in carriers}
    joined = asyncio.ensure_future(share.joined.wait())
    await asyncio.wait([*waits, joined], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    pending = [w for w in [*waits, joined] if not w.done()]
    for w in pending:
        w.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    woke = []
    for w, carrier in waits.items():
        if w.cancelled():
            continue
        got = w.exception() or w.result()
        if got is None:  # next_async without a timeout returns None only once closed
            got = _stopping()
        woke.append((carrier, (got, cursors[carrier])))
    return woke


def _stopping() -> EngineClosed:
    """What a subscription the stopping server closed ends with."""
    return EngineClosed("the sediment server ended the feed (it is stopping): subscribe again with resume=True")


def _group_key(event: Any, initial: bool) -> Any:
    """Subscriptions that took the same event share one message: an update event is one
    object for all of them; progress and schema events are equal by kind, time and being
    initial or not."""
    if isinstance(event, BaseException) or event.kind == "updates" or event.kind == "snapshot":
        return id(event)
    return (event.kind, event.time, initial)

