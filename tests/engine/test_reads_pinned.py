"""Reads against what they took under the engine lock (engine/reads.py): a replay never
iterated releases its reader pin, and a snapshot or replay that an alter lands in the
middle of keeps the schema version it started with."""

from __future__ import annotations

import gc

import pyarrow as pa
import pytest

import sediment


def test_a_replay_never_iterated_releases_its_pin_and_what_it_held_back_is_deleted(tmp_path):
    with sediment.open(tmp_path / "d", compact_interval=None) as eng:
        eng.add_relation("r", pa.schema([("id", pa.int64())]))
        eng.append("r", pa.table({"id": [1], "time": [1], "diff": [1]}))
        eng.seal("r", 1)
        eng.compact()
        first = set(eng.traces.blobs.list("trace/"))
        replay = eng.replay("r")
        eng.append("r", pa.table({"id": [2], "time": [2], "diff": [1]}))
        eng.seal("r", 2)
        eng.compact()
        eng.compaction.merge_relation(eng.view.relations["r"], full=True)
        assert first <= set(eng.traces.blobs.list("trace/")) and not eng.collector.readers.idle  # held for the replay
        del replay
        gc.collect()
        assert eng.collector.readers.idle and not first & set(eng.traces.blobs.list("trace/"))
        assert sorted(b.column("id").to_pylist()[0] for b in eng.replay("r", batch_rows=1)) == [1, 2]


CHANGES = {"rename": {"rename": {"item": "name"}}, "drop": {"drop": ["item"]},
           "add": {"add": [pa.field("n", pa.int64())]}, "widen": {"widen": {"id": pa.int64()}}}
BEFORE = pa.schema([("id", pa.int32()), ("item", pa.string())])


def filled(eng, compacted: bool) -> None:
    """Relation ``r`` with rows at times 1-4 in batches (``compacted``: and a pending tail), else in the WAL."""
    eng.add_relation("r", BEFORE)
    for t in range(1, 5):
        eng.append("r", pa.table({"id": pa.array([t, t + 10], pa.int32()), "item": ["a", "b"], "time": [t, t],
                                  "diff": [1, 1]}))
    eng.seal("r", 4)
    if compacted:
        eng.compact()
        eng.append("r", pa.table({"id": pa.array([5], pa.int32()), "item": ["c"], "time": [5], "diff": [1]}))
        eng.seal("r", 5)


@pytest.mark.parametrize("change", list(CHANGES))
@pytest.mark.parametrize("compacted", [False, True], ids=["wal", "trace"])
def test_a_replay_an_alter_lands_in_keeps_its_schema(tmp_path, change, compacted):
    with sediment.open(tmp_path / "d", compact_interval=None) as eng:
        filled(eng, compacted)
        whole = pa.Table.from_batches(list(eng.replay("r")))
        replay = eng.replay("r", batch_rows=1)
        first = next(replay)
        eng.alter_relation("r", **CHANGES[change])
        got = pa.Table.from_batches([first, *replay])
        assert got.schema == whole.schema and got.to_pylist() == whole.to_pylist()
        assert pa.Table.from_batches(list(eng.replay("r"))).schema.names != whole.schema.names or change == "widen"


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_snapshot_an_alter_lands_in_keeps_its_schema(tmp_path, monkeypatch, change):
    """The alter lands after the snapshot took the trace under the lock and before it reads
    the batches (another thread's alter; here made by the first batch read)."""
    with sediment.open(tmp_path / "d", compact_interval=None) as eng:
        filled(eng, compacted=True)
        whole = eng.snapshot("r", 5)
        plain, altered = eng.traces.read_pieces, []

        def read_after_an_alter(*args, **kwargs):
            if not altered:
                altered.append(eng.alter_relation("r", **CHANGES[change]))
            return plain(*args, **kwargs)

        monkeypatch.setattr(eng.traces, "read_pieces", read_after_an_alter)  # how a snapshot reads a batch
        got = eng.snapshot("r", 5)
        assert altered and got.schema == whole.schema and got.to_pylist() == whole.to_pylist()
