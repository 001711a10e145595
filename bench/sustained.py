"""Sustained ingest: the rate one writer keeps up while compaction keeps the WAL bounded.

Why: a writer's rate with compaction off is a burst the disk fills; the figure users plan with
is the rate with compaction on, over a minute or more, with the WAL backlog bounded. One
writer appends 1 KiB rows (bench/compact_stream.py's rows: int64 id, 1000-byte payload) in
10,000-row appends, durable on return, never sealed, for ``--seconds``, to an engine with the
background compacter on (the default, ``max_wal_backlog`` 1 GiB) and one with it off (no
bound: nothing leaves the WAL). ``--keys fresh`` gives every append new ids (nothing
consolidates: every byte is compacted and its pending runs merged while the stream goes on);
``--keys repeated`` appends the same table again and again (consolidation collapses it).

Reported per case: rows/s, the largest backlog seen after any append (``Engine.stats()``), the
CPU seconds of the whole process, of the background scheduler's compaction passes and merges
(``Engine.scheduler.cpu_seconds``: the CPU time of the thread each step runs in) and of the WAL
writer's thread (from ``/proc/self/task``); Arrow's own pool threads and the k-way merge's
helper threads are in the process figure only) per MB appended: what compaction costs per byte. Cases of one round run
back to back in an order that rotates per round; ratios are taken within a round; medians
with min-max.

    .venv/bin/python bench/sustained.py                  # 60 s per case, 3 rounds, fresh and repeated keys
    .venv/bin/python bench/sustained.py --quick          # 10 s per case
    .venv/bin/python bench/sustained.py --keys fresh --rounds 2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from compact_stream import one_kib_rows  # noqa: E402

import sediment  # noqa: E402

ROW_BYTES = 1024
TICKS = os.sysconf("SC_CLK_TCK")


def thread_cpu(eng) -> dict[str, float]:
    """CPU seconds of the scheduler's passes and merges (the scheduler counts them: trio runs
    both in the same reused worker threads) and of the WAL writer's thread, found by its name
    (``wal-writer-P``, ``s3-wal-writer-P``)."""
    out = {"wal-writer": 0.0}
    if eng.scheduler is not None:
        out.update({f"compaction-{k}": v for k, v in eng.scheduler.cpu_seconds.items()})
    for t in threading.enumerate():
        if "wal-writer" not in t.name:
            continue
        try:
            with open(f"/proc/self/task/{t.native_id}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out["wal-writer"] += (int(fields[11]) + int(fields[12])) / TICKS
    return out


def run_case(root: str, compact: bool, keys: str, seconds: float) -> dict:
    d = tempfile.mkdtemp(prefix="sed-sustained-", dir=root)
    try:
        eng = sediment.open(d, compact=compact, **({} if compact else {"max_wal_backlog": None}))
        eng.add_relation("r", pa.schema([("id", pa.int64()), ("payload", pa.binary())]))
        table = one_kib_rows(10_000, 0)
        n, peak = 0, 0
        before = thread_cpu(eng)
        c0, t0 = time.process_time(), time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            if keys == "fresh":
                table = table.set_column(0, "id", pa.array(range(n, n + table.num_rows), pa.int64()))
            eng.append("r", table)
            n += table.num_rows
            peak = max(peak, eng.stats()["wal"]["backlog_bytes"])
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        threads = {k: v - before.get(k, 0.0) for k, v in thread_cpu(eng).items()}
        eng.close()
        mb = n * ROW_BYTES / 1e6
        return {"rows_per_s": n / elapsed, "max_backlog_mib": peak / (1 << 20), "cpu_ms_per_mb": 1e3 * cpu / mb,
                "thread_cpu_ms_per_mb": {k: round(1e3 * v / mb, 3) for k, v in sorted(threads.items()) if v}}
    finally:
        shutil.rmtree(d, ignore_errors=True)


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keys", choices=["fresh", "repeated", "both"], default="both")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    seconds = 10.0 if args.quick else args.seconds
    kinds = ["fresh", "repeated"] if args.keys == "both" else [args.keys]
    cases = [(k, on) for k in kinds for on in (True, False)]
    res: dict[str, list[dict]] = {f"{k}, compaction {'on' if on else 'off'}": [] for k, on in cases}
    for r in range(args.rounds):
        order = cases[r % len(cases):] + cases[:r % len(cases)]
        for k, on in order:
            got = run_case(args.dir, on, k, seconds)
            res[f"{k}, compaction {'on' if on else 'off'}"].append(got)
            print(f"round {r + 1} {k:8} compaction {'on ' if on else 'off'}: {got['rows_per_s'] / 1e3:.0f}k rows/s, "
                  f"max backlog {got['max_backlog_mib']:.0f} MiB, {got['cpu_ms_per_mb']:.2f} ms CPU/MB "
                  f"{got['thread_cpu_ms_per_mb']}", flush=True)
    load = os.getloadavg()[0]
    print(f"sustained ingest, 1 KiB rows in 10k-row appends, {seconds:.0f} s per case, {args.rounds} rounds "
          f"(load average at the end {load:.1f}; the machine is shared)")
    for k in kinds:
        on, off = res[f"{k}, compaction on"], res[f"{k}, compaction off"]
        ratios = [a["rows_per_s"] / b["rows_per_s"] for a, b in zip(on, off, strict=True)]
        print(f"  {k} keys: on {med([x['rows_per_s'] / 1e3 for x in on])}k rows/s, off "
              f"{med([x['rows_per_s'] / 1e3 for x in off])}k rows/s; on/off {med(ratios)} (target >= 0.8); "
              f"max backlog {max(x['max_backlog_mib'] for x in on):.0f} MiB (bound 1024); "
              f"CPU ms/MB on {med([x['cpu_ms_per_mb'] for x in on])}, off {med([x['cpu_ms_per_mb'] for x in off])}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seconds": seconds, "load_at_end": load, "cases": res}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
