"""A drop_relation that lands while a background merge of the relation runs (the drop takes
the pass lock, not the merge lock): the merge's splice finds the relation gone and commits
nothing, instead of committing over the deleted trace state and fencing a healthy engine."""
import pyarrow as pa

import sediment
from sediment.clock import ManualClock

SCHEMA = pa.schema([("id", pa.int64())])


def rows(ids, t):
    return pa.table({"id": ids, "time": [t] * len(ids), "diff": [1] * len(ids)})


def test_drop_during_merge_does_not_fence_a_local_engine(tmp_path):
    with sediment.open(tmp_path / "d", compact_interval=None, clock=ManualClock()) as eng:
        # The background merger (woken by the segment finishes below) waits on the merge lock:
        # the merge this test runs is the one the drop lands in, and no other calls the patch.
        with eng.compaction.merge_lock:
            eng.add_relation("gone", SCHEMA)
            eng.add_relation("kept", SCHEMA)
            for t in (1, 2, 3):
                eng.append("gone", rows([t, t + 10], t))
                eng.append("kept", rows([t], t))
                eng.seal("gone", t)
                eng.seal("kept", t)
                eng.compaction.log.finish_segment()
                eng.compaction.run_pass(None, merge=False)  # a batch per time, merged below
            eng.set_since("gone", 3)
            rel = eng.view.relations["gone"]
            assert len(rel.trace.batches) >= 2
            plain, merged = eng.traces.merge, []

            def merge_then_drop(*a, **k):
                out = plain(*a, **k)
                merged.append(out.key)
                eng.drop_relation("gone")  # lands while the merge runs, before its splice
                return out

            eng.traces.merge = merge_then_drop
            eng.compaction.merge_relation(rel, full=True)  # the splice sees the drop: nothing to commit
            eng.traces.merge = plain
        assert merged and eng.traces.fence.replaced is None
        assert eng.relations() == ["kept"]
        eng.append("kept", rows([4], 4))
        eng.seal("kept", 4)
        eng.compact()  # a healthy local engine keeps compacting
        assert sorted(eng.snapshot("kept", 4).column("id").to_pylist()) == [1, 2, 3, 4]
        assert eng.compaction_errors() == {}
        eng.compaction.collector.collect()
        assert merged[0] not in set(eng.traces.blobs.list("trace/"))  # the merge's output is collected
