"""Batch reads of the ``sediment`` data source: the plan, its partitions, and the executors' reads.

``load()`` gives the relation consolidated (columns + ``diff``) as of ``asOf`` (default: the
sealed frontier), or with ``from`` its consolidated changes in (from, asOf] (columns, ``time``,
``diff``), or with ``raw`` the stored updates (columns, ``time``, ``diff``).

Consolidation needs every update of a row in one task, without a shuffle: batches are sorted
by the row's columns, so the first row column's Parquet statistics say which values each row
group holds. The planner cuts that column's value space into ranges of about ``split_rows``
rows at row-group boundaries; a task reads the row groups whose statistics meet its range,
keeps the rows whose first column falls in it (equal rows always share a range), adds its
share of the WAL tail and consolidates locally. A float first column (NaN has no place in an
order) or a relation with no usable statistics reads as one range. Pushed filters drop row
groups by statistics in the planner and rows in the tasks.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from sediment.arrow_codec import (
    schema_from_text,
    schema_to_text,
    table_from_ipc,
    table_from_text,
    table_to_ipc,
)
from sediment.net import held_tails
from sediment.spark_jobs import pushdown
from sediment.spark_jobs.errors import short_traceback
from sediment.spark_jobs.options import (
    DEFAULT_LEASE_SECONDS,
    DIFF,
    TIME,
    arrow_schema,
    as_of_option,
    bool_option,
    conform,
    connect,
    int_option,
    required,
)

SPLIT_ROWS = 1 << 20  # rows per read task
TAIL_SPLIT_ROWS = 1 << 16  # WAL-tail rows per task when the tail alone is read
MAX_TAIL_PARTS = 16


@dataclass
class PlanInfo:
    """The part of a coordinator's read plan the executors need (small: pickled to each task)."""

    lease: int
    relation: str
    relation_id: int
    as_of: int
    from_t: int | None
    blob_uri: str
    s3_endpoint: str | None
    batches: list[dict]
    update_schema_b64: str
    key_columns: list[str] = field(default_factory=list)
    schema_history: dict | None = None  # an altered relation's versions: old batches are read by field id

    @classmethod
    def of(cls, plan: Any, from_t: int | None) -> PlanInfo:
        return cls(plan.lease, plan.relation, plan.relation_id, plan.as_of, from_t, plan.blob_uri,
                   plan.s3_endpoint, list(plan.batches), schema_to_text(plan.update_schema), list(plan.key_columns),
                   getattr(plan, "schema_history", None))

    @property
    def update_schema(self) -> pa.Schema:
        return schema_from_text(self.update_schema_b64)

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> PlanInfo:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class ReadSpec:
    """What every task of one read needs besides its own share (pickled with each partition)."""

    relation_id: int
    as_of: int
    from_t: int | None
    blob_uri: str
    s3_endpoint: str | None
    mode: str  # snapshot | changes | raw
    key_columns: tuple[str, ...]
    filters: tuple[pushdown.Pushed, ...]
    boundaries: tuple[Any, ...]  # first row column: range i is [b[i-1], b[i]); nulls in range 0
    credentials: tuple[tuple[str, str], ...] = ()
    history: str = ""  # PlanInfo.schema_history as JSON text ("" : the relation was never altered)

    def layout(self) -> Any:
        """The relation's schema versions (trace/evolve.py Layout), or None when never altered."""
        return layout_of(self.history)

    @classmethod
    def of(cls, info: PlanInfo, mode: str = "raw") -> ReadSpec:
        keys = tuple(info.key_columns or [n for n in info.update_schema.names if n not in (TIME, DIFF)])
        return cls(info.relation_id, info.as_of, info.from_t, info.blob_uri, info.s3_endpoint, mode, keys, (), (),
                   history=json.dumps(info.schema_history) if info.schema_history else "")


@dataclass(frozen=True)
class HeldTail:
    """A WAL tail the coordinator keeps for the plan's lease (``plan_read_held``): tasks fetch
    their parts of it themselves, so its rows never pass through the driver."""

    relation: str
    lease: int
    rows: int
    parts: int
    key: str | None
    cuts: tuple[Any, ...]  # the coordinator's quantiles of ``key``, for a read with no batch statistics


@dataclass(frozen=True)
class TailFetch:
    """Which part of a held tail a task reads: key range ``index`` of ``cuts`` on ``key``, or
    rows [start, stop), or (all None) all of it."""

    relation: str
    lease: int
    key: str | None = None
    cuts: Any = None  # pa.Array of the key's type
    index: int | None = None
    start: int | None = None
    stop: int | None = None


class ScanPartition(InputPartition):
    """One task's share: row groups of stored batches and WAL-tail rows (Arrow IPC bytes, or a
    part of a tail held on the coordinator), with the index of its key range (None: no
    range, a raw read)."""

    def __init__(self, spec: ReadSpec, groups: list[tuple[dict, list[int]]], tail: bytes, index: int | None,
                 seq: int = 0, fetch: TailFetch | None = None) -> None:
        super().__init__((seq, index, sum(len(g) for _, g in groups), len(tail), fetch is not None))
        self.spec = spec
        self.groups = groups
        self.tail = tail
        self.index = index
        self.fetch = fetch


def ipc_bytes(table: pa.Table) -> bytes:
    """A scan partition's tail rows as IPC bytes; none at all (b"") for no rows."""
    return table_to_ipc(table) if table.num_rows else b""


_stores: dict[tuple[str, str | None], Any] = {}
_stores_lock = threading.Lock()

AWS_OPTIONS = {"aws_access_key_id": "AWS_ACCESS_KEY_ID", "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
               "aws_session_token": "AWS_SESSION_TOKEN", "aws_region": "AWS_DEFAULT_REGION"}


def credentials_of(options: Any) -> tuple[tuple[str, str], ...]:
    return tuple((env, str(options[k])) for k, env in AWS_OPTIONS.items() if options.get(k))


def blob_store(blob_uri: str, s3_endpoint: str | None, credentials: Sequence[tuple[str, str]] = ()) -> Any:
    """One blob store per Python worker process and URI: Spark reuses workers across tasks,
    and an S3 client costs far more to build than a batch's first request. Credentials given
    as options become this worker's AWS environment, so executors need none set up by hand."""
    from sediment.blob.uri import open_blob_store

    for env, value in credentials:
        os.environ[env] = value
    key = (blob_uri, s3_endpoint)
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = open_blob_store(blob_uri, s3_endpoint=s3_endpoint) \
                if blob_uri.startswith("s3://") else open_blob_store(blob_uri)
        return store


def layout_of(history: str) -> Any:
    """The Layout of a plan's schema history (JSON text), None for a relation never altered."""
    if not history:
        return None
    from sediment.engine.schema_history import SchemaHistory

    return SchemaHistory.from_json(json.loads(history)).layout()


def current(table: pa.Table, layout: Any) -> pa.Table:
    """A stored row group in the relation's current columns (by field id), when it was altered."""
    return table if layout is None or layout.is_current(table.schema) else layout.project(table)


def open_batch(spec: ReadSpec, ref_doc: dict) -> tuple[Any, Any, str]:
    """A stored batch opened with its footer checked against the plan's reference."""
    from sediment.errors import BatchCorruption, BlobNotFound
    from sediment.trace.batch import open_stored
    from sediment.trace.state import BatchRef
    from sediment.trace.store import describe

    ref = BatchRef(**ref_doc)
    blobs = blob_store(spec.blob_uri, spec.s3_endpoint, spec.credentials)
    where = f"batch {ref.key!r}"
    try:
        pf, desc = open_stored(blobs, ref.key, describe(spec.relation_id, ref), expected_bytes=ref.bytes,
                               footer_crc=ref.footer_crc)
    except BlobNotFound as e:
        raise BatchCorruption(f"{where} is gone from the blob store: the read plan's lease ended (released, or "
                              "expired after lease_seconds) and compaction replaced the batch; read again") from e
    return pf, desc, where


# --- planning (pure given the statistics) ---------------------------------------------------


@dataclass(frozen=True)
class GroupStats:
    """One row group as the planner sees it."""

    batch: int
    index: int
    rows: int
    first: tuple[Any, Any, int | None]  # (min, max, nulls) of the first row column; None: unknown
    time: tuple[Any, Any]


def _stats(rg: Any, column: int) -> tuple[Any, Any, int | None]:
    s = rg.column(column).statistics
    if s is None:
        return (None, None, None)
    nulls = s.null_count if s.has_null_count else None
    return (s.min, s.max, nulls) if s.has_min_max else (None, None, nulls)


def group_stats(pf: Any, batch: int, names: Sequence[str], layout: Any = None, time: int | None = None,
                ) -> list[tuple[GroupStats, dict[str, tuple]]]:
    """Every row group's statistics: the first row column's and time's, and each named column's.
    With a ``layout`` (an altered relation) a current column's statistics are those of the
    stored column with its field id, in the type it was written with; none when the batch
    predates the column. ``time``: a raw run's one time, when its file has no time column."""
    md = pf.metadata
    schema_names = [md.schema.column(i).name for i in range(md.num_columns)]
    stored = {n: n for n in schema_names} if layout is None else layout.stored_names(pf.schema_arrow)
    out = []
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        cols = {n: _stats(rg, schema_names.index(stored[n])) for n in names if stored.get(n) in schema_names}
        t = _stats(rg, schema_names.index(TIME)) if TIME in schema_names else (time, time)
        first = cols.get(names[0], (None, None, None)) if names else (None, None, None)
        out.append((GroupStats(batch, i, rg.num_rows, first, (t[0], t[1])), cols))
    return out


def wanted(g: GroupStats, cols: dict[str, tuple], as_of: int, from_t: int | None,
           filters: Sequence[pushdown.Pushed]) -> bool:
    """Whether a row group can hold a row the read needs (times, then pushed filters)."""
    lo, hi = g.time
    if lo is not None and lo > as_of:
        return False
    if hi is not None and from_t is not None and hi <= from_t:
        return False
    for f in filters:
        s = cols.get(f[1])
        if s is not None and not pushdown.may_match(f, s[0], s[1], s[2], g.rows):
            return False
    return True


def boundaries(groups: Sequence[GroupStats], split_rows: int) -> list[Any]:
    """Cut points of the first row column: a new range starts at a row group's minimum once
    the previous range holds ``split_rows`` rows. Strictly increasing."""
    known = sorted((g for g in groups if g.first[0] is not None), key=lambda g: g.first[0])
    if len(known) != len(groups):
        return []
    cuts: list[Any] = []
    acc = 0
    for g in known:
        if acc >= split_rows and (not cuts or g.first[0] > cuts[-1]) and g.first[0] > known[0].first[0]:
            cuts.append(g.first[0])
            acc = 0
        acc += g.rows
    return cuts


def meets(g: GroupStats, cuts: Sequence[Any], index: int) -> bool:
    """Whether row group ``g`` may hold first-column values of range ``index`` (nulls: range 0)."""
    lo, hi, nulls = g.first
    if index == 0 and (nulls is None or nulls > 0):
        return True
    if lo is None or hi is None:
        return True
    start = cuts[index - 1] if index > 0 else None
    end = cuts[index] if index < len(cuts) else None
    return (start is None or hi >= start) and (end is None or lo < end)


def range_index(column: pa.ChunkedArray | pa.Array, cuts: Sequence[Any]) -> pa.Array:
    """Each value's range: how many cut points are <= it (nulls: 0). The coordinator cuts held
    WAL tails with the same function."""
    return held_tails.range_index(column, cuts)


def quantile_cuts(column: pa.ChunkedArray, parts: int) -> list[Any]:
    """Cut points splitting a column's non-null values into about ``parts`` equal ranges."""
    return held_tails.quantile_cuts(column, parts).to_pylist()


# --- the reader -----------------------------------------------------------------------------


def mode_of(options: Any) -> str:
    raw = bool_option(options, "raw")
    if raw:
        return "raw"
    return "changes" if int_option(options, "from") is not None else "snapshot"


def plan_relation(options: Any, *, hold: bool = True) -> tuple[PlanInfo, pa.Table, HeldTail | None]:
    """Ask the coordinator for a read plan (asOf default: the sealed frontier; from;
    lease_seconds); returns the plan, its WAL-tail rows when they came with it, and (with
    ``hold``) the held tail when the coordinator kept them (more than one task's worth)."""
    relation = required(options, "relation")
    from_t = int_option(options, "from")
    lease = float(options.get("lease_seconds") or DEFAULT_LEASE_SECONDS)
    split_rows = int_option(options, "split_rows", SPLIT_ROWS) or SPLIT_ROWS
    with connect(options) as client:
        as_of = as_of_option(options)
        if as_of is None:
            as_of = client.sealed(relation)
        plan, held, cuts = client.plan_read_held(relation, as_of, from_t=from_t, lease_seconds=lease,
                                                 part_rows=min(split_rows, TAIL_SPLIT_ROWS) if hold else None,
                                                 max_parts=MAX_TAIL_PARTS)
    return PlanInfo.of(plan, from_t), plan.tail, held_tail(relation, plan.lease, held, cuts)


def held_tail(relation: str, lease: int, held: dict[str, Any] | None, cuts: pa.Array | None) -> HeldTail | None:
    """What ``Client.plan_read_held`` said about a held tail, as the planner keeps it."""
    if held is None:
        return None
    return HeldTail(relation, lease, held["rows"], held["parts"], held["key"],
                    tuple(cuts.to_pylist()) if cuts is not None else ())


class SedimentReader(DataSourceReader):
    """Plans in the planning worker (``partitions``), reads on executors. Without pushdown:
    PySpark refuses a reader that implements ``pushFilters`` in a session where
    ``spark.sql.python.filterPushdown.enabled`` is false, so that one is a subclass."""

    def __init__(self, options: dict[str, str], schema: StructType, columns_b64: str) -> None:
        self.options = dict(options)
        self.schema = schema
        self.columns_b64 = columns_b64
        self.filters: list[pushdown.Pushed] = []

    @short_traceback
    def partitions(self) -> list[InputPartition]:
        given = self.options.get("plan")
        held = None
        if given:  # planned on the driver by open_relation: the tail travels in an option
            info = PlanInfo.from_json(given)
            tail_b64 = self.options.get("plan_tail") or ""
            tail = table_from_text(tail_b64) if tail_b64 else info.update_schema.empty_table()
        else:
            info, tail, held = plan_relation(self.options)
        return plan_partitions(info, tail, mode_of(self.options), self.filters,
                               int_option(self.options, "split_rows", SPLIT_ROWS) or SPLIT_ROWS,
                               credentials_of(self.options), held)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, ScanPartition):
            return  # Spark's placeholder partition for a plan with none
        yield from read_partition(partition, arrow_schema(self.schema), self.options)


class SedimentPushdownReader(SedimentReader):
    """The reader where Spark pushes filters: those on the relation's columns that Arrow can
    evaluate exactly are taken (they drop row groups and rows); Spark keeps the rest."""

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:  # noqa: N802 - Spark's name
        columns = schema_from_text(self.columns_b64)
        for f in filters:
            mine = pushdown.from_spark(f, columns.names)
            if mine is not None and pushdown.usable(mine, columns):
                self.filters.append(mine)
            else:
                yield f


def pushdown_enabled() -> bool:
    """Whether the Spark worker creating the reader takes pushed filters. PySpark has no API
    for it: with filters to push and pushdown on it runs ``data_source_pushdown_filters``;
    otherwise ``plan_data_source_read``, which keeps the setting in a local
    (``enable_pushdown``) and refuses a reader with ``pushFilters`` when it is off. Anything
    else (another Spark version) gets the reader without pushdown: correct, unfiltered."""
    import sys

    frame = sys._getframe(1)
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).endswith("data_source_pushdown_filters"):
            return True
        if "enable_pushdown" in frame.f_locals and "is_streaming" in frame.f_locals:
            return bool(frame.f_locals["enable_pushdown"]) and not frame.f_locals["is_streaming"]
        frame = frame.f_back
    return False


def plan_partitions(info: PlanInfo, tail: pa.Table, mode: str, filters: Sequence[pushdown.Pushed],
                    split_rows: int, credentials: tuple[tuple[str, str], ...] = (),
                    held: HeldTail | None = None) -> list[InputPartition]:
    """The read's tasks: row groups the filters and times cannot rule out, cut into key ranges
    (consolidated reads) or runs of about ``split_rows`` rows (raw reads), plus the tail: its
    rows in the tasks, or with ``held`` which part of the coordinator's copy each task fetches."""
    keys = [n for n in info.update_schema.names if n not in (TIME, DIFF)]
    key_columns = tuple(info.key_columns or keys)
    base = ReadSpec(info.relation_id, info.as_of, info.from_t, info.blob_uri, info.s3_endpoint, mode,
                    key_columns, tuple(filters), (), credentials,
                    json.dumps(info.schema_history) if info.schema_history else "")
    layout = base.layout()
    names = [key_columns[0], *(f[1] for f in filters)] if key_columns else [f[1] for f in filters]
    refs = [r for r in info.batches if r.get("key")]
    groups: list[GroupStats] = []
    for b, ref in enumerate(refs):
        pf, desc, _ = open_batch(base, ref)
        groups += [g for g, cols in group_stats(pf, b, names, layout, desc.time)
                   if wanted(g, cols, info.as_of, info.from_t, filters)]
    if filters and tail.num_rows:
        tail = pushdown.apply(tail, filters)
    if mode == "raw":
        return _raw_partitions(base, refs, groups, tail, split_rows, held)
    first_type = info.update_schema.field(key_columns[0]).type if key_columns else None
    if first_type is None or pa.types.is_floating(first_type):
        cuts: list[Any] = []
    elif held is not None:  # the held tail's quantiles with the batches' cuts: both spread over tasks
        cuts = sorted({*(boundaries(groups, split_rows) if groups else ()), *held.cuts})
    elif groups:
        cuts = boundaries(groups, split_rows)
    else:
        parts = min(MAX_TAIL_PARTS, -(-tail.num_rows // min(split_rows, TAIL_SPLIT_ROWS)))
        cuts = quantile_cuts(tail.column(key_columns[0]), parts)
    spec = ReadSpec(**{**base.__dict__, "boundaries": tuple(cuts)})
    tail_idx = range_index(tail.column(key_columns[0]), cuts) if cuts and tail.num_rows else None
    cut_array = pa.array(cuts, first_type) if held is not None and cuts else None
    out: list[InputPartition] = []
    for i in range(len(cuts) + 1):
        mine = [g for g in groups if not cuts or meets(g, cuts, i)]
        piece = tail if tail_idx is None else tail.filter(pc.equal(tail_idx, i))
        fetch = None if held is None else TailFetch(held.relation, held.lease, key_columns[0], cut_array,
                                                    i if cuts else None)
        if mine or piece.num_rows or fetch is not None:
            out.append(ScanPartition(spec, _by_batch(refs, mine), ipc_bytes(piece), i if cuts else None, len(out),
                                     fetch))
    return out


def _by_batch(refs: list[dict], groups: Sequence[GroupStats]) -> list[tuple[dict, list[int]]]:
    per: dict[int, list[int]] = {}
    for g in groups:
        per.setdefault(g.batch, []).append(g.index)
    return [(refs[b], idx) for b, idx in sorted(per.items())]


def _raw_partitions(spec: ReadSpec, refs: list[dict], groups: list[GroupStats], tail: pa.Table,
                    split_rows: int, held: HeldTail | None = None) -> list[InputPartition]:
    out: list[InputPartition] = []
    run: list[GroupStats] = []
    rows = 0
    for g in groups:
        if run and (rows + g.rows > split_rows or g.batch != run[-1].batch):
            out.append(ScanPartition(spec, _by_batch(refs, run), b"", None, len(out)))
            run, rows = [], 0
        run.append(g)
        rows += g.rows
    if run:
        out.append(ScanPartition(spec, _by_batch(refs, run), b"", None, len(out)))
    if held is not None:  # each task fetches its slice of the held rows
        step = -(-held.rows // held.parts)
        for i in range(0, held.rows, step):
            out.append(ScanPartition(spec, [], b"", None, len(out), TailFetch(held.relation, held.lease,
                                                                               start=i, stop=i + step)))
        return out
    step = max(min(split_rows, TAIL_SPLIT_ROWS), -(-tail.num_rows // MAX_TAIL_PARTS))
    for i in range(0, tail.num_rows, step):
        out.append(ScanPartition(spec, [], ipc_bytes(tail.slice(i, step)), None, len(out)))
    return out


def _keep(table: pa.Table, spec: ReadSpec, index: int | None, *, check_range: bool = True) -> pa.Table:
    """The rows of ``table`` the read wants: times in (from, asOf], pushed filters, the range."""
    if table.num_rows == 0:
        return table
    times = table.column(TIME)
    lo, hi = pc.min_max(times).values()
    keep = None
    if hi.as_py() > spec.as_of:
        keep = pc.less_equal(times, pa.scalar(spec.as_of, pa.int64()))
    if spec.from_t is not None and lo.as_py() <= spec.from_t:
        later = pc.greater(times, pa.scalar(spec.from_t, pa.int64()))
        keep = later if keep is None else pc.and_(keep, later)
    if keep is not None:
        table = table.filter(keep)
    table = pushdown.apply(table, spec.filters)
    if check_range and index is not None and spec.boundaries:
        table = table.filter(pc.equal(range_index(table.column(spec.key_columns[0]), spec.boundaries), index))
    return table


def fetch_tail(fetch: TailFetch, options: Any) -> pa.Table:
    """A task's part of a tail held on the coordinator, fetched by the task itself."""
    with connect(options) as client:
        return client.tail_part(fetch.relation, fetch.lease, key=fetch.key, cuts=fetch.cuts, index=fetch.index,
                                start=fetch.start, stop=fetch.stop)


def read_partition(partition: ScanPartition, target: pa.Schema, options: Any = None) -> Iterator[pa.RecordBatch]:
    """A task's rows: raw updates streamed row group by row group, or its range consolidated.
    A raw run's rows (a bulk load's file as written) get their constant time and diff here;
    raw reads hand them out unconsolidated, as they hand out the WAL tail's."""
    from sediment.trace.batch import read_row_group
    from sediment.trace.raw import RAW_VERSION, raw_updates

    spec = partition.spec
    layout = spec.layout()
    pieces: list[pa.Table] = []
    for ref, indices in partition.groups:
        pf, desc, where = open_batch(spec, ref)
        for i in indices:
            table = read_row_group(pf, i, desc, where=where)
            table = _keep(current(raw_updates(table, desc) if desc.format_version == RAW_VERSION else table, layout), spec, partition.index)
            if spec.mode == "raw":
                yield from conform(table, target).to_batches()
            elif table.num_rows:
                pieces.append(table)
    fetch = getattr(partition, "fetch", None)
    if partition.tail or fetch is not None:
        rows = table_from_ipc(partition.tail) if partition.tail else fetch_tail(fetch, options)
        table = _keep(rows, spec, partition.index, check_range=False)
        if spec.mode == "raw":
            yield from conform(table, target).to_batches()
            return
        if table.num_rows:
            pieces.append(table)
    if spec.mode == "raw" or not pieces:
        return
    from sediment.trace.consolidate import changes, snapshot

    table = pa.concat_tables(pieces, promote_options="permissive")
    keys = list(spec.key_columns)
    out = snapshot(table, keys, spec.as_of) if spec.mode == "snapshot" else \
        changes(table, keys, spec.from_t if spec.from_t is not None else -(1 << 63), spec.as_of)
    if TIME in target.names and TIME not in out.column_names:  # a stream's snapshot: every row at as_of
        out = out.append_column(TIME, pa.repeat(pa.scalar(spec.as_of, pa.int64()), out.num_rows))
    yield from conform(out, target).to_batches(max_chunksize=1 << 16)
