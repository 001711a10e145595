"""How batches are laid out in Parquet: dictionaries only where values repeat, same rows back."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq

from sediment.trace.batch import BatchDescription, decode_batch, encode_batch
from sediment.trace.parquet_layout import column_compression, dictionary_columns


def _fresh(n: int, start: int = 0) -> pa.Table:
    blob = os.urandom(40 * n)
    return pa.table({"id": pa.array(range(start, start + n), pa.int64()),
                     "region": pa.array([f"r{i % 7}" for i in range(n)]),
                     "payload": pa.array([blob[40 * i:40 * (i + 1)] for i in range(n)], pa.binary()),
                     "time": pa.array([i // 1000 for i in range(n)], pa.int64()),
                     "diff": pa.array([1] * n, pa.int64())})


def _written(table: pa.Table, key_columns: list[str], attribute: str) -> list[dict]:
    """Encode ``table`` as a batch, check it reads back equal, and give each row group's
    ``attribute`` of its column chunks by column name."""
    desc = BatchDescription(1, 0, 1000, 0, table.num_rows)
    data = encode_batch(table, desc)
    assert decode_batch(data, desc, key_columns=key_columns).select(table.column_names).equals(table)
    meta = pq.ParquetFile(pa.BufferReader(data)).metadata
    return [{table.column_names[c]: getattr(meta.row_group(g).column(c), attribute) for c in range(meta.num_columns)}
            for g in range(meta.num_row_groups)]


def test_distinct_columns_get_no_dictionary_and_repeating_ones_do():
    assert dictionary_columns(_fresh(20_000)) == ["region", "time", "diff"]
    chunked = pa.concat_tables([_fresh(1000, 1000 * k) for k in range(20)])  # the same judged over chunks
    assert dictionary_columns(chunked) == ["region", "time", "diff"]


def test_no_sample_a_small_one_or_a_nested_column_keep_parquets_default():
    assert dictionary_columns(None) is True
    assert dictionary_columns(_fresh(100)) is True
    nested = _fresh(20_000).append_column("tags", pa.array([[i % 3] for i in range(20_000)], pa.list_(pa.int64())))
    assert dictionary_columns(nested) is True


def test_a_batch_of_fresh_ids_has_dictionary_pages_only_for_repeating_columns_and_reads_back_equal():
    groups = _written(_fresh(150_000), ["id", "region", "payload"], "has_dictionary_page")
    assert groups and all(has == {"id": False, "region": True, "payload": False, "time": True, "diff": True}
                          for has in groups)


def test_payloads_zstd_cannot_shrink_are_stored_uncompressed_and_the_rest_compressed():
    """Random payloads (as encrypted or compressed ones) skip zstd, which saved nothing and cost
    a quarter of a pass; text that compresses keeps it; a batch reads back equal either way."""
    table = _fresh(150_000).append_column("note", pa.array([f"order {i} shipped to depot {i % 40}"
                                                            for i in range(150_000)]))
    assert column_compression(table) == {"id": "zstd", "region": "zstd", "payload": "none", "time": "zstd",
                                         "diff": "zstd", "note": "zstd"}
    assert column_compression(None) == "zstd" and column_compression(_fresh(100)) == "zstd"
    groups = _written(table, ["id", "region", "payload", "note"], "compression")
    assert groups and all(codecs == {"id": "ZSTD", "region": "ZSTD", "payload": "UNCOMPRESSED", "time": "ZSTD",
                                     "diff": "ZSTD", "note": "ZSTD"} for codecs in groups)


def test_the_sample_stays_near_1_mib_for_wide_rows_and_rows_over_32_kib_keep_the_defaults():
    from sediment.trace.parquet_layout import _spread_rows

    def wide(width: int) -> pa.Table:
        blob = os.urandom(width)
        return pa.table({"id": pa.array(range(3000), pa.int64()), "blob": pa.array([blob] * 3000, pa.binary())})

    sample = _spread_rows(wide(16 << 10))
    assert sample is not None and 32 <= sample.num_rows and sample.nbytes <= (1 << 20) + 16 * 1024
    assert dictionary_columns(wide(16 << 10)) == ["blob"]  # one value again and again
    assert dictionary_columns(wide(64 << 10)) is True and column_compression(wide(64 << 10)) == "zstd"


def test_values_that_repeat_far_apart_keep_their_dictionary_and_zstd():
    """Four thousand random payloads used again and again (one per customer) look distinct and
    incompressible in a small sample, yet a dictionary and zstd shrink them tenfold: a sample
    with any real share of repeats keeps both."""
    pool = [os.urandom(76) for _ in range(4000)]
    n = 100_000
    table = pa.table({"id": pa.array(range(n), pa.int64()), "payload": pa.array([pool[i % 4000] for i in range(n)]),
                      "time": pa.array([1] * n, pa.int64()), "diff": pa.array([1] * n, pa.int64())})
    assert dictionary_columns(table) == ["payload", "time", "diff"]
    assert column_compression(table) == "zstd" or set(column_compression(table).values()) == {"zstd"}
    data = encode_batch(table, BatchDescription(1, 0, 1000, 0, n))
    assert len(data) < n * 76 / 5
