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

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from sediment.errors import EngineClosed, InvalidArgument
from sediment.net.feed_streams import FeedStreams
from sediment.net.protocol import FEED_BATCH_ROWS, field
from sediment.net.wire_errors import error_detail, to_flight_error

SHARE_VERSION = 1  # the shared stream's message format (docs/formats.md "Messages")
SHARE_SCHEMA = pa.schema([("ipc", pa.large_binary())])
WAIT_SLICE = 0.05  # seconds the reader waits on one subscription before looking at new joiners
_IPC_KEY = ("shared-ipc", SHARE_VERSION)


def table_ipc(table: pa.Table | None) -> list[bytes]:
    """An event's table as Arrow IPC streams of up to FEED_BATCH_ROWS rows each (none for a
    progress event)."""
    if table is None:
        return []
    out = []
    for batch in table.to_batches(max_chunksize=FEED_BATCH_ROWS) or [None]:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            if batch is not None:
                writer.write_batch(batch)
        out.append(sink.getvalue().to_pybytes())
    return out


def share_message(meta: dict[str, Any], parts: list[bytes]) -> tuple[pa.RecordBatch, bytes]:
    """One message of a shared stream: IPC parts of the event's table as rows, ``meta`` as
    app metadata."""
    batch = pa.record_batch([pa.array(parts, pa.large_binary())], schema=SHARE_SCHEMA)
    return batch, json.dumps(meta).encode()


def share_messages(meta: dict[str, Any], parts: list[bytes]) -> Iterator[tuple[pa.RecordBatch, bytes]]:
    """An event as messages of one IPC part each (a large snapshot is not one gRPC message);
    every one but the last says ``"more": true``."""
    for part in parts[:-1]:
        yield share_message({**meta, "more": True}, [part])
    yield share_message(meta, parts[-1:])


class _Carrier:
    """An engine subscription and the subscriptions of the stream it delivers to: one at
    first; carriers that have reached the same place in the feed merge (:meth:`_Share.merge`)."""

    __slots__ = ("sub", "sids", "idle")

    def __init__(self, sub: Any, sid: str) -> None:
        self.sub = sub
        self.sids = [sid]
        self.idle = False  # it had nothing to take once: its initial events are gone


class _Share:
    """One shared stream: its relation and its carriers."""

    def __init__(self, relation: str) -> None:
        self.relation = relation
        self.carriers: list[_Carrier] = []
        self.by_sid: dict[str, _Carrier] = {}
        self.lock = threading.Lock()
        self.ended = False

    def drop(self, carrier: _Carrier) -> list[str]:
        """Take ``carrier`` off the stream (lock held); the subscriptions it delivered to."""
        if carrier in self.carriers:
            self.carriers.remove(carrier)
        for sid in carrier.sids:
            self.by_sid.pop(sid, None)
        return list(carrier.sids)

    def merge(self) -> list[Any]:
        """Merge the idle carriers at one place of the feed (same cursor, same max_lag): from
        there on they would take the same events, so one engine subscription takes them for
        all. Returns the engine subscriptions merged away (to close)."""
        merged, at = [], {}
        with self.lock:
            for carrier in list(self.carriers):
                cursor = getattr(carrier.sub, "cursor", None)
                if not carrier.idle or cursor is None:
                    continue
                key = (cursor, getattr(carrier.sub, "max_lag", None))
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
    every subscription is also held in ``streams`` so that the server's stop closes it."""

    def __init__(self, streams: FeedStreams, subscribe: Callable[[str, dict[str, Any]], Any],
                 stopped: Callable[[], bool]) -> None:
        self._streams = streams
        self._subscribe = subscribe
        self._stopped = stopped
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
                raise InvalidArgument(f"feed stream {stream!r} is already open on {where}; pick a new stream id")
            self._shares[stream] = share
        try:
            self._add(share, sid, args, where)
        except BaseException:
            with self._lock:
                self._shares.pop(stream, None)
            raise
        return flight.GeneratorStream(SHARE_SCHEMA, self._events(stream, share, context))

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
        """End subscription ``sub`` of stream ``stream`` (the others go on); idempotent."""
        stream, sid = str(field(args, "stream", "feed_leave")), str(field(args, "sub", "feed_leave"))
        with self._lock:
            share = self._shares.get(stream)
        if share is None:
            return
        with share.lock:
            carrier = share.by_sid.pop(sid, None)
            if carrier is None:
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
            taken = sid in share.by_sid
            if not share.ended and not taken:
                carrier = share.by_sid[sid] = _Carrier(sub, sid)
                share.carriers.append(carrier)
                return
        self._streams.release(sub)
        if taken:
            raise InvalidArgument(f"feed subscription id {sid!r} is already in use on this stream; pick a new one")
        raise EngineClosed(f"the feed stream on {where} ended while subscription {sid!r} joined it; subscribe again")

    def _events(self, stream: str, share: _Share, context: flight.ServerCallContext,
                ) -> Iterator[tuple[pa.RecordBatch, bytes]]:
        """Rounds of one event per carrier that has one; each distinct event goes out once,
        for every subscription of every carrier that takes it in that round."""
        try:
            while not self._stopped() and not context.is_cancelled():
                with share.lock:
                    carriers = list(share.carriers)
                if not carriers:
                    share_wait(context)
                    continue
                yield from self._round(share, carriers)
                for sub in share.merge():
                    self._streams.release(sub)
        except Exception as exc:  # noqa: BLE001 - every failure goes back typed
            raise to_flight_error(exc) from exc
        finally:
            with self._lock:
                self._shares.pop(stream, None)
            with share.lock:
                share.ended = True
                carriers, share.carriers = share.carriers, []
                share.by_sid.clear()
            for carrier in carriers:
                self._streams.release(carrier.sub)

    def _round(self, share: _Share, carriers: list[_Carrier]) -> Iterator[tuple[pa.RecordBatch, bytes]]:
        ready = [c for c in carriers if not c.idle or getattr(c.sub, "lag", 1) > 0]
        taken = [got for c in ready if (got := self._take(share, c, 0)) is not None]
        if not taken:  # all caught up: wait on one; the others take the same event at once after it
            first = self._take(share, carriers[0], WAIT_SLICE)
            if first is None:
                return
            taken = [first] + [got for c in carriers[1:] if (got := self._take(share, c, 0)) is not None]
        groups: dict[Any, tuple[Any, list[str]]] = {}
        for event, sids in taken:
            groups.setdefault(_group_key(event), (event, []))[1].extend(sids)
        for event, sids in groups.values():
            if isinstance(event, BaseException):
                detail = json.loads(error_detail(event))
                yield share_message({"kind": "error", "time": None, "subs": sids, "error": detail}, [])
                continue
            parts = table_ipc(event.table) if event.kind != "updates" else \
                event.encoded(_IPC_KEY, lambda event=event: table_ipc(event.table))
            yield from share_messages({"kind": event.kind, "time": event.time, "subs": sids}, parts)

    def _take(self, share: _Share, carrier: _Carrier, timeout: float) -> tuple[Any, list[str]] | None:
        """``carrier``'s next event, or the error that ended it (then it leaves the stream),
        with the subscriptions it goes to; None when it has none."""
        try:
            event = carrier.sub.next(timeout=timeout)
            if event is None:
                carrier.idle = True
                return None
            return event, list(carrier.sids)
        except Exception as exc:  # noqa: BLE001 - goes to that carrier's subscriptions alone
            with share.lock:
                sids = share.drop(carrier)
            self._streams.release(carrier.sub)
            return exc, sids


def _group_key(event: Any) -> Any:
    """Subscriptions that took the same event share one message: an update event is one
    object for all of them; progress and schema events are equal by kind and time."""
    if isinstance(event, BaseException) or event.kind == "updates" or event.kind == "snapshot":
        return id(event)
    return (event.kind, event.time)


def share_wait(context: flight.ServerCallContext) -> None:
    """Idle while a stream has no subscription (its last one left; the client cancels it next)."""
    threading.Event().wait(WAIT_SLICE)
