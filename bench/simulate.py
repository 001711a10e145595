"""Seeded, deterministic simulation of the whole replicated log (FoundationDB-style).

    python bench/simulate.py --seeds 1000            # seeds 0..999
    python bench/simulate.py --seeds 100 --seed 5000 # seeds 5000..5099
    python bench/simulate.py --seed 42 --trace       # replay one seed, with its event trace
    python bench/simulate.py --seeds 10000 --jobs 2  # split across 2 processes, same output

Each seed runs storage nodes, coordinators and clients in memory under a virtual clock
(tests/support/sim_cluster.py) with a schedule of faults drawn from the seed: storage-node
crashes that lose unsynced writes, partitions (both ways, one way, a coordinator cut
from some replicas), slow links that reorder messages across connections, connection
resets, coordinator crashes and takeovers, metadata compare-and-set conflicts and
outages, replicas added, removed and replaced, full and slow disks. Then every fault
heals, a final coordinator recovers, and the history checker (tests/support/sim_checker.py)
reports violations. Prints runs, faults injected by kind, violations by kind, and for
every failing seed the command that replays it exactly. Exits 1 if any seed failed.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass, field

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from support.sim_cluster import FAULT_KINDS, run_seed  # noqa: E402


@dataclass
class Tally:
    """What a range of seeds adds up to (merged across processes, seeds kept in order)."""

    appends: int = 0
    acked: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    failing: dict[str, list[int]] = field(default_factory=dict)  # violation kind -> failing seeds
    violations: dict[str, int] = field(default_factory=dict)

    def merge(self, other: Tally) -> None:
        self.appends += other.appends
        self.acked += other.acked
        for k, n in other.faults.items():
            self.faults[k] = self.faults.get(k, 0) + n
        for k, seeds in other.failing.items():
            self.failing[k] = sorted(self.failing.get(k, []) + seeds)
        for k, n in other.violations.items():
            self.violations[k] = self.violations.get(k, 0) + n


def run_range(first: int, count: int, steps: int, duration: float, kinds: dict[str, int] | None, clients: int,
              trace: bool) -> Tally:
    """Seeds first..first+count-1 in this process (a worker of --jobs, or the only one)."""
    t = Tally()
    for seed in range(first, first + count):
        r = run_seed(seed, steps, duration, logs=trace, kinds=kinds, clients=clients)
        t.appends += r.appends
        t.acked += r.acked
        for k, n in r.faults.items():
            t.faults[k] = t.faults.get(k, 0) + n
        for k in sorted({v.kind for v in r.violations}):
            t.failing.setdefault(k, []).append(seed)
        for k, n in r.counts.items():
            t.violations[k] = t.violations.get(k, 0) + n
        if trace:
            print(f"--- seed {seed}: {r.appends} appends, {r.acked} acknowledged, {r.virtual_seconds:.1f} virtual s, "
                  f"digest {r.digest[:16]}")
            print("\n".join(r.trace))
            for v in r.violations:
                print(f"VIOLATION {v.kind}: {v.detail}")
    return t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=None, help="how many seeds to run (default 1 with --seed, else 100)")
    p.add_argument("--seed", type=int, default=None, help="the first seed (default 0)")
    p.add_argument("--steps", type=int, default=12, help="faults scheduled per seed")
    p.add_argument("--duration", type=float, default=8.0, help="virtual seconds of load and faults per seed")
    p.add_argument("--kinds", default="", help="comma-separated fault kinds to draw from (default: all, weighted)")
    p.add_argument("--clients", type=int, default=3, help="concurrent appenders")
    p.add_argument("--trace", action="store_true", help="print each seed's event trace (with the coordinators' and nodes' log lines) and violation details")
    p.add_argument("--jobs", type=int, default=1, help="processes to split the seeds across (same output)")
    p.add_argument("--show", type=int, default=3, help="failing seeds listed per violation kind")
    args = p.parse_args(argv)
    kinds = None
    if args.kinds:
        names = args.kinds.split(",")
        unknown = [k for k in names if k not in FAULT_KINDS]
        if unknown:
            p.error(f"unknown fault kinds {unknown}; known: {', '.join(FAULT_KINDS)}")
        kinds = {k: FAULT_KINDS[k] for k in names}
    first = args.seed if args.seed is not None else 0
    count = args.seeds if args.seeds is not None else (1 if args.seed is not None else 100)
    started = time.monotonic()
    jobs = max(1, min(args.jobs, count))
    if args.trace or jobs == 1:
        tally = run_range(first, count, args.steps, args.duration, kinds, args.clients, args.trace)
    else:
        chunk = max(1, min(50, count // (jobs * 4)))  # small chunks: a slow range does not idle a core
        ranges = [(s, min(chunk, first + count - s), args.steps, args.duration, kinds, args.clients, False)
                  for s in range(first, first + count, chunk)]
        with multiprocessing.get_context("spawn").Pool(jobs) as pool:
            parts = pool.starmap(run_range, ranges)
        tally = Tally()
        for part in parts:
            tally.merge(part)
    appends, acked, faults, failing, violations = (tally.appends, tally.acked, tally.faults, tally.failing,
                                                   tally.violations)
    took = time.monotonic() - started
    print(f"runs: {count} seeds ({first}..{first + count - 1}), {args.steps} faults scheduled each, "
          f"{took:.1f}s ({took / max(count, 1):.3f}s per seed)")
    print(f"appends: {appends} submitted, {acked} acknowledged")
    print("faults injected by kind: " + (", ".join(f"{k}={n}" for k, n in sorted(faults.items())) or "none"))
    if not failing:
        print("violations: 0")
        return 0
    print(f"violations: {sum(violations.values())} in {len({s for v in failing.values() for s in v})} failing seeds")
    for k in sorted(failing):
        seeds = failing[k]
        print(f"  {k}: {violations[k]} in {len(seeds)} seeds, e.g. {seeds[:args.show]}")
        for s in seeds[:args.show]:
            extra = (f" --kinds {args.kinds}" if args.kinds else "") + (
                f" --clients {args.clients}" if args.clients != 3 else "")
            print(f"    replay: python bench/simulate.py --seed {s} --steps {args.steps} --duration {args.duration}"
                  f"{extra} --trace")
    return 1


if __name__ == "__main__":
    sys.exit(main())
