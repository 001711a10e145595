"""One-row durable appends, one writer and many, beside SQLite and a bare queue-and-wake loop.

Why: issue 27 asks one writer's one-row durable appends at >= 1.0x SQLite (WAL,
synchronous=FULL) with p99 beside SQLite's, and 64 writers at >= 30,000 appends/s with
p99 <= 10 ms, CPU per append reported and what bounds it. The machine is shared, so
every round runs the peers back to back (sediment, SQLite, the loop), rounds interleave,
and figures are medians with min-max:

* sediment ``Engine.append`` of a one-row table (``id int64, payload binary`` plus
  ``time`` and ``diff``, 100 B of row payload), durable on return, from one thread;
  p50/p99 latency, CPU per append (the whole process, so the log's own threads count);
* SQLite (stdlib sqlite3), WAL mode, ``synchronous=FULL``, one ``INSERT`` per
  transaction of the same four columns, from one thread;
* ``--threads`` (default 64) threads of one process, each appending one row at a time
  to sediment and waiting for it; appends per fdatasync from the engine's histogram;
* the ceiling of the threading alone: the same threads each put a ticket on a queue and
  wait for it, one thread takes the whole queue and wakes them (no I/O, no Arrow):
  what the interpreter does per append with nothing else to do.

    .venv/bin/python bench/small_writes.py                # 3 rounds x 2 s per case
    .venv/bin/python bench/small_writes.py --rounds 5 --seconds 3 --json out.json

A/B against another build (``git archive`` of a commit, unpacked), turns alternated:

    for i in 1 2 3 4 5; do .venv/bin/python bench/small_writes.py --rounds 1 --seconds 3 --build /tmp/before \
        --json b$i.json; .venv/bin/python bench/small_writes.py --rounds 1 --seconds 3 --json a$i.json; done

``--many``: only the many-writer cases (sediment and the bare loop), each also reporting the
process's voluntary context switches per append. ``--bell-loop`` adds the bare loop woken
another way: the threads sleep on one eventfd per group, woken by one write of their count
(session 27 tried this in the group commit: see docs/benchmarks.md). ``--loop-sync DIR``: the
loops' draining thread writes 100 B per append and syncs each group into a file under DIR.

``--slices 30``: the one-writer peers open together and take turns of 0.1 s (3 s rounds), so
that both see the same disk and load; their figures are the sums over their turns.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time

if "--build" in sys.argv[:-1]:  # before sediment is imported: another checkout, for A/B runs
    from small_writes_cpu import use_build

    use_build(sys.argv[sys.argv.index("--build") + 1])

import pyarrow as pa  # noqa: E402
from append import sqlite_table  # noqa: E402 - bench/append.py: the same SQLite peer

import sediment  # noqa: E402

SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.binary())])
ROW_BYTES = 100
PAYLOAD = ROW_BYTES - 24  # id, time and diff: int64 each


def one_row(k: int) -> pa.Table:
    return pa.table({"id": pa.array([k], pa.int64()), "payload": pa.array([os.urandom(PAYLOAD)], pa.binary()),
                     "time": pa.array([1], pa.int64()), "diff": pa.array([1], pa.int64())})


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def summary(lats: list[float], elapsed: float, cpu: float, switches: int | None = None) -> dict:
    n = len(lats)
    out = {"appends": n, "rate": n / elapsed, "p50_ms": pct(lats, 0.5) * 1e3, "p99_ms": pct(lats, 0.99) * 1e3,
           "cpu_us": cpu / max(1, n) * 1e6}
    if switches is not None:
        out["switches"] = switches / max(1, n)
    return out


def time_calls(step, seconds: float, lats: list[float]) -> tuple[float, float]:
    """Call ``step()`` for ``seconds``, adding each call's latency to ``lats``; the wall time
    and process CPU spent."""
    t0, c0 = time.perf_counter(), time.process_time()
    end = t0 + seconds
    while True:
        a = time.perf_counter()
        step()
        b = time.perf_counter()
        lats.append(b - a)
        if b >= end:
            break
    return time.perf_counter() - t0, time.process_time() - c0


def timed_loop(step, seconds: float) -> dict:
    """Call ``step()`` for ``seconds``; latencies, rate and process CPU per call."""
    step()  # warm-up
    lats: list[float] = []
    return summary(lats, *time_calls(step, seconds, lats))


def sediment_one(root: str, seconds: float) -> dict:
    d = tempfile.mkdtemp(prefix="sed-small-", dir=root)
    try:
        engine = sediment.open(d)
        try:
            engine.add_relation("r", SCHEMA)
            table = one_row(0)
            return timed_loop(lambda: engine.append("r", table), seconds)
        finally:
            engine.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)


def sqlite_one(root: str, seconds: float) -> dict:
    d = tempfile.mkdtemp(prefix="sqlite-small-", dir=root)
    try:
        conn = sqlite_table(d)
        try:
            body = os.urandom(PAYLOAD)
            return timed_loop(lambda: conn.execute("INSERT INTO r VALUES (?, ?, 1, 1)", (0, body)), seconds)
        finally:
            conn.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)


def one_writer_sliced(root: str, seconds: float, slices: int) -> tuple[dict, dict]:
    """One writer, sediment and SQLite both open, taking turns of ``seconds / slices`` (which
    goes first alternates): (sediment's figures, SQLite's). Why: on the shared host the disk
    and the CPUs swing between seconds, and turns of 0.1 s put both peers under nearly the
    same conditions, where back-to-back 3 s runs did not. No timed compaction pass (a
    back-to-back round's 3 s ends before the first, at 5 s; here it would run in SQLite's
    turns)."""
    d = tempfile.mkdtemp(prefix="sed-sliced-", dir=root)
    try:
        engine = sediment.open(os.path.join(d, "sed"), compact_interval=None)  # a pass would land in SQLite's turns
        os.mkdir(os.path.join(d, "sqlite"))
        conn = sqlite_table(os.path.join(d, "sqlite"))
        try:
            engine.add_relation("r", SCHEMA)
            table, body = one_row(0), os.urandom(PAYLOAD)
            steps = (lambda: engine.append("r", table),
                     lambda: conn.execute("INSERT INTO r VALUES (?, ?, 1, 1)", (0, body)))
            lats: tuple[list[float], list[float]] = ([], [])
            spent = [0.0, 0.0]
            cpu = [0.0, 0.0]
            for step in steps:
                step()  # warm-up
            for i in range(slices):
                for k in ((0, 1) if i % 2 == 0 else (1, 0)):
                    wall, used = time_calls(steps[k], seconds / slices, lats[k])
                    spent[k] += wall
                    cpu[k] += used
            return summary(lats[0], spent[0], cpu[0]), summary(lats[1], spent[1], cpu[1])
        finally:
            conn.close()
            engine.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)


def run_threads(threads: int, seconds: float, step_for) -> tuple[list[float], float, float, int]:
    """``threads`` threads each calling their ``step_for(k)()`` until ``seconds`` pass;
    (latencies, elapsed, process CPU, the process's voluntary context switches)."""
    lats: list[list[float]] = [[] for _ in range(threads)]
    start = threading.Barrier(threads + 1)
    stop = threading.Event()

    def work(k: int) -> None:
        step, mine = step_for(k), lats[k]
        step()  # warm-up
        start.wait()
        while not stop.is_set():
            a = time.perf_counter()
            step()
            mine.append(time.perf_counter() - a)

    ts = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(threads)]
    for t in ts:
        t.start()
    start.wait()
    t0, c0 = time.perf_counter(), time.process_time()
    v0 = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
    stop.wait(seconds)
    stop.set()
    for t in ts:
        t.join()
    switches = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - v0
    return [x for xs in lats for x in xs], time.perf_counter() - t0, time.process_time() - c0, switches


def group_commits(engine) -> tuple[float, float]:
    """(group commits, WAL records in them) so far, from the engine's own histogram (a
    group's joined appends are one record: wal/group_records.py)."""
    got = {s.name.rsplit("_", 1)[-1]: s.value for s in engine.metrics.group_commit.collect()[0].samples
           if s.name.endswith(("_count", "_sum"))}
    return got.get("count", 0.0), got.get("sum", 0.0)


def sediment_many(root: str, threads: int, seconds: float) -> dict:
    d = tempfile.mkdtemp(prefix="sed-small-many-", dir=root)
    try:
        engine = sediment.open(d)
        try:
            engine.add_relation("r", SCHEMA)
            tables = [one_row(k) for k in range(threads)]
            g0 = group_commits(engine)
            lats, elapsed, cpu, switches = run_threads(threads, seconds,
                                                       lambda k: lambda: engine.append("r", tables[k]))
            g1 = group_commits(engine)
        finally:
            engine.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    out = summary(lats, elapsed, cpu, switches)
    appends = len(lats) + threads  # with the warm-up's
    out["per_sync"] = appends / max(1.0, g1[0] - g0[0])  # one on_durable call, one histogram count, per group commit
    out["per_record"] = appends / max(1.0, g1[1] - g0[1])
    return out


def loop_sync(root: str | None):
    """None, or (for ``--loop-sync``) a function the loops' draining thread calls per group:
    a ``pwrite`` of 100 B per append and an ``fdatasync``, into a file under ``root``."""
    if root is None:
        return None
    fd = os.open(os.path.join(tempfile.mkdtemp(prefix="loop-sync-", dir=root), "f"), os.O_RDWR | os.O_CREAT)
    os.ftruncate(fd, 1 << 20)

    def sync(n: int) -> None:
        os.pwrite(fd, b"x" * min(ROW_BYTES * n, 1 << 20), 0)
        os.fdatasync(fd)
    return sync


def bare_loop(threads: int, seconds: float, sync=None) -> dict:  # noqa: ANN001
    """The threading ceiling: tickets on a bare Lock, queued under one lock; one thread
    takes the whole queue and releases them (what a group commit does minus the work);
    with ``sync`` (:func:`loop_sync`), after writing and syncing the group."""
    lock = threading.Lock()
    ready = threading.Condition(lock)
    queue: list[threading.Lock] = []
    done = threading.Event()

    def drain() -> None:
        while not done.is_set():
            with lock:
                while not queue and not done.is_set():
                    ready.wait(0.05)
                batch = queue[:]
                queue.clear()
            if sync is not None and batch:
                sync(len(batch))
            for t in batch:
                t.release()

    def step_for(_k: int):
        def step() -> None:
            t = threading.Lock()
            t.acquire()
            with lock:
                queue.append(t)
                ready.notify()
            t.acquire()
        return step

    drainer = threading.Thread(target=drain, daemon=True)
    drainer.start()
    try:
        lats, elapsed, cpu, switches = run_threads(threads, seconds, step_for)
    finally:
        done.set()
        drainer.join()
    return summary(lats, elapsed, cpu, switches)


class _LoopBell:
    """An eventfd closed when the last thread holding it lets go (as wal/group_commit.py's)."""

    def __init__(self) -> None:
        self.fd = os.eventfd(0, os.EFD_SEMAPHORE | os.EFD_CLOEXEC)

    def __del__(self, _close=os.close) -> None:  # noqa: ANN001
        _close(self.fd)


def bell_loop(threads: int, seconds: float, sync=None) -> dict:  # noqa: ANN001
    """The bare loop with its threads woken another way: they queue under one lock and sleep
    on the queue's eventfd (semaphore mode); the draining thread takes the queue with its
    eventfd (and with ``sync`` writes and syncs the group) and wakes them all with one write
    of their count."""
    lock = threading.Lock()
    ready = threading.Condition(lock)
    queue: list[None] = []
    current = [_LoopBell()]
    done = threading.Event()

    def drain() -> None:
        while not done.is_set():
            with lock:
                while not queue and not done.is_set():
                    ready.wait(0.05)
                n = len(queue)
                queue.clear()
                bell = current[0]
                if n:
                    current[0] = _LoopBell()
            if n:
                if sync is not None:
                    sync(n)
                os.eventfd_write(bell.fd, n)
            del bell

    def step_for(_k: int):
        def step() -> None:
            with lock:
                bell = current[0]
                queue.append(None)
                ready.notify()
            os.eventfd_read(bell.fd)
        return step

    drainer = threading.Thread(target=drain, daemon=True)
    drainer.start()
    try:
        lats, elapsed, cpu, switches = run_threads(threads, seconds, step_for)
    finally:
        done.set()
        drainer.join()
    return summary(lats, elapsed, cpu, switches)


def med(runs: list[dict], key: str) -> tuple[float, float, float]:
    xs = [r[key] for r in runs]
    return statistics.median(xs), min(xs), max(xs)


def fmt(runs: list[dict], key: str, unit: str = "", digits: int = 0) -> str:
    m, lo, hi = med(runs, key)
    return f"{m:,.{digits}f}{unit} ({lo:,.{digits}f}-{hi:,.{digits}f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--threads", type=int, default=64)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--json", help="also write every round's figures to this file")
    ap.add_argument("--slices", type=int, default=0,
                    help="one writer: sediment and SQLite open together, taking turns in this many slices per round "
                         "(0: each its own back-to-back run)")
    ap.add_argument("--many", action="store_true", help="only the many-writer cases (sediment and the bare loop)")
    ap.add_argument("--bell-loop", action="store_true",
                    help="also the bare loop with one eventfd per group in place of a lock per waiter")
    ap.add_argument("--loop-sync", metavar="DIR", help="the loops write 100 B per append and fdatasync each "
                    "group, into a file under DIR")
    ap.add_argument("--build", help="a checkout of the repository to run instead of this one (read before "
                    "sediment is imported; see bench/small_writes_cpu.py)")
    a = ap.parse_args(argv)
    cases = {"sediment 1": lambda: sediment_one(a.dir, a.seconds), "sqlite 1": lambda: sqlite_one(a.dir, a.seconds),
             f"sediment {a.threads}": lambda: sediment_many(a.dir, a.threads, a.seconds),
             f"bare loop {a.threads}": lambda: bare_loop(a.threads, a.seconds, loop_sync(a.loop_sync))}
    if a.many:
        del cases["sediment 1"], cases["sqlite 1"]
    if a.bell_loop:
        cases[f"bell loop {a.threads}"] = lambda: bell_loop(a.threads, a.seconds, loop_sync(a.loop_sync))
    if a.slices:
        turns: list[dict] = []

        def sliced_sediment() -> dict:
            got = one_writer_sliced(a.dir, a.seconds, a.slices)
            turns.append(got[1])
            return got[0]

        cases["sediment 1"] = sliced_sediment
        cases["sqlite 1"] = lambda: turns.pop()
    res: dict[str, list[dict]] = {k: [] for k in cases}
    loads = [os.getloadavg()[0]]
    for i in range(a.rounds):
        for name, case in cases.items():
            r = case()
            res[name].append(r)
            print(f"round {i + 1} {name}: {r['rate']:,.0f}/s p50 {r['p50_ms']:.2f} ms p99 {r['p99_ms']:.2f} ms "
                  f"CPU {r['cpu_us']:.0f} us/append" + (f" {r['switches']:.2f} switches/append" if "switches" in r
                                                        else "") + (f" {r['per_sync']:.1f}/sync {r['per_record']:.1f}/record"
                                                        if "per_sync" in r else ""),
                  file=sys.stderr)
        loads.append(os.getloadavg()[0])
    ratios = [s["rate"] / q["rate"] for s, q in zip(res.get("sediment 1", []), res.get("sqlite 1", []), strict=True)]
    ceil = [s["rate"] / q["rate"] for s, q in zip(res[f"sediment {a.threads}"], res[f"bare loop {a.threads}"],
                                                  strict=True)]
    print(f"load average {min(loads):.1f}-{max(loads):.1f}, {a.rounds} rounds x {a.seconds} s, medians (min-max)")
    print("| case | appends/s | p50 ms | p99 ms | CPU us/append |")
    print("| --- | --- | --- | --- | --- |")
    for name, runs in res.items():
        print(f"| {name} | {fmt(runs, 'rate')} | {fmt(runs, 'p50_ms', digits=2)} | {fmt(runs, 'p99_ms', digits=2)} "
              f"| {fmt(runs, 'cpu_us')} |")
    if ratios:
        print(f"one writer, sediment / SQLite per round: {statistics.median(ratios):.2f}x "
              f"({min(ratios):.2f}-{max(ratios):.2f})")
    print(f"{a.threads} writers, sediment / bare loop per round: {statistics.median(ceil):.2f}x "
          f"({min(ceil):.2f}-{max(ceil):.2f}); appends per fdatasync {fmt(res[f'sediment {a.threads}'], 'per_sync', digits=1)}"
          f", per WAL record {fmt(res[f'sediment {a.threads}'], 'per_record', digits=1)}; voluntary context "
          f"switches per append {fmt(res[f'sediment {a.threads}'], 'switches', digits=2)} (bare loop "
          f"{fmt(res[f'bare loop {a.threads}'], 'switches', digits=2)})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rounds": res, "load": loads}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
