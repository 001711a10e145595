"""What ``sediment verify`` finds wrong with one stored batch: its whole-object checksum, each
row group read back (sizes, footer and page checksums, description and schema, checked by the
reader it is given), its row count, and the order of its rows (a sorted batch out of the
trace's order breaks every merge of it). Reads only; the trace store (trace/store.py) runs it
for every batch its trace state names."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pyarrow as pa

from sediment.blob.protocol import BlobStore
from sediment.errors import BatchCorruption, BlobNotFound, TraceError
from sediment.trace.batch_checksum import object_checksum
from sediment.trace.consolidate import first_out_of_order
from sediment.trace.state import BatchRef


def batch_problems(blobs: BlobStore, ref: BatchRef, pieces: Callable[[BatchRef], Iterable[pa.Table]]) -> list[str]:
    """Problems with the batch ``ref`` names (none when it checks); ``pieces`` reads its row
    groups as stored, each checked as it is decoded."""
    try:
        if ref.crc is not None:
            got = object_checksum(blobs, ref.key, ref.bytes)
            if got != ref.crc:
                return [f"batch {ref.key!r}: CRC32C of the object is {got:#010x} but the trace state recorded "
                        f"{ref.crc:#010x}; the object is damaged"]
        rows, last = 0, None
        for t in pieces(ref):
            bad = None if ref.raw or not t.num_rows else first_out_of_order(t, last)
            if bad is not None:
                return [f"batch {ref.key!r}: row {rows + bad} sorts before the row ahead of it: the batch is out "
                        "of the trace's order, and merges of it fail; restore the batch from a backup, or drop "
                        "and reload the relation"]
            rows += t.num_rows
            last = t.slice(t.num_rows - 1) if t.num_rows else last
        if rows != ref.rows:
            return [f"batch {ref.key!r}: holds {rows} rows, the trace state says {ref.rows}"]
    except (BatchCorruption, TraceError) as exc:
        return [str(exc)]
    except BlobNotFound as exc:
        return [f"batch {ref.key!r} is missing from the blob store ({exc})"]
    return []
