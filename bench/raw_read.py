"""A raw run (a bulk load's file as written) read consolidated: in bounded memory
(trace/raw_sort.py, through the trace store) beside consolidating the whole file at once (the
route every read and the merge took before), in one run.

Why: bounded memory costs a spill and a merge when a shuffled file is past the budget; this
says how much, and what it saves. Each figure is one fresh process (pyarrow's peak
allocation cannot be reset), rounds interleaved (whole, bounded, whole, ...), medians with
min-max. The file is Spark's shape: one row group, ``(v string, k int64)``, time and diff
constants; keys in order (fresh ids) or shuffled with repeats.

    .venv/bin/python bench/raw_read.py                       # 2M rows, 3 rounds, bound 256 MiB
    .venv/bin/python bench/raw_read.py --rows 1000000 --bound 16777216
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq

from sediment.blob.file import FileBlobStore
from sediment.trace.batch import RAW_VERSION, BatchDescription, batch_key, file_checksums
from sediment.trace.state import BatchRef

CHILD = textwrap.dedent("""
    import json, sys, time
    import pyarrow as pa, pyarrow.parquet as pq
    from sediment.blob.file import FileBlobStore
    from sediment.metadata.memory import MemoryMetadataStore
    from sediment.trace.raw import raw_run
    from sediment.trace.state import BatchRef
    from sediment.trace.store import TraceStore, describe
    root, ref, bound, side = sys.argv[1], BatchRef(**json.loads(sys.argv[2])), int(sys.argv[3]), sys.argv[4]
    schema = pa.schema([("k", pa.int64()), ("v", pa.string()), ("time", pa.int64()), ("diff", pa.int64())])
    store = TraceStore(MemoryMetadataStore(), FileBlobStore(root))
    store.set_schema(1, schema)
    store.memory_bound = bound
    pool = pa.default_memory_pool()
    t = time.perf_counter()
    if side == "whole":
        rows = raw_run(pq.read_table(store.blobs.local_path(ref.key)), describe(1, ref), schema).num_rows
    else:
        rows = sum(p.num_rows for p in store.read_stream(1, ref))
    print(json.dumps({"s": time.perf_counter() - t, "peak": pool.max_memory(), "rows": rows}))
""")


def make(root: str, rows: int, shuffled: bool, work: str) -> BatchRef:
    rng = random.Random(27)
    keys = [rng.randrange(rows // 2) for _ in range(rows)] if shuffled else list(range(rows))
    table = pa.table({"v": pa.array([f"{k:016x}" for k in keys]), "k": pa.array(keys, pa.int64())})
    desc = BatchDescription(1, 6, 7, 3, rows, format_version=RAW_VERSION, time=6, diff=1)
    path = os.path.join(work, "raw.parquet")
    pq.write_table(table.replace_schema_metadata(desc.to_metadata()), path, row_group_size=1 << 26,
                   compression="snappy")
    crc, footer_crc = file_checksums(path)
    blobs = FileBlobStore(root)
    key = batch_key(1, 6, 7, "shuffled" if shuffled else "ordered")
    blobs.put_file(key, path)
    return BatchRef(key, 6, 7, rows, os.path.getsize(blobs.local_path(key)), 0, 3, None, None, crc, footer_crc,
                    True, 6, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bound", type=int, default=256 << 20)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="sediment-bench-raw-read-")
    try:
        root = os.path.join(work, "blobs")
        print(f"a raw run of {args.rows} rows (v 16 B string, k int64) read consolidated; bound {args.bound >> 20} MiB; "
              f"{args.rounds} rounds interleaved; load before: {os.getloadavg()}")
        for shape in ("ordered", "shuffled"):
            ref = make(root, args.rows, shape == "shuffled", work)
            res: dict[str, list[dict]] = {"whole": [], "bounded": []}
            for _ in range(args.rounds):
                for side in res:
                    got = subprocess.run([sys.executable, "-c", CHILD, root, json.dumps(ref.to_json()), str(args.bound),
                                          side], capture_output=True, text=True, check=True, cwd=work)
                    res[side].append(json.loads(got.stdout))
            assert len({r["rows"] for rs in res.values() for r in rs}) == 1, "the two routes disagree"
            print(f"  {shape}, {ref.bytes / 1e6:.0f} MB file:")
            for side, rs in res.items():
                s = [r["s"] for r in rs]
                peak = [r["peak"] / 1e6 for r in rs]
                print(f"    {side:8s} {statistics.median(s):.2f} s ({min(s):.2f}-{max(s):.2f}), peak "
                      f"{statistics.median(peak):.0f} MB")
            ratio = statistics.median(r["s"] for r in res["bounded"]) / statistics.median(r["s"] for r in res["whole"])
            print(f"    bounded / whole: {ratio:.2f}x the time")
        print(f"  load after: {os.getloadavg()}")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
