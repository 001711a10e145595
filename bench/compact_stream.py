"""Compaction over a stream (part C of bench/compact.py): unsealed vs sealed, and appends with
compaction on vs off. Both halves of each comparison run in the same process, rounds interleaved
(the order alternates per round), so drift on this shared machine hits both alike; figures are
medians over the rounds with min-max.

C1, stream: ``--steps`` steps of ``--step-rows`` rows (bench/compact.py's rows: int64 k, 16-byte v,
~10% repeats with diff +-1), step i's times in ``[100 i, 100 i + 100)``, ``engine.compact()`` after
each step, timed per pass. "sealed" seals each step before its pass (the peer: every pass turns the
step into a batch and merges); "unsealed" never seals during the stream (every pass keeps the step
as a pending run), then seals once and runs one more pass (the fold, reported apart and in the
total). Before pending runs, each unsealed pass re-read and re-sorted everything pending: issue 15
measured 42 s against 21 s, the 12th pass 7.3 s against 0.45 s. The engines are opened with
``compact=False`` so that only the timed, explicit passes run (the pass is what is measured).

C2, appends: one writer appending ``--append-batch`` rows of 1 KiB (1000-byte payload, all at time
1 as in bench/append.py, never sealed) for ``--append-seconds``, durable on return, to an engine
with the background compacter on (the default) and one with it off; rows/s of each.

    .venv/bin/python bench/compact_stream.py                # 3 rounds, 12 x 1M rows; 3 x 20 s appends
    .venv/bin/python bench/compact_stream.py --quick        # 3 rounds, 12 x 200k rows; 3 x 6 s appends
    .venv/bin/python bench/compact_stream.py --only stream --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from compact import SCHEMA, make_updates  # noqa: E402

import sediment  # noqa: E402


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def run_stream(root: str, steps: list[pa.Table], sealed: bool) -> dict:
    d = tempfile.mkdtemp(prefix="sed-stream-", dir=root)
    try:
        eng = sediment.open(d, compact=False, segment_bytes=4 << 30)
        eng.add_relation("r", SCHEMA)
        passes = []
        for i, table in enumerate(steps):
            for piece in table.to_batches(max_chunksize=100_000):
                eng.append("r", pa.Table.from_batches([piece]))
            if sealed:
                eng.seal("r", 100 * i + 99)
            t0 = time.perf_counter()
            eng.compact()
            passes.append(time.perf_counter() - t0)
        fold = 0.0
        if not sealed:
            eng.seal("r", 100 * len(steps) - 1)
            t0 = time.perf_counter()
            eng.compact()
            fold = time.perf_counter() - t0
        trace = eng.view.relations["r"].trace
        out = {"passes": passes, "fold": fold, "total": sum(passes) + fold, "batches": len(trace.batches),
               "pending": len(trace.pending)}
        eng.close()
        return out
    finally:
        shutil.rmtree(d, ignore_errors=True)


def part_stream(args) -> dict:
    print(f"== C1: {args.steps} steps x {args.step_rows:,} rows, compact() after each; {args.rounds} rounds, "
          "unsealed / sealed interleaved ==", flush=True)
    steps = [make_updates(args.step_rows, 100, t0=100 * i) for i in range(args.steps)]
    rounds = []
    for r in range(args.rounds):
        got = {}
        for mode in (("unsealed", "sealed") if r % 2 == 0 else ("sealed", "unsealed")):
            got[mode] = run_stream(args.dir, steps, mode == "sealed")
        rounds.append(got)
        print(f"round {r + 1}: unsealed {sum(got['unsealed']['passes']):.2f} s + fold {got['unsealed']['fold']:.2f} s"
              f" = {got['unsealed']['total']:.2f} s; sealed {got['sealed']['total']:.2f} s; "
              f"last pass {got['unsealed']['passes'][-1]:.2f} vs {got['sealed']['passes'][-1]:.2f} s", flush=True)
    uns = [x["unsealed"] for x in rounds]
    sea = [x["sealed"] for x in rounds]
    ratio_passes = [sum(u["passes"]) / s["total"] for u, s in zip(uns, sea, strict=True)]
    ratio_total = [u["total"] / s["total"] for u, s in zip(uns, sea, strict=True)]
    print("\npass | unsealed s | sealed s   (median (min-max) over rounds)")
    for i in range(args.steps):
        print(f"{i + 1:4d} | {med([u['passes'][i] for u in uns])} | {med([s['passes'][i] for s in sea])}")
    print(f"fold (unsealed: seal all, one pass) | {med([u['fold'] for u in uns])}")
    print(f"total of the {args.steps} passes: unsealed {med([sum(u['passes']) for u in uns])} s, sealed "
          f"{med([s['total'] for s in sea])} s; ratio {med(ratio_passes)}; with the fold {med(ratio_total)} "
          f"(target <= 1.3)")
    return {"rounds": rounds, "ratio_passes": ratio_passes, "ratio_with_fold": ratio_total}


def one_kib_rows(n: int, start: int) -> pa.Table:
    payload = pa.array([b"p" * 1000] * n, pa.binary())
    return pa.table({"id": pa.array(range(start, start + n), pa.int64()), "payload": payload,
                     "time": pa.array([1] * n, pa.int64()), "diff": pa.array([1] * n, pa.int64())})


def run_appends(root: str, compact: bool, batch: int, seconds: float) -> dict:
    d = tempfile.mkdtemp(prefix="sed-append-", dir=root)
    try:
        eng = sediment.open(d, compact=compact)
        eng.add_relation("r", pa.schema([("id", pa.int64()), ("payload", pa.binary())]))
        table = one_kib_rows(batch, 0)
        n = 0
        t0 = time.perf_counter()
        c0 = time.process_time()
        while time.perf_counter() - t0 < seconds:
            eng.append("r", table)
            n += batch
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - c0
        passes = eng.scheduler.passes if eng.scheduler is not None else 0
        backlog = eng.stats()["wal"]["backlog_bytes"]
        eng.close()
        return {"rows_per_s": n / elapsed, "cpu_s": cpu, "elapsed_s": elapsed, "passes": passes,
                "backlog_bytes_at_end": backlog}
    finally:
        shutil.rmtree(d, ignore_errors=True)


def part_appends(args) -> dict:
    print(f"\n== C2: durable appends of {args.append_batch:,} x 1 KiB rows, {args.append_seconds:g} s each, "
          f"compaction on / off interleaved, {args.rounds} rounds ==", flush=True)
    rounds = []
    for r in range(args.rounds):
        got = {}
        for mode in (("on", "off") if r % 2 == 0 else ("off", "on")):
            got[mode] = run_appends(args.dir, mode == "on", args.append_batch, args.append_seconds)
        rounds.append(got)
        print(f"round {r + 1}: on {got['on']['rows_per_s'] / 1e3:.0f}k rows/s ({got['on']['passes']} passes), "
              f"off {got['off']['rows_per_s'] / 1e3:.0f}k rows/s; ratio "
              f"{got['on']['rows_per_s'] / got['off']['rows_per_s']:.2f}", flush=True)
    ratios = [x["on"]["rows_per_s"] / x["off"]["rows_per_s"] for x in rounds]
    print(f"on {med([x['on']['rows_per_s'] / 1e3 for x in rounds])}k rows/s, off "
          f"{med([x['off']['rows_per_s'] / 1e3 for x in rounds])}k rows/s; on/off {med(ratios)} (target >= 0.9)")
    return {"rounds": rounds, "ratios": ratios}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--step-rows", type=int)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--append-batch", type=int, default=10_000)
    ap.add_argument("--append-seconds", type=float)
    ap.add_argument("--only", choices=["stream", "appends"])
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--json")
    args = ap.parse_args()
    args.step_rows = args.step_rows or (200_000 if args.quick else 1_000_000)
    args.append_seconds = args.append_seconds or (6.0 if args.quick else 20.0)
    out = {"args": vars(args)}
    if args.only in (None, "stream"):
        out["stream"] = part_stream(args)
    if args.only in (None, "appends"):
        out["appends"] = part_appends(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
