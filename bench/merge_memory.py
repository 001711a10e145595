"""A merge's memory against its bound when the stored batches have large row groups.

Three batches of incompressible rows (``--rows``, a third and a ninth of it; ``--width``
bytes each: one 64K-row group is then ``64K x width``) are written once; each round merges
them in a fresh process (the pool's peak is then the merge's) with ``--bound``, once with
this checkout's ``trace/`` and, with ``--base DIR``, once with ``DIR/trace`` (a checkout of
the build before), interleaved A B A B. Prints per build the median and min-max of the
Arrow pool's peak, the child's peak RSS, CPU seconds and wall seconds, and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

import pyarrow as pa

import sediment
from sediment.clock import ManualClock

CHILD = textwrap.dedent("""
    import importlib.util, json, os, resource, sys, time
    base = sys.argv[3]
    if base:  # the build before: its trace/ package in place of this checkout's
        spec = importlib.util.spec_from_file_location("sediment.trace", os.path.join(base, "trace", "__init__.py"),
                                                      submodule_search_locations=[os.path.join(base, "trace")])
        mod = importlib.util.module_from_spec(spec)
        sys.modules["sediment.trace"] = mod
        spec.loader.exec_module(mod)
    import pyarrow as pa
    import sediment
    eng = sediment.open(sys.argv[1], compact=False, memory_bound=int(sys.argv[2]))
    rel = eng.view.relations["r"]
    refs = list(rel.trace.batches)
    cpu, wall = time.process_time(), time.perf_counter()
    merged = eng.traces.merge(rel.entry.id, refs, rel.keys, rel.update_schema, 0, 1,
                              chunk_rows=eng.compaction._chunk_rows(refs))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    hwm = [int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM")][0]
    eng.traces.delete([merged.key])
    print(json.dumps({"pool_mib": pa.default_memory_pool().max_memory() / 2**20, "rss_mib": hwm / 1024,
                      "cpu_s": cpu, "wall_s": wall, "rows": merged.rows}))
    eng.close()
""")


def fill(data_dir: str, rows: int, width: int) -> None:
    with sediment.open(data_dir, clock=ManualClock(), compact_interval=None, segment_bytes=256 << 20,
                       major_compaction_quiet=None) as eng:
        eng.add_relation("r", pa.schema([("k", pa.int64()), ("p", pa.binary())]))
        for b, n in enumerate([rows, rows // 3, rows // 9]):
            ks = list(range(b, 4 * n, 4))
            eng.append("r", pa.table({"k": pa.array(ks, pa.int64()), "p": [os.urandom(width) for _ in ks],
                                      "time": [b + 1] * n, "diff": [1] * n}))
            eng.seal("r", b + 1)
            eng.compact()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=60_000)
    ap.add_argument("--width", type=int, default=1000)
    ap.add_argument("--bound", type=int, default=16 << 20, help="memory_bound in bytes")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--base", help="a checkout of the build before (its trace/ is used for B)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = os.path.join(tmp, "d")
        fill(data_dir, args.rows, args.width)
        builds = {"this": ""} | ({"base": os.path.abspath(args.base)} if args.base else {})
        got: dict[str, list[dict]] = {b: [] for b in builds}
        for _ in range(args.rounds):
            for name, base in builds.items():
                out = subprocess.run([sys.executable, "-c", CHILD, data_dir, str(args.bound), base],
                                     capture_output=True, text=True, check=True, timeout=600)
                got[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
        load = open("/proc/loadavg").read().split()[:3]
        print(f"merge of {args.rows + args.rows // 3 + args.rows // 9} rows of {args.width} B, bound "
              f"{args.bound >> 20} MiB, {args.rounds} rounds interleaved, load {' '.join(load)}")
        for field in ("pool_mib", "rss_mib", "cpu_s", "wall_s"):
            cells = []
            for name in builds:
                vals = [r[field] for r in got[name]]
                cells.append(f"{name} {statistics.median(vals):.2f} [{min(vals):.2f}-{max(vals):.2f}]")
            print(f"  {field:9s} " + "   ".join(cells))


if __name__ == "__main__":
    main()
