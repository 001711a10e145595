"""A feed over the network: the client side of ``subscribe`` (see :mod:`sediment.net`).

A reader thread's ``next()`` reads the server's stream itself; for ``next(timeout=...)``
(and on the main thread) a thread pumps the stream into a queue so that the wait can have
a deadline, which a Flight reader's cannot; ``await next_async()`` and ``async for`` read
that queue from an event loop (:mod:`sediment.net.async_reads`). Events come out as the
engine's ``FeedEvent`` values. Across an alter it moves to the feed's next stream.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable, Generator, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from sediment import errors
from sediment.engine.feed_async import AsyncIterating, Loops, Seat
from sediment.errors import EngineClosed, FeedOverrun
from sediment.interrupts import WaitingIterator, wait_slices
from sediment.net.async_reads import NOTHING, wait_item_async
from sediment.net.protocol import event_records
from sediment.net.wire_errors import typed_error

_END = object()
MAX_QUEUED = 1 << 18  # events a subscription may have waiting in the client when it has no max_lag
CHECK_EVERY = 1024  # live events between checks of a subscription's queue against its max_lag, as the engine's


def check_due(before: int, after: int) -> bool:
    """Whether a subscription's count of live events queued, going from ``before`` to
    ``after``, passed a multiple of :data:`CHECK_EVERY`: where its max_lag check runs."""
    return after // CHECK_EVERY > before // CHECK_EVERY


def overrun_error(relation: str, max_lag: int, last_progress: int | None, as_of: int | None) -> FeedOverrun:
    """The error of a subscription dropped for more than ``max_lag`` events queued in the
    client; it resumes from its last progress, or from ``as_of`` (its snapshot's time) before any."""
    from sediment.engine.feed import resume_advice

    return FeedOverrun(f"the feed of {relation!r} dropped this subscription: more than {max_lag} events waited for "
                       f"it in the client; {resume_advice(last_progress, as_of)}")


class ClientFeedEnd:
    """How a client's subscription (shared or not) ends: closed, or failed for good (an error
    from the stream, or FeedOverrun once dropped in the client), raised by every read after."""

    _closed: bool
    _overrun: bool
    _failure: BaseException | None
    _relation: str
    _max_lag: int
    _as_of: int | None  # the time it started at: given, or its snapshot's
    last_progress: int | None

    def _open(self) -> bool:
        """False once closed; raises the error that ended the subscription."""
        if self._closed:
            return False
        if self._overrun and self._failure is None:
            self._failure = overrun_error(self._relation, self._max_lag, self.last_progress, self._as_of)
        if self._failure is not None:
            raise self._failure
        return True


def wait_item(events: queue.Queue[Any] | queue.SimpleQueue[Any], timeout: float | None,
              closed: Callable[[], bool]) -> Any:
    """The next item of ``events`` within ``timeout`` seconds (None: no limit), or NOTHING
    on timeout or once ``closed()``; on the main thread in slices, so Ctrl-C ends the wait
    (sediment/interrupts.py)."""
    try:
        return events.get_nowait()  # a zero timeout on the main thread has no slice to wait in
    except queue.Empty:
        pass
    for part in wait_slices(timeout):
        try:
            return events.get(timeout=part)
        except queue.Empty:
            if closed():
                return NOTHING
    return NOTHING


class RemoteSubscription(ClientFeedEnd, WaitingIterator[Any], AsyncIterating):
    """A feed from the server, like the engine's Subscription: an iterator of
    ``sediment.engine.feed.FeedEvent``; ``next(timeout)``; ``last_progress``; close it when
    done; also asynchronous (``async for``, :meth:`next_async`). When the server stops,
    ``next`` raises EngineClosed (subscribe again, with ``resume``, to a new one). Read it
    from one thread or one event loop at a time.

    A ``next()`` without a timeout, off the main thread (a reader thread iterating the feed),
    reads the stream itself: one thread woken per event and subscriber, where a pump thread
    handing events to the reader through a queue woke two (with 1,000 subscribers in a
    process, the wake-ups are what bound the feed). The first ``next`` with a timeout, or on
    the main thread (whose waits must let Ctrl-C through, sediment/interrupts.py), starts a
    thread that pumps the stream into a queue, and every later ``next`` reads the queue; so
    does every read from asyncio. More than ``max_lag`` live events waiting in that queue (a
    reader that stopped reading; checked every :data:`CHECK_EVERY` of them; every event but
    the initial ones the server marks counts, from the first, an event the server merged
    from several feed entries as that many) drops the subscription with
    FeedOverrun, as the server's feed would have: the pump reads the stream as fast as it
    comes, so the server never sees the lag.

    A relation's alter ends the server's stream (one Flight stream has one schema) with a
    continuation token: the feed opens the next stream of the same server-side subscription
    with it (``reopen``) and goes on in the new schema, after the ``schema`` event, with
    nothing lost or repeated."""

    def __init__(self, uri: str, reader: flight.FlightStreamReader,
                 reopen: Callable[[str], flight.FlightStreamReader] | None = None, *,
                 relation: str = "", max_lag: int | None = None, as_of: int | None = None) -> None:
        self._uri = uri
        self._relation = relation
        self._as_of = as_of
        self._max_lag = MAX_QUEUED if max_lag is None else max_lag
        self._taken = 0  # live events read from the queue
        self._past_snapshot = False  # an older server's events carry no "initial": see _initial
        self._overrun = False
        self._failure: BaseException | None = None
        self._reader = reader
        self._reopen = reopen
        self._lock = threading.Lock()
        self._events: queue.Queue[Any] = queue.Queue()
        self._closed = False
        self.last_progress: int | None = None
        self._items = self._feed_items()
        self._direct = threading.Lock()  # held while a next() reads the stream itself
        self._pumping = False  # set once the stream is read by the pump thread (or fully read)
        self._thread: threading.Thread | None = None
        self._loops = Loops()  # the event loop it is read in, if any
        self._seat = Seat(self._loops)

    def _feed_items(self) -> Iterator[Any]:
        """The feed's items in order, across schema changes: events, then the error that ended it."""
        reader: flight.FlightStreamReader | None = self._reader
        try:
            while reader is not None:
                reader = yield from self._drain(reader)
        except flight.FlightError as exc:
            if not self._closed:
                yield typed_error(exc)
        except Exception as exc:  # noqa: BLE001 - handed to the reader of the events
            if not self._closed:
                yield exc

    def _pump(self) -> None:
        pushed = 0  # live events queued (a catch-up in bulk counts its records): the initial ones do not count
        try:
            for item in self._items:
                if isinstance(item, tuple) and not item[1]:
                    before, pushed = pushed, pushed + item[0].records
                    if check_due(before, pushed) and pushed - self._taken > self._max_lag:
                        self._overrun = True
                        with self._lock:
                            self._reader.cancel()  # the server ends its subscription
                        return
                self._events.put(item)
                self._loops.poke()
        finally:
            self._events.put(_END)
            self._loops.poke()

    def _drain(self, reader: flight.FlightStreamReader) -> Generator[Any, None, flight.FlightStreamReader | None]:
        """The events of one stream, each as (event, initial); returns the next stream after
        a schema change, else None."""
        from sediment.engine.feed import FeedEvent

        parts: list[pa.RecordBatch] = []
        for chunk in reader:
            parts.append(chunk.data)
            meta = json.loads(chunk.app_metadata.to_pybytes())
            if not meta["last"]:
                continue
            table = pa.Table.from_batches(parts)
            parts = []
            kind, t = meta["kind"], meta["time"]
            if kind == "schema":
                return (yield from self._next_stream(t, meta.get("continuation")))
            initial = self._initial(kind, meta.get("initial"))
            if kind == "progress":
                yield FeedEvent(kind, t), initial
            elif kind == "snapshot":
                yield FeedEvent(kind, t, table.drop_columns(["time"])), initial
            else:
                yield FeedEvent(kind, t, table, records=event_records(meta)), initial
        if not self._closed:
            yield EngineClosed(f"the sediment server at {self._uri} ended the feed (it stopped); "
                               "subscribe again with resume=True")
        return None

    def _initial(self, kind: str, marked: bool | None) -> bool:
        """Whether an event is one of the subscription's initial events, which the max_lag
        check does not count: as the server marks it; an older server marks none, so the
        snapshot and the one event after it count as initial (at most one initial event, its
        first progress, is then counted as live: the check stays bounded)."""
        if marked is not None:
            return marked
        initial = kind == "snapshot" or not self._past_snapshot
        self._past_snapshot = self._past_snapshot or kind != "snapshot"
        return initial

    def _next_stream(self, version: int, token: str | None) -> Generator[Any, None, flight.FlightStreamReader | None]:
        """Open the stream after schema version ``version``'s event, then yield the event (an
        empty table of the new update schema, as the engine's): the caller sees it in order."""
        from sediment.engine.feed import FeedEvent

        if token is None or self._reopen is None:  # a server without continuations
            yield FeedEvent("schema", version), False
            yield errors.SchemaMismatch(f"relation altered to schema version {version}: subscribe with resume=True")
            return None
        reader = self._reopen(token)
        with self._lock:
            if self._closed:
                reader.cancel()
                return None
            self._reader = reader
        yield FeedEvent("schema", version, reader.schema.empty_table()), False
        return reader

    def next(self, timeout: float | None = None) -> Any:
        """The next event, waiting up to ``timeout`` seconds (None: forever). Returns None on
        timeout or once the subscription is closed."""
        if not self._open():
            return None
        if not self._pumping and timeout is None and threading.current_thread() is not threading.main_thread():
            with self._direct:
                if not self._pumping:
                    return self._read_directly()
        if not self._pumping and not self._start_pump(timeout):
            return None
        return self._took(wait_item(self._events, timeout, lambda: self._closed))

    async def next_async(self, timeout: float | None = None) -> Any:
        """:meth:`next` for asyncio: the task sleeps in its event loop until the pump thread
        queues the next event (see :mod:`sediment.net.async_reads`). Returns None on timeout or
        once closed; raises as :meth:`next` does. Cancelling the awaiting task leaves the
        subscription as it was."""
        if not self._open() or not self._pumping and not self._start_pump(0):
            return None  # closed, or a reader thread holds the stream (read from one place at a time)
        return self._took(await wait_item_async(self._events, self._seat, timeout, lambda: self._closed))

    def _took(self, item: Any) -> Any:
        """What a read of the queue returns for ``item``: the event, None, or the error raised."""
        if item is NOTHING:
            return None
        if item is _END:
            self._events.put(_END)  # for the next call too
            self._open()  # raises FeedOverrun when that is why the stream ended
            return None
        if isinstance(item, BaseException):
            self._fail(item)
        event, initial = item
        if not initial:
            self._taken += event.records
        return self._note(event)

    def _read_directly(self) -> Any:
        """The next item read from the stream in the caller's thread (``_direct`` held). At the
        feed's end, or its error, the calls after read the queue (its end)."""
        item = next(self._items, _END)
        if self._closed:
            return None
        if item is _END or isinstance(item, BaseException):
            self._events.put(_END)
            self._pumping = True  # nothing is left to pump: later calls read what is queued
            if item is _END:
                self._open()  # raises why it was ended, if it was
                return None
            self._fail(item)
        return self._note(item[0])

    def _fail(self, error: BaseException) -> None:
        """Raise the error that ended the feed, again on every later call: the first one (a
        feed ended by its client's close sees the stream's cancellation after)."""
        with self._lock:
            if self._failure is None:
                self._failure = error
        raise self._failure

    def _note(self, event: Any) -> Any:
        if event.kind == "progress":
            self.last_progress = event.time
        elif event.kind == "snapshot":
            self._as_of = event.time
        return event

    def _start_pump(self, timeout: float | None) -> bool:
        """Start the thread that pumps the stream into the queue (once); False if a direct read
        held the stream past ``timeout``."""
        if not self._direct.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            return False
        try:
            if not self._pumping:
                self._thread = threading.Thread(target=self._pump, name="sediment-feed", daemon=True)
                self._thread.start()
                self._pumping = True
        finally:
            self._direct.release()
        return True

    def end(self, why: BaseException) -> None:
        """End the feed with ``why`` (its client is closing): a read waiting now, from a
        thread or a task, and every read after raise it; the server ends its side."""
        with self._lock:
            if self._closed or self._failure is not None:
                return
            self._failure = why
            reader = self._reader
        self._events.put(_END)  # wakes a read of the queue, which then raises it
        self._loops.poke()
        reader.cancel()  # ends a read of the stream itself, and the pump

    def close(self) -> None:
        """Stop the feed (the server ends its side); idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            reader = self._reader
        self._seat.close()
        reader.cancel()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> RemoteSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
