"""The engine's compaction: WAL records to batches, merges, and the log trim below them.

Planning is pure (sediment.trace.compacter, sediment.trace.planner); this mixin of
:class:`sediment.engine.engine.Engine` runs the plan against the engine's view and stores,
one relation at a time, so one relation's failure never stops the others.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc

from sediment.arrow_codec import decode_updates
from sediment.engine.relation import TailEntry, _Relation
from sediment.errors import (
    CompactionFailed,
    TraceInvariantViolation,
)
from sediment.trace import compacter as cmp
from sediment.trace.fold import fold
from sediment.trace.planner import plan_full_merge, plan_major_merge, plan_merges, plan_pending_merges
from sediment.trace.state import TraceState

log = logging.getLogger(__name__)


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


class Compaction:
    """Compaction passes of the Engine (mixin)."""

    # --- compaction ----------------------------------------------------------------------------

    def compact(self, name: str | None = None) -> None:
        """Finish the current WAL segment, turn everything durable into batches, merge, and
        trim the log; returns when the pass is done (for tests and tools). A relation with no
        history left (``since`` at its sealed time) is merged into one batch, a major
        compaction as RocksDB's ``CompactRange``: its snapshot then reads one sorted run as
        stored. The background merger does the same for such a relation once it has had no
        new data for ``major_compaction_quiet`` seconds (and enough new rows to be worth it:
        trace/planner.py ``plan_major_merge``); until then it keeps to size-tiered merges."""
        with self._lock:
            names = None if name is None else {self._rel(name).entry.name}
            self._check_open()
        started = time.perf_counter()
        self._log.finish_segment()
        failed = self._compaction_pass(names, full=True)
        log.info("compaction pass over %s took %.3f s (%d relations failed)", "all relations" if name is None
                 else repr(name), time.perf_counter() - started, len(failed))
        if failed:
            raise CompactionFailed(
                f"could not compact {sorted(failed)} (the others were compacted; these keep their WAL records and "
                f"are retried on every pass): " + "; ".join(f"{n}: {e}" for n, e in sorted(failed.items())),
                failures=failed)

    def _background_pass(self) -> None:
        """A compacter wake: finish the active segment if its data is ``compact_interval``
        old (compaction on time, see trace/compacter.py SegmentAge), then compact."""
        log_ = self._log
        with self._lock:
            backlog_waits = self._backlog.waiting
        if self._segment_age.due(log_.finished_lsn, log_.end_lsn, self._compacter.clock.current_time(),
                                 self._compact_interval) or backlog_waits and log_.end_lsn > log_.finished_lsn:
            log_.finish_segment()
            self._segment_age.finished()
        self._compaction_pass(None, merge=False)
        if self._merger is not None:
            self._merger.notify()  # merges run beside the passes (engine/merger.py)

    def _wait_backlog(self, records: list) -> None:
        """Under the lock: wait while the append would take the WAL backlog past
        ``max_wal_backlog`` (engine/backlog.py); the compacter is asked to finish the active
        segment so that the records in it can be compacted."""
        backlog = self._backlog
        if backlog.bound is None:
            return
        n = sum(len(r.body) for r in records)
        if not backlog.must_wait(n):
            return
        self.metrics.backlog_waits.inc()
        backlog.admit(n, where=self.data_dir, closed=lambda: self._closed, wake_compacter=self._wake_for_backlog)

    def _wake_for_backlog(self) -> None:
        if self._compacter is not None:
            self._compacter.notify()

    def compaction_errors(self) -> dict[str, str]:
        """Relations whose last compaction attempt (a pass or a merge) failed, with the error;
        each is retried on every pass until it succeeds. A failed pass keeps the relation's WAL
        records (the log is trimmed only below them); a failed merge leaves its inputs as they
        are. Empty when every relation compacts."""
        with self._lock:
            out: dict[str, str] = {}
            for (name, _step), (text, _count) in sorted(self._compaction_failures.items()):
                if name in self._relations:
                    out[name] = f"{out[name]}; {text}" if name in out else text
            return out

    def _failure_count(self, name: str) -> int:
        """Failed attempts of the relation's failing steps (0 when none fails now)."""
        with self._lock:
            return sum(count for (n, _step), (_text, count) in self._compaction_failures.items() if n == name)

    def _isolated(self, rel: _Relation, failed: dict[str, str], step, kind: str = "pass") -> None:
        """Run one relation's compaction step (``kind``: "pass" or "merge"); a failure is
        logged and recorded under that kind, so a merge failing on the merger's thread is not
        hidden by the next pass succeeding, and never stops the other relations' steps (nor
        the trim below this one's records)."""
        name = rel.entry.name
        if name in failed:
            return
        if (name, kind) in self._compaction_failures:
            self.metrics.retries.labels(where="compaction").inc()
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - reported, retried on the next pass
            text = f"{type(exc).__name__}: {exc}"
            failed[name] = text
            self.metrics.error("compaction", exc)
            with self._lock:
                count = self._compaction_failures.get((name, kind), ("", 0))[1] + 1
                self._compaction_failures[(name, kind)] = (text, count)
            log.error("compaction (%s) of relation %r failed (attempt %d; its WAL records are kept and it is "
                      "retried on the next pass): %s", kind, name, count, text)

    def _compaction_pass(self, names: set[str] | None, *, merge: bool = True, full: bool = False) -> dict[str, str]:
        """Take finished WAL records into the traces and trim the log; then, with ``merge``,
        run the merges in line (else the background merger runs them)."""
        failed: dict[str, str] = {}
        with self._compact_lock, self.metrics.timed(self.metrics.compaction_seconds):
            self.metrics.compactions.inc()
            with self._lock:
                if self._closed:
                    return failed
                cut = cmp.plan_wal_cut(self._log.finished_lsn, self._txns.first_lsns())
                rels = [r for r in self._relations.values() if names is None or r.entry.name in names]
                work = []
                for rel in rels:
                    entries = [e for e in rel.tail if e.lsn < cut.safe]
                    progress = [t for lsn, t in rel.progress if lsn < cut.safe]
                    if entries or progress:
                        work.append((rel, entries, progress, rel.trace, rel.entry.since))
            for item in work:
                self._isolated(item[0], failed, lambda item=item: self._compact_relation(cut.safe, *item))
            with self._lock:
                for rel in rels:
                    if rel.entry.name not in failed:
                        self._compaction_failures.pop((rel.entry.name, "pass"), None)
                needed = [n for n in (r.needs_from() for r in self._relations.values()) if n is not None]
                needed += [n for n in (r.feed.oldest_lsn() for r in self._relations.values()) if n is not None]
                point = cmp.trim_point(cut.safe, [*needed, *self._txns.first_lsns()])
                self._trim_to = max(self._trim_to or 0, point)
                self._bodies.drop_below(point)
        self._collect()
        if merge:
            self._merge_pass(names, failed, full=full)
        return failed

    def _merge_pass(self, names: set[str] | None = None, failed: dict[str, str] | None = None, *,
                    full: bool = False) -> None:
        """Merge pending runs and batches by the size-tiered rules, one relation at a time.
        No engine lock is held while merging (replaced blobs are kept until it ends); each result is
        spliced into the trace under the pass lock."""
        failed = {} if failed is None else failed
        with self._merge_lock:
            with self._lock:
                if self._closed:
                    return
                rels = [r for r in self._relations.values() if names is None or r.entry.name in names]
                self._merging += 1  # replaced blobs wait for the merge; the log trim does not
            skipped = set(failed)
            try:
                for rel in rels:
                    self._isolated(rel, failed, lambda rel=rel: self._merge_pending(rel), "merge")
                    self._isolated(rel, failed, lambda rel=rel: self._merge_relation(rel, full), "merge")
                with self._lock:
                    for rel in rels:
                        if rel.entry.name not in failed and rel.entry.name not in skipped:
                            self._compaction_failures.pop((rel.entry.name, "merge"), None)
            finally:
                with self._lock:
                    self._merging -= 1
                self._collect()

    def _compact_relation(self, safe: int, rel: _Relation, entries: list[TailEntry], progress: list[int],
                          trace: TraceState, since: int) -> None:
        """Take this relation's WAL records below ``safe`` into its trace. Updates at sealed
        times (below the new upper) go into one new batch with the pending runs whose times
        became sealed; the rest becomes one new sorted, consolidated pending run (absorbing the
        newest run when it holds at most half as many rows as this pass takes, so a pass adds at
        most half its own size in rewrites). Other runs still wholly unsealed are not read: each pass costs what it takes out of the WAL plus what
        became sealed, so a stream costs time linear in its size, sealed or not."""
        rid = rel.entry.id
        upper = cmp.new_upper(trace.upper, progress)
        since = min(since, upper - 1) if upper > 0 else 0
        table = self._wal_table(rel, entries, trace, safe)
        below, above = _split_at(table, upper)
        plan = cmp.split_pending([(p.lower, p.upper) for p in trace.pending], upper)
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
        new = replace(trace, since=since, upper=upper, batches=batches, pending=pending, wal_through=safe,
                      version=trace.version + 1)
        self.traces.commit(new)
        if upper > trace.upper:
            self.metrics.batches_written.labels(relation=rel.entry.name).inc()
        replaced = [trace.pending[i].key for i in (*plan.folded, *plan.split)] + [absorbed.key if absorbed else None]
        with self._lock:
            rel.trace = new
            rel.trace_changed_at = self._clock.current_time()
            if entries:
                rel.data_added_at = rel.trace_changed_at
            rel.tail = [e for e in rel.tail if e.lsn >= safe]
            rel.progress = [(lsn, t) for lsn, t in rel.progress if lsn >= safe]
            self._garbage += [k for k in replaced if k]
            self._backlog.remove(sum(e.bytes for e in entries))

    def _wal_table(self, rel: _Relation, entries: list[TailEntry], trace: TraceState, safe: int) -> pa.Table:
        with self._lock:
            cached = [self._bodies.take(e.lsn) for e in entries]
        parts = [decode_updates(body, rel.update_schema) if body is not None
                 else self._decode(rel, self._log.read(e.lsn)) for e, body in zip(entries, cached, strict=True)]
        table = pa.Table.from_batches(parts, schema=rel.update_schema)
        if entries and min(e.t_lo for e in entries) < trace.upper:
            raise TraceInvariantViolation(
                f"relation {rel.entry.name!r}: WAL records below LSN {safe} hold times below the trace's upper "
                f"{trace.upper}; the log and the trace disagree: run `sediment verify`")
        return table

    def _read_run(self, rel: _Relation, ref) -> pa.Table:
        got = self.traces.read(rel.entry.id, ref)
        if got is None:
            return rel.update_schema.empty_table()
        return got.select(rel.update_schema.names).cast(rel.update_schema)

    def _write_run(self, rid: int, table: pa.Table, since: int):
        if not table.num_rows:
            return None
        lo, hi = pc.min_max(table.column("time")).values()
        return self.traces.write(rid, table, lo.as_py(), hi.as_py() + 1, since)

    def _merge_pending(self, rel: _Relation) -> None:
        """Keep the pending runs few: merge neighbours by the size-tiered rule once there
        are more than ``max_pending_runs`` (trace/planner.py plan_pending_merges)."""
        with self._lock:
            trace = rel.trace
        spans = plan_pending_merges([p.rows for p in trace.pending], max_runs=self._max_pending_runs,
                                    factor=max(self._merge_factor, 1.5))
        if not spans:
            return
        done = []
        for start, stop in reversed(spans):
            refs = trace.pending[start:stop]
            stored = sum(r.bytes for r in refs) or 1
            per_row = max(64, 8 * stored // max(1, sum(r.rows for r in refs)))
            chunk_rows = max(1024, self._memory_bound // (4 * len(refs) * per_row))
            span = (min(r.lower for r in refs), max(r.upper for r in refs))
            with self.metrics.timed(self.metrics.merge_seconds):
                merged = self.traces.merge(rel.entry.id, refs, rel.keys, rel.update_schema, trace.since,
                                           1 + max(r.level for r in refs), chunk_rows=chunk_rows, span=span)
            done.append((refs, merged))
        with self._compact_lock:  # no pass commits meanwhile: splice into the trace as it is now
            with self._lock:
                now = rel.trace
            runs, dropped, replaced = list(now.pending), [], []
            for refs, merged in done:
                at = _find_run(runs, refs)
                if at is None or self._closed:  # a pass folded or split these runs meanwhile: nothing to splice
                    dropped += [merged.key] if merged.key else []
                    continue
                runs[at:at + len(refs)] = [merged] if merged.key is not None else []
                replaced += [r.key for r in refs if r.key]
            if replaced:
                new = replace(now, pending=tuple(runs), version=now.version + 1)
                self.traces.commit(new)
                self.metrics.merges.labels(relation=rel.entry.name).inc()
            with self._lock:
                if replaced:
                    rel.trace = new
                    rel.trace_changed_at = self._clock.current_time()
                self._garbage += replaced + dropped

    def _merge_relation(self, rel: _Relation, full: bool = False) -> None:
        with self._lock:
            trace, since = rel.trace, min(rel.entry.since, max(rel.trace.upper - 1, 0))
            quiet_for = self._clock.current_time() - (rel.data_added_at if rel.data_added_at is not None
                                                      else self._opened_at)
        tasks = plan_merges(trace.batches, factor=self._merge_factor)
        whole = None
        if since >= trace.upper - 1:  # no history left: the relation's state can be one batch
            whole = plan_full_merge(trace.batches) if full else \
                plan_major_merge(trace.batches, quiet_for=quiet_for, quiet_needed=self._major_quiet)
        if whole is not None:
            tasks = [whole]
        for task in reversed(tasks):  # from the newest, so earlier indices stay valid
            refs = list(trace.batches[task.start:task.stop])
            stored = sum(r.bytes for r in refs) or 1
            per_row = max(64, 8 * stored // max(1, sum(r.rows for r in refs)))
            chunk_rows = max(1024, self._memory_bound // (4 * len(refs) * per_row))
            with self.metrics.timed(self.metrics.merge_seconds):
                merged = self.traces.merge(rel.entry.id, refs, rel.keys, rel.update_schema, since, task.level,
                                           chunk_rows=chunk_rows)
            with self._compact_lock:  # splice into the trace as a pass may have left it (batches only appended)
                with self._lock:
                    now = rel.trace
                at = _find_run(list(now.batches), refs)
                if at is None or self._closed:
                    with self._lock:
                        self._garbage += [merged.key] if merged.key else []
                    continue
                self.metrics.merges.labels(relation=rel.entry.name).inc()
                if task is whole and not full:
                    self.metrics.major_compactions.labels(relation=rel.entry.name).inc()
                new = replace(now.apply_merge(at, at + len(refs), merged, inputs=refs), since=max(since, now.since))
                self.traces.commit(new)
                with self._lock:
                    rel.trace = new
                    rel.trace_changed_at = self._clock.current_time()
                    self._garbage += [r.key for r in refs if r.key]


def _find_run(refs: list, wanted) -> int | None:
    """Where the stretch ``wanted`` (blob refs, by key) starts in ``refs``, or None when
    it is no longer there whole."""
    keys = [r.key for r in wanted]
    for i in range(len(refs) - len(keys) + 1):
        if refs[i].key == keys[0] and [r.key for r in refs[i:i + len(keys)]] == keys:
            return i
    return None
