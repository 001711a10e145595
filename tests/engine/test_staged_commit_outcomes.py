"""Bulk commits whose outcome is in doubt or whose load changed under them (engine/staged.py,
compaction's add_runs): a trace commit that may have landed keeps its runs, a load staged
before a restart never commits part of itself, an alter during the commit is refused typed,
and staged files with empty row groups commit."""

from __future__ import annotations

import os
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import sediment
from sediment.engine import staged
from sediment.errors import (
    CoordinatorSuperseded,
    MetadataConflict,
    MetadataUnavailable,
    SchemaMismatch,
    StagedFileInvalid,
    TimeAlreadySealed,
    UnknownRelation,
)

SCHEMA = pa.schema([("id", pa.int64()), ("item", pa.string())])


def stage_rows(eng, job: str, ids: list[int], part: int = 0) -> str:
    path = staged.stage(eng, "bulk", job)
    pq.write_table(pa.table({"id": ids, "item": [f"i{i}" for i in ids]}), os.path.join(path, f"part-{part:05d}.parquet"))
    return path


def trace_commits_fail(monkeypatch, meta, error: type[Exception], landed: bool, read_back: bool = True) -> None:
    """The metadata store's next trace compare-and-set raises ``error``, after writing it when ``landed``
    (ZooKeeper's ConnectionLoss or an S3 timeout after the write was applied); without ``read_back``
    the reads of trace keys fail too, until ``monkeypatch.undo()``."""
    plain, plain_get = meta.compare_and_set, meta.get

    def failing(key, value, expected):
        if not key.startswith("trace"):
            return plain(key, value, expected)
        monkeypatch.setattr(meta, "compare_and_set", plain)
        if landed:
            plain(key, value, expected)
        raise error(f"the metadata store did not answer for {key!r}")

    def failing_get(key):
        if key.startswith("trace"):
            raise MetadataUnavailable(f"the metadata store did not answer for {key!r}")
        return plain_get(key)

    monkeypatch.setattr(meta, "compare_and_set", failing)
    if not read_back:
        monkeypatch.setattr(meta, "get", failing_get)


def test_a_commit_of_unknown_outcome_that_landed_is_read_back_as_committed(tmp_path, monkeypatch):
    data = tmp_path / "data"
    with sediment.open(data, compact_interval=None) as eng:
        eng.add_relation("bulk", SCHEMA)
        stage_rows(eng, "job-1", [1, 2])
        trace_commits_fail(monkeypatch, eng.traces.meta, MetadataUnavailable, landed=True)
        staged.commit_staged(eng, "bulk", "job-1", time=3)  # the lost answer is read back: it landed
        assert eng.view.relations["bulk"].trace.loads == ("job-1",)
        eng.seal("bulk", 3)
        assert sorted(eng.snapshot("bulk", 3).column("id").to_pylist()) == [1, 2]
        eng.compact()  # the next commit of the relation goes on from the version read back
        assert sorted(eng.snapshot("bulk", 3).column("id").to_pylist()) == [1, 2]


def test_a_commit_of_unknown_outcome_that_landed_keeps_its_runs_readable_after_a_reopen(tmp_path, monkeypatch):
    data = tmp_path / "data"
    with sediment.open(data, compact_interval=None) as eng:
        eng.add_relation("bulk", SCHEMA)
        stage_rows(eng, "job-1", [1, 2])
        trace_commits_fail(monkeypatch, eng.traces.meta, MetadataUnavailable, landed=True, read_back=False)
        with pytest.raises(MetadataUnavailable):
            staged.commit_staged(eng, "bulk", "job-1", time=3)
        monkeypatch.undo()
        batch = [k for k in eng.traces.blobs.list("trace/") if k.endswith(".parquet")]
        stored = eng.traces.blobs.get(batch[0])
        with pytest.raises(MetadataConflict, match="reopen"):  # asked again: this process's trace is behind
            staged.commit_staged(eng, "bulk", "job-1", time=4)
        assert eng.traces.fence.replaced is None  # behind its own write, not replaced
        assert eng.traces.blobs.get(batch[0]) == stored  # the batch that landed keeps its footer
    with sediment.open(data, compact_interval=None) as eng:
        assert eng.view.relations["bulk"].trace.loads == ("job-1",)
        eng.seal("bulk", 3)
        assert sorted(eng.snapshot("bulk", 3).column("id").to_pylist()) == [1, 2]
        eng.compact()
        assert sorted(eng.snapshot("bulk", 3).column("id").to_pylist()) == [1, 2]


def test_a_commit_the_metadata_store_refused_deletes_its_runs(tmp_path, monkeypatch):
    with sediment.open(tmp_path / "data", compact_interval=None) as eng:
        eng.add_relation("bulk", SCHEMA)
        stage_rows(eng, "job-2", [1, 2])
        before = set(eng.traces.blobs.list("trace/"))
        trace_commits_fail(monkeypatch, eng.traces.meta, MetadataConflict, landed=False)
        with pytest.raises(MetadataConflict) as info:  # a trace key changed under it
            staged.commit_staged(eng, "bulk", "job-2", time=3)
        assert not isinstance(info.value, CoordinatorSuperseded)  # a local engine: no other coordinator exists
        assert eng.traces.fence.replaced is None and eng.superseded is None
        assert set(eng.traces.blobs.list("trace/")) == before
        assert not eng.view.relations["bulk"].trace.pending


def test_a_load_half_put_back_after_a_restart_does_not_commit(tmp_path):
    """The open deletes the load's directory; a writer still running puts its own file back
    (Spark's writer makes missing parents): the commit refuses the load, it does not take the
    half as a whole."""
    data = tmp_path / "data"
    with sediment.open(data, compact_interval=None) as eng:
        eng.add_relation("bulk", SCHEMA)
        path = stage_rows(eng, "job-3", [1, 2])
    with sediment.open(data, compact_interval=None) as eng:
        assert not os.path.exists(path)
        os.makedirs(path)
        pq.write_table(pa.table({"id": [3], "item": ["c"]}), os.path.join(path, "part-00001.parquet"))
        with pytest.raises(StagedFileInvalid, match="not staged since the coordinator opened"):
            staged.commit_staged(eng, "bulk", "job-3", time=3)
        assert not eng.view.relations["bulk"].trace.pending and not eng.view.relations["bulk"].trace.loads
        assert staged.abort_staged(eng, "bulk", "job-3") == 1 and not os.path.exists(path)
        stage_rows(eng, "job-3", [4])  # the writer writes it again under the same name: that commits
        assert staged.commit_staged(eng, "bulk", "job-3", time=3)["rows"] == 1


ALTERS = {"drop": {"drop": ["x"]}, "widen": {"widen": {"id": pa.int64()}},
          "rename": {"rename": {"item": "name"}}, "add": {"add": [pa.field("n", pa.int64())]}}


@pytest.mark.parametrize("shape", ["raw", "run"])
@pytest.mark.parametrize("alter", list(ALTERS))
def test_an_alter_between_the_checks_and_the_commit_refuses_it_typed(tmp_path, monkeypatch, alter, shape):
    """The alter waits for the pass lock, which the file checks do not hold: it lands after
    the checks (here made just before add_runs takes the lock, as another thread's would)."""
    with sediment.open(tmp_path / "data", compact_interval=None) as eng:
        eng.add_relation("bulk", pa.schema([("id", pa.int32()), ("item", pa.string()), ("x", pa.int64())]))
        frame = pa.table({"id": pa.array([1, 2], pa.int32()), "item": ["a", "b"], "x": [5, 6]})
        path = staged.stage(eng, "bulk", "job-4")
        if shape == "run":
            frame = frame.append_column("time", pa.array([3, 3], pa.int64())).append_column("diff", pa.array([1, 1]))
            frame = frame.cast(eng.traces.schema_of(eng.view.relations["bulk"].entry.id))
        pq.write_table(frame, os.path.join(path, "part-00000.parquet"))
        plain = eng.compaction.add_runs

        def altered_first(*args, **kwargs):
            eng.alter_relation("bulk", **ALTERS[alter])
            return plain(*args, **kwargs)

        monkeypatch.setattr(eng.compaction, "add_runs", altered_first)
        before = set(eng.traces.blobs.list("trace/"))
        with pytest.raises(SchemaMismatch, match="altered during the load"):
            staged.commit_staged(eng, "bulk", "job-4", time=3 if shape == "raw" else None)
        rel = eng.view.relations["bulk"]
        assert not rel.trace.pending and not rel.trace.loads and set(eng.traces.blobs.list("trace/")) == before
        assert sorted(os.listdir(path)) == [staged.MARKER, "part-00000.parquet"]  # left for the abort


@pytest.mark.parametrize("shape", ["frame", "frame-with-time", "run"])
def test_a_staged_file_with_an_empty_row_group_commits(tmp_path, shape):
    """Writers may close a file with an empty row group, whose statistics have no min or max."""
    with sediment.open(tmp_path / "data", compact_interval=None) as eng:
        eng.add_relation("bulk", SCHEMA)
        path = staged.stage(eng, "bulk", "job-5")
        t = pa.table({"item": ["b", "a", "c"], "id": [2, 1, 3]})
        if shape != "frame":
            t = t.append_column("time", pa.array([3, 3, 4], pa.int64()))
        if shape == "run":
            t = pa.table({"id": [1, 2, 3], "item": ["a", "b", "c"], "time": [3, 3, 4], "diff": [1, 1, 1]})
            t = t.cast(eng.traces.schema_of(eng.view.relations["bulk"].entry.id))
        with pq.ParquetWriter(os.path.join(path, "part-00000.parquet"), t.schema) as w:
            w.write_table(t.slice(0, 2))
            w.write_table(t.slice(0, 0))
            w.write_table(t.slice(2))
            w.write_table(t.slice(0, 0))
        got = staged.commit_staged(eng, "bulk", "job-5", time=3 if shape == "frame" else None)
        assert got["rows"] == 3 and got["min_time"] == 3 and got["max_time"] == (3 if shape == "frame" else 4)
        eng.seal("bulk", 4)
        assert sorted(eng.snapshot("bulk", 4).column("id").to_pylist()) == [1, 2, 3]
        eng.compact()
        assert sorted(eng.snapshot("bulk", 4).column("id").to_pylist()) == [1, 2, 3]


def test_a_drop_deletes_the_relation_s_staged_loads_and_a_seal_before_the_footers_touches_no_file(tmp_path, monkeypatch):
    with sediment.open(tmp_path / "data", compact_interval=None) as eng:
        eng.add_relation("bulk", SCHEMA)
        path = stage_rows(eng, "job-6", [1, 2])
        footer = open(os.path.join(path, "part-00000.parquet"), "rb").read()
        plain = eng.compaction.add_runs

        def sealed_first(*args, **kwargs):
            eng.seal("bulk", 3)
            return plain(*args, **kwargs)

        monkeypatch.setattr(eng.compaction, "add_runs", sealed_first)
        with pytest.raises(TimeAlreadySealed):
            staged.commit_staged(eng, "bulk", "job-6", time=3)
        assert open(os.path.join(path, "part-00000.parquet"), "rb").read() == footer  # refused before any rewrite
        eng.drop_relation("bulk")
        assert not os.path.exists(path) and not os.path.exists(os.path.dirname(path))
        with pytest.raises(UnknownRelation):
            staged.abort_staged(eng, "bulk", "job-6")


def test_a_load_swept_while_its_writer_runs_does_not_commit_the_files_put_back(tmp_path):
    """The sweep lands while the writer still writes (as at an open that follows a coordinator
    restart; here called on the running engine): what the writer puts back is refused."""
    with sediment.open(tmp_path / "data", compact_interval=None) as eng:
        eng.add_relation("bulk", SCHEMA)
        path = stage_rows(eng, "job-7", [1, 2])
        assert staged.sweep_staging(eng.traces.blobs) == [f"{eng.view.relations['bulk'].entry.id:016x}"]
        os.makedirs(path)
        pq.write_table(pa.table({"id": [3], "item": ["c"]}), os.path.join(path, "part-00001.parquet"))
        with pytest.raises(StagedFileInvalid, match="not staged since the coordinator opened"):
            staged.commit_staged(eng, "bulk", "job-7", time=3)
        assert not eng.view.relations["bulk"].trace.pending


def test_a_retry_sent_while_the_first_commit_runs_finds_the_load_committed(tmp_path, monkeypatch):
    """The driver asks again after a lost reply while the first attempt still runs: the retry
    waits for it and finds the load committed, instead of checking files the first attempt's
    clean-up deletes (StagedFileInvalid, a NothingWritten: the driver would abort and fail)."""
    with sediment.open(tmp_path / "data", compact_interval=None) as eng:
        eng.add_relation("bulk", SCHEMA)
        stage_rows(eng, "job-1", [1, 2])
        stage_rows(eng, "job-1", [11, 12], part=1)
        rid = eng.view.relations["bulk"].entry.id
        inside, go, results = threading.Event(), threading.Event(), {}
        plain_runs, plain_check = staged._as_runs, staged._check_file

        def held_runs(*a, **k):  # the first attempt, past its checks, holds here
            inside.set()
            assert go.wait(30)
            return plain_runs(*a, **k)

        def retry_check(*a, **k):  # reached by a retry running beside the first attempt
            go.set()  # let the first attempt commit and delete the staged files
            assert first.join(30) is None and not first.is_alive()
            return plain_check(*a, **k)

        def attempt(name):
            try:
                results[name] = staged.commit_staged(eng, "bulk", "job-1", time=3)
            except Exception as e:  # noqa: BLE001 - recorded for the assertion below
                results[name] = e

        monkeypatch.setattr(staged, "_as_runs", held_runs)
        first = threading.Thread(target=attempt, args=("first",))
        first.start()
        assert inside.wait(30)
        monkeypatch.setattr(staged, "_check_file", retry_check)
        retry = threading.Thread(target=attempt, args=("retry",))
        retry.start()
        deadline = time.monotonic() + 30
        while staged.committing(eng, rid, "job-1") < 2 and not go.is_set():
            assert time.monotonic() < deadline, "the retry neither waited for the first attempt nor checked files"
            time.sleep(0.001)
        go.set()
        first.join(30)
        retry.join(30)
        assert results["first"]["committed"] is True and results["first"]["rows"] == 4
        assert isinstance(results["retry"], dict), results["retry"]
        assert results["retry"]["committed"] is False
        assert (results["retry"]["rows"], results["retry"]["max_time"]) == (4, 3)  # what the first commit kept
        assert eng.view.relations["bulk"].trace.loads == ("job-1",)
        assert staged.committing(eng, rid, "job-1") == 0
