"""Merges beside the passes (engine/scheduler.py): a pass never waits behind a merge, a merge
splices its result into the trace as it is at commit, and a merge whose inputs a pass
changed meanwhile is dropped without losing or doubling anything.

The merge under test is the real one; the tests only hold it at its start with a gate (an
event it waits on), as tests/wal/test_replication_recovery.py holds a ZooKeeper update."""

from __future__ import annotations

import os
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import sediment
from sediment.clock import ManualClock
from sediment.engine import staged

SCHEMA = pa.schema([("k", pa.int64())])
GATE_TIMEOUT = 60


def ups(keys, t):
    return pa.table({"k": pa.array(keys, pa.int64()), "time": pa.array([t] * len(keys), pa.int64()),
                     "diff": pa.array([1] * len(keys), pa.int64())})


def model_of(table) -> dict[int, int]:
    return dict(zip(table.column("k").to_pylist(), table.column("diff").to_pylist(), strict=True))


class GatedMerges:
    """Holds every trace merge of ``eng`` at its start until ``release``; ``started`` is
    set once a merge waits there."""

    def __init__(self, eng) -> None:
        self.started = threading.Event()
        self.gate = threading.Event()
        self._real = eng.traces.merge

        def merge(*args, **kwargs):
            self.started.set()
            assert self.gate.wait(GATE_TIMEOUT), "the test never opened the gate"
            return self._real(*args, **kwargs)

        eng.traces.merge = merge

    def release(self) -> None:
        self.gate.set()


@pytest.fixture
def eng(tmp_path):
    e = sediment.open(str(tmp_path / "data"), clock=ManualClock(), segment_bytes=64 << 20)
    e.add_relation("r", SCHEMA)
    e.settings.max_pending_runs = 2
    yield e
    e.close()


def flush(eng) -> None:
    """One compaction pass without merges, as the background compacter runs it."""
    eng.wal.finish_segment()
    eng.compaction.run_pass(None, merge=False)


def append_step(eng, expected: dict[str, dict[int, int]], t: int, keys: list[int]) -> None:
    """Append ``keys`` at time ``t`` to every relation of ``expected`` (updating its model),
    seal them at ``t`` and advance relation "now"'s since to ``t`` (no history kept)."""
    for name, model in expected.items():
        eng.append(name, ups(keys, t))
        for k in keys:
            model[k] = model.get(k, 0) + 1
        eng.seal(name, t)
    eng.set_since("now", t)


def pending_keys(eng) -> list[str]:
    return [p.key for p in eng.view.relations["r"].trace.pending]


def test_a_pass_completes_while_a_merge_is_under_way_and_the_merge_splices_in_after(eng):
    expected: dict[int, int] = {}
    gated = GatedMerges(eng)  # before the runs exist: a background wake's merge is held too
    for step in range(3):  # three unsealed runs: more than max_pending_runs, so a merge is due
        keys = list(range(step * 10, step * 10 + 10))
        eng.append("r", ups(keys, 100 + step))
        expected.update({k: 1 for k in keys})
        flush(eng)
    assert len(pending_keys(eng)) == 3
    eng.scheduler.merge_soon()
    assert gated.started.wait(GATE_TIMEOUT)
    # The merge holds three runs; a pass adds a fourth run meanwhile, without waiting for it.
    eng.append("r", ups([1000, 1001], 200))
    expected.update({1000: 1, 1001: 1})
    done = threading.Event()
    threading.Thread(target=lambda: (flush(eng), done.set()), daemon=True).start()
    assert done.wait(GATE_TIMEOUT), "the pass waited behind the merge"
    before = pending_keys(eng)
    assert len(before) == 4
    gated.release()
    assert eng.scheduler.wait_merges_idle(GATE_TIMEOUT)
    after = pending_keys(eng)
    assert len(after) < len(before) and after[-1] == before[-1], "the merge should replace the older runs only"
    assert eng.scheduler.cpu_seconds["merge"] > 0  # counted in the worker thread that ran it (bench/sustained.py)
    eng.seal("r", 200)
    assert model_of(eng.snapshot("r", 200)) == expected
    assert eng.compaction_errors() == {}


def test_a_merge_whose_runs_a_pass_folded_meanwhile_is_dropped(eng):
    expected: dict[int, int] = {}
    gated = GatedMerges(eng)
    for step in range(3):
        keys = list(range(step * 10, step * 10 + 10))
        eng.append("r", ups(keys, 100 + step))
        expected.update({k: 1 for k in keys})
        flush(eng)
    eng.scheduler.merge_soon()
    assert gated.started.wait(GATE_TIMEOUT)
    eng.seal("r", 150)  # every run's times are sealed now: the next pass folds them into a batch
    flush(eng)
    assert pending_keys(eng) == [] and eng.trace_info("r")["batches"] == 1
    folded_trace = eng.view.relations["r"].trace
    gated.release()
    assert eng.scheduler.wait_merges_idle(GATE_TIMEOUT)
    assert eng.view.relations["r"].trace == folded_trace, "a merge of runs that are gone must change nothing"
    assert model_of(eng.snapshot("r", 150)) == expected
    eng.close()
    reopened = sediment.open(eng.data_dir, clock=ManualClock(), segment_bytes=64 << 20)
    try:
        assert model_of(reopened.snapshot("r", 150)) == expected
        assert reopened.compaction_errors() == {}
    finally:
        reopened.close()


def test_compact_merges_in_line_after_waiting_for_a_background_merge(eng):
    gated = GatedMerges(eng)
    for step in range(3):
        eng.append("r", ups(list(range(step * 10, step * 10 + 10)), 100 + step))
        flush(eng)
    eng.scheduler.merge_soon()
    assert gated.started.wait(GATE_TIMEOUT)
    done = threading.Event()
    threading.Thread(target=lambda: (eng.compact(), done.set()), daemon=True).start()
    gated.release()  # compact() ran its pass, then waited for the merger's lock: no deadlock, no double merge
    assert done.wait(GATE_TIMEOUT)
    assert len(pending_keys(eng)) <= 2


def test_compact_merges_a_relation_with_no_history_left_into_one_batch(tmp_path):
    """Explicit compact() is a major compaction for a relation whose since reached its sealed
    time: one batch, read as stored. The background merges keep to the size-tiered rule,
    and a relation that keeps history keeps its tiers."""
    eng = sediment.open(str(tmp_path / "data"), clock=ManualClock(), segment_bytes=64 << 20)
    try:
        expected = {"now": {}, "history": {}}
        for name in expected:
            eng.add_relation(name, SCHEMA)
        for step, n in enumerate((50_000, 8_000)):  # sizes far apart: the tiered rule merges neither
            append_step(eng, expected, step, [(i * 7 + step) % 60_000 for i in range(n)])
            flush(eng)
        eng.compaction.merge_pass()  # what the background merger runs
        assert eng.trace_info("now")["batches"] == 2 and eng.trace_info("history")["batches"] == 2
        eng.compact()
        assert eng.trace_info("now")["batches"] == 1
        assert eng.trace_info("history")["batches"] == 2  # its times are still apart: tiers kept
        stats = eng.read_stats
        as_is, sorted_rows = stats.batches_as_is, stats.rows_sorted
        assert model_of(eng.snapshot("now", 1)) == expected["now"]
        assert (stats.batches_as_is, stats.rows_sorted) == (as_is + 1, sorted_rows)  # one run as stored, no sort
        assert model_of(eng.snapshot("history", 1)) == expected["history"]
        assert stats.rows_sorted > sorted_rows  # two interleaving batches: merged on read
        assert model_of(eng.snapshot("history", 0)) != expected["history"]
    finally:
        eng.close()


def background_round(eng, clock, seconds: float) -> None:
    """Move the engine's clock on by ``seconds`` and wait for the background compacter's pass
    it causes and for the merge that pass wakes: the real threads, no direct calls."""
    passes = eng.scheduler.passes
    clock.advance(seconds)
    assert eng.scheduler.wait_passes(passes + 1, GATE_TIMEOUT)
    assert eng.scheduler.wait_merges_idle(GATE_TIMEOUT)


def test_a_quiet_relation_with_no_history_left_becomes_one_batch_in_the_background(tmp_path):
    """The background's major compaction (trace/planner.py plan_major_merge): once a relation
    whose since is at its sealed time has had no new data for major_compaction_quiet
    seconds, its size-tiered batches become one batch, read as stored. A relation that keeps
    history keeps its tiers, and a new batch too small next to the big one (less than
    1/8 of its rows) is not worth a rewrite of everything."""
    clock = ManualClock()
    eng = sediment.open(str(tmp_path / "data"), clock=clock, segment_bytes=64 << 20, compact_interval=5.0,
                        major_compaction_quiet=30.0)
    try:
        expected = {"now": {}, "history": {}}
        for name in expected:
            eng.add_relation(name, SCHEMA)

        def step(t: int, keys: list[int]) -> None:
            append_step(eng, expected, t, keys)
            background_round(eng, clock, 5.0)

        step(0, [(i * 7) % 60_000 for i in range(50_000)])
        step(1, [(i * 7 + 1) % 60_000 for i in range(8_000)])  # far apart in size: no tiered merge
        assert eng.trace_info("now")["batches"] == 2 and eng.trace_info("history")["batches"] == 2
        background_round(eng, clock, 25.0)  # 25 s since the last data: not quiet long enough
        assert eng.trace_info("now")["batches"] == 2

        background_round(eng, clock, 5.0)  # 30 s: the major compaction runs
        assert eng.trace_info("now")["batches"] == 1
        assert eng.trace_info("history")["batches"] == 2  # its times are still apart: tiers kept
        assert eng.metrics.major_compactions.labels(relation="now")._value.get() == 1
        stats = eng.read_stats
        as_is, sorted_rows = stats.batches_as_is, stats.rows_sorted
        assert model_of(eng.snapshot("now", 1)) == expected["now"]
        assert (stats.batches_as_is, stats.rows_sorted) == (as_is + 1, sorted_rows)  # one run as stored
        assert model_of(eng.snapshot("history", 1)) == expected["history"]

        step(2, list(range(100_000, 101_000)))  # 1,000 rows next to ~58,000: below the rewrite ratio
        background_round(eng, clock, 60.0)
        assert eng.trace_info("now")["batches"] == 2
        assert eng.metrics.major_compactions.labels(relation="now")._value.get() == 1
        assert model_of(eng.snapshot("now", 2)) == expected["now"]

        step(3, list(range(200_000, 210_000)))  # now 11,000 new rows: worth it once quiet
        background_round(eng, clock, 30.0)
        assert eng.trace_info("now")["batches"] == 1
        assert model_of(eng.snapshot("now", 3)) == expected["now"]
    finally:
        eng.close()
    with sediment.open(str(tmp_path / "data"), clock=ManualClock(), major_compaction_quiet=None) as again:
        assert model_of(again.snapshot("now", 3)) == expected["now"]
        assert model_of(again.snapshot("history", 3)) == expected["history"]


def test_a_failing_background_merge_stays_reported_after_a_pass_succeeds(eng):
    """A merge fails on the merger's thread (its blob store unreachable); the next pass, which
    succeeds, must not clear the report: compaction_errors() and trace_info show it until a
    merge of that relation succeeds."""
    from sediment.errors import BlobError

    real = eng.traces.merge

    def unreachable(*args, **kwargs):
        raise BlobError("PUT trace/...: the blob store is unreachable (injected)")

    eng.traces.merge = unreachable  # before the runs exist: a background wake's merge fails too
    for step in range(3):  # three unsealed runs: a merge is due
        eng.append("r", ups(list(range(step * 10, step * 10 + 10)), 100 + step))
        flush(eng)
    eng.scheduler.merge_soon()
    assert eng.scheduler.wait_merges_idle(GATE_TIMEOUT)
    assert "unreachable" in eng.compaction_errors()["r"]
    eng.append("r", ups([500], 300))
    flush(eng)  # a pass that succeeds
    assert "unreachable" in eng.compaction_errors()["r"]
    assert eng.trace_info("r")["compaction_failures"] >= 1  # the pass's finished segment may wake one more try
    eng.traces.merge = real
    eng.clock.advance(600)  # past the failing merge's backoff
    eng.scheduler.merge_soon()
    assert eng.scheduler.wait_merges_idle(GATE_TIMEOUT)
    assert eng.compaction_errors() == {} and eng.trace_info("r")["compaction_failures"] == 0
    assert len(pending_keys(eng)) <= 2


def test_a_relation_whose_pending_merge_keeps_failing_does_not_stop_any_other_merge(tmp_path):
    """Damaged pending runs of "a" (bytes overwritten on disk): its pending-run merge fails on
    every attempt. That is reported (compaction_errors, trace_info, the errors metric) and
    retried after a backoff on the engine's clock, and it stops neither "a"'s batch merges
    nor any merge of "b"; the background merger does the merging here."""
    from sediment.engine.compaction import MERGE_RETRY_FIRST

    clock = ManualClock()
    eng = sediment.open(str(tmp_path / "data"), clock=clock, segment_bytes=64 << 20)
    names = ("a", "b")

    def merged_in_background() -> None:
        eng.scheduler.merge_soon()
        assert eng.scheduler.wait_merges_idle(GATE_TIMEOUT)

    try:
        for name in names:
            eng.add_relation(name, SCHEMA)
        eng.settings.max_pending_runs = 2
        for step in range(2):  # two unsealed runs each: no merge due yet
            for name in names:
                eng.append(name, ups(list(range(step * 10, step * 10 + 10)), 100 + step))
            flush(eng)
        merged_in_background()
        assert [len(eng.view.relations[n].trace.pending) for n in names] == [2, 2]
        for ref in eng.view.relations["a"].trace.pending:
            [path] = [p for p in (tmp_path / "data").rglob("*") if p.is_file() and str(p).endswith(ref.key)]
            damaged = bytearray(path.read_bytes())
            damaged[4:-8] = b"\xa5" * (len(damaged) - 12)
            path.write_bytes(bytes(damaged))
        for name in names:  # a third run: the merge is due, and a's fails
            eng.append(name, ups([77], 102))
        flush(eng)
        merged_in_background()
        assert list(eng.compaction_errors()) == ["a"]
        assert eng.trace_info("a")["compaction_failures"] == 1
        assert len(eng.view.relations["b"].trace.pending) <= 2
        assert 'where="compaction"' in eng.metrics.exposition().decode()

        for t in range(1, 17):  # sixteen sealed batches each: batch merges are due again and again
            for name in names:
                eng.append(name, ups([t], t))
                eng.seal(name, t)
            flush(eng)
            merged_in_background()
        batches = [len(eng.view.relations[n].trace.batches) for n in names]
        assert batches[0] == batches[1] < 16, f"a's batch merges stopped behind its failing pending merge: {batches}"
        assert eng.trace_info("a")["compaction_failures"] == 1  # backing off: not retried on every wake

        clock.advance(MERGE_RETRY_FIRST)
        eng.compaction.merge_pass()
        assert eng.trace_info("a")["compaction_failures"] == 2
        clock.advance(MERGE_RETRY_FIRST)  # the backoff doubled
        eng.compaction.merge_pass()
        assert eng.trace_info("a")["compaction_failures"] == 2
        clock.advance(MERGE_RETRY_FIRST)
        eng.compaction.merge_pass()
        assert eng.trace_info("a")["compaction_failures"] == 3
        assert list(eng.compaction_errors()) == ["a"]
    finally:
        eng.close()


def test_a_bulk_load_counts_as_new_data_for_the_major_compactions_quiet_time(tmp_path):
    """Rows that arrive as a bulk load's runs (engine/staged.py), not through the WAL, restart
    the quiet time too: the major compaction waits major_compaction_quiet seconds after the
    load, not after the last append, and then makes one batch of everything."""
    clock = ManualClock()
    eng = sediment.open(str(tmp_path / "data"), clock=clock, segment_bytes=64 << 20, compact_interval=5.0,
                        major_compaction_quiet=30.0)
    try:
        expected: dict[str, dict[int, int]] = {"now": {}}
        eng.add_relation("now", SCHEMA)
        append_step(eng, expected, 0, [(i * 7) % 60_000 for i in range(50_000)])
        background_round(eng, clock, 5.0)
        append_step(eng, expected, 1, [(i * 7 + 1) % 60_000 for i in range(8_000)])
        background_round(eng, clock, 5.0)
        assert eng.trace_info("now")["batches"] == 2
        background_round(eng, clock, 25.0)  # 25 s after the pass took the last append: not yet quiet

        keys = list(range(300_000, 311_000))
        path = staged.stage(eng, "now", "load-1")
        pq.write_table(ups(keys, 2), os.path.join(path, "part-00000.parquet"))
        assert staged.commit_staged(eng, "now", "load-1")["rows"] == len(keys)
        for k in keys:
            expected["now"][k] = 1
        eng.seal("now", 2)
        eng.set_since("now", 2)
        background_round(eng, clock, 5.0)  # 30 s after the last append's pass, 5 s after the load
        assert eng.metrics.major_compactions.labels(relation="now")._value.get() == 0
        assert eng.trace_info("now")["batches"] + eng.trace_info("now")["pending"] >= 2
        background_round(eng, clock, 25.0)  # 30 s after the load: quiet
        assert eng.metrics.major_compactions.labels(relation="now")._value.get() == 1
        assert eng.trace_info("now")["batches"] == 1 and eng.trace_info("now")["pending"] == 0
        assert model_of(eng.snapshot("now", 2)) == expected["now"]
    finally:
        eng.close()
