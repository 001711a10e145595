"""SIGKILLs during background compaction on the device ring, many seeds in parallel processes.

Why: ``tests/engine/test_compaction.py::test_sigkill_during_compaction_loses_nothing`` failed
now and then on the device ring under load (one append of the 2-row model missing after
three SIGKILLs): a compaction pass could cut past a record whose ``on_durable`` callback had
not run yet (docs/reliability.md, "Found and fixed"). This script runs the same scenario
(the test's crasher: append, seal, ``set_since`` every 5th time, ``compact`` every 9th,
background compaction every 10 ms; three rounds killed at a random point) for many seeds at
once, so that the machine is loaded as the suite loads it, and reports each mismatch with
the rounds' first and last acknowledged times and the times whose loss explains it.

    .venv/bin/python bench/device_compaction_kills.py --seeds 64 --jobs 8
    .venv/bin/python bench/device_compaction_kills.py --wal file     # the file log, same runs
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests")]

from engine.test_compaction import CRASHER, model  # noqa: E402

import sediment  # noqa: E402

CAPACITY = 32 << 20


def options(base: str, wal: str) -> dict:
    return {"wal": f"device:{os.path.join(base, 'ring')}", "wal_capacity": CAPACITY} if wal == "device" else {}


def explain(delta: dict[int, int], sealed: int) -> list[int]:
    """Single times whose two rows (t % 13, t % 7) are exactly the missing counts."""
    out = []
    for t in range(1, sealed + 1):
        d: dict[int, int] = {}
        for k in (t % 13, t % 7):
            d[k] = d.get(k, 0) + 1
        if d == delta:
            out.append(t)
    return out


def one(seed: int, wal: str, root: str) -> str | None:
    base = tempfile.mkdtemp(prefix=f"kills-{seed}-", dir=root)
    data, opts = os.path.join(base, "data"), options(base, wal)
    rnd, rounds = random.Random(seed), []
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", CRASHER, data, json.dumps(opts)],
                                stdout=subprocess.PIPE, text=True)
        stop, first, last = rnd.randint(20, 120), None, 0
        try:
            for n, line in enumerate(proc.stdout):  # type: ignore[union-attr]
                last = int(line)
                first = last if first is None else first
                if n >= stop:
                    break
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        rounds.append((first, last))
    eng = sediment.open(data, segment_bytes=1 << 13, compact=False, **opts)
    try:
        sealed = eng.sealed("r")
        got = dict(tuple(r.values()) for r in eng.snapshot("r", sealed).to_pylist())
    finally:
        eng.close()
    expected = dict(model(sealed))
    if got == expected:
        shutil.rmtree(base, ignore_errors=True)
        return None
    delta = {k: expected.get(k, 0) - got.get(k, 0) for k in set(expected) | set(got)
             if expected.get(k, 0) != got.get(k, 0)}
    return (f"seed {seed}: sealed {sealed}, rounds (first, last acknowledged) {rounds}, missing counts "
            f"{sorted(delta.items())}, explained by the loss of time(s) {explain(delta, sealed)}; kept in {base}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--wal", choices=["device", "file"], default="device")
    parser.add_argument("--dir", default=tempfile.gettempdir())
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="sediment-kills-", dir=args.dir)
    with ThreadPoolExecutor(args.jobs) as pool:
        found = [r for r in pool.map(lambda s: one(s, args.wal, root), range(args.seed, args.seed + args.seeds)) if r]
    for line in found:
        print(line)
    print(f"{args.wal}: {len(found)} mismatches in {args.seeds} seeds ({args.jobs} at once, load {os.getloadavg()[0]:.1f})")
    if not found:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
