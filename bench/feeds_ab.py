"""Feed latency of this build's feed against an earlier commit's, in the same rounds.

    .venv/bin/python bench/feeds_ab.py --base d7fa6a5 [--counts 100,1000] [--rounds 3] [--appends 1000]

Why: on this shared machine absolute latencies swing several-fold between runs, so a
change to ``engine/feed.py`` is judged against the previous one measured alternately.
Each case runs in its own process: ``bench/feeds.py``'s in-process case (one writer, N
subscriber threads), with ``engine/feed.py`` either as checked out or as of ``--base``
(loaded in its place before the engine opens). Prints, per case, the median over the
rounds with min-max, process CPU included.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def child(base_file: str | None, subscribers: int, appends: int) -> None:
    sys.path.insert(0, HERE)
    import feeds

    if base_file:
        import sediment.engine.reads as reads
        import sediment.engine.relation_registry as registry

        spec = importlib.util.spec_from_file_location("sediment.engine.feed_base", base_file)
        base = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = base
        spec.loader.exec_module(base)
        reads.Subscription, reads.FeedEvent, registry.FeedLog = base.Subscription, base.FeedEvent, base.FeedLog
    c0 = time.process_time()
    got = feeds.run("in-process", subscribers, appends, tempfile.gettempdir())
    got["cpu"] = time.process_time() - c0
    print(json.dumps(got))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the commit whose engine/feed.py is the peer")
    ap.add_argument("--counts", default="100,1000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--appends", type=int, default=1000)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0] or None, int(args.child[1]), int(args.child[2]))
        return
    source = subprocess.run(["git", "show", f"{args.base}:engine/feed.py"], cwd=HERE, check=True,
                            capture_output=True, text=True).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(source)
    builds = {f"base {args.base}": f.name, "this build": ""}
    counts = [int(c) for c in args.counts.split(",")]
    results: dict[tuple[str, int], list[dict]] = {(b, n): [] for b in builds for n in counts}
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; {args.appends} one-row appends per case", flush=True)
    try:
        for r in range(args.rounds):
            order = list(builds) if r % 2 == 0 else list(builds)[::-1]
            for n in counts:
                for build in order:
                    out = subprocess.run([sys.executable, __file__, "--base", args.base, "--child", builds[build],
                                          str(n), str(args.appends)], check=True, capture_output=True, text=True)
                    got = json.loads(out.stdout.strip().splitlines()[-1])
                    results[(build, n)].append(got)
                    print(f"round {r + 1}: {build:16s} {n:5d} subscribers: append p99 {got['append_p99'] * 1e3:.2f} ms, "
                          f"delivery p50 {got['delivery_p50'] * 1e3:.2f} p99 {got['delivery_p99'] * 1e3:.2f} ms, "
                          f"{got['delivery_p99'] / got['append_p99']:.2f}x, CPU {got['cpu']:.2f} s, "
                          f"missing {got['missing']}, load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        os.unlink(f.name)

    def spread(values: list[float], scale: float = 1.0) -> str:
        return f"{statistics.median(values) * scale:.2f} ({min(values) * scale:.2f}-{max(values) * scale:.2f})"

    print("\n| subscribers | build | append p99 ms | delivery p50 ms | delivery p99 ms | p99 / append p99 | CPU s |")
    print("| ---: | --- | --- | --- | --- | --- | --- |")
    for n in counts:
        for build in builds:
            rows = results[(build, n)]
            print(f"| {n} | {build} | {spread([g['append_p99'] for g in rows], 1e3)} | "
                  f"{spread([g['delivery_p50'] for g in rows], 1e3)} | {spread([g['delivery_p99'] for g in rows], 1e3)} | "
                  f"{spread([g['delivery_p99'] / g['append_p99'] for g in rows])}x | {spread([g['cpu'] for g in rows])} |")


if __name__ == "__main__":
    main()
