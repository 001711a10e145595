"""Arrow bytes as sediment stores and sends them, in one place.

Three encodings: a schema as base64 text of its IPC serialization (the catalog, the Flight
actions, Spark job options), a table as an Arrow IPC stream (held tails, Spark scan
partitions, ticket cut points), and an UPDATES record's body, one IPC record batch
message without its schema (docs/formats.md, "WAL record frame"): the reader brings the
relation's update schema. Everything that writes one of these decodes it here too, so a
change of encoding has one owner.
"""

from __future__ import annotations

import base64

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


def table_to_text(table: pa.Table) -> str:
    """:func:`table_to_ipc` as base64 text, for JSON and ticket fields."""
    return base64.b64encode(table_to_ipc(table)).decode("ascii")


def table_from_text(text: str) -> pa.Table:
    """The table :func:`table_to_text` wrote."""
    return table_from_ipc(base64.b64decode(text))


def encode_updates(batch: pa.RecordBatch) -> pa.Buffer:
    """An UPDATES record's body: the batch as one IPC record batch message, no schema."""
    return batch.serialize()


def decode_updates(body: bytes | pa.Buffer, update_schema: pa.Schema) -> pa.RecordBatch:
    """The batch of an UPDATES body, read with the relation's update schema."""
    return pa.ipc.read_record_batch(pa.py_buffer(body), update_schema)


_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def decode_updates_many(bodies: list, update_schema: pa.Schema) -> pa.Table:
    """Many UPDATES bodies of one schema as one table, in their order.

    Why: compaction takes thousands of one-row records at a time, and decoding each with
    :func:`decode_updates` cost about 7 us of interpreter time a record, with the interpreter
    lock held, beside the writers that need it. Each body is a whole encapsulated message,
    so the schema's message, the bodies and an end-of-stream marker are an IPC stream,
    read in one call. Raises pyarrow's error (or ValueError) on a body that does not decode,
    and ValueError when the stream holds another number of batches than ``bodies`` (a damaged
    body can read as an end-of-stream marker, which would end the read early and silently)."""
    stream = b"".join([update_schema.serialize(), *bodies, _EOS])
    batches = list(pa.ipc.open_stream(pa.py_buffer(stream)))
    if len(batches) != len(bodies):
        raise ValueError(f"{len(bodies)} UPDATES bodies read as {len(batches)} batches: a body is damaged")
    return pa.Table.from_batches(batches, schema=update_schema)
