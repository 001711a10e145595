"""A feed over the network: the client side of ``subscribe`` (see :mod:`sediment.net`).

A thread pumps the server's stream into a queue so that ``next(timeout=...)``
can wait with a deadline, which a Flight reader cannot; events come out as the
engine's ``FeedEvent`` values. Across an alter it moves to the feed's next stream.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from sediment import errors
from sediment.errors import EngineClosed
from sediment.interrupts import WaitingIterator, wait_slices
from sediment.net.wire_errors import typed_error

_END = object()


class RemoteSubscription(WaitingIterator[Any]):
    """A feed from the server, like the engine's Subscription: an iterator of
    ``sediment.engine.feed.FeedEvent``; ``next(timeout)``; ``last_progress``; close it when
    done. A background thread reads the stream, so ``next`` can time out; when the server
    stops, ``next`` raises EngineClosed (subscribe again, with ``resume``, to a new one).

    A relation's alter ends the server's stream (one Flight stream has one schema) with a
    continuation token: the thread opens the next stream of the same server-side
    subscription with it (``reopen``) and the feed goes on in the new schema, after the
    ``schema`` event, with nothing lost or repeated."""

    def __init__(self, uri: str, reader: flight.FlightStreamReader,
                 reopen: Callable[[str], flight.FlightStreamReader] | None = None) -> None:
        self._uri = uri
        self._reader = reader
        self._reopen = reopen
        self._lock = threading.Lock()
        self._events: queue.Queue[Any] = queue.Queue()
        self._closed = False
        self.last_progress: int | None = None
        self._thread = threading.Thread(target=self._pump, name="sediment-feed", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        reader: flight.FlightStreamReader | None = self._reader
        try:
            while reader is not None:
                reader = self._drain(reader)
        except flight.FlightError as exc:
            if not self._closed:
                self._events.put(typed_error(exc))
        except Exception as exc:  # noqa: BLE001 - handed to the reader of the events
            if not self._closed:
                self._events.put(exc)
        finally:
            self._events.put(_END)

    def _drain(self, reader: flight.FlightStreamReader) -> flight.FlightStreamReader | None:
        """Queue the events of one stream; the next stream after a schema change, else None."""
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
                return self._next_stream(t, meta.get("continuation"))
            if kind == "progress":
                self._events.put(FeedEvent(kind, t))
            elif kind == "snapshot":
                self._events.put(FeedEvent(kind, t, table.drop_columns(["time"])))
            else:
                self._events.put(FeedEvent(kind, t, table))
        if not self._closed:
            self._events.put(EngineClosed(f"the sediment server at {self._uri} ended the feed (it stopped); "
                                          "subscribe again with resume=True"))
        return None

    def _next_stream(self, version: int, token: str | None) -> flight.FlightStreamReader | None:
        """Open the stream after schema version ``version``'s event, then queue the event (an
        empty table of the new update schema, as the engine's): the caller sees it in order."""
        from sediment.engine.feed import FeedEvent

        if token is None or self._reopen is None:  # a server without continuations
            self._events.put(FeedEvent("schema", version))
            self._events.put(errors.SchemaMismatch(
                f"relation altered to schema version {version}: subscribe with resume=True"))
            return None
        reader = self._reopen(token)
        with self._lock:
            if self._closed:
                reader.cancel()
                return None
            self._reader = reader
        self._events.put(FeedEvent("schema", version, reader.schema.empty_table()))
        return reader

    def next(self, timeout: float | None = None) -> Any:
        """The next event, waiting up to ``timeout`` seconds (None: forever). Returns None on
        timeout or once the subscription is closed."""
        if self._closed:
            return None
        for part in wait_slices(timeout):  # Ctrl-C ends it (sediment/interrupts.py)
            try:
                item = self._events.get(timeout=part)
                break
            except queue.Empty:
                if self._closed:
                    return None
        else:
            return None
        if item is _END:
            self._events.put(_END)
            return None
        if isinstance(item, BaseException):
            self._events.put(item)  # raise it again on the next call too
            raise item
        if item.kind == "progress":
            self.last_progress = item.time
        return item

    def close(self) -> None:
        """Stop the feed (the server ends its side); idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            reader = self._reader
        reader.cancel()
        self._thread.join()

    def __enter__(self) -> RemoteSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
