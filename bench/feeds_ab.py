"""Feed latency of this build's feed against an earlier commit's, in the same rounds.

    .venv/bin/python bench/feeds_ab.py --base d7fa6a5 [--counts 100,1000] [--rounds 3] [--appends 1000] [--modes in-process,network]
    .venv/bin/python bench/feeds_ab.py --base HEAD --modes network,network-async   # both builds need next_async for the async modes
    .venv/bin/python bench/feeds_ab.py --base HEAD --counts 100 --modes network-async --pace-ms 2   # one append every 2 ms

Why: on this shared machine absolute latencies swing several-fold between runs, so a
change to the feed is judged against the previous build measured alternately. Each case
runs in its own process: a case of ``bench/feeds.py`` (one writer; N subscriber threads
in process, or N subscriptions over the network from 4 client processes), with the package
either as checked out or as of ``--base`` (the commit's tree, exported to a temporary
folder and put first on PYTHONPATH, so the client processes load it too).
Prints, per case, the median over the rounds with min-max, process CPU included (and, over
the network, the client processes' CPU per delivered update).
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


def package_root(tree: str) -> str:
    """A folder that, first on PYTHONPATH, makes ``import sediment`` (and its subpackages, and
    so the client processes a network case spawns) load the exported commit ``tree``: the
    editable install maps each package to a folder of this checkout, so the same layout is
    laid out of symlinks into ``tree``."""
    here = os.path.dirname(HERE)
    finders = [m for name, m in sys.modules.items() if name.startswith("__editable__") and hasattr(m, "MAPPING")]
    if not finders:
        raise SystemExit("feeds_ab.py needs the project installed in editable mode (pip install -e .)")
    root = os.path.join(tree, "_packages")
    for finder in finders:
        for name, path in sorted(finder.MAPPING.items()):
            if not path.startswith(here + os.sep):
                continue
            src, dest = tree + path[len(here):], os.path.join(root, *name.split("."))
            if name == "sediment":
                os.makedirs(dest, exist_ok=True)
                for entry in os.listdir(src):
                    if not os.path.exists(os.path.join(dest, entry)):
                        os.symlink(os.path.join(src, entry), os.path.join(dest, entry))
            elif not os.path.lexists(dest):
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                os.symlink(src, dest)
    return root


def child(mode: str, subscribers: int, appends: int, pace_ms: float) -> None:
    sys.path.insert(0, HERE)
    import feeds

    feeds.PACE[0] = pace_ms / 1e3

    c0 = time.process_time()
    got = feeds.run(mode, subscribers, appends, tempfile.gettempdir())
    got["cpu"] = time.process_time() - c0
    print(json.dumps(got))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the commit whose build is the peer")
    ap.add_argument("--counts", default="100,1000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--appends", type=int, default=1000)
    ap.add_argument("--modes", default="in-process")
    ap.add_argument("--pace-ms", type=float, default=0.0, help="one append every so many ms (default: back to back)")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), int(args.child[2]), args.pace_ms)
        return
    tree = tempfile.mkdtemp(prefix="sediment-feeds-base-")
    archive = subprocess.run(["git", "archive", args.base], cwd=os.path.dirname(HERE), check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    builds = {f"base {args.base}": package_root(tree), "this build": ""}
    counts = [int(c) for c in args.counts.split(",")]
    modes = args.modes.split(",")
    cases = [(m, n) for n in counts for m in modes]
    results: dict[tuple[str, str, int], list[dict]] = {(m, b, n): [] for m, n in cases for b in builds}
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; {args.appends} one-row appends per case", flush=True)
    try:
        for r in range(args.rounds):
            order = list(builds) if r % 2 == 0 else list(builds)[::-1]
            for mode, n in cases:
                for build in order:
                    got = run_case(args.base, builds[build], mode, n, args.appends, args.pace_ms)
                    results[(mode, build, n)].append(got)
                    print(f"round {r + 1}: {mode:10s} {build:16s} {n:5d} subscribers: append p99 "
                          f"{got['append_p99'] * 1e3:.2f} ms, delivery p50 {got['delivery_p50'] * 1e3:.2f} p99 "
                          f"{got['delivery_p99'] * 1e3:.2f} ms, {got['delivery_p99'] / got['append_p99']:.2f}x, "
                          f"CPU {got['cpu']:.2f} s, clients' {got.get('client_cpu_us', 0):.1f} us/delivery, "
                          f"missing {got['missing']}, load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    print_table(results, cases, list(builds))


def run_case(base: str, packages: str, mode: str, subscribers: int, appends: int, pace_ms: float = 0.0) -> dict:
    """One case in a process of its own; ``packages``: the base build's package root ("" for this build)."""
    env = dict(os.environ)
    if packages:
        env["PYTHONPATH"] = packages + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, __file__, "--base", base, "--pace-ms", str(pace_ms),
                          "--child", mode, str(subscribers), str(appends)],
                         capture_output=True, text=True, env=env)
    if out.returncode:
        raise SystemExit(f"{packages or 'this build'}, {mode}, {subscribers} subscribers failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def print_table(results: dict[tuple[str, str, int], list[dict]], cases: list[tuple[str, int]],
                builds: list[str]) -> None:
    def spread(values: list[float], scale: float = 1.0) -> str:
        return f"{statistics.median(values) * scale:.2f} ({min(values) * scale:.2f}-{max(values) * scale:.2f})"

    print("\n| subscribers | path | build | append p99 ms | delivery p50 ms | delivery p99 ms | p99 / append p99 "
          "| CPU s | clients' CPU us per delivery |")
    print("| ---: | --- | --- | --- | --- | --- | --- | --- | --- |")
    for mode, n in cases:
        for build in builds:
            rows = results[(mode, build, n)]
            print(f"| {n} | {mode} | {build} | {spread([g['append_p99'] for g in rows], 1e3)} | "
                  f"{spread([g['delivery_p50'] for g in rows], 1e3)} | {spread([g['delivery_p99'] for g in rows], 1e3)} | "
                  f"{spread([g['delivery_p99'] / g['append_p99'] for g in rows])}x | {spread([g['cpu'] for g in rows])} | "
                  f"{spread([g.get('client_cpu_us', 0) for g in rows])} |")


if __name__ == "__main__":
    main()
