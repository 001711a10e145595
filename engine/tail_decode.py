"""Many WAL records of a relation's tail decoded together: their bodies read from the log in
few reads, decoded with one IPC stream read per run of one schema version, projected once.

Why: pyarrow lets go of the interpreter lock in almost every call, and so do syscalls. A
read that took each record alone (``log.read``, a decode, a projection, a table of it) made
several such calls a record, and beside threads running Python each one waits for the lock
again, up to the switch interval (5 ms): a snapshot, replay or feed catch-up over thousands
of one-row records took seconds where it takes milliseconds alone. Compaction, the reads
(engine/reads.py) and the feeds (engine/feed.py) share these steps. A run that does not
decode to the rows its headers count is decoded again one record at a time, which names
the damaged record by its LSN.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa

from sediment.arrow_codec import decode_updates_many, message_count
from sediment.engine.relation import Relation, TailEntry
from sediment.errors import SedimentError, WalCorruption
from sediment.wal.protocol import WriteAheadLog

Body = object
Target = tuple[int, pa.Schema]  # (schema version, its update schema): what the rows are read as

SMALL_RECORD_BYTES = 64 << 10


def small_records(entries: Sequence[TailEntry]) -> bool:
    """Whether ``entries`` are worth joining: several, averaging less than 64 KiB. Past that,
    a record's rows are enough for the kernels' per-call costs, and joining costs a copy of
    every byte (1,000-row records of 100 B rows: 20% of a compaction pass's CPU)."""
    return len(entries) > 1 and sum(e.bytes for e in entries) < SMALL_RECORD_BYTES * len(entries)


def bodies_of(entries: Sequence[TailEntry], cached: Callable[[int], Body | None], log: WriteAheadLog) -> list[Body]:
    """The bodies of ``entries``: from ``cached`` (the engine's memory of recent bodies) where
    it has them, the others read from ``log`` together (``read_many``: neighbours in one read)."""
    bodies = [cached(e.lsn) for e in entries]
    missing = [e.lsn for e, body in zip(entries, bodies, strict=True) if body is None]
    if missing:
        read = iter(log.read_many(missing))
        bodies = [body if body is not None else next(read).body for body in bodies]
    return bodies


def decode_tail(rel: Relation, entries: Sequence[TailEntry], bodies: Sequence[Body], target: Target) -> pa.Table:
    """The rows of ``entries`` (their ``bodies``) in order, in the ``target`` schema version:
    joined when the records are small (:func:`joined`), else, or when a run is damaged, one
    record at a time (:func:`decoded`, which names a damaged record's LSN)."""
    table = joined(rel, entries, bodies, target) if small_records(entries) else None
    if table is None:
        table = pa.Table.from_batches([decoded(rel, e, body, target) for e, body in zip(entries, bodies, strict=True)],
                                      schema=target[1])
    return table


def joined(rel: Relation, entries: Sequence[TailEntry], bodies: Sequence[Body], target: Target) -> pa.Table | None:
    """``entries`` decoded with one stream read per run of one schema version
    (arrow_codec.decode_updates_many), other versions' runs projected to ``target`` once
    each; None when any run does not decode to its rows (the caller then decodes one by one)."""
    version, schema = target
    parts = []
    for start, stop, written in _runs([e.schema_version for e in entries]):
        source = _source(rel, written, target)
        if source is None:
            return None
        try:
            part = decode_updates_many(list(bodies[start:stop]), source)
        except (pa.ArrowException, OSError, EOFError, ValueError):
            return None
        if part.num_rows != sum(e.rows for e in entries[start:stop]):
            return None
        if source is not schema:
            part = rel.layout.project(part, version)
        parts.append(part)
    if not parts:
        return schema.empty_table()
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts)


def decoded(rel: Relation, entry: TailEntry, body: Body, target: Target) -> pa.RecordBatch:
    """One WAL record's batch in ``target``, or WalCorruption naming it when its body does not
    decode to the rows its header counts (the body passed its checksum: damage after it was
    read, or a build's bug)."""
    try:
        batch = rel.decode_body(body, entry.schema_version, target[0])
    except (SedimentError, MemoryError):  # not damage: out of memory keeps its type
        raise
    except Exception as e:  # pyarrow's errors on a damaged message: OSError, EOFError, ArrowInvalid
        batch, cause = None, f"{type(e).__name__}: {e}"
    else:
        cause = f"{batch.num_rows} rows decoded"
    if batch is None or batch.num_rows != entry.rows:
        raise WalCorruption(f"relation {rel.entry.name!r}: the UPDATES record at LSN {entry.lsn} does not decode to "
                            f"the {entry.rows} rows its header counts ({cause}); run `sediment verify`")
    return batch


def decode_each(rel: Relation, records: Sequence[tuple[int, Body]], target: Target,
                one: Callable[[int], pa.Table]) -> list[tuple[pa.Table, int]]:
    """Each record of ``records`` (its schema version written, its body) as a table of its
    own rows in ``target``, with its size in bytes: decoded together per run of one version,
    then cut into the records' slices (a feed keeps one event a record), each sized as its
    share of the run's rows (``Table.nbytes`` lets go of the interpreter lock: a call a
    record waited for it a record). A run that does not decode whole is taken one record at a
    time with ``one(i)`` (``i``: its index), which raises as a read of that record alone does."""
    out: list[tuple[pa.Table, int]] = []
    for start, stop, written in _runs([w for w, _body in records]):
        out += _run_each(rel, [body for _w, body in records[start:stop]], written, target) or \
            [(table, table.nbytes) for table in (one(i) for i in range(start, stop))]
    return out


def _runs(versions: Sequence[int]) -> Iterator[tuple[int, int, int]]:
    """(start, stop, version) of each run of equal schema versions in ``versions``."""
    start = 0
    while start < len(versions):
        stop = start + 1
        while stop < len(versions) and versions[stop] == versions[start]:
            stop += 1
        yield start, stop, versions[start]
        start = stop


def _source(rel: Relation, written: int, target: Target) -> pa.Schema | None:
    """The schema records written under version ``written`` decode with (``target``'s own
    schema object when it is that version), or None when the relation does not know it."""
    version, schema = target
    if written == version:
        return schema
    return rel.layout.decode_schema(written) if rel.layout is not None else None


def _run_each(rel: Relation, bodies: list[Body], written: int, target: Target) -> list[tuple[pa.Table, int]] | None:
    version, schema = target
    source = _source(rel, written, target)
    if source is None or len(bodies) < 2:
        return None
    try:
        counts = [message_count(body) for body in bodies]
        table = decode_updates_many(bodies, source)
    except (pa.ArrowException, OSError, EOFError, ValueError):
        return None
    chunks = [len(chunk) for chunk in table.column(0).chunks]
    if len(chunks) != sum(counts):
        return None
    rows, at = [], 0
    for n in counts:
        rows.append(sum(chunks[at:at + n]))
        at += n
    if source is not schema:
        table = rel.layout.project(table, version)
    table = table.combine_chunks()  # a slice of a chunked column walks its chunks: one per record here
    size, total = table.nbytes, max(1, table.num_rows)
    return [(piece, size * n // total) for piece, n in zip(split_rows(table, rows), rows, strict=True)]


def split_rows(table: pa.Table, rows: Sequence[int]) -> list[pa.Table]:
    """``table`` cut into consecutive pieces of ``rows`` rows each: slices, which take no
    pyarrow call that lets go of the interpreter lock."""
    out, at = [], 0
    for n in rows:
        out.append(table.slice(at, n))
        at += n
    return out
