"""Replay and snapshot throughput of a compacted relation, beside pyarrow reading the same files.

Why: the targets are relative (the time-ordered ``Engine.replay`` >= 0.5x of a plain
``pq.read_table`` of the relation's batch files, issue 27; ``ordered=False`` >= 0.6x), and this machine is shared and noisy, so the peer is measured
in the same run, on the same files, in alternating rounds; each figure is the median of
its rounds, with the min-max beside it.

Set-up: an engine (``compact=False``; compaction driven by ``engine.compact()``) gets
N rows of ``k int64, v binary (16 B)`` plus ``time`` and ``diff`` in ``--steps`` steps;
each step appends its rows (times in its own slice of ``--times`` timestamps, ~10%
repeated (k, v, time) with diff +-1), seals, and compacts, so the relation ends as a
few size-tiered, merged batches and an empty WAL tail. ``since`` stays 0, so the batches
keep every time and replay has real time-ordering work.

Cases, all run in each round, in an order shuffled per round (seeded by the round's
number): a case that follows the read + sort below takes the page faults of the memory it
freed (the time-ordered replay 25k minor faults against 9k, 12% more CPU here), so no case
may always follow it:

* ``replay``: iterate ``engine.replay("r")`` to the end (time-ordered record batches);
* ``replay ordered=False``: the same with ``ordered=False`` (batches as stored, row groups
  streamed, then the WAL tail);
* ``snapshot``: ``engine.snapshot("r", sealed)`` (consolidated as of the last time);
* ``pq.read_table``: each batch file under ``<data-dir>/blobs/trace/...`` read whole
  (pyarrow defaults: threaded), concatenated: the peer;
* ``pq.read_table``, ``use_threads=False``, and ``ParquetFile.read_row_group`` one group
  at a time with page-checksum verification (what the engine's reader asks for), and
  ``pq.read_table`` + ``sort_by(time)`` (the least a time-ordered replay of key-sorted
  batches must do), for reference.

    .venv/bin/python bench/replay.py            # about 1 min: 10M rows, 5 rounds
    .venv/bin/python bench/replay.py --quick    # about 10-20 s: 3M rows, 5 rounds
    .venv/bin/python bench/replay.py --profile  # also cProfile one replay and one snapshot

A/B against another build (``git archive`` of a commit, unpacked), runs alternated:

    for i in 1 2 3; do .venv/bin/python bench/replay.py --rounds 3 --build /tmp/before; .venv/bin/python bench/replay.py --rounds 3; done

Temp directories go under ``--dir`` (default /tmp) and are removed afterwards.
"""

from __future__ import annotations

import argparse
import cProfile
import glob
import io
import json
import os
import platform
import pstats
import random
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
from compact import SCHEMA, fmt_rate, make_updates, status  # noqa: E402

import sediment  # noqa: E402

MiB = 1 << 20


def build(root: str, rows: int, times: int, steps: int) -> tuple[str, object, int]:
    d = tempfile.mkdtemp(prefix="sed-replay-", dir=root)
    engine = sediment.open(d, compact=False, segment_bytes=1 << 30)
    engine.add_relation("r", SCHEMA)
    per_t = max(1, times // steps)
    for s in range(steps):
        table = make_updates(rows // steps, per_t, seed_keys=rows, t0=s * per_t)
        for piece in table.to_batches(max_chunksize=100_000):
            engine.append("r", pa.Table.from_batches([piece]))
        engine.seal("r", (s + 1) * per_t - 1)
        engine.compact()
    return d, engine, steps * per_t - 1


def batch_files(d: str) -> list[str]:
    return sorted(glob.glob(os.path.join(d, "blobs", "trace", "**", "*.parquet"), recursive=True))


def run_replay(engine, ordered: bool = True) -> tuple[float, int]:
    t0 = time.perf_counter()
    n = 0
    for b in engine.replay("r", ordered=ordered):
        n += b.num_rows
    return time.perf_counter() - t0, n


def run_snapshot(engine, as_of: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    t = engine.snapshot("r", as_of)
    return time.perf_counter() - t0, t.num_rows


def run_plain(files: list[str], **kw) -> tuple[float, int]:
    t0 = time.perf_counter()
    t = pa.concat_tables([pq.read_table(f, **kw) for f in files])
    return time.perf_counter() - t0, t.num_rows


def run_plain_sorted(files: list[str]) -> tuple[float, int]:
    """What any time-ordered replay of key-sorted batches must at least do: read, then sort by time."""
    t0 = time.perf_counter()
    t = pa.concat_tables([pq.read_table(f, use_threads=False) for f in files]).sort_by([("time", "ascending")])
    return time.perf_counter() - t0, t.num_rows


def run_groups(files: list[str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    n = 0
    for f in files:
        pf = pq.ParquetFile(f, page_checksum_verification=True)
        for i in range(pf.num_row_groups):
            n += pf.read_row_group(i).num_rows
    return time.perf_counter() - t0, n




def profile(fn, n: int = 24) -> str:
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(n)
    s2 = io.StringIO()
    pstats.Stats(prof, stream=s2).sort_stats("tottime").print_stats(14)
    return s.getvalue() + "\n--- by tottime ---\n" + s2.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rows", type=int, help="default 10M, quick 3M")
    ap.add_argument("--times", type=int, default=300)
    ap.add_argument("--steps", type=int, default=4, help="append+seal+compact steps")
    ap.add_argument("--rounds", type=int, help="default 5")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--build", help="a checkout of the repository to run instead of this one (read before "
                    "sediment is imported, for A/B runs)")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--json")
    args = ap.parse_args()
    args.rows = args.rows or (3_000_000 if args.quick else 10_000_000)
    args.rounds = args.rounds or 5
    print(f"machine: {os.cpu_count()} cores, Python {platform.python_version()}, pyarrow {pa.__version__}, "
          f"load average {os.getloadavg()[0]:.1f}; dir {args.dir}")
    t_start = time.perf_counter()
    d, engine, sealed = build(args.dir, args.rows, args.times, args.steps)
    try:
        info = engine.trace_info("r")
        files = batch_files(d)
        stored_rows = info["rows"]
        print(f"relation: {stored_rows:,} stored rows in {info['batches']} batches ({len(files)} files, "
              f"{info['bytes'] / 1e6:.0f} MB), tail records {info['tail_records']}, sealed {sealed}, since {info['since']}; "
              f"built in {time.perf_counter() - t_start:.1f} s", flush=True)
        cases = {
            "replay": lambda: run_replay(engine),
            "replay ordered=False": lambda: run_replay(engine, ordered=False),
            "snapshot": lambda: run_snapshot(engine, sealed),
            "pq.read_table": lambda: run_plain(files),
            "pq.read_table use_threads=False": lambda: run_plain(files, use_threads=False),
            "read_row_group + checksums": lambda: run_groups(files),
            "pq.read_table + sort_by(time) (kernel for time order)": lambda: run_plain_sorted(files),
        }
        results: dict[str, list[tuple[float, int]]] = {n: [] for n in cases}
        cpu: dict[str, list[float]] = {n: [] for n in cases}  # process CPU seconds: less sensitive to load than wall time
        for r in range(args.rounds):
            order = list(cases.items())
            random.Random(r).shuffle(order)  # a case run after the read + sort pays its page faults: vary who follows it
            for name, fn in order:
                c0 = time.process_time()
                results[name].append(fn())
                cpu[name].append(time.process_time() - c0)
            print("  round " + str(r + 1) + ": " + ", ".join(
                f"{n} {results[n][-1][0]:.2f} s" for n, _ in order), flush=True)
        best = {n: (statistics.median(s for s, _ in v), v[0][1]) for n, v in results.items()}  # medians
        spread = {n: (min(s for s, _ in v), max(s for s, _ in v)) for n, v in results.items()}
        # the peer: the faster of the two plain reads (threaded reads lose on a loaded 2-core machine)
        peer_name = min(("pq.read_table", "pq.read_table use_threads=False"), key=lambda n: best[n][0])
        peer = best[peer_name][0]
        print(f"\npeer: {peer_name}; medians over {args.rounds} rounds (min-max)")
        peer_cpu = statistics.median(cpu[peer_name])
        print("\n| case | seconds | rows | rows/s (stored rows / s) | ratio to peer | CPU s | CPU ratio to peer |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for n, (s, rows) in best.items():
            lo, hi = spread[n]
            c = statistics.median(cpu[n])
            print(f"| {n} | {s:.3f} ({lo:.3f}-{hi:.3f}) | {rows:,} | {fmt_rate(stored_rows / s)} | {peer / s:.2f}x "
                  f"| {c:.3f} ({min(cpu[n]):.3f}-{max(cpu[n]):.3f}) | {peer_cpu / c:.2f}x |")
        rep = peer / best["replay"][0]
        print("\n| target | ours | peer | ratio | need | status |")
        print("| --- | ---: | ---: | ---: | ---: | --- |")
        print(f"| replay (time order) rows/s >= 0.5x of plain pq.read_table | {fmt_rate(stored_rows / best['replay'][0])} | "
              f"{fmt_rate(stored_rows / peer)} | {rep:.2f}x | 0.50x | {status(rep >= 0.5)} |")
        unordered = peer / best["replay ordered=False"][0]
        print(f"| replay ordered=False (as stored) >= 60% of plain pq.read_table | "
              f"{fmt_rate(stored_rows / best['replay ordered=False'][0])} | {fmt_rate(stored_rows / peer)} | "
              f"{unordered:.2f}x | 0.60x | {status(unordered >= 0.6)} |")
        snap = peer / best["snapshot"][0]
        print(f"| (snapshot, no target) | {fmt_rate(stored_rows / best['snapshot'][0])} | {fmt_rate(stored_rows / peer)} | "
              f"{snap:.2f}x | - | - |")
        profs = {}
        if args.profile:
            profs["replay"] = profile(lambda: run_replay(engine))
            profs["snapshot"] = profile(lambda: run_snapshot(engine, sealed))
            for n, p in profs.items():
                print(f"\ncProfile of one {n}:\n{p}")
        print(f"\ntotal {time.perf_counter() - t_start:.0f} s; load average {os.getloadavg()[0]:.1f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), "info": info, "results": results, "cpu": cpu, "profiles": profs}, f, indent=1)
    finally:
        engine.close()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
