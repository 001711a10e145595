"""Bulk loads at the engine (engine/staged.py): staged Parquet files become pending runs in one
commit, are checked first (a refusal changes nothing), are committed at most once (also
across a restart), and read back as the same rows appended through the WAL would."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import sediment
from sediment.engine import staged
from sediment.engine.verify import verify_data_dir
from sediment.errors import (
    InvalidArgument,
    SchemaMismatch,
    StagedFileInvalid,
    TimeAlreadySealed,
    UnknownRelation,
)

SCHEMA = pa.schema([("id", pa.int64()), ("item", pa.string())])


def updates(ids, items, times, diffs) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "item": pa.array(items, pa.string()),
                     "time": pa.array(times, pa.int64()), "diff": pa.array(diffs, pa.int64())})


def snapshot(engine, name, t) -> Counter:
    got = engine.snapshot(name, t)
    return Counter(zip(got.column("id").to_pylist(), got.column("item").to_pylist(), got.column("diff").to_pylist(),
                       strict=True))


@pytest.fixture
def engine(tmp_path):
    eng = sediment.open(tmp_path / "data", compact_interval=None)
    eng.add_relation("bulk", SCHEMA)
    eng.add_relation("rows", SCHEMA)
    yield eng
    eng.close()


def stage_files(engine, job, tables) -> str:
    path = staged.stage(engine, "bulk", job)
    for i, t in enumerate(tables):
        pq.write_table(t, os.path.join(path, f"part-{i:05d}.parquet"), compression="snappy")
    open(os.path.join(path, "_SUCCESS"), "w").close()
    open(os.path.join(path, ".part-00000.parquet.crc"), "wb").close()
    return path


def test_staged_files_read_back_as_the_same_rows_appended_through_the_wal(engine):
    """One file sorted and consolidated (taken as written), one with repeats, a zero sum and
    rows out of order (kept as written, a raw run that reads consolidate); both relations then
    read alike at every time, before and after compaction folds the runs into batches."""
    sorted_run = updates([1, 2, 2, 5], ["a", "b", None, "e"], [3, 3, 4, 3], [1, 1, -1, 2])
    messy = updates([9, 1, 1, 7, 7], ["z", "a", "a", "q", "q"], [5, 3, 3, 4, 4], [1, 1, 1, 1, -1])
    engine.seal("bulk", 1)
    engine.seal("rows", 1)
    path = stage_files(engine, "job-1", [sorted_run, messy])
    written = os.path.getsize(os.path.join(path, "part-00000.parquet"))
    got = staged.commit_staged(engine, "bulk", "job-1")
    assert got == {"rows": 9, "runs": 2, "min_time": 3, "max_time": 5, "committed": True}
    assert not os.path.exists(path)  # staged files collected
    info = engine.trace_info("bulk")
    assert info["pending"] == 2 and info["tail_records"] == 0  # no WAL record: runs straight into the trace
    first = engine.view.relations["bulk"].trace.pending[0]
    assert first.rows == 4 and first.bytes > written - 200  # the sorted file kept its pages (snappy, not zstd)
    engine.append("rows", pa.concat_tables([sorted_run, messy]))
    for t in (3, 4, 5):
        engine.seal("bulk", t)
        engine.seal("rows", t)
        assert snapshot(engine, "bulk", t) == snapshot(engine, "rows", t)
    engine.compact()
    assert engine.trace_info("bulk")["pending"] == 0
    assert snapshot(engine, "bulk", 5) == snapshot(engine, "rows", 5) == Counter(
        {(1, "a", 3): 1, (2, "b", 1): 1, (2, None, -1): 1, (5, "e", 2): 1, (9, "z", 1): 1})


def test_a_retried_commit_changes_nothing_even_after_a_restart(tmp_path):
    eng = sediment.open(tmp_path / "data", compact_interval=None)
    eng.add_relation("bulk", SCHEMA)
    stage_files(eng, "job-2", [updates([1, 2], ["a", "b"], [1, 1], [1, 1])])
    assert staged.commit_staged(eng, "bulk", "job-2")["committed"]
    stage_files(eng, "job-2", [updates([1, 2], ["a", "b"], [1, 1], [1, 1])])  # a duplicate of the load's files
    again = {"rows": 2, "runs": 0, "min_time": 1, "max_time": 1, "committed": False, "counts_known": True}
    assert staged.commit_staged(eng, "bulk", "job-2") == again  # what the first commit kept
    eng.close()
    with sediment.open(tmp_path / "data", compact_interval=None) as eng:
        assert staged.commit_staged(eng, "bulk", "job-2") == again
        eng.seal("bulk", 1)
        assert eng.snapshot("bulk", 1).num_rows == 2
        assert not os.path.exists(os.path.join(eng.data_dir, "blobs", "staging", "0000000000000001", "job-2"))


@pytest.mark.parametrize("bad, error", [
    (pa.table({"id": pa.array([1], pa.int32()), "item": ["a"], "time": pa.array([5], pa.int64()),
               "diff": pa.array([1], pa.int64())}), SchemaMismatch),
    (pa.table({"id": pa.array([1], pa.int64()), "time": pa.array([5], pa.int64()),
               "diff": pa.array([1], pa.int64())}), SchemaMismatch),
    (updates([1], ["a"], [5], [None]), StagedFileInvalid),
    (updates([1], ["a"], [None], [1]), StagedFileInvalid),
    (updates([1, 2], ["a", "b"], [5, 2], [1, 1]), TimeAlreadySealed),
])
def test_a_bad_staged_file_is_refused_with_nothing_changed(engine, bad, error):
    engine.seal("bulk", 2)
    path = stage_files(engine, "job-3", [updates([1], ["a"], [5], [1]), bad])
    before = engine.view.relations["bulk"].trace
    files = sorted(os.listdir(path))
    with pytest.raises(error, match="bulk|relation 'bulk'"):
        staged.commit_staged(engine, "bulk", "job-3")
    assert engine.view.relations["bulk"].trace == before
    assert engine.traces.load(engine.view.relations["bulk"].entry.id) == before
    assert sorted(os.listdir(path)) == files
    assert pq.read_table(os.path.join(path, "part-00000.parquet")).num_rows == 1  # not rewritten
    assert staged.abort_staged(engine, "bulk", "job-3") == len(files)
    assert not os.path.exists(path)
    engine.seal("bulk", 6)
    assert engine.snapshot("bulk", 6).num_rows == 0


def test_a_seal_past_the_staged_times_before_the_commit_refuses_it(engine):
    stage_files(engine, "job-4", [updates([1], ["a"], [3], [1])])
    engine.seal("bulk", 3)
    with pytest.raises(TimeAlreadySealed, match="sealed through time 3"):
        staged.commit_staged(engine, "bulk", "job-4")
    assert engine.trace_info("bulk")["pending"] == 0


def test_job_names_and_blob_stores_are_checked(engine, tmp_path):
    with pytest.raises(InvalidArgument, match="job name"):
        staged.stage(engine, "bulk", "../up")
    with sediment.open(tmp_path / "memdata", blob="memory://", compact_interval=None) as eng:
        eng.add_relation("bulk", SCHEMA)
        with pytest.raises(InvalidArgument, match=r"^bulk loads need a file or S3 blob store that the writers reach"):
            staged.stage(eng, "bulk", "job-5")  # S3 stores stage too: tests/engine/test_staged_s3.py


def test_a_load_staged_before_a_restart_is_collected_and_cannot_commit(tmp_path):
    eng = sediment.open(tmp_path / "data", compact_interval=None)
    eng.add_relation("bulk", SCHEMA)
    path = stage_files(eng, "job-6", [updates([1], ["a"], [1], [1])])
    eng.close()
    with sediment.open(tmp_path / "data", compact_interval=None) as eng:
        assert not os.path.exists(path)  # the open collected it
        with pytest.raises(StagedFileInvalid, match="not staged since the coordinator opened"):
            staged.commit_staged(eng, "bulk", "job-6")
        assert eng.trace_info("bulk")["pending"] == 0 and not eng.view.relations["bulk"].trace.loads


def test_add_runs_refused_under_the_lock_deletes_the_runs_and_commits_nothing(engine):
    """The compaction component's commit of staged runs: a check that refuses under the engine
    lock (a seal that came while the runs were written) leaves the trace as it was and the
    runs' blobs gone; a dropped relation is refused the same way."""
    rel = engine.view.relations["bulk"]
    before = rel.trace
    written: list[str] = []

    def make_runs(since):
        ref = engine.traces.write(rel.entry.id, updates([1], ["a"], [5], [1]), 5, 6, since)
        written.append(ref.key)
        return [ref]

    def sealed_meanwhile():
        raise TimeAlreadySealed("sealed while the runs were written")

    with pytest.raises(TimeAlreadySealed):
        engine.compaction.add_runs(rel, make_runs, "job-7", check=lambda: sealed_meanwhile(), keep_loads=4)
    assert rel.trace == before and engine.traces.load(rel.entry.id) == before
    assert written and written[0] not in engine.traces.blobs.list()
    engine.drop_relation("bulk")
    with pytest.raises(UnknownRelation):
        engine.compaction.add_runs(rel, make_runs, "job-8", check=lambda: None, keep_loads=4)
    assert written[1] not in engine.traces.blobs.list()


def test_add_runs_remembers_only_the_last_loads(engine):
    rel = engine.view.relations["bulk"]
    for i in range(3):
        engine.compaction.add_runs(rel, lambda _since, i=i: [engine.traces.write(
            rel.entry.id, updates([i], ["a"], [5 + i], [1]), 5 + i, 6 + i, 0)], f"job-{i}", check=lambda: None,
            keep_loads=2)
    assert rel.trace.loads == ("job-1", "job-2") and len(rel.trace.pending) == 3
    assert engine.view.max_time == 7  # the lock table's floor at the next open counts them
    engine.seal("bulk", 7)
    assert snapshot(engine, "bulk", 7) == Counter({(0, "a", 1): 1, (1, "a", 1): 1, (2, "a", 1): 1})


def test_add_runs_of_a_load_committed_meanwhile_makes_nothing(engine):
    """Two commits of one load racing: the second, once it holds the pass lock, finds the job
    recorded and writes no runs, so the rows are never added twice."""
    rel = engine.view.relations["bulk"]
    made: list[int] = []

    def make_runs(since):
        made.append(since)
        return [engine.traces.write(rel.entry.id, updates([1], ["a"], [5], [1]), 5, 6, since)]

    assert len(engine.compaction.add_runs(rel, make_runs, "job-9", check=lambda: None, keep_loads=4)) == 1
    assert engine.compaction.add_runs(rel, make_runs, "job-9", check=lambda: None, keep_loads=4) is None
    assert len(made) == 1 and len(rel.trace.pending) == 1


@pytest.mark.parametrize("stats", [True, False])
def test_a_one_column_relation_s_unsorted_staged_file_is_a_raw_run_that_compaction_sorts(tmp_path, stats):
    """With one key column the first column is the whole row: a file out of order in it (or in
    time within a row) is not a run, whether or not the writer kept row-group statistics. The
    commit keeps it as written (a raw run), reads consolidate it, and the merge task rewrites it
    sorted; reads are the same before and after."""
    with sediment.open(tmp_path / "data", compact_interval=None) as eng:
        for name in ("bulk", "rows"):
            eng.add_relation(name, pa.schema([("id", pa.int64())]))
        files = [pa.table({"id": pa.array(ids, pa.int64()), "time": pa.array(times, pa.int64()),
                           "diff": pa.array([1] * len(ids), pa.int64())})
                 for ids, times in (([2, 1, 3], [1, 1, 1]), ([4, 4, 5], [2, 1, 1]))]
        path = staged.stage(eng, "bulk", "job-7")
        for i, t in enumerate(files):
            pq.write_table(t, os.path.join(path, f"part-{i:05d}.parquet"), write_statistics=stats)
        assert staged.commit_staged(eng, "bulk", "job-7")["rows"] == 6
        assert [run.raw for run in eng.view.relations["bulk"].trace.pending] == [True, True]
        eng.append("rows", pa.concat_tables(files))
        for t in (1, 2):
            for name in ("bulk", "rows"):
                eng.seal(name, t)

        def reads(name):
            return ([eng.snapshot(name, t) for t in (1, 2)],
                    sorted(r for b in eng.replay(name) for r in zip(*b.to_pydict().values(), strict=True)))

        before = reads("bulk")
        assert before == reads("rows")
        eng.compaction.merge_pass()  # rewrites the raw runs, folds nothing (no pass)
        runs = eng.view.relations["bulk"].trace.pending
        assert len(runs) == 2 and not any(run.raw for run in runs)
        for run in runs:
            ids = pq.read_table(eng.traces.blobs.local_path(run.key)).column("id").to_pylist()
            assert ids == sorted(ids)
        assert reads("bulk") == before


KILLED_AFTER_COMMIT = textwrap.dedent("""
    import os, sys
    import pyarrow as pa, pyarrow.parquet as pq
    import sediment
    from sediment.engine import staged
    eng = sediment.open(sys.argv[1], compact_interval=None)
    eng.add_relation("bulk", pa.schema([("id", pa.int64()), ("item", pa.string())]))
    eng.seal("bulk", 1)
    path = staged.stage(eng, "bulk", "job-k")
    frame = pa.schema([pa.field("item", pa.string()), pa.field("id", pa.int64(), nullable=False)])
    for i, ids in enumerate(([5, 3, 5, 1], [2, 3])):
        pq.write_table(pa.table({"item": [f"i{x}" for x in ids], "id": ids}, schema=frame),
                       os.path.join(path, f"part-{i:05d}.parquet"))
    print(staged.commit_staged(eng, "bulk", "job-k", time=4)["committed"], flush=True)
    sys.stdin.read()  # killed here: after the commit, before any merge
""")


def test_raw_runs_committed_then_sigkilled_read_alike_before_and_after_the_merge_and_a_reopen(tmp_path):
    """Files as Spark writes a frame (the relation's columns in another order, not null, no time
    or diff): the commit keeps them as raw runs; the process is SIGKILLed before any merge; the
    reopened engine reads them consolidated, the merge rewrites them, and a reopen reads the same."""
    data = str(tmp_path / "data")
    proc = subprocess.Popen([sys.executable, "-c", KILLED_AFTER_COMMIT, data], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "True"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    want = Counter({(1, "i1", 1): 1, (2, "i2", 1): 1, (3, "i3", 2): 1, (5, "i5", 2): 1})
    report = verify_data_dir(data)  # the raw runs' footers, checksums and schemas, read-only
    assert report.ok and sum("/trace/" in k for k in report.checked) == 2, report.problems
    with sediment.open(data, compact_interval=None) as eng:
        runs = eng.view.relations["bulk"].trace.pending
        assert [(r.raw, r.time, r.diff, r.rows) for r in runs] == [(True, 4, 1, 4), (True, 4, 1, 2)]
        eng.seal("bulk", 4)
        assert snapshot(eng, "bulk", 3) == Counter() and snapshot(eng, "bulk", 4) == want
        for ordered in (True, False):  # replay in time order and as stored: each raw run consolidated
            replayed = [r for b in eng.replay("bulk", ordered=ordered) for r in zip(*b.to_pydict().values(), strict=True)]
            sums = Counter()
            for i, item, t, d in replayed:
                sums[(i, item, t)] += d
            assert Counter({(i, item, d): 1 for (i, item, _t), d in sums.items()}) == want  # one row per run
            assert {t for _i, _item, t, _d in replayed} == {4} and len(replayed) == 5
        eng.compaction.merge_pass()
        assert not any(r.raw for r in eng.view.relations["bulk"].trace.pending)
        assert snapshot(eng, "bulk", 4) == want
    with sediment.open(data, compact_interval=None) as eng:
        assert snapshot(eng, "bulk", 4) == want
        eng.compact()
        assert eng.trace_info("bulk")["pending"] == 0 and snapshot(eng, "bulk", 4) == want


def test_raw_runs_read_by_name_after_an_alter_and_are_rewritten_with_ids_after_one(tmp_path):
    """A raw run committed before an alter reads in the altered columns (an added column's
    default); one committed after an alter added a column (files without field ids) is
    rewritten at the commit as a batch with the relation's ids."""
    frame = pa.schema([pa.field("item", pa.string()), pa.field("id", pa.int64(), nullable=False)])
    with sediment.open(tmp_path / "data", compact_interval=None) as eng:
        eng.add_relation("bulk", SCHEMA)
        path = staged.stage(eng, "bulk", "before")
        pq.write_table(pa.table({"item": ["b", "a", "b"], "id": [2, 1, 2]}, schema=frame),
                       os.path.join(path, "part-0.parquet"))
        staged.commit_staged(eng, "bulk", "before", time=3)
        eng.alter_relation("bulk", add=[pa.field("n", pa.int64())], defaults={"n": 7})
        path = staged.stage(eng, "bulk", "after")
        pq.write_table(pa.table({"n": [8], "item": ["c"], "id": [3]}), os.path.join(path, "part-0.parquet"))
        staged.commit_staged(eng, "bulk", "after", time=4)
        assert [r.raw for r in eng.view.relations["bulk"].trace.pending] == [True, False]
        eng.seal("bulk", 4)
        got = eng.snapshot("bulk", 4).to_pylist()
        assert got == [{"id": 1, "item": "a", "n": 7, "diff": 1}, {"id": 2, "item": "b", "n": 7, "diff": 2},
                       {"id": 3, "item": "c", "n": 8, "diff": 1}]
        eng.compact()
        assert eng.trace_info("bulk")["pending"] == 0 and eng.snapshot("bulk", 4).to_pylist() == got


def same(eng, replay: bool = False) -> bool:
    """``bulk`` and ``rows`` hold the same updates: as of 4, or replayed and summed by row
    and time (a replay gives updates as stored, consolidated or not)."""
    def rows(name):
        if not replay:
            return sorted(map(repr, eng.snapshot(name, 4).to_pylist()))
        sums: Counter = Counter()
        for batch in eng.replay(name):
            for r in batch.to_pylist():
                diff = r.pop("diff")
                sums[repr(sorted(r.items()))] += diff
        return sorted((k, v) for k, v in sums.items() if v)
    return rows("bulk") == rows("rows")


@pytest.mark.parametrize("alter", ["drop", "widen", "rename"])
def test_a_frame_loaded_as_is_after_an_alter_reads_as_the_row_path_does(tmp_path, alter):
    """A raw file names the columns of the schema current at the load, not version 0's: after
    any alter the commit writes it again with the relation's ids (a drop or a widen left it
    unreadable: reads, compaction and merges failed while verify said ok)."""
    wide = pa.schema([("id", pa.int32()), ("item", pa.string()), ("x", pa.int64())])
    change = {"drop": {"drop": ["x"]}, "widen": {"widen": {"id": pa.int64()}},
              "rename": {"rename": {"item": "name"}}}[alter]
    with sediment.open(tmp_path / "data", compact_interval=None) as eng:
        for name in ("bulk", "rows"):
            eng.add_relation(name, wide)
            eng.alter_relation(name, **change)
        now = eng.view.relations["bulk"].entry.schema
        big = (1 << 40) if alter == "widen" else 7
        rows = [{"id": big, **{n: "b" if n != "x" else None for n in now.names if n != "id"}},
                {"id": 1, **{n: None for n in now.names if n != "id"}}]
        frame = pa.Table.from_pylist(rows * 2, schema=now).select(list(reversed(now.names)))
        path = staged.stage(eng, "bulk", "job")
        pq.write_table(frame, os.path.join(path, "part-0.parquet"), row_group_size=2)
        staged.commit_staged(eng, "bulk", "job", time=3)
        eng.append("rows", frame.append_column("time", pa.array([3] * 4, pa.int64()))
                   .append_column("diff", pa.array([1] * 4, pa.int64())))
        for name in ("bulk", "rows"):
            eng.seal(name, 4)
        assert same(eng) and same(eng, replay=True)
        eng.compact()
        assert same(eng) and same(eng, replay=True)
    report = verify_data_dir(str(tmp_path / "data"))
    assert report.ok, report.problems
    with sediment.open(tmp_path / "data", compact_interval=None) as eng:
        assert same(eng)


def test_a_raw_run_past_the_memory_bound_reads_and_merges_as_the_row_path_does(tmp_path):
    """100k shuffled rows with repeats, loaded as written into an engine whose merges are bound
    to 1 MiB: reads (snapshots, replay in time order and as stored) sort the raw run in pieces
    (trace/raw_sort.py) and agree with the same rows appended through the WAL, before and after
    the merge task rewrites it, and across a reopen."""
    rng = random.Random(12)
    ids = [rng.randrange(50_000) for _ in range(100_000)]
    frame = pa.table({"item": [f"i{x % 997}" for x in ids], "id": pa.array(ids, pa.int64())})
    with sediment.open(tmp_path / "data", compact_interval=None, memory_bound=1 << 20) as eng:
        for name in ("bulk", "rows"):
            eng.add_relation(name, SCHEMA)
        path = staged.stage(eng, "bulk", "big")
        pq.write_table(frame, os.path.join(path, "part-0.parquet"), row_group_size=1 << 24)
        staged.commit_staged(eng, "bulk", "big", time=3)
        assert [r.raw for r in eng.view.relations["bulk"].trace.pending] == [True]
        eng.append("rows", frame.append_column("time", pa.array([3] * len(ids), pa.int64()))
                   .append_column("diff", pa.array([1] * len(ids), pa.int64())))
        for name in ("bulk", "rows"):
            eng.seal(name, 4)
        assert same(eng) and same(eng, replay=True)
        assert eng.traces.raw_spills > 8  # sorted in pieces, not whole
        eng.compaction.merge_pass()
        assert not any(r.raw for r in eng.view.relations["bulk"].trace.pending)
        assert same(eng) and same(eng, replay=True)
    with sediment.open(tmp_path / "data", compact_interval=None, memory_bound=1 << 20) as eng:
        assert same(eng)


def test_a_commit_failing_on_one_file_leaves_no_linked_runs_behind(engine):
    """The second file passes the check (its columns are the update schema's) but carries Parquet
    field ids, so its row groups cannot take the batch footer: the commit fails with a typed
    error, nothing is committed, and the first file's run, already linked under a batch key,
    is deleted at once (before, it waited for the next open's orphan sweep). Without the
    second file the load then commits."""
    ids = pa.schema([pa.field(f.name, f.type, metadata={b"PARQUET:field_id": str(i + 1).encode()})
                     for i, f in enumerate(updates([], [], [], []).schema)])
    path = stage_files(engine, "job-f", [updates([1, 2], ["a", "b"], [1, 1], [1, 1])])
    pq.write_table(updates([3], ["c"], [1], [1]).cast(ids), os.path.join(path, "part-00001.parquet"))
    before = set(engine.traces.blobs.list("trace/"))
    with pytest.raises(StagedFileInvalid, match="part-00001.parquet.*batch footer"):
        staged.commit_staged(engine, "bulk", "job-f")
    assert set(engine.traces.blobs.list("trace/")) == before
    assert engine.view.relations["bulk"].trace.pending == () and "job-f" not in engine.view.relations["bulk"].trace.loads
    os.unlink(os.path.join(path, "part-00001.parquet"))
    assert staged.commit_staged(engine, "bulk", "job-f")["rows"] == 2
    engine.seal("bulk", 1)
    assert snapshot(engine, "bulk", 1) == Counter({(1, "a", 1): 1, (2, "b", 1): 1})
