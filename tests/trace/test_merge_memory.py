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

import sediment
from sediment.clock import ManualClock

ROWS, WIDTH, BOUND = 30_000, 1000, 8 << 20
SCHEMA = pa.schema([("k", pa.int64()), ("p", pa.binary())])


def _fill(data_dir: str) -> None:
    """Three batches of 1 KB incompressible rows (30, 10 and 3.3 MB: one row group each), sizes
    the size-tiered rule leaves unmerged."""
    with sediment.open(data_dir, clock=ManualClock(), compact_interval=None, segment_bytes=128 << 20,
                       major_compaction_quiet=None) as eng:
        eng.add_relation("r", SCHEMA)
        for b, n in enumerate([ROWS, ROWS // 3, ROWS // 9]):
            ks = list(range(b, 4 * n, 4))
            eng.append("r", pa.table({"k": pa.array(ks, pa.int64()), "p": [os.urandom(WIDTH) for _ in ks],
                                      "time": [b + 1] * n, "diff": [1] * n}))
            eng.seal("r", b + 1)
            eng.compact()
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


def test_a_merge_of_batches_with_large_row_groups_keeps_to_the_memory_bound(tmp_path):
    data_dir = str(tmp_path / "d")
    _fill(data_dir)
    got = subprocess.run([sys.executable, "-c", MERGE, data_dir, str(BOUND)], capture_output=True, text=True,
                         timeout=300, check=True)
    out = json.loads(got.stdout.strip().splitlines()[-1])
    assert out["rows"] == ROWS + ROWS // 3 + ROWS // 9
    assert out["before"] < BOUND  # a fresh process: the peak is the merge's
    assert out["peak"] < 3 * BOUND, f"the merge held {out['peak'] >> 20} MiB with a {BOUND >> 20} MiB bound ({out})"
    with sediment.open(data_dir, clock=ManualClock(), compact_interval=None, major_compaction_quiet=None) as eng:
        assert eng.snapshot("r", 3).num_rows == ROWS + ROWS // 3 + ROWS // 9
