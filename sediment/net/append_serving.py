"""The server's half of the append stream: read a stream's appends, apply or queue each, and
acknowledge them in order (the wire: sediment/net/append_stream.py, docs/formats.md "Append stream").

Why a module of its own: the client's half (streams, their pool, cancelling them) and this
half share only the wire's constants, and the server serves the same appends on two calls:
``do_exchange`` (this build's clients, whose ``close()`` can cancel an append under way) and
``do_put`` (clients of the build before, kept working across an upgrade of the server first).
Either call hands its reader and a ``send`` of one acknowledgement to :func:`serve_append_stream`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from queue import Empty, SimpleQueue
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.flight as flight

from sediment.errors import InvalidArgument
from sediment.net.append_stream import ACK_OK, PLAIN, PROBE
from sediment.net.protocol import json_arg
from sediment.net.wire_errors import error_detail

Send = Callable[[pa.Buffer], None]  # writes one acknowledgement (a metadata message) to the client

PLAIN_ARGS: dict[str, Any] = {"txn": None}  # the metadata of a plain append, decoded once
DEFAULT_MAX_APPEND_BYTES = 1 << 30  # the most Arrow bytes of one append (or staged table) a server holds


def too_big(limit: int) -> InvalidArgument:
    """The refusal of an append whose batches pass ``limit`` bytes: the server holds a whole append
    before applying it (all or nothing), so one client could otherwise take all its memory."""
    return InvalidArgument(f"an append of more than {limit} bytes (Arrow buffers) was refused and nothing of it "
                           "was applied: split it into smaller appends (a transaction keeps them all or nothing), "
                           "or start the server with a larger --max-append-bytes")


def read_bounded(reader: flight.MetadataRecordBatchReader, limit: int) -> pa.Table:
    """A do_put's whole table, refused (:func:`too_big`) once its batches pass ``limit`` bytes."""
    parts, held = [], 0
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            return pa.Table.from_batches(parts, schema=reader.schema)
        if chunk.data is not None:
            held += chunk.data.nbytes
            if held > limit:
                raise too_big(limit)
            parts.append(chunk.data)


def serve_append_stream(reader: flight.MetadataRecordBatchReader, send: Send,
                        append: Callable[[pa.Table, dict[str, Any]], None], stopping: Callable[[], bool],
                        queue: Callable[[pa.Table], Queued] | None = None,
                        max_bytes: int = DEFAULT_MAX_APPEND_BYTES) -> None:
    """Each append (batches up to one with metadata) goes to ``append(table, metadata)``
    (``PLAIN_ARGS`` itself for a plain append) and is acknowledged with ``send``; returns when
    the client ends the stream, or once ``stopping()``: right after an acknowledgement, or
    instead of applying an append that arrives then (unacknowledged, so the client sends it
    elsewhere).

    With ``queue`` (the engine's ``append_queued``), plain appends are queued on the log as
    they arrive and acknowledged in order by a second thread once durable (:class:`Acks`), so
    a pipelining client's appends share group commits and the next one is read and decoded
    while the earlier ones are written; other appends are applied here, after the ones queued
    before them. An append whose batches pass ``max_bytes`` is read to its end without being
    kept and refused (:func:`too_big`); the stream goes on."""
    if queue is None:
        for table, meta in _appends(reader, max_bytes):
            if stopping():
                return
            if meta == PROBE:
                send(pa.py_buffer(PROBE))
                continue
            if table is None:
                send(pa.py_buffer(error_ack(too_big(max_bytes))))
                continue
            send(pa.py_buffer(_outcome(append, table, PLAIN_ARGS if meta == PLAIN else None, meta)))
            if stopping():
                return
        return
    acks = Acks(send)
    try:
        for table, meta in _appends(reader, max_bytes):
            if stopping():
                return
            if meta == PROBE:
                acks.put(PROBE)  # answered in order, after the acknowledgements before it
            elif table is None:
                acks.put(error_ack(too_big(max_bytes)))
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

    def __init__(self, send: Send, limit: int = 64) -> None:
        self._write = send
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
                self._write(pa.py_buffer(ack))
            except (flight.FlightError, pa.ArrowException, OSError):
                self._broken = True  # the client is gone: the rest are still waited for, not sent


def _settled(queued: Queued) -> bytes:
    """Wait for a queued append; its acknowledgement."""
    try:
        queued.wait()
    except Exception as exc:  # noqa: BLE001 - the write's error goes back typed
        return error_ack(exc)
    return ACK_OK


def _appends(reader: flight.MetadataRecordBatchReader, max_bytes: int) -> Iterator[tuple[pa.Table | None, bytes]]:
    """Each append of the stream (its batches, up to the one with metadata) and its metadata;
    None for the table of an append that passed ``max_bytes`` (its batches were let go)."""
    parts: list[pa.RecordBatch] = []
    held, over = 0, False
    schema = reader.schema
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            return
        if chunk.data is not None and not over:
            held += chunk.data.nbytes
            over = held > max_bytes
            if over:
                parts = []  # let go: the rest of this append is read and dropped
            else:
                parts.append(chunk.data)
        if chunk.app_metadata is not None:
            yield None if over else pa.Table.from_batches(parts, schema=schema), chunk.app_metadata.to_pybytes()
            parts, held, over = [], 0, False
