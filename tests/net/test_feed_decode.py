"""A shared feed stream's reader decodes each event's IPC part with a StreamDecoder, which
parses a schema once while the parts repeat it: it must read every part as table_from_ipc
does, across schema changes, metadata changes and the encodings it hands back."""

from __future__ import annotations

import pyarrow as pa

from sediment.arrow_codec import StreamDecoder, table_from_ipc, table_to_ipc
from sediment.net.shared_feeds import share_batches, table_ipc
from sediment.net.shared_subscription import decode_event

UPDATES = pa.schema([("id", pa.int64()), ("payload", pa.binary()), ("time", pa.int64()), ("diff", pa.int64())])


def update(i: int, schema: pa.Schema = UPDATES) -> pa.Table:
    return pa.table({"id": [i], "payload": [b"x" * i], "time": [i], "diff": [1]}, schema=schema)


def test_it_reads_each_part_as_the_stream_reader_does_across_schemas():
    altered = UPDATES.insert(1, pa.field("note", pa.string()))
    tables = [
        update(1),
        pa.concat_tables([update(2), update(3), update(4)]),  # a merged run: several batches in one part
        UPDATES.empty_table(),
        update(5).replace_schema_metadata({"b": "1"}),  # the same fields, other metadata: parsed again
        pa.table({"id": [6], "note": ["six"], "payload": [b"6"], "time": [6], "diff": [1]}, schema=altered),
        update(7),  # back to the first schema after an alter
        pa.table({"k": pa.array(["a", "b", "a"]).dictionary_encode()}),  # dictionaries: the stream reader's way
        update(8),
    ]
    decoder = StreamDecoder()
    for table in tables:
        got = decoder.table(pa.py_buffer(table_to_ipc(table)))
        want = table_from_ipc(table_to_ipc(table))
        assert got.equals(want), (got, want)
        assert got.schema.equals(want.schema, check_metadata=True), (got.schema, want.schema)


def test_a_shared_streams_event_decodes_the_same_with_it():
    decoder = StreamDecoder()
    for table in (update(1), pa.concat_tables([update(2), update(3)]), update(4)):
        meta = {"kind": "updates", "time": 1, "subs": ["1"], "records": table.num_rows}
        batches = share_batches(table_ipc(table))
        assert decode_event(meta, batches, decoder.table).table.equals(decode_event(meta, batches).table)
