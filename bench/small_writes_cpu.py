"""CPU per one-row durable append with the disk taken out: the log on tmpfs (/dev/shm),
where fdatasync costs next to nothing, so what is left is the Python of the write path.

Why: on the shared machine the disk swings SQLite's one-row commits by 30x between
minutes, and the rates of bench/small_writes.py move with it; the CPU an append costs
does not. Two figures, each the least of several repetitions (the least is the run the
other sessions disturbed least):

* one writer: the caller thread's CPU per ``Engine.append`` of one row (it leads its
  own group, so the whole path runs there), least of 15 x 1,000 appends;
* one writer after a pause: the same, each append after a 100 us sleep (on the disk the
  caller sleeps in every fdatasync, and the path then runs with cold caches and branch
  history, about twice its hot cost), the CPU of the append calls alone, least of 5 x 1,000;
* 64 writer threads: the process's CPU per append, least of 3 x 64 x 150 appends;
* a compaction pass over 20,000 one-row records beside two busy Python threads (the
  writers' stand-in): its thread CPU and wall time per record, least of 3. A pass that
  releases the interpreter lock per record waits to get it back each time.

``--build DIR`` runs another checkout of the repository (``git archive`` of a commit,
unpacked) through this virtualenv, for builds compared A B A B:

    for i in 1 2 3; do python bench/small_writes_cpu.py --build /tmp/before; python bench/small_writes_cpu.py; done
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time


def use_build(root: str) -> None:
    """Import sediment from ``root`` instead of this checkout (the editable install's finder)."""
    import __editable___sediment_engine_0_1_0_finder as finder  # noqa: PLC0415 - only for --build
    here = os.path.dirname(finder.MAPPING["sediment"])  # the checkout the virtualenv was installed from
    for name, path in list(finder.MAPPING.items()):
        finder.MAPPING[name] = path.replace(here, os.path.abspath(root))


def one_row(pa, k: int = 0):  # noqa: ANN001 - pyarrow is imported after use_build
    return pa.table({"id": pa.array([k], pa.int64()), "payload": pa.array([os.urandom(76)], pa.binary()),
                     "time": pa.array([1], pa.int64()), "diff": pa.array([1], pa.int64())})


def spin(stop: threading.Event, used: list[float]) -> None:
    """Run Python until ``stop``; add this thread's CPU to ``used``."""
    c0 = time.thread_time()
    while not stop.is_set():
        pass
    used.append(time.thread_time() - c0)


def measure_pass(directory: str, records: int = 20_000) -> tuple[float, float]:
    """(CPU, wall) in us per record of ``Engine.compact`` over ``records`` one-row appends,
    while two threads spin in Python; least of 3. The CPU is the process's less the
    spinners' (the pass may run on the scheduler's thread, woken by the segment's finish)."""
    import pyarrow as pa  # noqa: PLC0415 - after use_build

    import sediment  # noqa: PLC0415
    from sediment.clock import ManualClock  # noqa: PLC0415

    cpu, wall = [], []
    for _ in range(3):
        d = tempfile.mkdtemp(prefix="sed-pass-", dir=directory)
        try:
            with sediment.open(d, clock=ManualClock(), compact_interval=None) as engine:
                engine.add_relation("r", pa.schema([("id", pa.int64()), ("payload", pa.binary())]))
                for k in range(records):
                    engine.append("r", one_row(pa, k))
                engine.seal("r", 1)
                stop, used = threading.Event(), []
                spinners = [threading.Thread(target=spin, args=(stop, used)) for _ in range(2)]
                c0, w0 = time.process_time(), time.perf_counter()
                for t in spinners:
                    t.start()
                engine.compact("r")
                w1 = time.perf_counter()
                stop.set()
                for t in spinners:
                    t.join()
                cpu.append((time.process_time() - c0 - sum(used)) / records * 1e6)
                wall.append((w1 - w0) / records * 1e6)
        finally:
            shutil.rmtree(d, ignore_errors=True)
    return min(cpu), min(wall)


def after_pause(engine, table, n: int = 1000) -> float:  # noqa: ANN001 - pyarrow is imported after use_build
    """Thread CPU in us per append, each made after a 100 us sleep (the sleep not counted)."""
    clock, pause, append = time.thread_time_ns, time.sleep, engine.append
    used = 0
    for _ in range(n):
        pause(0.0001)
        c0 = clock()
        append("r", table)
        used += clock() - c0
    return used / n / 1000


def measure(directory: str) -> tuple[float, float, float]:
    import pyarrow as pa  # noqa: PLC0415 - after use_build

    import sediment  # noqa: PLC0415

    table = one_row(pa)
    d = tempfile.mkdtemp(prefix="sed-cpu-", dir=directory)
    try:
        engine = sediment.open(d)
        try:
            engine.add_relation("r", pa.schema([("id", pa.int64()), ("payload", pa.binary())]))
            for _ in range(1000):
                engine.append("r", table)
            one = []
            for _ in range(15):
                c0 = time.thread_time()
                for _ in range(1000):
                    engine.append("r", table)
                one.append((time.thread_time() - c0) / 1000 * 1e6)
            cold = [after_pause(engine, table) for _ in range(5)]

            def work() -> None:
                for _ in range(150):
                    engine.append("r", table)

            many = []
            for _ in range(3):
                threads = [threading.Thread(target=work) for _ in range(64)]
                c0 = time.process_time()
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                many.append((time.process_time() - c0) / (64 * 150) * 1e6)
            return min(one), min(cold), min(many)
        finally:
            engine.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", help="a checkout of the repository to run instead of this one")
    ap.add_argument("--dir", default="/dev/shm")
    a = ap.parse_args(argv)
    if a.build:
        use_build(a.build)
    one, cold, many = measure(a.dir)
    pass_cpu, pass_wall = measure_pass(a.dir)
    import sediment.engine.writer  # noqa: PLC0415 - which checkout ran

    if a.build and not os.path.abspath(sediment.engine.writer.__file__).startswith(os.path.abspath(a.build)):
        raise SystemExit(f"--build {a.build}: ran {sediment.engine.writer.__file__} instead")
    print(f"{a.build or 'this build'}: one writer {one:.2f} us thread CPU per append, {cold:.1f} after a pause; "
          f"64 writers {many:.1f} us process CPU per append; compaction pass beside 2 busy threads "
          f"{pass_cpu:.1f} us CPU, {pass_wall:.0f} us wall per record (load {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
