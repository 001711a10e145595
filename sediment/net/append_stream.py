"""Appends over one long-lived Flight stream per (relation, schema): the client's half
(the server's: sediment/net/append_serving.py).

Why: a call per append costs a new gRPC stream (headers, the token check, the
descriptor, the schema message, the closing status) on top of the batches: about half a
millisecond of CPU per call on this machine, as much as the engine's own work for a
1,000-row append. On an open stream an append is its record batches (the last one
carrying the append's JSON metadata) and one acknowledgement back.

The stream is a ``do_exchange`` whose descriptor is ``{"op": "append_exchange", "version":
1, "relation": NAME}`` (with ``"queue": true`` from a pipelining client; docs/formats.md
"Append stream"): unlike a ``do_put``, whose acknowledgements Arrow reads with no way to
cancel, an exchange's reader can be cancelled from another thread, so a client's
``close()`` ends an append waiting for its acknowledgement (:meth:`StreamPool.cancel`). A
server of the build before has no exchange (its ``ping`` does not list ``append_exchange``):
the same messages then go on a ``do_put`` whose descriptor is ``{"op": "append_stream",
"relation": NAME}``, which ``close()`` cannot cancel.

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
  acknowledges them in order once durable, so one stream's pipelined
  appends share group commits; other appends are applied after the ones queued before them.
  Without the queue it reads the next append only after acknowledging the one before.
* The client ends a stream it has not used for ``STREAM_IDLE_SECONDS`` (so a server's stop
  does not wait longer than that for a live client); the server ends it only when stopping:
  on receiving an append, which it then neither applies nor acknowledges, once every append
  it took is acknowledged (or right after an acknowledgement, without a queue). So an append
  without an acknowledgement on a stream the server ended cleanly (an OK status) was not
  applied, and the client sends it again on a new stream (which a stopping server refuses:
  ``EngineClosed`` or ``CoordinatorUnavailable``). A stream that broke (the connection, a
  deadline, the client's own close: a failed status) leaves the appends sent in doubt:
  ``OutcomeUnknown`` (``CallCancelled`` for the close).
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from sediment.clock import MONOTONIC, Clock
from sediment.errors import CallCancelled
from sediment.net.messages import STREAM_FIELDS, Exchange, Put, encode
from sediment.net.wire_errors import error_from_detail, server_error

StreamKey = tuple[str, pa.Schema, bool]  # relation, schema, whether the server queues its plain appends
REFUSED_BEFORE_HANDLER = (flight.FlightUnauthenticatedError, flight.FlightUnauthorizedError)  # nothing applied
STREAM_IDLE_SECONDS = 2.0  # a client's stream unused this long is closed
CLOSE_WAIT_SECONDS = 2.0  # the most a client's close waits for the server to end its streams
ACK_OK = b'{"ok":true}'
PLAIN = b'{"txn":null}'  # the metadata of an append outside any transaction, without locks
PROBE = b'{"probe":true}'  # a message without an append: the server answers it with PROBE (is it reading?)
PROBE_AFTER_SECONDS = 0.1  # a plain append first probes a stream unused this long
EXCHANGE_VERSION = 1  # the append exchange's version, in its descriptor; a server's ping lists those it serves


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
    """One open append stream (the client's half): a do_exchange, or with ``exchange=False``
    (a server of the build before) a do_put. Not thread-safe: a :class:`StreamPool` lends
    it to one caller at a time, and only :meth:`cancel` may come from another thread."""

    def __init__(self, client: flight.FlightClient, relation: str, schema: pa.Schema,
                 options: flight.FlightCallOptions, queued: bool = False, exchange: bool = True) -> None:
        queue = {"queue": True} if queued else {}
        self.key: StreamKey = (relation, schema, queued)
        self._reader: flight.FlightStreamReader | None = None  # an exchange's: acknowledgements, and cancel
        self._acks: flight.FlightMetadataReader | None = None  # a do_put's acknowledgements
        if exchange:
            command = encode(Exchange.APPEND_STREAM, version=EXCHANGE_VERSION, relation=relation, **queue)
            self._writer, self._reader = client.do_exchange(flight.FlightDescriptor.for_command(command),
                                                            options=options)
            self._writer.begin(schema)
        else:
            command = encode(Put.APPEND_STREAM, relation=relation, **queue)
            self._writer, self._acks = client.do_put(flight.FlightDescriptor.for_command(command), schema,
                                                     options=options)
        self.last_used = 0.0  # when the pool last got it back
        self.opened = 0.0  # when the pool opened it
        self.in_doubt = False  # an append went out and its acknowledgement was not read: unusable
        self.cancelled = False  # the client's close cancelled it: what it was waiting for ends CallCancelled
        self._unacknowledged = 0
        self._durable_ahead = 0  # appends after this one that the last acknowledgement also covered
        self._status: flight.FlightError | None | bool = False  # the call's final status once read (False: not yet)
        self._failed: flight.FlightError | None = None  # the failed status an exchange's read raised

    def append(self, batches: list[pa.RecordBatch], meta: bytes) -> bool:
        """Send one append and wait for its acknowledgement: True once it is durable; False when
        it never reached the server whole or the server had ended the stream before reading it
        (not appended: send it again on another stream); raises the server's typed error for
        a refused append, and a FlightError when the stream broke after the append was sent
        (outcome unknown, as with a per-call do_put; cancelled, when ``cancelled``)."""
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
            ack = self._next_ack()
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

    def _next_ack(self) -> pa.Buffer | None:
        """The next metadata message from the server; None once the stream has ended (a
        failed status of an exchange is kept for :meth:`_ended`; a do_put's comes with its close)."""
        if self._reader is None:
            assert self._acks is not None
            return self._acks.read()
        try:
            return self._reader.read_chunk().app_metadata
        except StopIteration:
            return None
        except REFUSED_BEFORE_HANDLER:
            raise
        except flight.FlightError as exc:
            self._failed = exc
            return None

    def _ended(self) -> bool:
        """No acknowledgement follows: False when the server ended the stream (with or without
        a typed error: it read no more appends; or its token check refused the call, before
        any handler ran). Flight's read gives the same end for a broken
        connection or a passed deadline, which only the call's status tells apart: then the
        appends sent may have been applied, and the status is raised as it is (in doubt)."""
        status = self._failed
        try:
            self._writer.close()
        except flight.FlightError as exc:
            status = status or exc
        self._status = status
        if status is not None and server_error(status) is None and not isinstance(status, REFUSED_BEFORE_HANDLER):
            self.in_doubt = True
            raise status
        return False

    def probe(self) -> bool:
        """Whether the server still reads this idle stream: a message with no append
        (``{"probe":true}``, no batch), which the server answers at once. False when the stream
        broke or was ended meanwhile: the probe is all that was sent on it since its last
        acknowledgement, so an append sent elsewhere now cannot be applied twice."""
        try:
            self._writer.write_metadata(pa.py_buffer(PROBE))
            return self._next_ack() is not None  # any answer: an older server's ack of an empty append too
        except (flight.FlightError, pa.ArrowException, OSError):
            return False

    def finish(self) -> None:
        """End the stream, raising the server's final status if it failed."""
        if self._status is False:
            if self._failed is not None:
                self._status = self._failed
                raise self._failed
            self._writer.close()
        elif self._status is not None:
            raise self._status

    def close(self) -> None:
        """End the stream (the server's handler returns); errors of a broken stream are moot,
        and the writer is closed even then (Arrow complains of a writer dropped unclosed)."""
        for step in (self._writer.done_writing, self._writer.close):
            try:
                step()
            except (flight.FlightError, pa.ArrowException, OSError):
                pass

    def cancel(self) -> None:
        """Cancel the call from any thread: a wait for an acknowledgement (or a close waiting
        for the server's status) ends at once with FlightCancelledError. A write that gRPC's
        flow control holds (a server that stopped reading a large append) ends only with the
        transport. A do_put stream cannot be cancelled: it is only marked."""
        self.cancelled = True
        if self._reader is not None:
            try:
                self._reader.cancel()
            except (flight.FlightError, pa.ArrowException, OSError):  # ended already
                pass


def cancelled_append(uri: str | None, relation: str | None) -> CallCancelled:
    """The error of an append under way when its client was closed (its stream cancelled)."""
    where = f" of {uri}" if uri else ""
    what = f"the append to {relation!r}" if relation else "an append"
    return CallCancelled(f"the client{where} was closed while {what} waited for the server: it may or may not have "
                         "been carried out; connect again and read back before writing again, or use keyed appends "
                         "(append_once)")


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
        self._cancelled = False
        self._lent: weakref.WeakSet[AppendStream] = weakref.WeakSet()  # taken, not given back (or dropped)
        self._wake = threading.Event()
        self._reaper: threading.Thread | None = None

    def take(self, relation: str, schema: pa.Schema, queued: bool = False,
             probe_after: float | None = None) -> tuple[AppendStream, bool]:
        """A stream for the relation and schema (``queued``: one whose plain appends the server
        queues, for pipelined appends), and whether it is new (never used). ``probe_after``: an
        idle stream unused for that many seconds is first probed (:meth:`AppendStream.probe`);
        one the server no longer reads is closed, and another taken. CallCancelled once
        :meth:`cancel` was called (the client closed)."""
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
            self._lend(stream)
            if probe_after is None or now - stream.last_used < probe_after or stream.probe():
                return stream, False
            stream.close()  # it broke while idle (the server died, say): nothing was sent on it
            self._check_cancelled(stream)
        self._check_cancelled(None)
        stream = self._open(relation, schema, queued)
        stream.opened = now
        self._lend(stream)
        return stream, True

    def _lend(self, stream: AppendStream) -> None:
        """Count ``stream`` as lent out, so that :meth:`cancel` reaches it (at once if it came first)."""
        with self._lock:
            self._lent.add(stream)
            cancelled = self._cancelled
        if cancelled:
            stream.cancel()

    def _check_cancelled(self, stream: AppendStream | None) -> None:
        if self._cancelled or (stream is not None and stream.cancelled):
            raise cancelled_append(None, stream.key[0] if stream is not None else None)

    def give(self, stream: AppendStream) -> None:
        stream.last_used = self._clock.current_time()
        with self._lock:
            self._lent.discard(stream)
            if not self._closed:
                self._idle.setdefault(stream.key, []).append(stream)
                return
        stream.close()

    def cancel(self) -> None:
        """Cancel every stream lent out (the append or probe waiting on it ends with
        FlightCancelledError, and its caller raises CallCancelled); streams taken later are
        cancelled as they are lent. The client's close calls this before :meth:`close`."""
        with self._lock:
            self._cancelled = True
            lent = list(self._lent)
        for stream in lent:
            stream.cancel()

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
        final status, which a paused server never sends): past it, they are cancelled (a do_put
        stream's close goes on in the background, and its server ends its half when it can)."""
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
    if closer.is_alive():  # the server does not answer: cancelled, the closes end now (do_put ones with gRPC)
        for stream in streams:
            stream.cancel()


