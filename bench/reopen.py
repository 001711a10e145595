"""Reopen of a small engine: what ``sediment.open`` and ``close`` cost when the log holds
little, beside another build in the same alternated rounds.

Why: bench/open.py times an open that reads a large log; what an open writes (syncs and
renames of the log manifest, the control file, the metadata snapshot and journal) is a
fixed cost that is most of a small engine's open. Session 31 cut the syncs of a reopen
after a clean close from nine to one; this measures what that is worth.

A data directory is filled once with this build (one relation, a compacted batch of
10,000 rows and 500 rows still in the log), closed, and copied for each build. Each
round runs one child process per build, in alternating order; the child opens and
closes its copy once untimed (imports; the metadata journal's first fold, see
metadata/journal.py), then ``--opens`` times: it times ``sediment.open(compact=False)``
and ``close()`` and counts the fsync/fdatasync and rename/replace calls each made and the
open's time inside them (the ``os`` functions wrapped in the child). Figures: per build, the median over the rounds
of each round's median, with min-max; the load average with each round.

    .venv/bin/python bench/reopen.py --build /tmp/before           # 5 rounds x 10 reopens
    .venv/bin/python bench/reopen.py --rounds 7 --opens 20 --json out.json

``--build DIR``: a checkout (``git archive <commit> | tar -x -C DIR``) whose sediment the
compared child imports (bench/small_writes_cpu.py ``use_build``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def fill(d: str) -> None:
    import pyarrow as pa

    import sediment

    def rows(first: int, n: int, t: int) -> pa.Table:
        return pa.table({"id": pa.array(range(first, first + n), pa.int64()),
                         "payload": pa.array([b"x" * 100] * n, pa.binary()),
                         "time": pa.array([t] * n, pa.int64()), "diff": pa.array([1] * n, pa.int64())})

    with sediment.open(d, compact_interval=None) as engine:
        engine.add_relation("r", pa.schema([("id", pa.int64()), ("payload", pa.binary())]))
        for t in range(1, 11):
            engine.append("r", rows(1000 * t, 1000, t))
            engine.seal("r", t)
        engine.compact()
        for t in range(11, 16):
            engine.append("r", rows(1000 * t, 100, t))
            engine.seal("r", t)


def child(d: str, opens: int, build: str | None) -> dict:
    """In the child process: ``opens`` timed reopens of ``d`` after one untimed."""
    if build:
        sys.path.insert(0, HERE)
        from small_writes_cpu import use_build

        use_build(build)
    import sediment

    counts = {"syncs": 0, "renames": 0, "in_s": 0.0}
    for name, kind in (("fsync", "syncs"), ("fdatasync", "syncs"), ("rename", "renames"), ("replace", "renames")):
        real = getattr(os, name)

        def wrapped(*a, _real=real, _kind=kind, **kw):
            counts[_kind] += 1
            t = time.perf_counter()
            try:
                return _real(*a, **kw)
            finally:
                counts["in_s"] += time.perf_counter() - t
        setattr(os, name, wrapped)
    sediment.open(d, compact=False).close()
    out: dict[str, list[float]] = {k: [] for k in ("open_s", "close_s", "open_syncs", "open_renames", "open_sync_s",
                                                   "close_syncs", "close_renames")}
    for _ in range(opens):
        counts.update(syncs=0, renames=0, in_s=0.0)
        t0 = time.perf_counter()
        engine = sediment.open(d, compact=False)
        t1 = time.perf_counter()
        out["open_syncs"].append(counts["syncs"])
        out["open_renames"].append(counts["renames"])
        out["open_sync_s"].append(counts["in_s"])
        counts.update(syncs=0, renames=0)
        engine.close()
        out["close_s"].append(time.perf_counter() - t1)
        out["open_s"].append(t1 - t0)
        out["close_syncs"].append(counts["syncs"])
        out["close_renames"].append(counts["renames"])
    return {"where": os.path.dirname(sediment.__file__), **out}


def med(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", help="a checkout to compare with, in the same alternated rounds")
    ap.add_argument("--rounds", type=int, default=5, help="alternated rounds (default 5)")
    ap.add_argument("--opens", type=int, default=10, help="timed reopens per build and round (default 10)")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the data directories go (default /tmp)")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--child", nargs=2, metavar=("DIR", "BUILD"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], args.opens, args.child[1] or None)))
        return 0
    builds = {"this build": ""} | ({"build before": os.path.abspath(args.build)} if args.build else {})
    root = tempfile.mkdtemp(prefix="sed-reopen-", dir=args.dir)
    try:
        fill(os.path.join(root, "source"))
        dirs = {}
        for i, name in enumerate(builds):
            dirs[name] = os.path.join(root, f"copy{i}")
            shutil.copytree(os.path.join(root, "source"), dirs[name])
        per: dict[str, dict[str, list[float]]] = {name: {} for name in builds}
        for rnd in range(args.rounds):
            order = list(builds) if rnd % 2 == 0 else list(reversed(builds))
            for name in order:
                load = os.getloadavg()[0]
                got = subprocess.run([sys.executable, os.path.abspath(__file__), "--opens", str(args.opens),
                                      "--child", dirs[name], builds[name]], capture_output=True, text=True,
                                     check=True, timeout=600, cwd=tempfile.gettempdir())
                res = json.loads(got.stdout.strip().splitlines()[-1])
                for key, xs in res.items():
                    if key != "where":
                        per[name].setdefault(key, []).append(statistics.median(xs))
                per[name].setdefault("load", []).append(load)
                print(f"[round {rnd + 1}/{args.rounds}] {name} ({res['where']}): open "
                      f"{1000 * statistics.median(res['open_s']):.2f} ms (in syncs and renames "
                      f"{1000 * statistics.median(res['open_sync_s']):.2f} ms), close "
                      f"{1000 * statistics.median(res['close_s']):.2f} ms, syncs {statistics.median(res['open_syncs']):.0f}"
                      f" + {statistics.median(res['close_syncs']):.0f}, renames {statistics.median(res['open_renames']):.0f}"
                      f" + {statistics.median(res['close_renames']):.0f}, load {load:.1f}", file=sys.stderr, flush=True)
        print("\n| build | open ms | of which in syncs and renames, ms | close ms | syncs: open + close "
              "| renames: open + close | load |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        table = {}
        for name in builds:
            f = {k: med(v) for k, v in per[name].items()}
            table[name] = f
            print(f"| {name} | {1000 * f['open_s']['median']:.2f} ({1000 * f['open_s']['min']:.2f}-"
                  f"{1000 * f['open_s']['max']:.2f}) | {1000 * f['open_sync_s']['median']:.2f} "
                  f"({1000 * f['open_sync_s']['min']:.2f}-{1000 * f['open_sync_s']['max']:.2f}) "
                  f"| {1000 * f['close_s']['median']:.2f} "
                  f"({1000 * f['close_s']['min']:.2f}-{1000 * f['close_s']['max']:.2f}) "
                  f"| {f['open_syncs']['median']:.0f} + {f['close_syncs']['median']:.0f} "
                  f"| {f['open_renames']['median']:.0f} + {f['close_renames']['median']:.0f} "
                  f"| {f['load']['min']:.1f}-{f['load']['max']:.1f} |")
        if args.build:
            ratio = [a / b for a, b in zip(per["this build"]["open_s"], per["build before"]["open_s"], strict=True)]
            table["open_ratio"] = med(ratio)
            print(f"\nopen, this build / build before, per round: {statistics.median(ratio):.2f}x "
                  f"({min(ratio):.2f}-{max(ratio):.2f})")
        print(f"({args.rounds} alternated rounds of {args.opens} reopens each; median of the rounds' medians (min-max))")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"rounds": args.rounds, "opens": args.opens, "per_round": per, "figures": table}, f, indent=2)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
