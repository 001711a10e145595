"""A merge of stored batches keeps to the memory bound, however large their row groups:
each input is read a piece of the merge's chunk at a time (not a whole row group, nor a
whole column chunk), and the output's row groups are no larger than the inputs' chunks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest

import sediment
from sediment.clock import ManualClock

SCHEMA = pa.schema([("k", pa.int64()), ("p", pa.binary())])


def _fill(data_dir: str, rows: int, width: int) -> None:
    """Three batches of ``rows``, a third and a ninth as many incompressible rows of ``width``
    bytes (one row group each), sizes the size-tiered rule leaves unmerged."""
    with sediment.open(data_dir, clock=ManualClock(), compact_interval=None, segment_bytes=128 << 20,
                       major_compaction_quiet=None) as eng:
        eng.add_relation("r", SCHEMA)
        for b, n in enumerate([rows, rows // 3, rows // 9]):
            ks = list(range(b, 4 * n, 4))
            eng.append("r", pa.table({"k": pa.array(ks, pa.int64()), "p": [os.urandom(width) for _ in ks],
                                      "time": [b + 1] * n, "diff": [1] * n}))
            eng.seal("r", b + 1)
            eng.wal.finish_segment()
            eng.compaction.run_pass(None, merge=False)  # one batch per step: the merge is the test's
        assert eng.trace_info("r")["batches"] == 3


MERGE = textwrap.dedent("""
    import json, sys
    import pyarrow as pa
    import sediment
    from sediment.clock import ManualClock
    eng = sediment.open(sys.argv[1], clock=ManualClock(), compact_interval=None, major_compaction_quiet=None,
                        memory_bound=int(sys.argv[2]))
    rel = eng.view.relations["r"]
    refs = list(rel.trace.batches)
    before = pa.default_memory_pool().max_memory()
    merged = eng.traces.merge(rel.entry.id, refs, rel.keys, rel.update_schema, 0, 1,
                              chunk_rows=eng.compaction._chunk_rows(refs))
    print(json.dumps({"before": before, "peak": pa.default_memory_pool().max_memory(), "rows": merged.rows,
                      "pool": pa.default_memory_pool().backend_name}))
    eng.close()
""")


@pytest.mark.parametrize(("rows", "width", "bound"), [(30_000, 1000, 8 << 20), (300, 64 << 10, 4 << 20)],
                         ids=["1KB-rows", "64KiB-rows"])
def test_a_merge_of_batches_with_large_row_groups_keeps_to_the_memory_bound(tmp_path, rows, width, bound):
    """Also with rows so wide that the usual floor of rows per chunk would not fit the bound
    (64 KiB rows: 1,024 of them an input would be 64 MiB against a 4 MiB bound)."""
    data_dir = str(tmp_path / "d")
    _fill(data_dir, rows, width)
    got = subprocess.run([sys.executable, "-c", MERGE, data_dir, str(bound)], capture_output=True, text=True,
                         timeout=300, check=True)
    out = json.loads(got.stdout.strip().splitlines()[-1])
    total = rows + rows // 3 + rows // 9
    assert out["rows"] == total
    assert out["before"] < bound  # a fresh process: the peak is the merge's
    assert out["peak"] < 3 * bound, f"the merge held {out['peak'] >> 20} MiB with a {bound >> 20} MiB bound ({out})"
    with sediment.open(data_dir, clock=ManualClock(), compact_interval=None, major_compaction_quiet=None) as eng:
        assert eng.snapshot("r", 3).num_rows == total
