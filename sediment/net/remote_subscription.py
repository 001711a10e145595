"""A feed over the network: the client side of ``subscribe`` (see :mod:`sediment.net`).

A thread pumps the server's stream into a bounded queue so that ``next(timeout=...)``
can wait with a deadline, which a Flight reader cannot; events come out as the
engine's ``FeedEvent`` values.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from sediment import errors
from sediment.errors import EngineClosed
from sediment.net.wire_errors import typed_error

_END = object()


class RemoteSubscription:
    """A feed from the server, like the engine's Subscription: an iterator of
    ``sediment.engine.feed.FeedEvent``; ``next(timeout)``; ``last_progress``; close it when
    done. A background thread reads the stream, so ``next`` can time out; when the server
    stops, ``next`` raises EngineClosed (subscribe again, with ``resume``, to a new one)."""

    def __init__(self, uri: str, reader: flight.FlightStreamReader) -> None:
        self._uri = uri
        self._reader = reader
        self._events: queue.Queue[Any] = queue.Queue()
        self._closed = False
        self.last_progress: int | None = None
        self._thread = threading.Thread(target=self._pump, name="sediment-feed", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        from sediment.engine.feed import FeedEvent

        parts: list[pa.RecordBatch] = []
        altered = None
        try:
            for chunk in self._reader:
                parts.append(chunk.data)
                meta = json.loads(chunk.app_metadata.to_pybytes())
                if not meta["last"]:
                    continue
                table = pa.Table.from_batches(parts)
                parts = []
                kind, t = meta["kind"], meta["time"]
                if kind == "schema":  # the server ends a feed at an alter: one stream, one schema
                    altered = errors.SchemaMismatch(f"relation altered to schema version {t}: subscribe with resume=True")
                    self._events.put(FeedEvent(kind, t))
                elif kind == "progress":
                    self._events.put(FeedEvent(kind, t))
                elif kind == "snapshot":
                    self._events.put(FeedEvent(kind, t, table.drop_columns(["time"])))
                else:
                    self._events.put(FeedEvent(kind, t, table))
            if altered is not None:
                self._events.put(altered)
            elif not self._closed:
                self._events.put(EngineClosed(f"the sediment server at {self._uri} ended the feed (it stopped); "
                                              "subscribe again with resume=True"))
        except flight.FlightError as exc:
            if not self._closed:
                self._events.put(typed_error(exc))
        except Exception as exc:  # noqa: BLE001 - handed to the reader of the events
            if not self._closed:
                self._events.put(exc)
        finally:
            self._events.put(_END)

    def next(self, timeout: float | None = None) -> Any:
        """The next event, waiting up to ``timeout`` seconds (None: forever). Returns None on
        timeout or once the subscription is closed."""
        if self._closed:
            return None
        try:
            item = self._events.get(timeout=timeout)
        except queue.Empty:
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

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        event = self.next()
        if event is None:
            raise StopIteration
        return event

    def close(self) -> None:
        """Stop the feed (the server ends its side); idempotent."""
        if self._closed:
            return
        self._closed = True
        self._reader.cancel()
        self._thread.join()

    def __enter__(self) -> RemoteSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
