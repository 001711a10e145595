"""Arrow bytes as sediment stores and sends them, in one place.

Three encodings: a schema as base64 text of its IPC serialization (the catalog, the Flight
actions, Spark job options), a table as an Arrow IPC stream (held tails, Spark scan
partitions, ticket cut points), and an UPDATES record's body (docs/formats.md, "Record
kinds and bodies"): one IPC record batch message without its schema, or a *group body*
(a small header, then the record batch messages of several appends one after the other)
that the file log writes for a group of concurrent small appends. The reader brings the
relation's update schema. Everything that writes one of these decodes it here too, so a
change of encoding has one owner.
"""

from __future__ import annotations

import base64
import struct

import pyarrow as pa


def schema_to_text(schema: pa.Schema) -> str:
    """The schema as base64 (ASCII) of its Arrow IPC serialization."""
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def schema_from_text(text: str) -> pa.Schema:
    """The schema :func:`schema_to_text` wrote."""
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def table_to_ipc(table: pa.Table) -> bytes:
    """The table as one Arrow IPC stream (schema, then its batches)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def table_from_ipc(data: bytes | pa.Buffer) -> pa.Table:
    """The table :func:`table_to_ipc` wrote."""
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


class StreamDecoder:
    """Reads tables :func:`table_to_ipc` wrote, one after another, parsing a schema once while
    the streams repeat it (a shared feed stream's events each carry their schema, since the
    stream goes on across alters). Why: its reader decodes every event once per client
    process, and pyarrow's stream reader with the schema's parse was most of that: 7.1
    against 4.3 us hot, 28.7 against 21.1 us after a millisecond asleep, as a reader between
    events is (docs/benchmarks.md, "Feed latency", session 27). Anything but schema, record
    batches and the end (dictionaries) is read by :func:`table_from_ipc`. One thread at a time."""

    def __init__(self) -> None:
        self._head = b""
        self._schema: pa.Schema | None = None

    def table(self, data: pa.Buffer) -> pa.Table:
        """The table of the IPC stream ``data``."""
        view = memoryview(data).cast("B")  # pyarrow exports signed bytes: compared to bytes, as bytes
        if len(view) < 8 or view[:4] != _CONTINUATION:
            return table_from_ipc(data)
        head = 8 + struct.unpack_from("<i", view, 4)[0]
        if self._schema is None or view[:head] != self._head:
            self._schema, self._head = pa.ipc.read_schema(data.slice(0, head)), view[:head].tobytes()
        batches, at = [], head
        while at + 8 <= len(view) and (length := struct.unpack_from("<i", view, at + 4)[0]):
            message = pa.ipc.read_message(data.slice(at))
            if message.type != "record batch":
                return table_from_ipc(data)
            batches.append(pa.ipc.read_record_batch(message, self._schema))
            at += 8 + length + (message.body.size if message.body is not None else 0)
        return pa.Table.from_batches(batches, self._schema)


_CONTINUATION = b"\xff\xff\xff\xff"  # an IPC message's first 4 bytes (docs/formats.md)


def table_to_text(table: pa.Table) -> str:
    """:func:`table_to_ipc` as base64 text, for JSON and ticket fields."""
    return base64.b64encode(table_to_ipc(table)).decode("ascii")


def table_from_text(text: str) -> pa.Table:
    """The table :func:`table_to_text` wrote."""
    return table_from_ipc(base64.b64decode(text))


def encode_updates(batch: pa.RecordBatch) -> pa.Buffer:
    """An UPDATES record's body: the batch as one IPC record batch message, no schema."""
    return batch.serialize()


GROUP_MAGIC = b"SDUG"
GROUP_VERSION = 2  # version 1 is the plain body: one message, no header
GROUP_HEADER = struct.Struct("<4sHHI")  # magic, version, reserved (0), number of messages
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def encode_joined_tables(tables: list[pa.Table]) -> bytes:
    """One plain UPDATES body (one IPC message) holding the rows of ``tables``, all of one
    schema, in order. Why: a group of concurrent small appends to one relation is one
    append of all their rows, so the log encodes them once, in the leader, instead of each
    appender reading its table's columns through pyarrow's wrappers (wal/group_records.py)."""
    batches = pa.concat_tables(tables).combine_chunks().to_batches()
    return batches[0].serialize().to_pybytes()


def join_updates(bodies: list) -> bytes:
    """One group body holding the plain UPDATES bodies ``bodies`` in order: a byte join,
    no decode. Why: the file log writes a group of concurrent small appends as one record
    (one frame, one CRC, one tail entry and feed event; wal/file_log.py)."""
    return b"".join([GROUP_HEADER.pack(GROUP_MAGIC, GROUP_VERSION, 0, len(bodies)), *bodies])


def is_group_body(body: bytes | pa.Buffer | memoryview) -> bool:
    """Whether ``body`` starts with a group header's magic. Compared as bytes: a pyarrow
    buffer's view has format ``b``, which memoryview compares element by element (1.7 us
    against 0.1); run once per body a pass decodes."""
    head = body[:4] if isinstance(body, bytes) else memoryview(body)[:4].tobytes()
    return head == GROUP_MAGIC and len(body) >= GROUP_HEADER.size


def updates_body_version(body: bytes | pa.Buffer | memoryview) -> int:
    """1 for a plain UPDATES body, else its group header's version (2 is the only one yet)."""
    if not is_group_body(body):
        return 1
    return GROUP_HEADER.unpack_from(body)[1]


def _group(body: bytes | pa.Buffer | memoryview) -> tuple[memoryview, int] | None:
    """A group body's messages and their number; None for a plain body. ValueError for a
    group header of a version this build does not know (a newer writer's): never read in part."""
    if not is_group_body(body):
        return None
    view = memoryview(body)
    _magic, version, _reserved, n = GROUP_HEADER.unpack_from(view)
    if version != GROUP_VERSION:
        raise ValueError(f"an UPDATES body is a group body of version {version}; this build reads version "
                         f"{GROUP_VERSION}")
    return view[GROUP_HEADER.size:], n


def _stream(parts: list, update_schema: pa.Schema, expected: int) -> pa.Table:
    """The messages ``parts`` read as one IPC stream, one chunk per message; ValueError unless
    there are exactly ``expected`` (a damaged message can read as an end-of-stream marker,
    which would end the read early and silently).

    Why one ``read_all``: pyarrow lets go of the interpreter lock in every reader call, so
    reading batch by batch beside threads running Python waited for the lock once per
    message (20,000 one-row records beside two busy threads: minutes, against 0.1 s)."""
    reader = pa.ipc.open_stream(pa.py_buffer(b"".join([update_schema.serialize(), *parts, _EOS])))
    table = reader.read_all()
    if reader.stats.num_record_batches != expected:
        raise ValueError(f"{expected} UPDATES messages read as {reader.stats.num_record_batches} batches: "
                         f"a body is damaged")
    return table


def decode_updates(body: bytes | pa.Buffer, update_schema: pa.Schema) -> pa.RecordBatch:
    """The batch of an UPDATES body (a group body's batches as one), read with the
    relation's update schema."""
    group = _group(body)
    if group is None:
        return pa.ipc.read_record_batch(pa.py_buffer(body), update_schema)
    batches = _stream([group[0]], update_schema, group[1]).combine_chunks().to_batches()
    return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=update_schema)


def message_count(body: bytes | pa.Buffer) -> int:
    """How many IPC messages an UPDATES body holds (a group body's, else one): the chunks it
    becomes in :func:`decode_updates_many`'s table. ValueError for a group body of another version."""
    group = _group(body)
    return 1 if group is None else group[1]


def decode_updates_many(bodies: list, update_schema: pa.Schema) -> pa.Table:
    """Many UPDATES bodies of one schema as one table, in their order.

    Why: compaction takes thousands of one-row records at a time, and decoding each with
    :func:`decode_updates` cost about 7 us of interpreter time a record, with the interpreter
    lock held, beside the writers that need it. Each plain body is a whole encapsulated
    message and a group body's are whole messages after its header, so the schema's message,
    the messages and an end-of-stream marker are an IPC stream, read in one call. Raises
    pyarrow's error (or ValueError) on a body that does not decode, and ValueError when the
    stream holds another number of batches than the bodies have messages."""
    parts = []
    expected = 0
    for body in bodies:
        group = _group(body)
        if group is None:
            parts.append(body)
            expected += 1
        else:
            parts.append(group[0])
            expected += group[1]
    return _stream(parts, update_schema, expected)
