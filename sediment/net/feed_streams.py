"""The server's side of feeds: an engine subscription served as Flight streams.

One Flight stream carries one schema, while a feed goes on across a relation's alters.
So the stream of a feed ends at each ``schema`` event, whose app metadata carries a
``continuation`` token; the subscription itself stays open on the server, parked under that
token, and the client's next ``subscribe`` ticket with the token gets a new stream of the
same subscription in the new schema. Nothing is computed again, so the events after the
alter come exactly once and in order. A parked subscription the client does not take up
within :data:`PARK_SECONDS` is closed (its cursor would otherwise pin the feed log and WAL).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from sediment.errors import EngineClosed, FeedOverrun
from sediment.net.protocol import event_batches
from sediment.net.wire_errors import to_flight_error

PARK_SECONDS = 60.0  # how long a feed's subscription waits, after a schema change, for its client to reopen it
START_SECONDS = 5.0  # how long a stream's subscription waits for gRPC to start the stream before it is let go


class StartGuard:
    """Releases what a returned stream holds if gRPC never starts it (its call was cancelled
    before the handler returned): a generator that never ran never runs its ``finally``, and
    its engine subscription would pin the WAL until the server stops."""

    def __init__(self, abandon: Callable[[], None], seconds: float = START_SECONDS) -> None:
        self._abandon = abandon
        self._lock = threading.Lock()
        self._state = ""
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def started(self) -> bool:
        """The stream started (its generator's first step); False when it was let go already."""
        if not self._settle("started"):
            return False
        self._timer.cancel()
        return True

    def _expire(self) -> None:
        if self._settle("expired"):
            self._abandon()

    def _settle(self, state: str) -> bool:
        """Whether this call decided the stream's fate (started or let go): only the first does."""
        with self._lock:
            if self._state:
                return False
            self._state = state
            return True


class FeedStreams:
    """The subscriptions a server streams or holds parked. ``stopped()`` says the server is
    stopping; ``poll`` is how often (seconds) a stream checks that its client is still there."""

    def __init__(self, stopped: Callable[[], bool], poll: float, park_seconds: float = PARK_SECONDS) -> None:
        self._stopped = stopped
        self._poll = poll
        self._park_seconds = park_seconds
        self._lock = threading.Lock()
        self.changed = threading.Condition(self._lock)
        self._open: set[Any] = set()
        self._parked: dict[str, tuple[Any, pa.Schema, threading.Timer]] = {}
        self._closed = False

    def stream(self, sub: Any, schema: pa.Schema, context: flight.ServerCallContext,
               where: str) -> flight.FlightDataStream:
        """A stream of ``sub``'s events in ``schema``; EngineClosed (``sub`` closed) once the
        server stops."""
        self.track(sub, where)
        guard = StartGuard(lambda: self.release(sub))
        return flight.GeneratorStream(schema, self._events(sub, schema, context, guard))

    def track(self, sub: Any, where: str) -> None:
        """Hold ``sub`` among the open subscriptions (closed when the server stops); closes it
        and raises EngineClosed when the server is stopping."""
        with self._lock:
            if self._closed:
                sub.close()
                raise EngineClosed(f"the sediment server on {where} is stopping")
            self._open.add(sub)

    def take(self, token: str) -> tuple[Any, pa.Schema]:
        """The subscription parked under ``token`` and its new stream schema."""
        with self._lock:
            got = self._parked.pop(token, None)
        if got is None:
            raise FeedOverrun(f"no feed waits under continuation {token!r}: it was not taken up within "
                              f"{self._park_seconds:g} s of its schema change, or the server restarted; subscribe "
                              "again with as_of = the last progress time seen and resume=True")
        sub, schema, timer = got
        timer.cancel()
        return sub, schema

    def _park(self, sub: Any, schema: pa.Schema) -> str:
        token = uuid.uuid4().hex
        timer = threading.Timer(self._park_seconds, self._expire, (token,))
        timer.daemon = True
        with self._lock:
            if self._closed:
                raise EngineClosed("the sediment server stopped while a feed crossed a schema change; subscribe "
                                   "again with as_of = the last progress time seen and resume=True")
            self._parked[token] = (sub, schema, timer)
        timer.start()
        return token

    def _expire(self, token: str) -> None:
        with self._lock:
            got = self._parked.pop(token, None)
        if got is not None:
            self.release(got[0])

    def release(self, sub: Any) -> None:
        """Close ``sub`` and stop holding it."""
        sub.close()
        with self._lock:
            self._open.discard(sub)
            self.changed.notify_all()

    def _events(self, sub: Any, schema: pa.Schema, context: flight.ServerCallContext,
                guard: StartGuard) -> Iterator[tuple[pa.RecordBatch, bytes]]:
        """``sub``'s events as batches of ``schema``, each with app metadata ``{"kind", "time",
        "last", "initial"}``; an event's table may span several batches (``last`` marks its
        end), a progress event is one empty batch; ``initial`` marks the subscription's own
        first events (snapshot, stored updates, first progress), which its client's max_lag
        check does not count. A schema event ends the stream with
        ``"continuation"`` added. Wakes every ``poll`` seconds to notice a client that went
        away, so its subscription does not pin the feed log forever."""
        if not guard.started():
            raise to_flight_error(EngineClosed("the feed stream started after its subscription was let go; "
                                               "subscribe again"))
        parked = False
        try:
            while not self._stopped() and not context.is_cancelled():
                cursor = getattr(sub, "cursor", None)
                event = sub.next(timeout=self._poll)
                if event is None:
                    continue
                if event.kind == "schema":
                    token = self._park(sub, event.table.schema)
                    parked = True
                    meta = {"kind": "schema", "time": event.time, "last": True, "initial": False,
                            "continuation": token}
                    yield pa.RecordBatch.from_pylist([], schema=schema), json.dumps(meta).encode()
                    return
                if cursor is not None and getattr(sub, "cursor", None) == cursor:  # initial: the cursor did not move
                    yield from event_batches(event, schema, initial=True)
                else:  # a live event's batches are made once for every subscriber
                    yield from event.encoded(schema, lambda event=event: event_batches(event, schema))
        except Exception as exc:  # noqa: BLE001 - every failure goes back typed
            raise to_flight_error(exc) from exc
        finally:
            if not parked:
                self.release(sub)

    def wait_released(self, timeout: float) -> bool:
        """Wait until no subscription is streamed or parked; False after ``timeout`` seconds."""
        with self.changed:
            return self.changed.wait_for(lambda: not self._open, timeout)

    def close(self) -> None:
        """Close every subscription (streams end, parked ones are dropped) and refuse new ones."""
        with self._lock:
            self._closed = True
            subs, self._open = list(self._open), set()
            parked, self._parked = list(self._parked.values()), {}
            self.changed.notify_all()
        for _sub, _schema, timer in parked:
            timer.cancel()
        for sub in subs:
            sub.close()
