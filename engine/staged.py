"""Bulk loads: Parquet files staged in the blob store become pending runs of a relation in one commit.

Why: rows written through the WAL cost a hand-off per batch into the coordinator and a second
write (log, then trace). A bulk load lets writers (Spark executors, with Spark's own Parquet
writer) put files under a staging prefix of the relation (a directory of a file blob store,
or a key prefix of an S3 one: engine/staging_area.py); :func:`commit_staged` checks them
and adds them to the trace as pending runs (docs/formats.md, "Trace state document") with
one compare-and-set of the trace state, the same commit point as a compaction pass. The WAL
is skipped: the files are durable in the blob store before the commit. Compaction folds the
runs into batches when their times are sealed, as it folds any pending run.

Every staged file gets a sediment footer in place (the old footer is cut off and a new one,
with the same schema and row groups and the batch's ``sediment.*`` description, is appended:
the data pages are not rewritten) and is linked under a batch key. A file in the update
schema that is sorted by (row, time) with distinct (row, time) and no zero diff becomes a
version 1 run; any other (a frame Spark wrote as it is, or rows out of order) a raw run
(batch format version 2, trace/raw.py), which reads consolidate and compaction's merge
rewrites: nothing is sorted inside the commit.

Only a load staged since this open commits: the open deletes every staging directory, but a
writer still running (Spark's file writer makes missing parent directories) can put part
of a load back, so :func:`stage` records each load in memory, for this open only, and puts
a marker file in its directory (which no writer makes, and a sweep deletes); a commit of a
load without both is refused.

Exactly once: the commit records the load's job name in the trace state (``loads``) in the
same compare-and-set, so a commit retried after it succeeded changes nothing; commits of one
load run one at a time (a retry sent while the first attempt runs waits for it), and a
refusal is raised only if the load is still not among the committed ones. A refused
commit changes nothing visible and leaves the staged files for :func:`abort_staged`, which
deletes them. Every file is checked before any footer is rewritten, and so are an alter, a
drop and the sealed frontier once the pass lock is held; only a seal that lands while the
footers are rewritten is found after them (the commit is refused then, and the files keep
their rows under the new footers).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import threading
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sediment._fs import fsync_dir
from sediment.engine import staging_area
from sediment.engine.args import check_time
from sediment.errors import (
    BlobError,
    InvalidArgument,
    NothingWritten,
    SchemaMismatch,
    StagedFileInvalid,
    TimeAlreadySealed,
    UnknownRelation,
)
from sediment.trace.batch import (
    FORMAT_VERSION,
    RAW_VERSION,
    BatchDescription,
    file_checksums,
)
from sediment.trace.consolidate import first_unsorted
from sediment.trace.fold import fold
from sediment.trace.raw import raw_matches, raw_run
from sediment.trace.state import BatchRef

if TYPE_CHECKING:
    from sediment.blob.protocol import BlobStore
    from sediment.engine.relation import Relation

Engine = Any  # sediment.engine.engine.Engine, which opens with sweep_staging (an import would be a cycle)

STAGING = "staging"
log = logging.getLogger(__name__)
MARKER = staging_area.MARKER
KEPT_LOADS = 64  # job names the trace state remembers: a retry comes long before 64 other loads
_JOB = re.compile(r"^[0-9a-z][0-9a-z-]{0,63}$")
_DECODE_ERRORS = (OSError, pa.ArrowException, ValueError)
_opened: weakref.WeakKeyDictionary[Any, set[tuple[int, str]]] = weakref.WeakKeyDictionary()  # engine: its staged loads
_opened_lock = threading.Lock()
_committing: weakref.WeakKeyDictionary[Any, dict[tuple[int, str], list[Any]]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class _Staged:
    """One checked staged file: its key, rows, time range, whether it is a run as it is or is
    kept as a raw run (batch format version 2), a raw run's one time and diff, and the footer
    the check read (``meta``), so the commit parses each file's footer once."""

    key: str
    path: str
    rows: int
    lo: int
    hi: int
    raw: bool = False
    time: int | None = None
    diff: int | None = None
    meta: Any = field(default=None, compare=False, repr=False)  # pq.FileMetaData


def staging_prefix(relation_id: int, job: str) -> str:
    """The blob keys of one load's staged files start with this."""
    return f"{STAGING}/{relation_id:016x}/{job}/"


def _check_job(job: object) -> str:
    if not isinstance(job, str) or not _JOB.match(job):
        raise InvalidArgument(f"bulk load job name {job!r} must match {_JOB.pattern}")
    return job


def stage(engine: Engine, name: str, job: str) -> str:
    """Where the load ``job`` of relation ``name`` writes its Parquet files, made empty: a local
    directory, or ``s3://BUCKET/KEYS/[?endpoint=URL]`` for an S3 blob store
    (engine/staging_area.py); nothing is visible until :func:`commit_staged`."""
    with engine.view.lock:
        rel = engine.view.get(name)
    path = staging_area.open_area(engine, staging_prefix(rel.entry.id, _check_job(job)))
    with _opened_lock:
        _opened.setdefault(engine, set()).add((rel.entry.id, job))
    return path


def _staged_here(engine: Engine, relation_id: int, job: str, forget: bool = False) -> bool:
    """Whether this engine (this open) staged load ``job`` of the relation; ``forget`` drops the record."""
    with _opened_lock:
        loads = _opened.get(engine, set())
        here = (relation_id, job) in loads
        if forget:
            loads.discard((relation_id, job))
    return here


def staged_keys(engine: Engine, rel: Relation, job: str) -> list[str]:
    """The staged Parquet files of a load: writers' markers (``_SUCCESS``) and hidden checksum
    files (``.part-...crc``) are not data."""
    prefix = staging_prefix(rel.entry.id, job)
    return sorted(k for k in engine.traces.blobs.list(prefix)
                  if k.endswith(".parquet") and not k[len(prefix):].startswith(("_", ".")))


def _check_file(key: str, path: str, accepted: tuple[pa.Schema, ...], keys: list[str], where: str,
                consts: tuple[int | None, int | None]) -> _Staged | None:
    """One staged file checked; None when empty. A file in the relation's update schema (time
    and diff columns, every column nullable) is checked as a run (:func:`_check_run`); any
    other shape of the relation's columns (a frame Spark wrote as it is) from its footer
    alone (:func:`_check_raw`) and becomes a raw run."""
    try:
        pf = pq.ParquetFile(path)
        got = pf.schema_arrow.remove_metadata()
    except _DECODE_ERRORS as e:
        raise StagedFileInvalid(f"{where}: staged file {key!r} is not a readable Parquet file ({e}); "
                                "abort the load and write it again") from None
    schema = accepted[-1]
    if got.equals(schema):
        return _check_run(pf, key, path, schema, keys, where)
    time, diff = consts
    shape = BatchDescription(0, 0, 1, 0, 0, format_version=RAW_VERSION, time=0 if time is not None else None,
                             diff=diff if "diff" not in got.names else None)
    if (time is None and "time" not in got.names) or not raw_matches(got, accepted, shape.time, shape.diff):
        raise SchemaMismatch(f"{where}: staged file {key!r} has columns {got.names} {[str(t) for t in got.types]}, "
                             f"the relation's are {schema.names} {[str(t) for t in schema.types]}; write the "
                             "relation's columns (any order and nullability), with time as int64 or a load time")
    return _check_raw(pf, key, path, where, time if "time" not in got.names else None, shape.diff)


def _check_raw(pf: pq.ParquetFile, key: str, path: str, where: str, time: int | None,
               diff: int | None) -> _Staged | None:
    """A raw file's rows and times from its footer (the time column read only where its
    statistics are missing); null times or diffs are refused. Its rows are never decoded."""
    if pf.metadata.num_rows == 0:
        return None
    names = pf.schema_arrow.names
    lo = hi = time
    for i in range(pf.num_row_groups):
        group = pf.metadata.row_group(i)
        if not group.num_rows:  # a writer's empty row group: no statistics to read
            continue
        for name in ("time", "diff"):
            if name not in names:
                continue
            s = group.column(names.index(name)).statistics
            if s is None or not s.has_null_count or not s.has_min_max and s.null_count < group.num_rows:
                col = _read(pf, i, name, key, where)
                nulls, mm = col.null_count, pc.min_max(col)
                s_lo, s_hi = mm["min"].as_py(), mm["max"].as_py()
            else:
                nulls, s_lo, s_hi = s.null_count, (s.min if s.has_min_max else None), (s.max if s.has_min_max else None)
            if nulls:
                raise StagedFileInvalid(f"{where}: staged file {key!r} has null {name}s; fill them")
            if name == "time":
                lo, hi = (s_lo, s_hi) if lo is None else (min(lo, s_lo), max(hi, s_hi))
    if lo < 0:
        raise StagedFileInvalid(f"{where}: staged file {key!r} has time {lo}; times are >= 0")
    return _Staged(key, path, pf.metadata.num_rows, lo, hi, True, time, diff, pf.metadata)


def _read(pf: pq.ParquetFile, i: int, name: str, key: str, where: str) -> pa.ChunkedArray:
    try:
        return pf.read_row_group(i, columns=[name]).column(0)
    except _DECODE_ERRORS as e:
        raise StagedFileInvalid(f"{where}: staged file {key!r} row group {i} fails to decode ({e})") from None


def _check_run(pf: pq.ParquetFile, key: str, path: str, schema: pa.Schema, keys: list[str],
               where: str) -> _Staged | None:
    """Nulls, times and order of a staged file in the update schema, one row group at a time.

    Why so: times and diffs are settled by the row groups' statistics when the writer kept them
    (Spark's and Arrow's writers do), so only the first key column is decoded when it alone
    orders the rows; a group it does not order is read whole and checked in full."""
    if pf.metadata.num_rows == 0:
        return None
    cols = [*keys, "time"]
    lo, hi, is_run, last = None, None, True, None
    for i in range(pf.num_row_groups):
        if not pf.metadata.row_group(i).num_rows:  # a writer's empty row group: nothing to check or order
            continue
        facts = _stated_facts(pf.metadata.row_group(i), schema)
        lead = [keys[0]] if facts is not None else [keys[0], "time", "diff"]
        whole = False  # the first column alone settles the order of rows it tells apart
        try:
            t = pf.read_row_group(i, columns=lead) if is_run or facts is None else None
            if is_run and (last is not None or first_unsorted(t, keys[:1], strict=True) is not None):
                t, whole = pf.read_row_group(i), True
        except _DECODE_ERRORS as e:
            raise StagedFileInvalid(f"{where}: staged file {key!r} row group {i} fails to decode ({e})") from None
        t_lo, t_hi, nonzero = facts if facts is not None else _read_facts(t, key, where)
        if t_lo < 0:
            raise StagedFileInvalid(f"{where}: staged file {key!r} has time {t_lo}; times are >= 0")
        lo, hi = (t_lo, t_hi) if lo is None else (min(lo, t_lo), max(hi, t_hi))
        if is_run and not whole:
            is_run = nonzero
            last = None if i + 1 == pf.num_row_groups else pf.read_row_group(i, columns=cols).slice(t.num_rows - 1)
        elif is_run:
            part = t.select(cols)
            joined = part if last is None else pa.concat_tables([last, part])
            is_run = nonzero and first_unsorted(joined, cols, strict=True) is None
            last = part.slice(part.num_rows - 1)
    return _Staged(key, path, pf.metadata.num_rows, lo, hi, not is_run, meta=pf.metadata)


def _stated_facts(group: Any, schema: pa.Schema) -> tuple[int, int, bool] | None:
    """(least time, greatest time, no zero diff) from a row group's statistics, or None when they
    are missing or leave it open (nulls, or diffs on both sides of zero): then the data decides."""
    stats = [group.column(schema.get_field_index(name)).statistics for name in ("time", "diff")]
    if any(s is None or not s.has_min_max or not s.has_null_count or s.null_count for s in stats):
        return None
    (t_lo, t_hi), (d_lo, d_hi) = ((s.min, s.max) for s in stats)
    if not d_lo > 0 and not d_hi < 0:
        return None
    return t_lo, t_hi, True


def _read_facts(t: pa.Table, key: str, where: str) -> tuple[int, int, bool]:
    """:func:`_stated_facts` from the decoded time and diff columns; refuses null times or diffs."""
    time, diff = t.column("time"), t.column("diff")
    if time.null_count or diff.null_count:
        raise StagedFileInvalid(f"{where}: staged file {key!r} has null times or diffs; fill them")
    t_lo, t_hi = (v.as_py() for v in pc.min_max(time).values())
    return t_lo, t_hi, pc.min(pc.abs(diff)).as_py() > 0


def _footer(path: str, schema: pa.Schema, desc: BatchDescription, meta: Any) -> tuple[int, bytes]:
    """(where the file's footer starts, a footer with the same row groups as ``meta`` (the
    file's), ``schema`` and ``desc``)."""
    sink = pa.BufferOutputStream()
    pq.ParquetWriter(sink, schema.with_metadata(desc.to_metadata())).close()
    footer = pq.read_metadata(pa.BufferReader(sink.getvalue()))
    try:
        footer.append_row_groups(meta)
    except RuntimeError as e:  # Arrow's refusal of a file whose Parquet schema is not the batch's (field ids)
        raise ValueError(f"its Parquet schema is not the batch's: {str(e).splitlines()[0]}") from e
    out = pa.BufferOutputStream()
    footer.write_metadata_file(out)
    with open(path, "rb") as f:
        f.seek(-8, os.SEEK_END)
        tail = f.read(8)
        start = f.tell() - 8 - int.from_bytes(tail[:4], "little")
    return start, out.getvalue().to_pybytes()[4:]  # write_metadata_file starts with the magic


def _as_run(engine: Engine, rel: Relation, staged: _Staged, since: int) -> BatchRef:
    """The staged file as a pending run under a fresh batch key: its pages kept, a new footer."""
    rid, keys = rel.entry.id, rel.keys
    # Spark's files carry no field ids, so they are read by version 0's names: a relation an
    # alter renamed or added columns to gets the file rewritten with its ids instead; a raw
    # file (written as the frame was) is kept as it is only while no alter has run at all
    unaltered = rel.layout is None or rel.layout.current_version == 0
    by_name = unaltered or (not staged.raw and rel.layout.is_current(engine.traces.schema_of(rid)))
    desc = BatchDescription(rid, staged.lo, staged.hi + 1, since, staged.rows,
                            format_version=RAW_VERSION if staged.raw else FORMAT_VERSION,
                            time=staged.time, diff=staged.diff)
    if not by_name:
        table = pq.read_table(staged.path)
        run = raw_run(table, desc, engine.traces.schema_of(rid)) if staged.raw else fold(table, keys, None)
        if not run.num_rows:
            return BatchRef(None, staged.lo, staged.hi + 1)
        lo, hi = (v.as_py() for v in pc.min_max(run.column("time")).values())
        return engine.traces.write(rid, run.select(rel.update_schema.names), lo, hi + 1, since)
    schema = staged.meta.schema.to_arrow_schema().remove_metadata() if staged.raw else engine.traces.schema_of(rid)
    start, footer = _footer(staged.path, schema, desc, staged.meta)
    if os.stat(staged.path).st_nlink > 1:  # linked as a batch by an earlier commit of unknown outcome: keep it as it is
        _own_copy(staged.path)
    with open(staged.path, "r+b") as f:
        f.truncate(start)
        f.seek(start)
        f.write(footer)
        f.flush()
        os.fsync(f.fileno())
    crc, footer_crc = file_checksums(staged.path, f"staged file {staged.key!r}")
    key = engine.traces.new_key(rid, staged.lo, staged.hi + 1)
    staging_area.put_file(engine.traces.blobs, key, staged.path)
    return BatchRef(key, staged.lo, staged.hi + 1, staged.rows, os.path.getsize(staged.path), 0, since,
                    None, None, crc, footer_crc, staged.raw, staged.time, staged.diff)


def _own_copy(path: str) -> None:
    """Put a copy of ``path`` in its place, so rewriting its footer leaves the other links alone."""
    tmp = f"{path}.copy"
    with open(path, "rb") as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
        dst.flush()
        os.fsync(dst.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))


@contextlib.contextmanager
def _one_at_a_time(engine: Engine, relation_id: int, job: str) -> Iterator[None]:
    """Hold load ``job``'s commit lock: a retry the driver sends while the first attempt still
    runs waits for it, then finds the load committed, instead of checking files the first
    attempt's clean-up is deleting."""
    with _opened_lock:
        slot = _committing.setdefault(engine, {}).setdefault((relation_id, job), [threading.Lock(), 0])
        slot[1] += 1
    try:
        with slot[0]:
            yield
    finally:
        with _opened_lock:
            slot[1] -= 1
            if not slot[1]:
                _committing.get(engine, {}).pop((relation_id, job), None)


def committing(engine: Engine, relation_id: int, job: str) -> int:
    """Commits of load ``job`` running or waiting for the one running (0: none)."""
    with _opened_lock:
        slot = _committing.get(engine, {}).get((relation_id, job))
        return slot[1] if slot is not None else 0


def commit_staged(engine: Engine, name: str, job: str, time: int | None = None, diff: int | None = None
                  ) -> dict[str, Any]:
    """Add the staged files of load ``job`` to relation ``name`` as pending runs, atomically.

    ``time``/``diff``: every row's time and diff, for files without such a column (a frame
    Spark wrote as it is; diff defaults to 1). Every file is checked first (schema, null
    times or diffs, times above the sealed frontier): any refusal raises with nothing
    changed. Nothing is sorted or consolidated here: a file that is not a run as written is
    committed as a raw run, which reads consolidate and the merge after the next compaction
    pass rewrites (at once when the runs are more than ``max_pending_runs``).
    Returns ``{"rows", "runs", "min_time", "max_time", "committed"}``; ``committed`` is False
    when the load was committed before (a retry), which changes nothing and reports the rows
    and times the first commit kept, and ``counts_known`` (False: not kept, rows 0)."""
    _check_job(job)
    if time is not None:
        check_time(time, "time")
    diff = 1 if diff is None else diff
    if not isinstance(diff, int) or isinstance(diff, bool) or not 0 < abs(diff) < 1 << 63:
        raise InvalidArgument(f"bulk load {job!r}: diff {diff!r} must be a non-zero int64")
    with engine.view.lock:
        rel = engine.view.get(name)
    with _one_at_a_time(engine, rel.entry.id, job):
        try:
            return _commit(engine, rel, name, job, time, diff)
        except NothingWritten:
            with engine.compaction.pass_lock, engine.view.lock:  # a commit of the load that landed meanwhile
                if engine.view.relations.get(name) is rel and job in rel.trace.loads:
                    return _again(rel, job)
            raise


def _commit(engine: Engine, rel: Relation, name: str, job: str, time: int | None, diff: int) -> dict[str, Any]:
    """:func:`commit_staged` of load ``job``, with the load's commit lock held."""
    with engine.view.lock:
        if job in rel.trace.loads:
            return _again(rel, job)
        version, keys, accepted = rel.schema_version, rel.keys, (engine.traces.schema_of(rel.entry.id),)
    where = f"bulk load {job!r} of relation {name!r}"
    if not _staged_here(engine, rel.entry.id, job) or not staging_area.marked(engine, staging_prefix(rel.entry.id, job)):
        raise StagedFileInvalid(f"{where}: not staged since the coordinator opened (aborted, or staged before a "
                                "restart, which collects its files even if a writer puts some back); write it again")
    with staging_area.local_files(engine) as path_of:
        checked = [s for s in _map(lambda k: _check_file(k, path_of(k), accepted, keys, where, (time, diff)),
                                   staged_keys(engine, rel, job), "sediment-bulk-check") if s is not None]
        lo, hi = min((s.lo for s in checked), default=None), max((s.hi for s in checked), default=None)
        _check_sealed(rel, name, lo)
        refs = engine.compaction.add_runs(
            rel, lambda since: _as_runs(engine, rel, checked, since, where, version), job,
            check=lambda: _check_sealed(rel, name, lo), keep_loads=KEPT_LOADS, times=(lo, hi))
    if refs is None:  # a commit of the same load got there first
        with engine.view.lock:
            return _again(rel, job)
    if engine.scheduler is not None and len(rel.trace.pending) > engine.compaction.settings.max_pending_runs:
        engine.scheduler.merge_soon()  # many runs: the merge task folds neighbours together now
    abort_staged(engine, name, job)
    return {"rows": sum(r.rows for r in refs), "runs": len(refs), "min_time": lo, "max_time": hi, "committed": True}


def _again(rel: Relation, job: str) -> dict[str, Any]:
    """The reply to a commit of a load committed before (under the lock): the rows and times
    the trace state kept with it; ``counts_known`` False (rows 0, times None) for a load
    committed by a build that did not keep them."""
    facts = rel.trace.load_result(job)
    rows, lo, hi = facts if facts is not None else (0, None, None)
    return {"rows": rows, "runs": 0, "min_time": lo, "max_time": hi, "committed": False,
            "counts_known": facts is not None}


def _as_runs(engine: Engine, rel: Relation, checked: list[_Staged], since: int, where: str,
             version: int) -> list[BatchRef]:
    """Every checked file as a pending run (:func:`_as_run`, two at a time), under the pass lock,
    which an alter takes too: files checked against schema ``version`` are refused when an
    alter came between the checks and here. When one fails, the runs already linked are
    deleted before the error is raised: nothing references them, and left alone they would
    wait for the next open's orphan sweep."""
    if rel.schema_version != version:
        raise SchemaMismatch(f"{where}: the relation was altered during the load (schema version {version}, now "
                             f"{rel.schema_version}); nothing was committed: abort the load and write it again")
    with engine.view.lock:  # a drop takes the pass lock too; a seal does not, so add_runs checks it again
        if engine.view.get(rel.entry.name) is not rel:
            raise UnknownRelation(f"{where}: the relation was dropped during the load; nothing was committed")
        _check_sealed(rel, rel.entry.name, min((s.lo for s in checked), default=None))
    with ThreadPoolExecutor(2, "sediment-bulk-run") as pool:
        futures = [pool.submit(_as_run, engine, rel, s, since) for s in checked]
    failed = [(s, f.exception()) for s, f in zip(checked, futures, strict=True) if f.exception() is not None]
    if failed:
        engine.traces.delete([f.result().key for f in futures if f.exception() is None and f.result().key])
        s, e = failed[0]
        if isinstance(e, _DECODE_ERRORS):
            raise StagedFileInvalid(f"{where}: staged file {s.key!r} cannot take a batch footer "
                                    f"({str(e).splitlines()[0]}); nothing was "
                                    "committed: abort the load and write it again") from e
        raise e
    return [f.result() for f in futures]


def _map(fn: Callable[[Any], Any], items: list[Any], name: str) -> list[Any]:
    """``fn`` over ``items`` on two threads (reading and footers are I/O and Arrow, which release the GIL)."""
    with ThreadPoolExecutor(2, name) as pool:
        return list(pool.map(fn, items))


def _check_sealed(rel: Relation, name: str, lo: int | None) -> None:
    if lo is not None and lo <= rel.sealed:
        raise TimeAlreadySealed(f"relation {name!r} is sealed through time {rel.sealed}, but the staged files "
                                f"include time {lo}; load at times > {rel.sealed} (nothing was committed)")


def abort_staged(engine: Engine, name: str, job: str) -> int:
    """Delete what load ``job`` staged (nothing of it is visible); returns how many files."""
    _check_job(job)
    with engine.view.lock:
        rel = engine.view.get(name)
    _staged_here(engine, rel.entry.id, job, forget=True)
    return staging_area.remove(engine.traces.blobs, staging_prefix(rel.entry.id, job))[0]


def sweep_staging(blobs: BlobStore) -> list[str]:
    """At open: delete every staging directory. A load staged before a restart can no longer
    commit (this open did not stage it: its commit says so), so its writer writes it again.
    Only collection: an S3 store that fails the listing leaves them to the next open."""
    try:
        return staging_area.remove(blobs, f"{STAGING}/")[1]
    except BlobError as exc:
        log.warning("could not collect the staged files of bulk loads under %s/: %s", STAGING, exc)
        return []


def drop_staging(blobs: BlobStore, relation_id: int) -> list[str]:
    """At a relation's drop: delete its loads' staging directories (their commits and aborts
    can only find the relation gone); returns the loads' names."""
    try:
        return staging_area.remove(blobs, f"{STAGING}/{relation_id:016x}/")[1]
    except (OSError, BlobError):  # the drop stands: the next open's sweep deletes what is left
        return []

