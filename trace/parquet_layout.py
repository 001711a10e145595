"""How a batch's columns are laid out in Parquet: the write batch, the dictionary columns
and each column's codec.

All three are chosen from the first rows a batch's writer gets (trace/batch.py); the external
sort's run files (trace/raw_sort.py) take the write batch. None changes what a batch reads
back as: only its size and what writing and reading it cost.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.compute as pc

_WRITE_BATCH_ROWS, _WRITE_BATCH_BYTES = 1024, 1 << 20  # Parquet's default write batch; its dictionary page limit


def write_batch_rows(sample: pa.Table | None) -> int:
    """Rows per Parquet write batch (the values a writer encodes before it checks its
    dictionary and page sizes): at most 1 MiB of ``sample``'s rows, at most Parquet's default
    1,024. Why: Parquet falls back from a dictionary only between write batches, so 1,024
    rows of 64 KiB made one 64 MiB dictionary page that every reader must decode whole,
    whatever its memory bound."""
    width = sample.nbytes // sample.num_rows if sample is not None and sample.num_rows else 0
    return max(1, min(_WRITE_BATCH_ROWS, _WRITE_BATCH_BYTES // max(1, width)))


_SLICES, _SLICE_ROWS = 256, 4  # the spread sample that picks the dictionary columns and the codecs
_SAMPLE_BYTES = 1 << 20  # ... at most this much of the rows: fewer rows and slices when rows are wide
_MIN_SLICES = 32  # ... and no fewer slices (rows over 32 KiB keep Parquet's defaults)
_UNIQUE_SHARE = 0.99  # a sample at least this share distinct: the column's values (nearly) never repeat
COMPRESSION = "zstd"
_STORED_SHARE = 0.9  # a byte column whose sample zstd cannot shrink below this share is stored uncompressed


def _flat(t: pa.DataType) -> bool:
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_string(t)
            or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)
            or pa.types.is_fixed_size_binary(t) or pa.types.is_temporal(t) or pa.types.is_decimal(t))


def _bytes_type(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)


def _spread_rows(sample: pa.Table | None) -> pa.Table | None:
    """``_SLICES`` blocks of ``_SLICE_ROWS`` rows of ``sample``, none overlapping, picked
    without a regular period (evenly spaced slices can fall in step with values that repeat
    every few thousand rows, and see no repeats), as one chunk of at most about
    ``_SAMPLE_BYTES`` (rows of 16 KiB: 64 blocks of one row); None for no sample, too few rows
    to judge, rows too wide for 32 blocks, or a nested column (Parquet's defaults then)."""
    if sample is None or sample.num_rows < 2 * _SLICES * _SLICE_ROWS:
        return None
    if not all(_flat(f.type) for f in sample.schema):
        return None
    width = max(1, sample.nbytes // sample.num_rows)
    slices = min(_SLICES, _SAMPLE_BYTES // width)
    if slices < _MIN_SLICES:
        return None
    rows = max(1, min(_SLICE_ROWS, _SAMPLE_BYTES // (slices * width)))
    blocks = sample.num_rows // rows
    picked = sorted(random.Random(blocks).sample(range(blocks), slices))  # seeded: same rows, same file
    return pa.concat_tables([sample.slice(b * rows, rows) for b in picked]).combine_chunks()


def _unique_columns(rows: pa.Table) -> set[str]:
    """The columns whose sampled values (nearly) never repeat. At most 1% repeats among 1,024
    sampled rows means some 50,000 distinct values or more (the birthday bound): a dictionary
    of them would pass Parquet's 1 MiB page limit for values of 20 bytes, and saves nothing
    for 8-byte ones in a 64Ki-row group. A column of a few thousand values repeating far
    apart (a payload per customer) shows 10% or more repeats, and keeps its dictionary."""
    limit = _UNIQUE_SHARE * rows.num_rows
    return {name for name, col in zip(rows.column_names, rows.columns, strict=True)
            if pc.count_distinct(col, mode="all").as_py() >= limit}


def dictionary_columns(sample: pa.Table | None) -> list[str] | bool:
    """The columns Parquet should dictionary-encode: every one but those whose spread sample
    shows no repeats (True, Parquet's default of every column, for no sample or a nested
    column). Why: a column of distinct values (fresh ids, payloads) fills a dictionary by
    hashing every value until the 1 MiB page limit makes Parquet fall back to plain: 11% of
    a compaction pass's CPU for nothing. A misjudged sample only changes the file's size,
    never what it reads back as."""
    rows = _spread_rows(sample)
    if rows is None:
        return True
    unique = _unique_columns(rows)
    return [name for name in rows.column_names if name not in unique]


def column_compression(sample: pa.Table | None) -> str | dict[str, str]:
    """The codec of each column: zstd, but none for a string or binary column whose sampled
    values never repeat and whose sampled bytes zstd cannot shrink below 90% (random,
    encrypted or already compressed payloads). Why: zstd on 76-byte random payloads was a
    quarter of a compaction pass's CPU and about as much of a merge's, and saved nothing.
    Values that repeat keep zstd even when the sample looks incompressible: zstd finds them
    again across a page, which a sample of spread slices does not show. A misjudged sample
    changes the file's size only."""
    rows = _spread_rows(sample)
    if rows is None or not any(_bytes_type(f.type) for f in rows.schema):
        return COMPRESSION
    unique = _unique_columns(rows)
    out = {}
    for name, col in zip(rows.column_names, rows.columns, strict=True):
        out[name] = COMPRESSION
        if name in unique and _bytes_type(col.type):
            data = col.chunk(0).buffers()[2] if col.num_chunks == 1 else None
            if data is not None and data.size >= 4096 and \
                    len(pa.compress(data, codec=COMPRESSION, asbytes=True)) >= _STORED_SHARE * data.size:
                out[name] = "none"
    return out
