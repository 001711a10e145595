"""The CLI's file handling: reading CSV and Parquet updates in checked chunks, writing
results atomically or to stdout, and the text forms of stats and change sets. Kept apart
from the command definitions (sediment/cli/commands.py) so each file holds one concern."""

from __future__ import annotations

import contextlib
import csv
import os
import re
import sys
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from sediment._fs import fsync_dir
from sediment.errors import SedimentError
from sediment.wording import counted

FORMATS = ("csv", "parquet")
_EXTENSIONS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".parq": "parquet"}
PARQUET_BATCH_ROWS = 65536


class UsageError(Exception):
    """A command line that cannot be carried out as written (exit code 2)."""


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in text.splitlines() if part.strip()) or text


class InputError(SedimentError, ValueError):
    """An input file that cannot be read or does not fit the relation."""


def _file_format(path: str, given: str | None, what: str) -> str:
    """``csv`` or ``parquet``, from ``--format`` or else the file's extension."""
    if given:
        return given
    ext = os.path.splitext(path)[1].lower()
    if ext in _EXTENSIONS:
        return _EXTENSIONS[ext]
    raise UsageError(f"cannot tell the format of {what} {path!r} from its extension; name it .csv or .parquet, "
                     "or pass --format csv|parquet")


_CSV_COLUMN = re.compile(r"In CSV column #(\d+)")


def _csv_error(path: str, exc: pa.ArrowInvalid, names: list[str] | None, offset: int) -> InputError:
    """Name the column (pyarrow only numbers it) and roughly where in the file it broke."""
    text = _one_line(str(exc))
    match = _CSV_COLUMN.search(text)
    if match and names is not None and int(match.group(1)) < len(names):
        text = text.replace(match.group(0), f"{match.group(0)} ({names[int(match.group(1))]!r})", 1)
    return InputError(f"{path}: {text} (in the block starting near byte {offset})")


def _csv_header(path: str) -> list[str] | None:
    """The column names from the first line, to name a column in an error that pyarrow
    raised before it produced a schema."""
    try:
        with open(path, newline="", encoding="utf-8", errors="replace") as f:
            return next(csv.reader(f), None)
    except (OSError, csv.Error):
        return None


def _csv_chunks(path: str, target: pa.Schema, chunk_bytes: int) -> Iterator[tuple[pa.Table, int]]:
    """(chunk, bytes of the file read so far). The relation's types drive the CSV parser,
    so a column reads as the type it will be stored as and a bad value is a parse error."""
    with open(path, "rb") as f:
        types = {field.name: field.type for field in target}
        try:
            reader = pacsv.open_csv(f, read_options=pacsv.ReadOptions(block_size=chunk_bytes),
                                    convert_options=pacsv.ConvertOptions(column_types=types))
        except pa.ArrowInvalid as exc:
            raise _csv_error(path, exc, _csv_header(path), 0) from None
        names = reader.schema.names
        offset = 0
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                return
            except pa.ArrowInvalid as exc:
                raise _csv_error(path, exc, names, offset) from None
            offset = f.tell()
            yield pa.Table.from_batches([batch]), offset


def _parquet_file(path: str) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(path)
    except pa.ArrowInvalid as exc:
        raise InputError(f"{path}: not a readable Parquet file: {_one_line(str(exc))}") from None


def _parquet_chunks(path: str) -> Iterator[tuple[pa.Table, int]]:
    """(chunk, rows read so far)."""
    with _parquet_file(path) as pf:
        done = 0
        for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS):
            done += batch.num_rows
            yield pa.Table.from_batches([batch]), done


def _input_size(path: str, fmt: str) -> int:
    """The progress total: bytes for CSV, rows for Parquet."""
    return os.path.getsize(path) if fmt == "csv" else _parquet_file(path).metadata.num_rows


def _print_stats(stats: dict) -> None:
    """One engine's stats; a cluster's (``sediment.connect("zk://...")``: each member's) or a
    member's (its ``grpc://`` address) as each partition's engine under a heading naming it."""
    if "members" in stats or "partitions" in stats:
        members = stats["members"].values() if "members" in stats else [stats]
        for member in members:
            if not member["partitions"]:
                print(f"member {member['member']} {member['advertise']}: no partitions")
            for p, engine in member["partitions"].items():
                print(f"partition {p}: member {member['member']} {member['advertise']} generation "
                      f"{engine['generation']}")
                _print_engine_stats(engine)
        return
    _print_engine_stats(stats)


def _print_engine_stats(stats: dict) -> None:
    wal, storage = stats["wal"], stats["storage"]
    size = "" if wal.get("bytes") is None else f", {counted(wal['segments'], 'segment')}, {wal['bytes']} bytes on disk"
    print(f"wal: {wal['kind']}, LSN {wal['start_lsn']}..{wal['end_lsn']}{size}, backlog "
          f"{counted(wal['backlog_records'], 'record')} / {wal['backlog_bytes']} bytes not yet compacted, "
          f"{counted(wal['open_transactions'], 'open transaction')}")
    print(f"storage: data {storage['data_dir']}, blobs {storage['blob']}, metadata "
          f"{storage['metadata'] or '<data-dir>/meta'}")
    columns = ["relation", "rows", "batches", "stored_bytes", "since", "sealed", "trace_upper", "tail_records",
               "tail_bytes", "compaction_lag", "subscribers"]
    rows = [[name, *(str(rel[c]) for c in columns[1:])] for name, rel in stats["relations"].items()]
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(columns)]
    for line in [columns, *rows]:
        print("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths, strict=True))))


def check_output_path(out: str) -> None:
    """Refuse an ``--out`` that cannot be written before the engine is read: a missing directory
    was found only after the whole read, and named the temporary file, not ``--out``."""
    directory = os.path.dirname(out) or "."  # as the file system will resolve it: sub/.. needs sub
    if not os.path.isdir(directory):
        raise UsageError(f"--out {out}: no directory {directory}; create it or write elsewhere")
    if os.path.isdir(out):
        raise UsageError(f"--out {out} is a directory; name a file in it")


def check_csv_writable(table: pa.Table, name: str) -> None:
    """CSV is text: a binary column's bytes go out as they are, and pyarrow refuses bytes that
    are not UTF-8 only once it has written the header (on stdout, a partial output ending in
    "Invalid UTF8 payload"). Checked before anything is written, naming the way out."""
    for field, column in zip(table.schema, table.columns, strict=True):
        if pa.types.is_binary(field.type) or pa.types.is_large_binary(field.type) \
                or pa.types.is_fixed_size_binary(field.type):
            try:
                column.cast(pa.large_binary()).cast(pa.large_string())  # validates UTF-8
            except pa.ArrowInvalid:
                raise UsageError(_not_utf8(field.name, name)) from None


def _not_utf8(column: str, name: str) -> str:
    return (f"column {column!r} of {name!r} holds bytes that are not UTF-8, which CSV cannot carry: write "
            f"Parquet instead (sediment read {name} --as-of T --out FILE.parquet)")


def csv_text(table: pa.Table, name: str) -> pa.Table:
    """Every column as the text pyarrow's CSV writer gives it, which ``sediment read`` prints
    and ``sediment append`` reads back; a row's Python values printed by ``csv`` came out as
    ``b'tea'``, ``0:00:01.500000`` or ``True`` instead."""
    columns = []
    for field, column in zip(table.schema, table.columns, strict=True):
        if pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
            columns.append(column)
            continue
        try:
            columns.append(column.cast(pa.large_binary()).cast(pa.large_string())
                           if pa.types.is_fixed_size_binary(field.type) else column.cast(pa.large_string()))
        except pa.ArrowInvalid:
            raise UsageError(_not_utf8(field.name, name)) from None
    return pa.Table.from_arrays(columns, names=table.column_names)


def _write_atomically(table: pa.Table, out: str, fmt: str) -> None:
    """Write to a temporary name beside ``out`` and rename, so a failure leaves no partial file;
    the rename is made durable too (the directory's fsync)."""
    directory = os.path.dirname(os.path.abspath(out))
    tmp = os.path.join(directory, f".{os.path.basename(out)}.tmp-{os.getpid()}")
    try:
        if fmt == "csv":
            pacsv.write_csv(table, tmp)
        else:
            pq.write_table(table, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, out)
        fsync_dir(directory)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _write_stdout_csv(table: pa.Table) -> None:
    sys.stdout.flush()
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is not None:
        pacsv.write_csv(table, buffer)
        buffer.flush()
    else:  # a text-only stdout (some embedders)
        sink = pa.BufferOutputStream()
        pacsv.write_csv(table, sink)
        sys.stdout.write(sink.getvalue().to_pybytes().decode("utf-8"))
        sys.stdout.flush()


def _difference(later: pa.Table, earlier: pa.Table) -> pa.Table:
    """``later - earlier`` of two consolidated snapshots (columns + diff), consolidated."""
    from sediment.trace.consolidate import snapshot as consolidate_snapshot

    keys = [c for c in later.column_names if c != "diff"]
    negated = earlier.set_column(earlier.column_names.index("diff"), "diff", pc.negate(earlier.column("diff")))
    both = pa.concat_tables([later, negated.cast(later.schema)])
    both = both.append_column("time", pa.repeat(pa.scalar(0, pa.int64()), both.num_rows))
    return consolidate_snapshot(both.select([*keys, "time", "diff"]), keys, 0)
