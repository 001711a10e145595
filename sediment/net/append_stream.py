"""Appends over one long-lived Flight ``do_put`` stream per (relation, schema), both halves.

Why: a do_put per append costs a new gRPC stream (headers, the token check, the
descriptor, the schema message, the closing status) on top of the batches: about half a
millisecond of CPU per call on this machine, as much as the engine's own work for a
1,000-row append. On an open stream an append is its record batches (the last one
carrying the append's JSON metadata) and one acknowledgement back.

The wire (``{"op": "append_stream", "relation": NAME}`` as the do_put descriptor, with
``"queue": true`` from a pipelining client; docs/formats.md "Append stream"):

* client -> server: an append's batches, of the stream's schema; every batch but the last
  has no app metadata; the last has ``{"txn": ID|null, "locks": LOCKS|absent}`` (as the
  per-call ``append`` op's descriptor), or for a keyed append to a cluster member
  ``{"txn": null, "client": ID, "seq": N}`` (its idempotency key, as ``append_once``'s).
  An empty append is one empty batch.
* server -> client: acknowledgements in the appends' order: ``{"ok": true}`` for one append
  once it is durable, ``{"ok": N}`` (queued streams only) for the next N appends, all
  durable, or ``{"error": DETAIL}`` (the typed error, as :func:`error_detail` writes it;
  the stream stays usable).
* ``{"probe": true}`` alone (a message without a batch): the client asks whether the server
  still reads the stream, before sending an append on one it has not used for
  ``PROBE_AFTER_SECONDS``; the server answers ``{"probe": true}`` in the acknowledgements'
  order. A probe that gets no answer (the server died while the stream was idle, say) proves
  that nothing of the append was sent on a live stream: it goes on a new one.
* On a queued stream the server queues plain appends on the log as it reads them and
  acknowledges them in order once durable (:class:`Acks`), so one stream's pipelined
  appends share group commits; other appends are applied after the ones queued before them.
  Without the queue it reads the next append only after acknowledging the one before.
* The client ends a stream it has not used for ``STREAM_IDLE_SECONDS`` (so a server's stop
  does not wait longer than that for a live client); the server ends it only when stopping:
  on receiving an append, which it then neither applies nor acknowledges, once every append
  it took is acknowledged (or right after an acknowledgement, without a queue). So an append
  without an acknowledgement on a stream the server ended cleanly (an OK status) was not
  applied, and the client sends it again on a new stream (which a stopping server refuses:
  ``EngineClosed`` or ``CoordinatorUnavailable``). A stream that broke (the connection, a
  deadline: a failed status) leaves the appends sent in doubt: ``OutcomeUnknown``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from queue import Empty, SimpleQueue
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.flight as flight

from sediment.clock import MONOTONIC, Clock
from sediment.net.messages import STREAM_FIELDS, Put, encode
from sediment.net.protocol import json_arg
from sediment.net.wire_errors import error_detail, error_from_detail, server_error

StreamKey = tuple[str, pa.Schema, bool]  # relation, schema, whether the server queues its plain appends
REFUSED_BEFORE_HANDLER = (flight.FlightUnauthenticatedError, flight.FlightUnauthorizedError)  # nothing applied
STREAM_IDLE_SECONDS = 2.0  # a client's stream unused this long is closed
CLOSE_WAIT_SECONDS = 2.0  # the most a client's close waits for the server to end its streams
ACK_OK = b'{"ok":true}'
PLAIN = b'{"txn":null}'  # the metadata of an append outside any transaction, without locks
PROBE = b'{"probe":true}'  # a message without an append: the server answers it with PROBE (is it reading?)
PROBE_AFTER_SECONDS = 0.1  # a plain append first probes a stream unused this long


def append_metadata(txn: int | None, locks: dict[str, Any] | None, key: tuple[str, int] | None = None) -> bytes:
    """The last batch's metadata of an append (``locks`` already in wire form; ``key``: the
    idempotency key (client id, sequence number) of a keyed append)."""
    if txn is None and locks is None and key is None:
        return PLAIN
    spec: dict[str, Any] = {"txn": txn}
    if locks is not None:
        spec["locks"] = locks
    if key is not None:
        spec["client"], spec["seq"] = key
    for name in spec:
        if name not in STREAM_FIELDS:
            raise ValueError(f"append stream metadata carries no field {name!r}")
    return json.dumps(spec, separators=(",", ":"), default=repr).encode()


def append_batches(table: pa.Table, chunk_bytes: int) -> list[pa.RecordBatch]:
    """The table's record batches as they are, cut only when one would exceed ``chunk_bytes``
    (gRPC's message limit); at least one (an empty batch for an empty table)."""
    size = table.get_total_buffer_size()
    if size > chunk_bytes and table.num_rows > 1:
        per_row = max(1, size // table.num_rows)
        batches = table.to_batches(max_chunksize=max(1, chunk_bytes // per_row))
    else:
        batches = table.to_batches()
    return batches or [pa.RecordBatch.from_pylist([], schema=table.schema)]


class AppendStream:
    """One open do_put of the append stream (the client's half). Not thread-safe: a
    :class:`StreamPool` lends it to one caller at a time."""

    def __init__(self, client: flight.FlightClient, relation: str, schema: pa.Schema,
                 options: flight.FlightCallOptions, queued: bool = False) -> None:
        command = encode(Put.APPEND_STREAM, relation=relation, **({"queue": True} if queued else {}))
        self.key: StreamKey = (relation, schema, queued)
        self._writer, self._acks = client.do_put(flight.FlightDescriptor.for_command(command), schema,
                                                 options=options)
        self.last_used = 0.0  # when the pool last got it back
        self.opened = 0.0  # when the pool opened it
        self.in_doubt = False  # an append went out and its acknowledgement was not read: unusable
        self._unacknowledged = 0
        self._durable_ahead = 0  # appends after this one that the last acknowledgement also covered
        self._status: flight.FlightError | None | bool = False  # the call's final status once read (False: not yet)

    def append(self, batches: list[pa.RecordBatch], meta: bytes) -> bool:
        """Send one append and wait for its acknowledgement: True once it is durable; False when
        it never reached the server whole or the server had ended the stream before reading it
        (not appended: send it again on another stream); raises the server's typed error for
        a refused append, and a FlightError when the stream broke after the append was sent
        (outcome unknown, as with a per-call do_put)."""
        return self.send(batches, meta) and self.receive()

    def send(self, batches: list[pa.RecordBatch], meta: bytes) -> bool:
        """Send one append without waiting for its acknowledgement; False when it did not go
        out whole (the server takes an append only with its last batch)."""
        writer = self._writer
        self.in_doubt = True
        self._unacknowledged += 1
        try:
            for batch in batches[:-1]:
                writer.write_batch(batch)
            writer.write_with_metadata(batches[-1], pa.py_buffer(meta))
        except (flight.FlightError, pa.ArrowException, OSError):
            return False
        return True

    def receive(self) -> bool:
        """The oldest unread acknowledgement: True (durable), False (the server ended the stream
        without reading that append), or the refusal raised as its typed error. One message
        ``{"ok":N}`` (a queued stream's) acknowledges the next N appends."""
        self._unacknowledged -= 1
        self.in_doubt = self._unacknowledged > 0
        if self._durable_ahead:
            self._durable_ahead -= 1
            return True
        try:
            ack = self._acks.read()
        except REFUSED_BEFORE_HANDLER as exc:  # the call's token check: no handler ran, nothing applied
            self._status = exc
            return False
        if ack is None:
            return self._ended()
        raw = ack.to_pybytes()
        if raw == ACK_OK:
            return True
        reply = json.loads(raw)
        count = reply.get("ok")
        if type(count) is int and 1 <= count <= self._unacknowledged + 1:
            self._durable_ahead = count - 1
            return True
        raise error_from_detail(reply.get("error")) or ValueError(f"unexpected append acknowledgement {raw!r}")

    def _ended(self) -> bool:
        """No acknowledgement follows: False when the server ended the stream (with or without
        a typed error: it read no more appends; or its token check refused the call, before
        any handler ran). Flight's read gives the same end for a broken
        connection or a passed deadline, which only the call's status tells apart: then the
        appends sent may have been applied, and the status is raised as it is (in doubt)."""
        try:
            self._writer.close()
        except flight.FlightError as exc:
            self._status = exc
            if server_error(exc) is None and not isinstance(exc, REFUSED_BEFORE_HANDLER):
                self.in_doubt = True
                raise
        else:
            self._status = None
        return False

    def probe(self) -> bool:
        """Whether the server still reads this idle stream: a message with no append
        (``{"probe":true}``, no batch), which the server answers at once. False when the stream
        broke or was ended meanwhile: the probe is all that was sent on it since its last
        acknowledgement, so an append sent elsewhere now cannot be applied twice."""
        try:
            self._writer.write_metadata(pa.py_buffer(PROBE))
            return self._acks.read() is not None  # any answer: an older server's ack of an empty append too
        except (flight.FlightError, pa.ArrowException, OSError):
            return False

    def finish(self) -> None:
        """End the stream, raising the server's final status if it failed."""
        if self._status is False:
            self._writer.close()
        elif self._status is not None:
            raise self._status

    def close(self) -> None:
        """End the stream (the server's handler returns); errors of a broken stream are moot."""
        try:
            self._writer.done_writing()
            self._writer.close()
        except (flight.FlightError, pa.ArrowException, OSError):
            pass


class StreamPool:
    """A client's idle append streams by (relation, schema). ``take`` lends one (opening a
    new one when none is idle), ``give`` returns it; a background thread closes streams idle
    for ``idle_seconds``. ``max_age``: a stream opened longer ago than that is not lent
    again but closed (a client with a call timeout opens its streams with that deadline,
    which gRPC applies to the whole stream: each append still gets at least the rest)."""

    def __init__(self, opener: Callable[[str, pa.Schema, bool], AppendStream], idle_seconds: float = STREAM_IDLE_SECONDS,
                 clock: Clock = MONOTONIC, max_age: float | None = None) -> None:
        self._open = opener
        self._idle_seconds = idle_seconds
        self._clock = clock
        self._max_age = max_age
        self._lock = threading.Lock()
        self._idle: dict[StreamKey, list[AppendStream]] = {}
        self._closed = False
        self._wake = threading.Event()
        self._reaper: threading.Thread | None = None

    def take(self, relation: str, schema: pa.Schema, queued: bool = False,
             probe_after: float | None = None) -> tuple[AppendStream, bool]:
        """A stream for the relation and schema (``queued``: one whose plain appends the server
        queues, for pipelined appends), and whether it is new (never used). ``probe_after``: an
        idle stream unused for that many seconds is first probed (:meth:`AppendStream.probe`);
        one the server no longer reads is closed, and another taken."""
        while True:
            now = self._clock.current_time()
            old: list[AppendStream] = []
            with self._lock:
                idle = self._idle.get((relation, schema, queued))
                while idle and self._max_age is not None and now - idle[-1].opened > self._max_age:
                    old.append(idle.pop())
                stream = idle.pop() if idle else None
                if self._reaper is None:
                    self._reaper = threading.Thread(target=self._reap, name="sediment-append-streams", daemon=True)
                    self._reaper.start()
            for gone in old:
                gone.close()
            if stream is None:
                break
            if probe_after is None or now - stream.last_used < probe_after or stream.probe():
                return stream, False
            stream.close()  # it broke while idle (the server died, say): nothing was sent on it
        stream = self._open(relation, schema, queued)
        stream.opened = now
        return stream, True

    def give(self, stream: AppendStream) -> None:
        stream.last_used = self._clock.current_time()
        with self._lock:
            if not self._closed:
                self._idle.setdefault(stream.key, []).append(stream)
                return
        stream.close()

    def _take_idle(self, older_than: float | None) -> list[AppendStream]:
        """Take out of the pool the idle streams last used before ``older_than`` (None: all)."""
        with self._lock:
            out = []
            for key, streams in list(self._idle.items()):
                stale = [s for s in streams if older_than is None or s.last_used < older_than]
                if stale:
                    out += stale
                    kept = [s for s in streams if s not in stale]
                    if kept:
                        self._idle[key] = kept
                    else:
                        del self._idle[key]
            return out

    def close_idle(self) -> int:
        """Close the streams idle for longer than ``idle_seconds``; how many."""
        stale = self._take_idle(self._clock.current_time() - self._idle_seconds)
        for stream in stale:
            stream.close()
        return len(stale)

    def _reap(self) -> None:
        while not self._wake.wait(self._idle_seconds / 2):
            self.close_idle()

    def close(self, wait: float | None = None) -> None:
        """Close every idle stream; streams lent out are closed when given back. ``wait``: the
        most seconds to wait for the server to end them (a stream's close waits for the server's
        final status, which a paused server never sends): past it, the rest of the closing goes
        on in the background, and the server ends its halves when it can."""
        with self._lock:
            self._closed = True
        self._wake.set()
        close_streams(self._take_idle(None), wait)


def close_streams(streams: list[AppendStream], wait: float | None) -> None:
    """Close ``streams``, waiting at most ``wait`` seconds (None: as long as it takes)."""
    if not streams:
        return
    if wait is None:
        for stream in streams:
            stream.close()
        return
    closer = threading.Thread(target=lambda: [stream.close() for stream in streams], name="sediment-stream-close",
                              daemon=True)
    closer.start()
    closer.join(wait)


def serve_append_stream(reader: flight.MetadataRecordBatchReader, writer: flight.FlightMetadataWriter,
                        append: Callable[[pa.Table, dict[str, Any]], None], stopping: Callable[[], bool],
                        queue: Callable[[pa.Table], Queued] | None = None) -> None:
    """The server's half: each append (batches up to one with metadata) goes to
    ``append(table, metadata)`` (``PLAIN_ARGS`` itself for a plain append) and is acknowledged; returns when the client ends the
    stream, or once ``stopping()``: right after an acknowledgement, or instead of applying
    an append that arrives then (unacknowledged, so the client sends it elsewhere).

    With ``queue`` (the engine's ``append_queued``), plain appends are queued on the log as
    they arrive and acknowledged in order by a second thread once durable (:class:`Acks`), so
    a pipelining client's appends share group commits and the next one is read and decoded
    while the earlier ones are written; other appends are applied here, after the ones queued
    before them."""
    if queue is None:
        for table, meta in _appends(reader):
            if stopping():
                return
            if meta == PROBE:
                writer.write(pa.py_buffer(PROBE))
                continue
            writer.write(pa.py_buffer(_outcome(append, table, PLAIN_ARGS if meta == PLAIN else None, meta)))
            if stopping():
                return
        return
    acks = Acks(writer)
    try:
        for table, meta in _appends(reader):
            if stopping():
                return
            if meta == PROBE:
                acks.put(PROBE)  # answered in order, after the acknowledgements before it
            elif meta == PLAIN:
                try:
                    acks.put(queue(table))
                except Exception as exc:  # noqa: BLE001 - refused before it was queued: acknowledged in order
                    acks.put(error_ack(exc))
            else:
                acks.put(_outcome(append, table, None, meta))
    finally:
        acks.close()


def _outcome(append: Callable[[pa.Table, dict[str, Any]], None], table: pa.Table, args: dict[str, Any] | None,
             meta: bytes) -> bytes:
    """Apply one append; its acknowledgement."""
    try:
        append(table, args if args is not None else json_arg(meta, "append stream metadata"))
    except Exception as exc:  # noqa: BLE001 - every failure goes back typed, the stream lives on
        return error_ack(exc)
    return ACK_OK


def durable_ack(n: int) -> bytes:
    """The acknowledgement of the next ``n`` appends as durable: ``{"ok":true}`` for one."""
    return ACK_OK if n == 1 else b'{"ok":%d}' % n


def error_ack(exc: BaseException) -> bytes:
    """The acknowledgement of a refused append: its typed error."""
    return b'{"error":' + error_detail(exc) + b"}"


class Queued(Protocol):
    """A queued append (the engine's ``append_queued``): ``wait`` until durable (raising the
    write's error); ``settled``: whether ``wait`` would return at once."""

    def wait(self) -> None: ...

    def settled(self) -> bool: ...


class Acks:
    """A stream's acknowledgements, written in order by their own thread: each entry is the
    acknowledgement itself or a queued append (acknowledged once its wait returns). Appends
    durable in a row are acknowledged by one message ``{"ok":N}`` sent before the thread
    waits for one that is not durable yet, or when no entry is left (each gRPC write is a
    hand-off to gRPC's own threads; a group commit makes many appends durable at once). At most
    ``limit`` entries are outstanding: a client that stops reading acknowledgements stops
    the stream's reads, not the engine. ``close`` waits until every entry is acknowledged
    (or the stream is broken): the stream's writer is valid only while its handler runs."""

    def __init__(self, writer: flight.FlightMetadataWriter, limit: int = 64) -> None:
        self._writer = writer
        self._entries: SimpleQueue[bytes | Queued | None] = SimpleQueue()
        self._room = threading.Semaphore(limit)
        self._limit = limit
        self._broken = False
        self._thread = threading.Thread(target=self._run, name="sediment-append-acks", daemon=True)
        self._thread.start()

    def put(self, entry: bytes | Queued) -> None:
        self._room.acquire()
        self._entries.put(entry)

    def close(self) -> None:
        self._entries.put(None)
        self._thread.join()

    def _run(self) -> None:
        durable = 0  # appends durable in a row, not acknowledged yet: one message for them all
        while True:
            try:
                entry = self._entries.get_nowait() if durable else self._entries.get()
            except Empty:  # none waiting behind them: acknowledge them now
                durable = self._send_durable(durable)
                continue
            if entry is None:
                self._send_durable(durable)
                return
            if isinstance(entry, bytes):
                ack = entry
            else:
                if durable and not entry.settled():  # the durable ones are not held back by it
                    durable = self._send_durable(durable)
                ack = _settled(entry)
            self._room.release()
            if ack == ACK_OK:
                durable += 1
                if durable >= self._limit:
                    durable = self._send_durable(durable)
            else:
                durable = self._send_durable(durable)
                self._send(ack)

    def _send_durable(self, n: int) -> int:
        """Acknowledge ``n`` appends as durable (``{"ok":true}`` for one); 0."""
        if n:
            self._send(durable_ack(n))
        return 0

    def _send(self, ack: bytes) -> None:
        if not self._broken:
            try:
                self._writer.write(pa.py_buffer(ack))
            except (flight.FlightError, pa.ArrowException, OSError):
                self._broken = True  # the client is gone: the rest are still waited for, not sent


def _settled(queued: Queued) -> bytes:
    """Wait for a queued append; its acknowledgement."""
    try:
        queued.wait()
    except Exception as exc:  # noqa: BLE001 - the write's error goes back typed
        return error_ack(exc)
    return ACK_OK


PLAIN_ARGS: dict[str, Any] = {"txn": None}  # the metadata of a plain append, decoded once


def _appends(reader: flight.MetadataRecordBatchReader) -> Iterator[tuple[pa.Table, bytes]]:
    parts: list[pa.RecordBatch] = []
    schema = reader.schema
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            return
        if chunk.data is not None:
            parts.append(chunk.data)
        if chunk.app_metadata is not None:
            yield pa.Table.from_batches(parts, schema=schema), chunk.app_metadata.to_pybytes()
            parts = []
