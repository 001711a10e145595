"""The client's side of shared feed streams (see :mod:`sediment.net.shared_feeds`).

A client's subscriptions to one relation share one Flight stream: the first opens it
(``feed_share``), the next ones join it (``feed_join``), and one thread per stream reads
it, decodes each event once and hands it to the queue of every subscription it names,
then wakes their reader threads through a relay (engine/feed_relay.py): a few at a time,
each waking the next once it has the event, where waking them all at once had every one
of them wait for the interpreter lock together (docs/benchmarks.md, "Feed latency").
Each subscription is the server's own engine subscription, so it has its own snapshot,
position and ``max_lag``; closing one (``feed_leave``) leaves the others running, and the
last one to close, or to be ended by the server (its relation dropped), cancels the stream,
which the client then forgets. A stream that breaks ends every subscription on it
with a typed error. Subscriptions read from asyncio (``async for``, ``await
sub.next_async(timeout)``) sleep in their event loop: after each event the reading thread
wakes each loop once for all its sleepers (:mod:`sediment.net.async_reads`). A server that
predates the op gets each subscription a stream of its own
(:class:`~sediment.net.remote_subscription.RemoteSubscription`).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from itertools import count
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from sediment.arrow_codec import StreamDecoder, table_from_ipc
from sediment.engine.feed_async import AsyncIterating, Loops, Seat
from sediment.engine.feed_relay import Relay, RelayQueue
from sediment.errors import CoordinatorUnavailable, EngineClosed, SedimentError, ServerError
from sediment.interrupts import WaitingIterator
from sediment.net.async_reads import NOTHING, wait_item_async
from sediment.net.messages import Action, Get
from sediment.net.protocol import event_records
from sediment.net.remote_subscription import MAX_QUEUED, ClientFeedEnd, check_due, wait_item
from sediment.net.shared_feeds import SHARE_VERSION
from sediment.net.wire_errors import error_from_detail, error_line, typed_error

_END = object()
LEAVE_SECONDS = 5.0  # the most a subscription's close waits for the server to take it off the stream
_AGAIN = object()  # an overrun seen: look again, which raises it


def decode_event(meta: dict[str, Any], data: list[pa.RecordBatch],
                 decode: Callable[[pa.Buffer], pa.Table] = table_from_ipc) -> Any:
    """A shared stream's event (its messages' batches, ``meta`` the last one's) as the
    engine's FeedEvent; ``decode`` reads one IPC part (a stream's :class:`StreamDecoder`)."""
    from sediment.engine.feed import FeedEvent

    kind, t = meta["kind"], meta["time"]
    if kind == "progress":
        return FeedEvent(kind, t)
    tables = [decode(part.as_buffer()) for batch in data for part in batch.column(0)]
    return FeedEvent(kind, t, tables[0] if len(tables) == 1 else pa.concat_tables(tables),
                     records=event_records(meta))


class SharedSubscription(ClientFeedEnd, WaitingIterator[Any], AsyncIterating):
    """One subscription on a shared stream, used like the engine's Subscription: an iterator
    of ``FeedEvent``; ``next(timeout)``; ``last_progress``; close it when done; also
    asynchronous (``async for``, :meth:`next_async`). When the server stops, ``next`` raises
    EngineClosed; when the connection breaks, CoordinatorUnavailable (subscribe again, with
    ``resume``). Read it from one thread or one event loop at a time.

    Its events wait in its own queue in the client: more than ``max_lag`` live events
    waiting there (a reader that stopped reading) drops it with FeedOverrun, with the same
    rule as the engine's: its initial events do not count, an event merged from several
    feed entries counts as that many, the check runs every :data:`CHECK_EVERY` live
    events, and the error names the last progress read (before
    any, the time it started at)."""

    def __init__(self, stream: SharedStream, sid: str, max_lag: int | None, as_of: int | None = None) -> None:
        self.id = sid
        self._as_of = as_of
        self._stream = stream
        self._relation = stream.relation
        self._queue = RelayQueue(stream.relay)
        self._max_lag = MAX_QUEUED if max_lag is None else max_lag
        self._closed = False
        self._dropped = False
        self._overrun = False
        self._pushed = 0  # live events queued (the reader's count) ...
        self._taken = 0  # ... and read (the subscriber's): their difference is its lag
        self._failure: BaseException | None = None
        self._seat = Seat(stream.loops)
        self.last_progress: int | None = None

    @property
    def stream(self) -> SharedStream:
        """The shared stream it is on."""
        return self._stream

    def push(self, item: Any, initial: bool = False) -> None:
        """Queue an event (``initial``: one of its snapshot, stored updates and first progress)
        or the error that ends this subscription (the stream's reader calls it). An event
        wakes a reader thread through the stream's relay, which the reader starts once the
        event is queued for every subscription it is for; an error wakes it at once."""
        if self._dropped:
            return
        if isinstance(item, BaseException):  # raised by every read from now on, queued events or not
            self._dropped = True
            self._failure = item
            self._queue.put(item)
            return
        if not initial:
            before = self._pushed
            self._pushed += item.records
            if check_due(before, self._pushed) and self._pushed - self._taken > self._max_lag:
                self._dropped = self._overrun = True
                self._queue.put(_END)  # wakes a waiting reader, which raises FeedOverrun
                threading.Thread(target=self._stream.leave, args=(self.id,), name="sediment-feed-leave",
                                 daemon=True).start()  # not on the reader thread: the others go on meanwhile
                return
        self._queue.put_quiet((item, initial))

    def next(self, timeout: float | None = None) -> Any:
        """The next event, waiting up to ``timeout`` seconds (None: forever). Returns None on
        timeout or once the subscription is closed."""
        if not self._open():
            return None
        got = self._took(wait_item(self._queue, timeout, lambda: self._closed))
        return self.next(0) if got is _AGAIN else got

    async def next_async(self, timeout: float | None = None) -> Any:
        """:meth:`next` for asyncio: the task sleeps in its event loop, which the stream's
        reading thread wakes once per event for all its sleepers. Returns None on timeout or
        once closed; raises as :meth:`next` does. Cancelling the awaiting task leaves the
        subscription as it was."""
        if not self._open():
            return None
        got = self._took(await wait_item_async(self._queue, self._seat, timeout, lambda: self._closed))
        return self.next(0) if got is _AGAIN else got

    def _took(self, item: Any) -> Any:
        """What a read of the queue returns for ``item``: the event, None, _AGAIN (dropped for
        an overrun: look again), or the error raised."""
        if item is _END or item is NOTHING:
            return _AGAIN if self._overrun and not self._closed else None
        if isinstance(item, BaseException):
            self._failure = item
            raise item
        item, initial = item
        if not initial:
            self._taken += item.records
        if item.kind == "progress":
            self.last_progress = item.time
        elif item.kind == "snapshot":
            self._as_of = item.time
        return item

    def close(self) -> None:
        """Stop this subscription (the others on the stream go on); idempotent."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_END)
        self._seat.close()
        self._stream.leave(self.id)

    def __enter__(self) -> SharedSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SharedStream:
    """One shared stream of a relation and the subscriptions on it. ``get(op, **fields)``
    opens a do_get stream; ``action(op, **fields)`` runs an action (raising typed errors)."""

    _sids = count(1)

    def __init__(self, uri: str, relation: str, get: Callable[..., flight.FlightStreamReader],
                 action: Callable[..., Any], on_end: Callable[[SharedStream], None] = lambda _s: None) -> None:
        self.uri = uri
        self.relation = relation
        self.id = uuid.uuid4().hex
        self._get = get
        self._action = action
        self._on_end = on_end  # told once it has ended (outside its lock): its client forgets it
        self._lock = threading.Lock()
        self._subs: dict[str, SharedSubscription] = {}
        self._reader: flight.FlightStreamReader | None = None
        self._closed_by: BaseException | None = None  # the error for its subscriptions once the client closed
        self.loops = Loops()  # event loops its subscriptions are read in
        self.relay = Relay()  # its subscriptions' reader threads asleep (engine/feed_relay.py)
        self.ended = False

    def add(self, as_of: int | None, resume: bool, max_lag: int | None) -> SharedSubscription | None:
        """A new subscription on this stream (opening it for the first); None when the stream
        has ended meanwhile (use a new one)."""
        sub = SharedSubscription(self, str(next(SharedStream._sids)), max_lag, as_of)
        with self._lock:
            if self.ended:
                return None
            self._subs[sub.id] = sub
            opening = self._reader is None
        args = {"stream": self.id, "sub": sub.id, "as_of": as_of, "resume": resume, "max_lag": max_lag}
        try:
            if opening:
                try:
                    reader = self._get(Get.FEED_SHARE, relation=self.relation, version=SHARE_VERSION, **args)
                except flight.FlightError as exc:
                    raise typed_error(exc) from None
                self._reader = reader
                threading.Thread(target=self._pump, args=(reader,), name="sediment-shared-feed", daemon=True).start()
            else:
                self._join(args)
        except BaseException:
            with self._lock:
                self._subs.pop(sub.id, None)
                if opening:
                    self.ended = True
            if opening:
                self._on_end(self)
            raise
        return sub

    def _join(self, args: dict[str, Any]) -> None:
        """``feed_join``; when it fails here (a deadline, Ctrl-C, a lost answer) the server may
        still finish it, so a ``feed_leave`` for it follows, lest it serve an orphan."""
        try:
            self._action(Action.FEED_JOIN, **args)
        except BaseException:
            try:
                self._action(Action.FEED_LEAVE, within=LEAVE_SECONDS, stream=self.id, sub=args["sub"])
            except Exception:  # noqa: BLE001 - best effort: the stream's end releases it anyway
                pass
            raise

    def leave(self, sid: str) -> None:
        """Take subscription ``sid`` off the stream; the last one cancels the stream. The
        ``feed_leave`` waits at most :data:`LEAVE_SECONDS` (a paused server): past it, the
        server goes on sending that subscription's events, which the reader drops, until the
        stream ends."""
        with self._lock:
            if self._subs.pop(sid, None) is None or self.ended:
                return
            last = not self._subs
            if last:
                self.ended = True
            reader = self._reader
        if last:
            self._on_end(self)
            if reader is not None:
                reader.cancel()
            return
        try:
            self._action(Action.FEED_LEAVE, within=LEAVE_SECONDS, stream=self.id, sub=sid)
        except Exception:  # noqa: BLE001 - the stream is gone: the server ended that subscription with it
            pass

    def close(self, why: BaseException) -> None:
        """End the stream and every subscription on it with ``why`` (the client is closing)."""
        with self._lock:
            self._closed_by = why
            reader = self._reader
        if reader is not None:
            reader.cancel()

    def _pump(self, reader: flight.FlightStreamReader) -> None:
        """Read the stream, handing each event to the subscriptions it names, until it ends."""
        failure: BaseException | None = None
        parts: list[pa.RecordBatch] = []
        decode = StreamDecoder().table
        try:
            for chunk in reader:
                meta = json.loads(chunk.app_metadata.to_pybytes())
                parts.append(chunk.data)
                if meta.get("more"):
                    continue
                data, parts = parts, []
                with self._lock:
                    subs = [s for sid in meta["subs"] if (s := self._subs.get(sid)) is not None]
                if not subs:
                    continue
                if meta["kind"] == "error":
                    self._end(subs, error_from_detail(meta.get("error")) or ServerError(
                        f"the sediment server at {self.uri} ended a feed without saying why"))
                    continue
                event, initial = decode_event(meta, data, decode), bool(meta.get("initial"))
                for sub in subs:
                    sub.push(event, initial)
                if self.relay.pending or self.relay.direct:
                    self.relay.start()
                self.loops.poke()
        except flight.FlightError as exc:
            failure = typed_error(exc)
            if not isinstance(failure, SedimentError):
                failure = CoordinatorUnavailable(f"the feed stream from {self.uri} broke ({error_line(exc)}); "
                                                 "subscribe again with as_of=<last progress> and resume=True")
        except Exception as exc:  # noqa: BLE001 - handed to every subscription on the stream
            failure = exc
            reader.cancel()  # else the server goes on sending to no one
        with self._lock:
            self.ended = True
            subs, self._subs = list(self._subs.values()), {}
            failure = self._closed_by or failure
        self._on_end(self)
        self._end(subs, failure or EngineClosed(f"the sediment server at {self.uri} ended the feed (it stopped); "
                                                "subscribe again with resume=True"))

    def _end(self, subs: list[SharedSubscription], failure: BaseException) -> None:
        """End ``subs`` with ``failure``. When that leaves the stream without subscriptions
        (the server ended the last ones: their relation was dropped, say), the stream is
        cancelled as the last one's close would have: else it stayed open, with a thread on
        each side, until the client closed, while later subscriptions opened new streams."""
        with self._lock:
            for sub in subs:
                self._subs.pop(sub.id, None)
            last = not self._subs and not self.ended
            if last:
                self.ended = True
            reader = self._reader
        for sub in subs:
            sub.push(failure)
        self.loops.poke()
        if last:
            self._on_end(self)
            if reader is not None:
                reader.cancel()


class FeedShares:
    """A client's shared streams, one per relation; ``supported`` turns False once the server
    answers that it has no ``feed_share`` op (an older server)."""

    def __init__(self, uri: str, get: Callable[..., flight.FlightStreamReader], action: Callable[..., Any]) -> None:
        self._uri = uri
        self._get = get
        self._action = action
        self._lock = threading.RLock()  # a stream that fails to open forgets itself inside subscribe
        self._streams: dict[str, SharedStream] = {}
        self.supported = True

    def subscribe(self, name: str, as_of: int | None, resume: bool,
                  max_lag: int | None) -> SharedSubscription | None:
        """A subscription on ``name``'s shared stream; None when the server lacks shared streams."""
        with self._lock:  # one at a time: a join must find its stream open
            while self.supported:
                stream = self._streams.get(name)
                if stream is None or stream.ended:
                    stream = self._streams[name] = SharedStream(self._uri, name, self._get, self._action,
                                                                self._forget)
                try:
                    sub = stream.add(as_of, resume, max_lag)
                except ValueError as exc:
                    if "unknown do_get op" not in str(exc):
                        raise
                    self.supported = False
                    return None
                if sub is not None:
                    return sub
        return None

    def _forget(self, stream: SharedStream) -> None:
        """An ended stream: no longer kept under its relation's name (a long-lived client
        subscribes to many relations over time)."""
        with self._lock:
            if self._streams.get(stream.relation) is stream:
                del self._streams[stream.relation]

    @property
    def streams(self) -> int:
        """How many shared streams are open (one per relation with subscriptions)."""
        with self._lock:
            return len(self._streams)

    def close(self) -> None:
        """End every shared stream: their subscriptions raise EngineClosed (the client closed)."""
        with self._lock:
            self.supported = False  # no new ones
            streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream.close(EngineClosed(f"the client of {self._uri} was closed; connect again and subscribe with "
                                      "resume=True"))
