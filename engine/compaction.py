"""Compaction: WAL records to batches, merges, and the log trim below them, one relation at a time.

Planning is pure (sediment.trace.wal_cut, sediment.trace.planner); this component runs
the plan against the relation view and the stores, one relation at a time, so one
relation's failure never stops the others. The background scheduler (engine/scheduler.py)
calls :meth:`Compaction.background_pass` and :meth:`Compaction.merge_pass`;
``Engine.compact()`` calls :meth:`Compaction.compact`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from sediment.clock import Clock
from sediment.engine import tail_decode
from sediment.engine.collector import Collector
from sediment.engine.relation import Relation, TailEntry
from sediment.engine.view import RelationView
from sediment.errors import (
    CompactionFailed,
    CoordinatorSuperseded,
    MetadataConflict,
    TraceInvariantViolation,
    UnknownRelation,
)
from sediment.metrics import EngineMetrics
from sediment.trace import wal_cut
from sediment.trace.fold import fold
from sediment.trace.planner import (
    DEFAULT_MAX_PENDING_RUNS,
    plan_full_merge,
    plan_major_merge,
    plan_merges,
    plan_pending_merges,
    with_raw_runs,
)
from sediment.trace.state import BatchRef, TraceState
from sediment.trace.store import TraceStore
from sediment.wal.protocol import WriteAheadLog

log = logging.getLogger(__name__)

DEFAULT_MAJOR_COMPACTION_QUIET = 10.0  # seconds without new data before a relation's batches become one


@dataclass
class CompactionSettings:
    """How compaction runs: ``interval`` (seconds a finished record may wait for a pass; None:
    only on finished segments), the size-tiered ``merge_factor``, the ``memory_bound`` a merge
    sizes its chunks by, ``max_pending_runs`` before runs merge, and ``major_quiet`` (seconds
    without new data before a relation with no history left becomes one batch; None: never)."""

    interval: float | None = 5.0
    merge_factor: float = 2.0
    memory_bound: int = 256 << 20
    max_pending_runs: int = DEFAULT_MAX_PENDING_RUNS
    major_quiet: float | None = DEFAULT_MAJOR_COMPACTION_QUIET


def _split_at(table: pa.Table, upper: int) -> tuple[list[pa.Table], pa.Table | None]:
    """(``[rows at times < upper]``, rows at times >= upper or None); order kept."""
    if not table.num_rows:
        return [], None
    lo, hi = pc.min_max(table.column("time")).values()
    if hi.as_py() < upper:
        return [table], None
    if lo.as_py() >= upper:
        return [], table
    t = table.column("time")
    return [table.filter(pc.less(t, upper))], table.filter(pc.greater_equal(t, upper))


MERGE_PENDING, MERGE_BATCHES = "merge pending", "merge"  # a relation's two merge steps, failing apart
MERGE_STEPS = (MERGE_PENDING, MERGE_BATCHES)
MERGE_RETRY_FIRST = 1.0  # seconds before a failed merge step is tried again
MERGE_RETRY_MOST = 300.0  # the longest wait between attempts of a merge step that keeps failing


def merge_retry_delay(attempts: int) -> float:
    """Seconds before the next attempt of a merge step that failed ``attempts`` times in a row."""
    return min(MERGE_RETRY_MOST, MERGE_RETRY_FIRST * 2 ** min(attempts - 1, 32))


class Compaction:
    """Runs compaction passes and merges over ``view``'s relations. ``pass_lock`` is held by a
    pass and by whoever must not interleave with one (dropping a relation, closing)."""

    def __init__(self, view: RelationView, traces: TraceStore, log_: WriteAheadLog, collector: Collector,
                 metrics: EngineMetrics, clock: Clock, settings: CompactionSettings, opened_at: float) -> None:
        self.view = view
        self.traces = traces
        traces.memory_bound = settings.memory_bound  # raw runs' reads and merges keep to it too
        self.log = log_
        self.collector = collector
        self.metrics = metrics
        self.clock = clock
        self.settings = settings
        self.opened_at = opened_at  # a relation's quiet time counts from here after a restart
        self.pass_lock = threading.Lock()
        self.merge_lock = threading.Lock()
        self.failures: dict[tuple[str, str], tuple[str, int]] = {}  # (name, step) -> (error, attempts)
        self.retry_at: dict[tuple[str, str], float] = {}  # (name, merge step) -> clock time of its next attempt
        self.segment_age = wal_cut.SegmentAge(clock.current_time())
        self._lock = view.lock

    def compact(self, name: str | None = None) -> None:
        """Finish the current WAL segment, turn everything durable into batches, merge, and
        trim the log; returns when the pass is done (for tests and tools). A relation with no
        history left (``since`` at its sealed time) is merged into one batch, a major
        compaction as RocksDB's ``CompactRange``: its snapshot then reads one sorted run as
        stored. The background merger does the same for such a relation once it has had no
        new data for ``major_compaction_quiet`` seconds (and enough new rows to be worth it:
        trace/planner.py ``plan_major_merge``); until then it keeps to size-tiered merges."""
        with self._lock:
            names = None if name is None else {self.view.get(name).entry.name}
            self.view.check_open()
        started = time.perf_counter()
        self.log.finish_segment()
        failed = self.run_pass(names, full=True)
        if self.traces.fence.replaced is not None:  # no retries into the new coordinator's state
            raise CoordinatorSuperseded(str(self.traces.fence.replaced))
        log.info("compaction pass over %s took %.3f s (%d relations failed)", "all relations" if name is None
                 else repr(name), time.perf_counter() - started, len(failed))
        if failed:
            raise CompactionFailed(
                f"could not compact {sorted(failed)} (the others were compacted; these keep their WAL records and "
                f"are retried on every pass): " + "; ".join(f"{n}: {e}" for n, e in sorted(failed.items())),
                failures=failed)

    def background_pass(self) -> None:
        """A scheduler wake: finish the active segment if its data is ``interval`` old
        (compaction on time, see trace/wal_cut.py SegmentAge) or appends wait for the
        backlog, then take the finished records; the scheduler merges after it."""
        log_ = self.log
        with self._lock:
            if self.view.failed is not None:
                return  # nothing more goes to its log (RelationView.fail)
            backlog_waits = self.view.backlog.waiting
        if self.segment_age.due(log_.finished_lsn, log_.end_lsn, self.clock.current_time(),
                                self.settings.interval) or backlog_waits and log_.end_lsn > log_.finished_lsn:
            log_.finish_segment()
            self.segment_age.finished()
        self.run_pass(None, merge=False)

    def compaction_errors(self) -> dict[str, str]:
        """Relations whose last compaction attempt (a pass or a merge) failed, with the error;
        a failed pass is retried on every pass, a failed merge step after a backoff, until it
        succeeds. A failed pass keeps the relation's WAL
        records (the log is trimmed only below them); a failed merge leaves its inputs as they
        are. Empty when every relation compacts."""
        with self._lock:
            out: dict[str, str] = {}
            for (name, _step), (text, _count) in sorted(self.failures.items()):
                if name in self.view.relations:
                    out[name] = f"{out[name]}; {text}" if name in out else text
            return out

    def failure_count(self, name: str) -> int:
        """Failed attempts of the relation's failing steps (0 when none fails now)."""
        with self._lock:
            return sum(count for (n, _step), (_text, count) in self.failures.items() if n == name)

    def forget(self, name: str) -> None:
        """A dropped relation: one added again under its name starts clean (under the lock)."""
        for step in ("pass", *MERGE_STEPS):
            self.failures.pop((name, step), None)
            self.retry_at.pop((name, step), None)

    def _isolated(self, rel: Relation, failed: dict[str, str], step, kind: str = "pass") -> None:
        """Run one relation's compaction step (``kind``: "pass", or one of ``MERGE_STEPS``); a
        failure is logged and recorded under that kind, so a merge failing on the merger's
        thread is not hidden by the next pass succeeding, and never stops the other relations'
        steps, nor the relation's other kind of merge (nor the trim below its records). A
        failing merge step is retried after a backoff on the clock (MERGE_RETRY_FIRST seconds,
        doubling up to MERGE_RETRY_MOST); a failing pass on every pass, as its WAL records
        hold the log back."""
        name = rel.entry.name
        if self.traces.fence.replaced is not None:
            failed[name] = f"CoordinatorSuperseded: {self.traces.fence.replaced}"
            return
        now = self.clock.current_time()
        with self._lock:
            if self.retry_at.get((name, kind), now) > now:
                return  # backing off; its failure stays reported
        if (name, kind) in self.failures:
            self.metrics.retries.labels(where="compaction").inc()
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - reported, retried on the next pass
            text = f"{type(exc).__name__}: {exc}"
            failed[name] = f"{failed[name]}; {text}" if name in failed else text
            self.metrics.error("compaction", exc)
            with self._lock:
                count = self.failures.get((name, kind), ("", 0))[1] + 1
                self.failures[(name, kind)] = (text, count)
                if kind in MERGE_STEPS:
                    self.retry_at[(name, kind)] = now + merge_retry_delay(count)
            log.error("compaction (%s) of relation %r failed (attempt %d; %s): %s", kind, name, count,
                      "its WAL records are kept and it is retried on the next pass" if kind == "pass" else
                      f"its inputs are kept and it is retried in {merge_retry_delay(count):g} s", text)
            return
        if kind in MERGE_STEPS:
            with self._lock:
                self.failures.pop((name, kind), None)
                self.retry_at.pop((name, kind), None)

    def run_pass(self, names: set[str] | None = None, *, merge: bool = True, full: bool = False) -> dict[str, str]:
        """Take finished WAL records into the traces and trim the log; then, with ``merge``,
        run the merges in line (else the background merger runs them)."""
        failed: dict[str, str] = {}
        with self.pass_lock, self.metrics.timed(self.metrics.compaction_seconds):
            self.metrics.compactions.inc()
            with self._lock:
                if self.view.closed or self.view.failed is not None:  # failed: records may exist it never saw
                    return failed
                cut = wal_cut.plan_wal_cut(self.log.finished_lsn, self.view.txns.first_lsns())
                rels = [r for r in self.view.relations.values() if names is None or r.entry.name in names]
                work = []
                for rel in rels:
                    entries = [e for e in rel.tail if e.lsn < cut.safe]
                    progress = [t for lsn, t in rel.progress if lsn < cut.safe]
                    if entries or progress:
                        work.append((rel, entries, progress, rel.trace, rel.entry.since))
            for item in work:
                self._isolated(item[0], failed, lambda item=item: self.compact_relation(cut.safe, *item))
            with self._lock:
                for rel in rels:
                    if rel.entry.name not in failed:
                        self.failures.pop((rel.entry.name, "pass"), None)
                point = wal_cut.trim_point(cut.safe, self.view.needed_lsns())
                self.collector.trim_below(point)
                self.view.bodies.drop_below(point)
        self.collector.collect()
        if merge:
            self.merge_pass(names, failed, full=full)
        return failed

    def merge_pass(self, names: set[str] | None = None, failed: dict[str, str] | None = None, *,
                    full: bool = False) -> None:
        """Merge pending runs and batches by the size-tiered rules, one relation at a time.
        No engine lock is held while merging (replaced blobs are kept until it ends); each result is
        spliced into the trace under the pass lock."""
        failed = {} if failed is None else failed
        with self.merge_lock:
            with self._lock:
                if self.view.closed or self.view.failed is not None:
                    return
                rels = [r for r in self.view.relations.values() if names is None or r.entry.name in names]
            skipped = set(failed)  # their pass failed just now: their merges wait for the next one
            with self.collector.merge_running():
                for rel in rels:
                    if rel.entry.name in skipped:
                        continue
                    self._isolated(rel, failed, lambda rel=rel: self.merge_pending(rel), MERGE_PENDING)
                    self._isolated(rel, failed, lambda rel=rel: self.merge_relation(rel, full), MERGE_BATCHES)

    def compact_relation(self, safe: int, rel: Relation, entries: list[TailEntry], progress: list[int],
                          trace: TraceState, since: int) -> None:
        """Take this relation's WAL records below ``safe`` into its trace. Updates at sealed
        times (below the new upper) go into one new batch with the pending runs whose times
        became sealed; the rest becomes one new sorted, consolidated pending run (absorbing the
        newest run when it holds at most half as many rows as this pass takes, so a pass adds at
        most half its own size in rewrites). Other runs still wholly unsealed are not read: each pass costs what it takes out of the WAL plus what
        became sealed, so a stream costs time linear in its size, sealed or not."""
        rid = rel.entry.id
        upper = wal_cut.new_upper(trace.upper, progress)
        since = min(since, upper - 1) if upper > 0 else 0
        table = self._wal_table(rel, entries, trace, safe)
        below, above = _split_at(table, upper)
        plan = wal_cut.split_pending([(p.lower, p.upper) for p in trace.pending], upper)
        kept = [trace.pending[i] for i in plan.kept]
        rest: list[pa.Table] = []
        for i in (*plan.folded, *plan.split):
            run = self._read_run(rel, trace.pending[i])
            low, high = _split_at(run, upper)
            below += low
            if high is not None:
                rest.append(high)  # sorted and consolidated already: a filter keeps it so
        batches = trace.batches
        if upper > trace.upper:
            wal_range = (entries[0].lsn, max(e.lsn for e in entries)) if entries else None
            parts = [t for t in below if t.num_rows]
            merged = fold(pa.concat_tables(parts), rel.keys, since) if parts else rel.update_schema.empty_table()
            batches += (self.traces.write(rid, merged, trace.upper, upper, since, wal_range=wal_range),)
        new_runs = [self._write_run(rid, t, since) for t in rest]
        absorbed = None
        if above is not None and kept and 2 * kept[-1].rows <= above.num_rows:
            absorbed = kept.pop()  # a small newest run joins this pass's: no run merge for it later
            above = pa.concat_tables([above, self._read_run(rel, absorbed)])
        if above is not None and above.num_rows:
            new_runs.append(self._write_run(rid, fold(above, rel.keys, None), since))
        pending = (*kept, *(r for r in new_runs if r is not None))
        new = trace.after_pass(since=since, upper=upper, batches=batches, pending=pending, wal_through=safe)
        self.traces.commit(new)
        if upper > trace.upper:
            self.metrics.batches_written.labels(relation=rel.entry.name).inc()
        replaced = [trace.pending[i].key for i in (*plan.folded, *plan.split)] + [absorbed.key if absorbed else None]
        with self._lock:
            rel.trace = new
            rel.trace_changed_at = self.clock.current_time()
            if entries:
                rel.data_added_at = rel.trace_changed_at
            rel.tail = [e for e in rel.tail if e.lsn >= safe]
            rel.progress = [(lsn, t) for lsn, t in rel.progress if lsn >= safe]
            self.collector.discard(replaced)
            self.view.backlog.remove(sum(e.bytes for e in entries))

    def _wal_table(self, rel: Relation, entries: list[TailEntry], trace: TraceState, safe: int) -> pa.Table:
        with self._lock:
            cached = {e.lsn: self.view.bodies.take(e.lsn) for e in entries}
        bodies = tail_decode.bodies_of(entries, cached.get, self.log)
        table = tail_decode.decode_tail(rel, entries, bodies, rel.shape)
        return self._checked(rel, entries, trace, safe, table)

    @staticmethod
    def _checked(rel: Relation, entries: list[TailEntry], trace: TraceState, safe: int, table: pa.Table) -> pa.Table:
        if table.num_columns and table.column(0).num_chunks > 1 and tail_decode.small_records(entries):
            table = table.combine_chunks()  # small appends: the kernels below cost per chunk, not per row
        if entries and min(e.t_lo for e in entries) < trace.upper:
            raise TraceInvariantViolation(
                f"relation {rel.entry.name!r}: WAL records below LSN {safe} hold times below the trace's upper "
                f"{trace.upper}; the log and the trace disagree: run `sediment verify`")
        return table

    def _read_run(self, rel: Relation, ref) -> pa.Table:
        got = self.traces.read(rel.entry.id, ref)
        if got is None:
            return rel.update_schema.empty_table()
        return got.select(rel.update_schema.names).cast(rel.update_schema)

    def _write_run(self, rid: int, table: pa.Table, since: int):
        if not table.num_rows:
            return None
        lo, hi = pc.min_max(table.column("time")).values()
        return self.traces.write(rid, table, lo.as_py(), hi.as_py() + 1, since)

    def _chunk_rows(self, refs: list) -> int:
        """Rows per input chunk of a merge, so that its chunks fit the memory bound. The floor
        (1,024 rows, fewer Python steps per row) gives way for wide rows: at 64 KiB a row,
        1,024 rows an input would be 64 MiB each, whatever the bound."""
        per_row = max(64, 8 * (sum(r.bytes for r in refs) or 1) // max(1, sum(r.rows for r in refs)))
        fits = self.settings.memory_bound // (4 * len(refs) * per_row)
        return max(fits, min(1024, max(1, self.settings.memory_bound // (len(refs) * per_row))))

    def merge_pending(self, rel: Relation) -> None:
        """Keep the pending runs few: merge neighbours by the size-tiered rule once there
        are more than ``max_pending_runs`` (trace/planner.py plan_pending_merges), and rewrite
        every raw run (a bulk load's file as written) sorted and consolidated."""
        with self._lock:
            trace = rel.trace
        spans = plan_pending_merges([p.rows for p in trace.pending], max_runs=self.settings.max_pending_runs,
                                    factor=max(self.settings.merge_factor, 1.5))
        spans = with_raw_runs(spans, [p.raw for p in trace.pending])
        if not spans:
            return
        done = []
        for start, stop in reversed(spans):
            refs = trace.pending[start:stop]
            span = (min(r.lower for r in refs), max(r.upper for r in refs))
            with self.metrics.timed(self.metrics.merge_seconds):
                merged = self.traces.merge(rel.entry.id, refs, rel.keys, rel.update_schema, trace.since,
                                           1 + max(r.level for r in refs), chunk_rows=self._chunk_rows(refs),
                                           span=span)
            done.append((refs, merged))
        with self.pass_lock:  # no pass commits meanwhile: splice into the trace as it is now
            with self._lock:
                now, live = rel.trace, self._live(rel)
            runs, dropped, replaced = list(now.pending), [], []
            for refs, merged in done:
                at = _find_run(runs, refs)
                if at is None or not live:  # a pass folded or split these runs meanwhile: nothing to splice
                    dropped += [merged.key] if merged.key else []
                    continue
                runs[at:at + len(refs)] = [merged] if merged.key is not None else []
                replaced += [r.key for r in refs if r.key]
            if replaced:
                new = now.with_pending(runs)
                self.traces.commit(new)
                self.metrics.merges.labels(relation=rel.entry.name).inc()
            with self._lock:
                if replaced:
                    rel.trace = new
                    rel.trace_changed_at = self.clock.current_time()
                self.collector.discard(replaced + dropped)

    def _live(self, rel: Relation) -> bool:
        """Still served (under the lock)? Not after a close, nor after a drop, which deletes the
        trace state a merge's splice would commit over (the drop takes the pass lock, not the merge's)."""
        return not self.view.closed and self.view.relations.get(rel.entry.name) is rel

    def add_runs(self, rel: Relation, make_runs: Callable[[int], list[BatchRef]], job: str, *,
                 check: Callable[[], None], keep_loads: int,
                 times: tuple[int | None, int | None] = (None, None)) -> list[BatchRef] | None:
        """Add runs written outside the WAL (a bulk load, engine/staged.py) to ``rel``'s pending
        runs in one trace commit that records ``job``. Under the pass lock, so no pass or merge
        splice commits the trace meanwhile: ``make_runs(since)`` writes the runs; ``check()``,
        under the engine lock with the commit, may refuse them.
        ``times``: the load's min and max time, kept with ``job``. A refused commit, or one the
        metadata store refused (MetadataConflict, CoordinatorSuperseded), changes no trace and deletes the runs
        written; a commit of unknown outcome (MetadataUnavailable: it may have landed) leaves
        them for the next open's orphan sweep, as a compaction pass does. Returns the runs
        committed, or None when ``job`` was committed already (a retry, perhaps racing the
        first commit): nothing is made."""
        with self.pass_lock:
            with self._lock:
                if job in rel.trace.loads:
                    return None
                since = rel.trace.since
            refs = [r for r in make_runs(since) if r.key is not None]
            sent = False  # once the compare-and-set is sent, only MetadataConflict says it did not land
            try:
                with self._lock:
                    if self.view.get(rel.entry.name) is not rel:
                        raise UnknownRelation(f"relation {rel.entry.name!r} was dropped during bulk load {job!r}; "
                                              "nothing was committed")
                    check()
                    new = rel.trace.with_load(refs, job, keep_loads, times)
                    sent = True
                    self.traces.commit(new)
                    rel.trace = new
                    rel.trace_changed_at = rel.data_added_at = self.clock.current_time()  # new data: not quiet
                    self.view.max_time = max([self.view.max_time, *(r.upper - 1 for r in refs)])
            except BaseException as e:
                if not sent or isinstance(e, (MetadataConflict, CoordinatorSuperseded)):  # refused: not landed
                    self.traces.delete([r.key for r in refs])
                raise
        return refs

    def merge_relation(self, rel: Relation, full: bool = False) -> None:
        """Merge the relation's batches by the size-tiered rules, or into one (``full``, or a
        quiet relation with no history left); each result spliced into the trace as it is then."""
        with self._lock:
            trace, since = rel.trace, min(rel.entry.since, max(rel.trace.upper - 1, 0))
            quiet_for = self.clock.current_time() - (rel.data_added_at if rel.data_added_at is not None
                                                     else self.opened_at)
        tasks = plan_merges(trace.batches, factor=self.settings.merge_factor)
        whole = None
        if since >= trace.upper - 1:  # no history left: the relation's state can be one batch
            whole = plan_full_merge(trace.batches) if full else \
                plan_major_merge(trace.batches, quiet_for=quiet_for, quiet_needed=self.settings.major_quiet)
        if whole is not None:
            tasks = [whole]
        for task in reversed(tasks):  # from the newest, so earlier indices stay valid
            refs = list(trace.batches[task.start:task.stop])
            with self.metrics.timed(self.metrics.merge_seconds):
                merged = self.traces.merge(rel.entry.id, refs, rel.keys, rel.update_schema, since, task.level,
                                           chunk_rows=self._chunk_rows(refs))
            with self.pass_lock:  # splice into the trace as a pass may have left it (batches only appended)
                with self._lock:
                    now, live = rel.trace, self._live(rel)
                at = _find_run(list(now.batches), refs)
                if at is None or not live:
                    with self._lock:
                        self.collector.discard([merged.key])
                    continue
                self.metrics.merges.labels(relation=rel.entry.name).inc()
                if task is whole and not full:
                    self.metrics.major_compactions.labels(relation=rel.entry.name).inc()
                new = now.apply_merge(at, at + len(refs), merged, inputs=refs, since=since)
                self.traces.commit(new)
                with self._lock:
                    rel.trace = new
                    rel.trace_changed_at = self.clock.current_time()
                    self.collector.discard(r.key for r in refs)


def _find_run(refs: list, wanted) -> int | None:
    """Where the stretch ``wanted`` (blob refs, by key) starts in ``refs``, or None when
    it is no longer there whole."""
    keys = [r.key for r in wanted]
    for i in range(len(refs) - len(keys) + 1):
        if refs[i].key == keys[0] and [r.key for r in refs[i:i + len(keys)]] == keys:
            return i
    return None
