"""Engine open with an uncompacted WAL, beside a sequential read of the same files, in one run.

Why: issue 15 asks that opening an engine whose log holds 1 GiB of uncompacted records
(10 KB and 1 MB records) take at most 1.5x the time of reading those files sequentially,
with a cold page cache. The peer (a plain read of every ``.seg`` file, 8 MiB at a time)
runs in the same interleaved rounds as the open, so drift on this shared machine hits both.

For each record size a data directory is filled once through ``Engine.append`` (records of
that size, with ``max_record_bytes``; compaction is off while filling and while opening,
so the log stays uncompacted: the thing measured is the open). Each round then measures,
in turn: the sequential read cold and the open cold (page cache of the data directory's
files dropped with ``posix_fadvise(DONTNEED)`` before each), then both hot (read once
before). Figures: median with min-max over the rounds, and the ratio open / read.

    .venv/bin/python bench/open.py              # 1 GiB per record size, 3 rounds
    .venv/bin/python bench/open.py --quick      # 128 MiB per record size, 3 rounds
    .venv/bin/python bench/open.py --json out.json --profile

Temp directories go under ``--dir`` (default /tmp, the work tree's file system) and are
removed afterwards.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import pyarrow as pa

import sediment

MiB = 1 << 20
SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.binary())])
ROW_PAYLOAD = 1000


def fill(root: str, total: int, record_bytes: int) -> str:
    """A data directory whose log holds about ``total`` bytes of UPDATES records of about
    ``record_bytes`` each (appends of 8 MiB, split into records by ``max_record_bytes``)."""
    d = tempfile.mkdtemp(prefix=f"sed-open-{record_bytes}-", dir=root)
    body = os.urandom(ROW_PAYLOAD)
    rows = (8 * MiB) // (ROW_PAYLOAD + 40)
    with sediment.open(d, compact=False, max_record_bytes=record_bytes) as engine:
        engine.add_relation("r", SCHEMA)
        written, t, first = 0, 1, 0
        while written < total:
            table = pa.table({"id": pa.array(range(first, first + rows), pa.int64()),
                              "payload": pa.array([body] * rows, pa.binary()),
                              "time": pa.array([t] * rows, pa.int64()),
                              "diff": pa.array([1] * rows, pa.int64())})
            engine.append("r", table)
            engine.seal("r", t)
            written += table.nbytes
            first += rows
            t += 1
    return d


def wal_files(d: str) -> list[str]:
    out = []
    for dirpath, _dirs, names in os.walk(os.path.join(d, "wal")):
        out += [os.path.join(dirpath, n) for n in sorted(names) if n.endswith(".seg")]
    return out


def all_files(d: str) -> list[str]:
    return [os.path.join(p, n) for p, _d, names in os.walk(d) for n in names]


def drop_cache(d: str) -> None:
    for path in all_files(d):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_files(d: str) -> tuple[float, int]:
    """Sequential read of every segment file, 8 MiB at a time, into one reused buffer."""
    buf = bytearray(8 * MiB)
    n = 0
    t0 = time.perf_counter()
    for path in wal_files(d):
        with open(path, "rb", buffering=0) as f:
            while k := f.readinto(buf):
                n += k
    return time.perf_counter() - t0, n


def open_engine(d: str, profile: cProfile.Profile | None = None) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (the whole process: the log's read-ahead thread too) and
    records of one open."""
    t0, c0 = time.perf_counter(), time.process_time()
    if profile is not None:
        profile.enable()
    engine = sediment.open(d, compact=False)
    if profile is not None:
        profile.disable()
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    try:
        records = engine.wal.report.records
    finally:
        engine.close()
    return elapsed, cpu, records


_CHILD = ("import sys, tempfile, time, sediment\n"
          "with tempfile.TemporaryDirectory() as scratch:\n"  # the imports a first open makes, not timed
          "    sediment.open(scratch, compact=False).close()\n"
          "t, c = time.perf_counter(), time.process_time()\n"
          "e = sediment.open(sys.argv[1], compact=False)\n"
          "print(time.perf_counter() - t, time.process_time() - c)\n"
          "e.close()\n")


def open_in(python: str, d: str) -> tuple[float, float]:
    """The open's wall and CPU seconds measured inside another interpreter (another build
    of sediment, e.g. the main branch's venv), so a before/after pair runs in the same
    interleaved rounds. The child opens a scratch engine first, so the modules an open
    imports on first use are loaded outside the timing, as they are in this process."""
    out = subprocess.run([python, "-c", _CHILD, d], capture_output=True, text=True, check=True, timeout=600,
                         cwd=tempfile.gettempdir())
    wall, cpu = out.stdout.strip().splitlines()[-1].split()
    return float(wall), float(cpu)


def med(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="128 MiB of log per record size instead of 1 GiB")
    ap.add_argument("--mib", type=int, help="MiB of log per record size (default 1024, or 128 with --quick)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--sizes", default="10000,1000000", help="record sizes in bytes, comma-separated")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where temp directories go (default /tmp)")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of one hot open per size")
    ap.add_argument("--compare", metavar="PYTHON",
                    help="also time the open under this interpreter (another build, e.g. /work/main/.venv/bin/python) "
                         "in the same rounds")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)
    total = (args.mib or (128 if args.quick else 1024)) * MiB
    sizes = [int(s) for s in args.sizes.split(",")]
    dirs = {}
    res: dict = {"bytes": total, "rounds": args.rounds, "sizes": {}}
    try:
        for size in sizes:
            t0 = time.perf_counter()
            dirs[size] = fill(args.dir, total, size)
            print(f"filled {size} B records: {sum(os.path.getsize(p) for p in wal_files(dirs[size])) / MiB:.0f} MiB "
                  f"in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        runs: dict[str, list[float]] = {}
        records: dict[int, int] = {}
        for rnd in range(args.rounds):
            for size in sizes:
                d = dirs[size]
                for temp in ("cold", "hot"):
                    if temp == "cold":
                        drop_cache(d)
                    else:
                        read_files(d)
                    r, _n = read_files(d)
                    if temp == "cold":
                        drop_cache(d)
                    else:
                        read_files(d)
                    o, cpu, records[size] = open_engine(d)
                    runs.setdefault(f"{size}/{temp}/read", []).append(r)
                    runs.setdefault(f"{size}/{temp}/open", []).append(o)
                    runs.setdefault(f"{size}/{temp}/cpu", []).append(cpu)
                    runs.setdefault(f"{size}/{temp}/ratio", []).append(o / r)
                    other = ""
                    if args.compare:
                        if temp == "cold":
                            drop_cache(d)
                        b, bc = open_in(args.compare, d)
                        runs.setdefault(f"{size}/{temp}/compare", []).append(b)
                        runs.setdefault(f"{size}/{temp}/compare_cpu", []).append(bc)
                        runs.setdefault(f"{size}/{temp}/compare_ratio", []).append(b / r)
                        other = f", compared build {b:.3f} s (CPU {bc:.3f} s, {b / r:.2f}x)"
                    print(f"[round {rnd + 1}/{args.rounds}] {size} B records, {temp}: open {o:.3f} s (CPU {cpu:.3f} s), "
                          f"read {r:.3f} s, {o / r:.2f}x{other}", file=sys.stderr, flush=True)
        print("\n| record size | cache | records | open s | open CPU s | sequential read s | open / read | target |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for size in sizes:
            for temp in ("cold", "hot"):
                o, c, r, q = (med(runs[f"{size}/{temp}/{k}"]) for k in ("open", "cpu", "read", "ratio"))
                res["sizes"][f"{size}/{temp}"] = {"open_s": o, "open_cpu_s": c, "read_s": r, "ratio": q,
                                                  "records": records[size]}
                target = ("<= 1.5x: " + ("met" if q["median"] <= 1.5 else "missed")) if temp == "cold" else "-"
                print(f"| {size:,} B | {temp} | {records[size]:,} | {o['median']:.3f} ({o['min']:.3f}-{o['max']:.3f}) "
                      f"| {c['median']:.3f} ({c['min']:.3f}-{c['max']:.3f}) "
                      f"| {r['median']:.3f} ({r['min']:.3f}-{r['max']:.3f}) "
                      f"| {q['median']:.2f}x ({q['min']:.2f}-{q['max']:.2f}) | {target} |")
                if args.compare:
                    b, bc, bq = (med(runs[f"{size}/{temp}/{k}"]) for k in ("compare", "compare_cpu", "compare_ratio"))
                    res["sizes"][f"{size}/{temp}"]["compare"] = {"open_s": b, "open_cpu_s": bc, "ratio": bq,
                                                                 "python": args.compare}
                    print(f"| {size:,} B | {temp} | compared build | {b['median']:.3f} ({b['min']:.3f}-{b['max']:.3f}) "
                          f"| {bc['median']:.3f} ({bc['min']:.3f}-{bc['max']:.3f}) "
                          f"| | {bq['median']:.2f}x ({bq['min']:.2f}-{bq['max']:.2f}) | |")
        print(f"\n({args.rounds} interleaved rounds, median (min-max); {total / MiB:.0f} MiB of log per size)")
        if args.profile:
            for size in sizes:
                prof = cProfile.Profile()
                open_engine(dirs[size], prof)
                out = io.StringIO()
                pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(25)
                print(f"\n--- profile, hot open, {size} B records ---\n{out.getvalue()}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=2)
    finally:
        for d in dirs.values():
            shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
