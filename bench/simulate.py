"""Seeded, deterministic simulation of the whole replicated log (FoundationDB-style).

    python bench/simulate.py --seeds 1000            # seeds 0..999
    python bench/simulate.py --seeds 100 --seed 5000 # seeds 5000..5099
    python bench/simulate.py --seed 42 --trace       # replay one seed, with its event trace
    python bench/simulate.py --seeds 10000 --jobs 2  # split across 2 processes, same output
    python bench/simulate.py --cluster --seeds 300   # the cluster mode: members, manager, moves
    python bench/simulate.py --cluster --seed 0 --partitions 1000 --members 50  # at scale

Each seed runs storage nodes, coordinators and clients in memory under a virtual clock
(tests/support/sim_cluster.py) with a schedule of faults drawn from the seed: storage-node
crashes that lose unsynced writes, partitions (both ways, one way, a coordinator cut
from some replicas), slow links that reorder messages across connections, connection
resets, coordinator crashes and takeovers, metadata compare-and-set conflicts and
outages, replicas added, removed and replaced, full and slow disks. Then every fault
heals, a final coordinator recovers, and the history checker (tests/support/sim_checker.py)
reports violations. Prints runs, faults injected by kind, violations by kind, and for
every failing seed the command that replays it exactly. Exits 1 if any seed failed.

``--cluster`` runs the cluster mode instead (tests/support/sim_members.py): ``--partitions``
logs served by ``--members`` members of a cluster, with a manager that assigns partitions
by ``sediment.cluster.assignment.plan_assignment`` and faults on members (killed, paused
past their session, joining, leaving, the manager killed), ZooKeeper and storage nodes;
besides the history checker of every partition it checks one owner per partition and
generation and that every partition is served again within a bound after each change.
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
from support.sim_members import CLUSTER_FAULT_KINDS, run_cluster_seed  # noqa: E402


@dataclass
class Tally:
    """What a range of seeds adds up to (merged across processes, seeds kept in order)."""

    appends: int = 0
    acked: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    failing: dict[str, list[int]] = field(default_factory=dict)  # violation kind -> failing seeds
    violations: dict[str, int] = field(default_factory=dict)
    cluster: dict[str, int] = field(default_factory=dict)  # the cluster mode's counters (moves, redirects, ...)
    plans: list[float] = field(default_factory=list)  # seconds per plan_assignment call (cluster mode)
    plans_cpu: list[float] = field(default_factory=list)  # the same calls' CPU seconds
    gaps: list[float] = field(default_factory=list)  # virtual seconds a partition went unserved (cluster mode)

    def merge(self, other: Tally) -> None:
        self.appends += other.appends
        self.acked += other.acked
        self.plans += other.plans
        self.plans_cpu += other.plans_cpu
        self.gaps += other.gaps
        for k, n in other.cluster.items():
            self.cluster[k] = self.cluster.get(k, 0) + n
        for k, n in other.faults.items():
            self.faults[k] = self.faults.get(k, 0) + n
        for k, seeds in other.failing.items():
            self.failing[k] = sorted(self.failing.get(k, []) + seeds)
        for k, n in other.violations.items():
            self.violations[k] = self.violations.get(k, 0) + n


def run_range(first: int, count: int, steps: int, duration: float, kinds: dict[str, int] | None, clients: int,
              trace: bool, cluster: tuple[int, int] | None = None) -> Tally:
    """Seeds first..first+count-1 in this process (a worker of --jobs, or the only one);
    ``cluster``: (partitions, members) for the cluster mode."""
    t = Tally()
    for seed in range(first, first + count):
        if cluster is None:
            r = run_seed(seed, steps, duration, logs=trace, kinds=kinds, clients=clients)
        else:
            r = run_cluster_seed(seed, steps, duration, logs=trace, kinds=kinds, clients=clients,
                                 partitions=cluster[0], members=cluster[1])
            t.plans += r.sim.plan_seconds
            t.plans_cpu += r.sim.plan_cpu
            t.gaps += r.sim.gaps
            for k, n in r.sim.stats.items():
                t.cluster[k] = t.cluster.get(k, 0) + n
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
    p.add_argument("--cluster", action="store_true",
                   help="the cluster mode: partitions served by members, a manager, moves on member death, join "
                        "and leave (tests/support/sim_members.py)")
    p.add_argument("--partitions", type=int, default=4, help="cluster mode: partitions (each its own replicated log)")
    p.add_argument("--members", type=int, default=3, help="cluster mode: members at the start")
    args = p.parse_args(argv)
    known = CLUSTER_FAULT_KINDS if args.cluster else FAULT_KINDS
    kinds = None
    if args.kinds:
        names = args.kinds.split(",")
        unknown = [k for k in names if k not in known]
        if unknown:
            p.error(f"unknown fault kinds {unknown}; known: {', '.join(known)}")
        kinds = {k: known[k] for k in names}
    cluster = (args.partitions, args.members) if args.cluster else None
    first = args.seed if args.seed is not None else 0
    count = args.seeds if args.seeds is not None else (1 if args.seed is not None else 100)
    started = time.monotonic()
    jobs = max(1, min(args.jobs, count))
    if args.trace or jobs == 1:
        tally = run_range(first, count, args.steps, args.duration, kinds, args.clients, args.trace, cluster)
    else:
        chunk = max(1, min(50, count // (jobs * 4)))  # small chunks: a slow range does not idle a core
        ranges = [(s, min(chunk, first + count - s), args.steps, args.duration, kinds, args.clients, False, cluster)
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
    if cluster is not None:
        print(f"cluster: {args.partitions} partitions, {args.members} members at the start; "
              + ", ".join(f"{k}={n}" for k, n in sorted(tally.cluster.items())))
        gaps = sorted(tally.gaps)
        if gaps:
            print(f"unserved spells: {len(gaps)}, virtual s p50 {gaps[len(gaps) // 2]:.2f}, "
                  f"p99 {gaps[int(len(gaps) * 0.99)]:.2f}, max {gaps[-1]:.2f}")
        for what, times in (("wall clock", tally.plans), ("CPU", tally.plans_cpu)):
            t = sorted(times)
            if t:
                print(f"plan_assignment, {what}: {len(t)} calls, p50 {t[len(t) // 2] * 1e3:.2f} ms, "
                      f"p99 {t[int(len(t) * 0.99)] * 1e3:.2f} ms, max {t[-1] * 1e3:.2f} ms")
    if not failing:
        print("violations: 0")
        return 0
    print(f"violations: {sum(violations.values())} in {len({s for v in failing.values() for s in v})} failing seeds")
    for k in sorted(failing):
        seeds = failing[k]
        print(f"  {k}: {violations[k]} in {len(seeds)} seeds, e.g. {seeds[:args.show]}")
        for s in seeds[:args.show]:
            extra = (f" --kinds {args.kinds}" if args.kinds else "") + (
                f" --clients {args.clients}" if args.clients != 3 else "") + (
                f" --cluster --partitions {args.partitions} --members {args.members}" if cluster else "")
            print(f"    replay: python bench/simulate.py --seed {s} --steps {args.steps} --duration {args.duration}"
                  f"{extra} --trace")
    return 1


if __name__ == "__main__":
    sys.exit(main())
