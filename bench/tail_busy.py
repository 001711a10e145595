"""Paths over many small WAL records beside threads running Python, this build against another.

Why: pyarrow and syscalls let go of the interpreter lock, and beside threads that run Python
without blocking, each such call waits up to the switch interval (5 ms) to get it back. A
path that makes such calls once per record (a log read, a decode, a sort, a size) takes
seconds there where it takes milliseconds alone (docs/architecture.md, "The interpreter
lock"). Each case fills a data directory with one-row records, then times one call beside
``--busy`` threads spinning in Python:

    compact-ring   a compaction pass after a reopen, the records read back from a device ring
    snapshot-ring  a snapshot after a reopen, its tail read back from a device ring
    compact-cold   a compaction pass after a reopen, segment files dropped from the page cache
    replay         a time-ordered replay of the tail
    feed           a subscriber 16 columns wide catching up

Each round runs every case once in a fresh process per build, the builds alternating (which
goes first alternates too); figures are medians over rounds with min-max, and the load
average is printed with each:

    .venv/bin/python bench/tail_busy.py --build /tmp/before --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = {"compact-ring": 500, "snapshot-ring": 500, "compact-cold": 20_000, "replay": 5_000, "feed": 3_000}


@contextlib.contextmanager
def busy(n: int):
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    threads = [threading.Thread(target=spin) for _ in range(n)]
    for th in threads:
        th.start()
    try:
        yield
    finally:
        stop.set()
        for th in threads:
            th.join()


def one(case: str, records: int, spinners: int, root: str) -> float:
    """Seconds of the case's timed call (run in a child process, sediment from its build)."""
    import pyarrow as pa  # noqa: PLC0415 - after the build is chosen

    import sediment  # noqa: PLC0415
    from sediment.clock import ManualClock  # noqa: PLC0415

    width = 16 if case == "feed" else 1
    schema = pa.schema([("id", pa.int64())] + [(f"c{j}", pa.binary()) for j in range(width)])

    def rows(i: int, t: int) -> pa.Table:
        return pa.table({"id": pa.array([i], pa.int64()), **{f"c{j}": [b"p%d" % i] for j in range(width)},
                         "time": pa.array([t], pa.int64()), "diff": pa.array([1], pa.int64())})

    options = {"wal": f"device:{root}/ring.dev", "wal_capacity": 64 << 20} if case.endswith("-ring") else {}
    path = os.path.join(root, "d")

    def opened():
        return sediment.open(path, clock=ManualClock(), compact_interval=None, **options)

    def fill(engine, t: int) -> None:
        queued = [engine.writer.append_queued("r", rows(i, t)) for i in range(records)]
        for q in queued:
            q.wait()

    def timed(call) -> float:
        with busy(spinners):
            started = time.perf_counter()
            call()
            return time.perf_counter() - started

    with opened() as engine:
        engine.add_relation("r", schema)
        if case == "feed":
            sub = engine.subscribe("r")
            fill(engine, 2)

            def catch_up() -> None:
                got = 0
                while got < records:
                    event = sub.next(timeout=60)
                    got += event.table.num_rows if event.kind == "updates" else 0

            return timed(catch_up)
        fill(engine, 1)
        engine.seal("r", 1)
        if case == "replay":
            return timed(lambda: list(engine.replay("r")))
    with opened() as engine:
        if case == "compact-cold":
            for where, _dirs, names in os.walk(path):
                for name in (n for n in names if n.endswith(".seg")):
                    fd = os.open(os.path.join(where, name), os.O_RDONLY)
                    os.fdatasync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    os.close(fd)
        if case.startswith("snapshot"):
            return timed(lambda: engine.snapshot("r", as_of=1))
        return timed(lambda: engine.compact("r"))


def child(args: argparse.Namespace) -> None:
    if args.build:
        sys.path.insert(0, HERE)
        from small_writes_cpu import use_build  # noqa: PLC0415

        use_build(args.build)
    root = tempfile.mkdtemp(dir=args.dir)
    try:
        print(one(args.child, CASES[args.child], args.busy, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", help="the peer: a checkout of the repository (git archive of a commit, unpacked)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--busy", type=int, default=2, help="threads spinning in Python beside the timed call")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    builds = [("this build", None), (args.build, args.build)] if args.build else [("this build", None)]
    cases = args.cases.split(",")
    got: dict[tuple[str, str], list[float]] = {}
    loads: list[float] = []
    for r in range(args.rounds):
        for case in cases:
            for label, build in builds[::-1] if r % 2 else builds:
                cmd = [sys.executable, __file__, "--child", case, "--busy", str(args.busy), "--dir", args.dir]
                out = subprocess.run(cmd + (["--build", build] if build else []), check=True, capture_output=True,
                                     text=True).stdout
                got.setdefault((case, label), []).append(float(out.split()[-1]))
                loads.append(os.getloadavg()[0])
    print(f"{args.rounds} rounds beside {args.busy} busy threads; load average {min(loads):.1f}-{max(loads):.1f} "
          f"(median {statistics.median(loads):.1f})")
    for case in cases:
        cells = []
        for label, _build in builds:
            xs = got[(case, label)]
            cells.append(f"{label}: {statistics.median(xs):.2f} s ({min(xs):.2f}-{max(xs):.2f})")
        print(f"{case:14} {CASES[case]:>6} records   " + "   ".join(cells))


if __name__ == "__main__":
    main()
