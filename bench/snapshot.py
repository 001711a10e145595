"""Snapshot of a fully compacted relation, beside ``pq.read_table`` of the same batch files.

Why: issue 15 asks for a snapshot of a relation with nothing left to consolidate at
>= 0.85x of a plain ``pq.read_table`` of its batch files, and for snapshot time to grow
at most 4.5x from 4M to 16M rows. The machine is shared and noisy, so the peer runs in
the same process on the same files, rounds interleaved (ours, peer, ours, peer, ...),
and each figure is the median of the rounds with the min-max beside it.

Layouts: ``one`` (one step), ``tiered`` (``--steps`` steps, ``engine.compact()`` after
each: since session 5 ``compact()`` merges a relation with no history left into one batch,
so this ends in one batch too), ``background`` (the same steps, each compacted as the
background compacter does: a pass, then the size-tiered merges only; the batches a snapshot
has to merge until the relation has been quiet for ``major_compaction_quiet`` seconds) and
``quiet`` (the same, then the engine's clock moved past that quiet time and one more
background pass: its major compaction leaves one batch).

Set-up per size: an engine (``compact=False``: compaction is driven here by
``engine.compact()``, so its work is outside the timed reads) gets N rows of
``k int64, v binary(16)`` plus ``time``/``diff`` in steps; each step appends, seals,
advances ``since`` to the sealed time and compacts, then compaction is repeated until
the trace stops changing. Every batch then holds one time (nothing left to consolidate)
and there is no WAL tail. Two layouts: ``one`` (one step: one batch, the relation
compacted into a single run) and ``tiered`` (``--steps`` steps: the planner's
size-tiered batches, which a snapshot has to merge).

Cases, alternated in each round:

* ``snapshot``: ``engine.snapshot("r", sealed)``;
* ``read_table``: ``pq.read_table`` of each batch file (pyarrow defaults, threaded),
  concatenated -- the peer: the least any reader of those files does.

    .venv/bin/python bench/snapshot.py            # 4M and 16M rows, 5 rounds
    .venv/bin/python bench/snapshot.py --quick    # 1M and 4M rows, 3 rounds
    .venv/bin/python bench/snapshot.py --quick --build /tmp/before   # another checkout (A/B, alternate runs)

Temp directories go under ``--dir`` (default /tmp) and are removed afterwards.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if "--build" in sys.argv[:-1]:  # before sediment is imported: another checkout, for A/B runs
    from small_writes_cpu import use_build

    use_build(sys.argv[sys.argv.index("--build") + 1])

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from compact import SCHEMA, make_updates  # noqa: E402

import sediment  # noqa: E402
from sediment.clock import ManualClock  # noqa: E402
from sediment.engine.compaction import DEFAULT_MAJOR_COMPACTION_QUIET  # noqa: E402


def build(root: str, rows: int, steps: int, times: int, background: bool = False,
          quiet: bool = False) -> tuple[str, object, int]:
    d = tempfile.mkdtemp(prefix="sed-snapshot-", dir=root)
    clock = ManualClock()
    engine = sediment.open(d, compact=False, segment_bytes=1 << 30, clock=clock)
    engine.add_relation("r", SCHEMA)
    per_t = max(1, times // steps)
    for s in range(steps):
        table = make_updates(rows // steps, per_t, seed_keys=rows, t0=s * per_t)
        for piece in table.to_batches(max_chunksize=200_000):
            engine.append("r", pa.Table.from_batches([piece]))
        sealed = (s + 1) * per_t - 1
        engine.seal("r", sealed)
        engine.set_since("r", sealed)
        compact(engine, background)
    before = None
    while before != engine.trace_info("r"):
        before = engine.trace_info("r")
        compact(engine, background)
    if quiet:  # the relation stays quiet: the background's major compaction (engine/scheduler.py)
        clock.advance(DEFAULT_MAJOR_COMPACTION_QUIET)
        compact(engine, background)
    return d, engine, steps * per_t - 1


def compact(engine, background: bool) -> None:
    if background:  # what the background compacter leaves: a pass, then size-tiered merges only
        engine.wal.finish_segment()
        engine.compaction.run_pass(None)
    else:
        engine.compact()


def batch_files(d: str) -> list[str]:
    return sorted(glob.glob(os.path.join(d, "blobs", "trace", "**", "*.parquet"), recursive=True))


def timed(fn) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds of this process (all threads; steadier than wall time
    when other jobs share the cores), rows."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - t0, time.process_time() - c0, out.num_rows


def run_size(root: str, rows: int, steps: int, times: int, rounds: int, background: bool = False,
             quiet: bool = False) -> dict:
    d, engine, sealed = build(root, rows, steps, times, background, quiet)
    try:
        files = batch_files(d)
        info = engine.trace_info("r")
        cases = {
            "snapshot": lambda: engine.snapshot("r", sealed),
            "read_table": lambda: pa.concat_tables([pq.read_table(f) for f in files]),
        }
        got: dict[str, list[float]] = {name: [] for name in cases}
        cpu: dict[str, list[float]] = {name: [] for name in cases}
        out_rows: dict[str, int] = {}
        for fn in cases.values():  # warm the page cache and the code paths once
            fn()
        for r in range(rounds):
            order = list(cases) if r % 2 == 0 else list(reversed(cases))
            for name in order:
                secs, used, n = timed(cases[name])
                got[name].append(secs)
                cpu[name].append(used)
                out_rows[name] = n
        before = engine.read_stats.batches_as_is
        engine.snapshot("r", sealed)
        as_is = engine.read_stats.batches_as_is - before
        return {"rows_appended": rows, "stored_rows": info["rows"], "batches": info["batches"],
                "tail_records": info["tail_records"], "bytes": info["bytes"], "batches_read_as_is": as_is,
                "out_rows": out_rows, "seconds": got, "cpu_seconds": cpu}
    finally:
        engine.close()
        shutil.rmtree(d, ignore_errors=True)


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} s ({min(xs):.3f}-{max(xs):.3f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1M and 4M rows, 3 rounds")
    ap.add_argument("--sizes", type=int, nargs="+", help="rows per size (default 4M 16M)")
    ap.add_argument("--steps", type=int, default=4, help="append+seal+compact steps of the tiered layout")
    ap.add_argument("--layouts", nargs="+", default=["one", "tiered", "background", "quiet"],
                    choices=["one", "tiered", "background", "quiet"])
    ap.add_argument("--times", type=int, default=400)
    ap.add_argument("--rounds", type=int, help="default 5 (quick 3); at least 3")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--json")
    ap.add_argument("--build", help="a checkout of the repository to run instead of this one (read before "
                    "sediment is imported, for A/B runs)")
    args = ap.parse_args()
    sizes = args.sizes or ([1_000_000, 4_000_000] if args.quick else [4_000_000, 16_000_000])
    rounds = max(3, args.rounds or (3 if args.quick else 5))
    print(f"machine: {os.cpu_count()} cores, Python {platform.python_version()}, pyarrow {pa.__version__}, "
          f"load average {os.getloadavg()[0]:.1f}; {rounds} rounds, interleaved")
    results = []
    for layout in args.layouts:
        steps = 1 if layout == "one" else args.steps
        done = []
        for rows in sizes:
            res = run_size(args.dir, rows, steps, args.times, rounds, background=layout in ("background", "quiet"),
                           quiet=layout == "quiet")
            res["layout"] = layout
            done.append(res)
            s, p = res["seconds"]["snapshot"], res["seconds"]["read_table"]
            cs, cp = res["cpu_seconds"]["snapshot"], res["cpu_seconds"]["read_table"]
            ratio = statistics.median(p) / statistics.median(s)
            res["ratio"] = ratio
            res["cpu_ratio"] = statistics.median(cp) / statistics.median(cs)
            print(f"[{layout}] {rows:>11,} rows appended, {res['stored_rows']:,} stored in {res['batches']} "
                  f"batch(es) ({res['batches_read_as_is']} read as stored), tail {res['tail_records']} records")
            print(f"    snapshot    {med(s)}  cpu {med(cs)}  {res['out_rows']['snapshot']:,} rows")
            print(f"    read_table  {med(p)}  cpu {med(cp)}  {res['out_rows']['read_table']:,} rows")
            print(f"    ratio (read_table / snapshot, medians) {ratio:.2f}x wall, {res['cpu_ratio']:.2f}x cpu "
                  "(target >= 0.85x)")
        if len(done) >= 2:
            a, b = done[0], done[-1]
            grow = statistics.median(b["seconds"]["snapshot"]) / statistics.median(a["seconds"]["snapshot"])
            peer = statistics.median(b["seconds"]["read_table"]) / statistics.median(a["seconds"]["read_table"])
            cgrow = statistics.median(b["cpu_seconds"]["snapshot"]) / statistics.median(a["cpu_seconds"]["snapshot"])
            print(f"[{layout}] growth {a['rows_appended']:,} -> {b['rows_appended']:,} rows: snapshot {grow:.2f}x "
                  f"wall, {cgrow:.2f}x cpu (target <= 4.5x); read_table {peer:.2f}x wall")
        results += done
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
