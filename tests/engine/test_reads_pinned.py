"""Reads against what they took under the engine lock (engine/reads.py): a replay never
iterated releases its reader pin, and a snapshot or replay that an alter lands in the
middle of keeps the schema version it started with."""

from __future__ import annotations

import gc

import pyarrow as pa

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
