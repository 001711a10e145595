"""One-row durable appends from one writer, called from many depths of the caller's stack,
beside SQLite's one-row inserts from the same depths.

Why: CPython 3.11 keeps its frames on a per-thread stack of 16 KiB chunks and frees a chunk
as soon as its first frame returns. A caller whose own frames end just below a chunk's end
makes the append's deeper calls start a fresh chunk (an ``mmap``) and free it on return (a
``munmap``, with its TLB shoot-down to the process's other threads' CPUs), as often as calls
cross the boundary: once or several times per append, depending on where the boundary
falls. One writer's CPU per append then depends on how deep the caller's loop happens to
be, which a benchmark at one depth cannot show. This script moves the caller's stack by
small steps (one padding frame of about 120 bytes each) across a whole chunk and, at each
position, measures the thread's CPU and minor page faults per call (a fresh chunk faults its
first page in: one fault or more per append marks a crossing position).

Rounds interleaved (every position of a round runs sediment then SQLite, rounds start at a
rotated position); figures are medians over rounds, with min-max:

    .venv/bin/python bench/caller_depth.py                    # log on /tmp (the disk), 3 rounds
    .venv/bin/python bench/caller_depth.py --dir /dev/shm     # tmpfs: the CPU without the sync
    .venv/bin/python bench/caller_depth.py --build /tmp/before # another checkout (bench/small_writes_cpu.py)
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

if "--build" in sys.argv[:-1]:  # before sediment is imported: another checkout, for A/B runs
    from small_writes_cpu import use_build

    use_build(sys.argv[sys.argv.index("--build") + 1])

from append import sqlite_table  # noqa: E402 - bench/append.py: the same SQLite peer
from small_writes import PAYLOAD, SCHEMA, one_row  # noqa: E402 - the same rows as bench/small_writes.py

import sediment  # noqa: E402


def measure(step, n: int) -> tuple[float, float]:  # noqa: ANN001 - any callable
    """(thread CPU in us, minor faults) per call of ``step`` over ``n`` calls."""
    f0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    c0 = time.thread_time()
    for _ in range(n):
        step()
    cpu = (time.thread_time() - c0) / n * 1e6
    return cpu, (resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f0) / n


def at_depth(depth: int, step, n: int) -> tuple[float, float]:  # noqa: ANN001
    """:func:`measure` run ``depth`` padding frames below this one."""
    a = b = c = d = 0  # noqa: F841 - the frame's size is the point
    return measure(step, n) if depth == 0 else at_depth(depth - 1, step, n)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--positions", type=int, default=140, help="caller depths, one padding frame apart")
    ap.add_argument("--calls", type=int, default=300, help="appends (and inserts) per position and round")
    ap.add_argument("--build", help="a checkout of the repository to run instead of this one (applied at import)")
    a = ap.parse_args(argv)
    root = tempfile.mkdtemp(prefix="sed-depth-", dir=a.dir)
    try:
        engine = sediment.open(os.path.join(root, "sed"))
        conn = sqlite_table(root)
        try:
            engine.add_relation("r", SCHEMA)
            table, body = one_row(0), os.urandom(PAYLOAD)
            cases = {"sediment": lambda: engine.append("r", table),
                     "sqlite": lambda: conn.execute("INSERT INTO r VALUES (?, ?, 1, 1)", (0, body))}
            for step in cases.values():
                measure(step, 200)  # warm-up
            got: dict[str, list[list[tuple[float, float]]]] = {k: [[] for _ in range(a.positions)] for k in cases}
            loads = [os.getloadavg()[0]]
            for r in range(a.rounds):
                start = r * a.positions // a.rounds
                for i in range(a.positions):
                    depth = (start + i) % a.positions
                    for name, step in cases.items():
                        got[name][depth].append(at_depth(depth, step, a.calls))
                loads.append(os.getloadavg()[0])
        finally:
            engine.close()
            conn.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    def per_position(name: str) -> list[tuple[float, float]]:
        return [(statistics.median(c for c, _f in runs), statistics.median(f for _c, f in runs))
                for runs in got[name]]

    def span(xs: list[float]) -> str:
        return f"{statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})" if xs else "-"

    print(f"{a.build or 'this build'}: {a.rounds} rounds x {a.positions} caller depths x {a.calls} calls, log on {a.dir}, "
          f"load {min(loads):.1f}-{max(loads):.1f}; medians over rounds, then over positions (min-max)")
    print("| case | positions with >= 1 fault per call | CPU us per call there | elsewhere | all positions |")
    print("| --- | --- | --- | --- | --- |")
    for name in cases:
        pos = per_position(name)
        hit = [c for c, f in pos if f >= 1.0]
        rest = [c for c, f in pos if f < 1.0]
        print(f"| {name} | {len(hit)} of {len(pos)} | {span(hit)} | {span(rest)} | {span([c for c, _f in pos])} |")
    sed, sql = per_position("sediment"), per_position("sqlite")
    ratio = [s / q for (s, _), (q, _) in zip(sed, sql, strict=True)]
    print(f"sediment's CPU per append / SQLite's per insert, per position: {span(ratio)}x "
          "(above 1: sediment spends more)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
