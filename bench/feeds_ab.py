"""Feed latency of this build's feed against an earlier commit's, in the same rounds.

    .venv/bin/python bench/feeds_ab.py --base d7fa6a5 [--counts 100,1000] [--rounds 3] [--appends 1000]

Why: on this shared machine absolute latencies swing several-fold between runs, so a
change to the feed is judged against the previous build measured alternately. Each case
runs in its own process: ``bench/feeds.py``'s in-process case (one writer, N subscriber
threads), with the package either as checked out or as of ``--base`` (the commit's tree,
exported to a temporary folder, imported in place of the editable install's folders).
Prints, per case, the median over the rounds with min-max, process CPU included.
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


def use_tree(root: str) -> None:
    """Import the package from ``root`` (an exported commit) instead of this checkout: the
    editable install's finder maps each package to a folder of the checkout."""
    here = os.path.dirname(HERE)
    finders = [m for name, m in sys.modules.items() if name.startswith("__editable__") and hasattr(m, "MAPPING")]
    if not finders:
        raise SystemExit("feeds_ab.py needs the project installed in editable mode (pip install -e .)")
    for finder in finders:
        for name, path in finder.MAPPING.items():
            if path.startswith(here + os.sep):
                finder.MAPPING[name] = root + path[len(here):]


def child(base_tree: str | None, subscribers: int, appends: int) -> None:
    if base_tree:
        use_tree(base_tree)
    sys.path.insert(0, HERE)
    import feeds

    c0 = time.process_time()
    got = feeds.run("in-process", subscribers, appends, tempfile.gettempdir())
    got["cpu"] = time.process_time() - c0
    print(json.dumps(got))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the commit whose build is the peer")
    ap.add_argument("--counts", default="100,1000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--appends", type=int, default=1000)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0] or None, int(args.child[1]), int(args.child[2]))
        return
    tree = tempfile.mkdtemp(prefix="sediment-feeds-base-")
    archive = subprocess.run(["git", "archive", args.base], cwd=os.path.dirname(HERE), check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    builds = {f"base {args.base}": tree, "this build": ""}
    counts = [int(c) for c in args.counts.split(",")]
    results: dict[tuple[str, int], list[dict]] = {(b, n): [] for b in builds for n in counts}
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; {args.appends} one-row appends per case", flush=True)
    try:
        for r in range(args.rounds):
            order = list(builds) if r % 2 == 0 else list(builds)[::-1]
            for n in counts:
                for build in order:
                    out = subprocess.run([sys.executable, __file__, "--base", args.base, "--child", builds[build],
                                          str(n), str(args.appends)], capture_output=True, text=True)
                    if out.returncode:
                        raise SystemExit(f"{build}, {n} subscribers failed:\n{out.stderr[-3000:]}")
                    got = json.loads(out.stdout.strip().splitlines()[-1])
                    results[(build, n)].append(got)
                    print(f"round {r + 1}: {build:16s} {n:5d} subscribers: append p99 {got['append_p99'] * 1e3:.2f} ms, "
                          f"delivery p50 {got['delivery_p50'] * 1e3:.2f} p99 {got['delivery_p99'] * 1e3:.2f} ms, "
                          f"{got['delivery_p99'] / got['append_p99']:.2f}x, CPU {got['cpu']:.2f} s, "
                          f"missing {got['missing']}, load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        shutil.rmtree(tree, ignore_errors=True)

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
