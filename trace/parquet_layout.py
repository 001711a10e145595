"""How a batch's columns are laid out in Parquet: the write batch, the dictionary columns
and each column's codec.

All three are chosen from the first rows a batch's writer gets (trace/batch.py); the external
sort's run files (trace/raw_sort.py) take the write batch. None changes what a batch reads
back as: only its size and what writing and reading it cost.
"""

from __future__ import annotations

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


_SLICES, _SLICE_ROWS = 64, 16  # the spread sample that picks the dictionary columns and the codecs
_SAMPLE_BYTES = 1 << 20  # ... at most this much of the rows: fewer rows and slices when rows are wide
_MIN_SLICES = 8  # ... and no fewer slices (rows over 128 KiB keep Parquet's defaults)
_DICT_SHARE = 0.5  # a column gets a dictionary when its sample has at most this share of distinct values
COMPRESSION = "zstd"
_STORED_SHARE = 0.9  # a byte column whose sample zstd cannot shrink below this share is stored uncompressed


def _flat(t: pa.DataType) -> bool:
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_string(t)
            or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)
            or pa.types.is_fixed_size_binary(t) or pa.types.is_temporal(t) or pa.types.is_decimal(t))


def _bytes_type(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)


def _spread_rows(sample: pa.Table | None) -> pa.Table | None:
    """``_SLICES`` slices of ``_SLICE_ROWS`` rows spread over ``sample``, as one chunk of at
    most about ``_SAMPLE_BYTES`` (rows of 64 KiB: 16 slices of one row); None for no sample,
    too few rows to judge, rows too wide for 8 slices, or a nested column (Parquet's
    defaults then)."""
    if sample is None or sample.num_rows < 2 * _SLICES * _SLICE_ROWS:
        return None
    if not all(_flat(f.type) for f in sample.schema):
        return None
    width = max(1, sample.nbytes // sample.num_rows)
    slices = min(_SLICES, _SAMPLE_BYTES // width)
    if slices < _MIN_SLICES:
        return None
    rows = max(1, min(_SLICE_ROWS, _SAMPLE_BYTES // (slices * width)))
    step = sample.num_rows // slices
    return pa.concat_tables([sample.slice(i * step, rows) for i in range(slices)]).combine_chunks()


def dictionary_columns(sample: pa.Table | None) -> list[str] | bool:
    """The columns Parquet should dictionary-encode, judged on spread slices of ``sample``
    (True, Parquet's default of every column, for no sample or a nested column). Why: a
    column of distinct values (fresh ids, payloads) fills a dictionary by hashing every
    value until the 1 MiB page limit makes Parquet fall back to plain: 11% of a compaction
    pass's CPU for nothing, while time, diff and repeating columns still get theirs. A
    misjudged sample only changes the file's size, never what it reads back as."""
    rows = _spread_rows(sample)
    if rows is None:
        return True
    limit = _DICT_SHARE * rows.num_rows
    return [name for name, col in zip(rows.column_names, rows.columns, strict=True)
            if pc.count_distinct(col, mode="all").as_py() <= limit]


def column_compression(sample: pa.Table | None) -> str | dict[str, str]:
    """The codec of each column: zstd, but none for a string or binary column whose sampled
    bytes zstd cannot shrink below 90% (random, encrypted or already compressed payloads).
    Why: zstd on 76-byte random payloads was a quarter of a compaction pass's CPU and about
    as much of a merge's, and saved nothing. A misjudged sample changes the file's size only."""
    rows = _spread_rows(sample)
    if rows is None or not any(_bytes_type(f.type) for f in rows.schema):
        return COMPRESSION
    out = {}
    for name, col in zip(rows.column_names, rows.columns, strict=True):
        out[name] = COMPRESSION
        if _bytes_type(col.type):
            data = col.chunk(0).buffers()[2] if col.num_chunks == 1 else None
            if data is not None and data.size >= 4096 and \
                    len(pa.compress(data, codec=COMPRESSION, asbytes=True)) >= _STORED_SHARE * data.size:
                out[name] = "none"
    return out
