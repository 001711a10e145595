"""Benchmark of the raw-device ring WAL (wal/device/log.py) against a plain Direct I/O writer.

Why: the ring's value is durable appends close to what the device can do, and fast
recovery. So in one run we measure, on the same file system:

* durable append throughput and latency (p50/p99) for 1 KiB, 4 KiB and 64 KiB records
  with one and with several concurrent appenders, beside a plain writer: the same number
  of threads each doing aligned O_DIRECT|O_DSYNC pwrites (the ring's own sync discipline)
  of the same size from a reused aligned buffer, one at a time (the same queue depth), and
  fio with the same settings when it is installed. Both write over blocks written before, as
  on a device: the ring writes its data area at creation, the plain writer's file is written
  through once before it is timed (a durable write into a fallocated, never written extent
  costs about twice as much here, which made a short run measure mostly the file system's
  first pass). The ring's figure is everything an
  append costs: the Record, ``DeviceLog.submit`` with an ``on_durable`` callback and the
  ticket's ``wait`` (the engine's calls), placement, the write and completion. Tables 1
  and 2: one record outstanding per appender; table 3: each keeps ``--depth`` submit() tickets in
  flight, against a plain writer/fio with threads x depth threads. Rounds alternate ring,
  plain, fio; each row shows medians, the min-max of the per-round ratio, the CPU
  time (all threads) per append of the ring and of the plain writer, which the machine's
  load moves far less than the bandwidth, their context switches per append, and the
  ring's appends per data write (``a/w``: 1.00 when no two appends shared a block write),
  its waits per append for an older write after its own had finished (``wt/a``: the
  price of acknowledging in log order), the mean writes in flight as one starts (``qd``)
  and header writes per append (``hdr/a``); with ``--ordered``, the plain writer again
  with completion in log order (``o/pl``: its share of the plain writer; ``r/o``: the
  ring's share of it), which separates the cost of ordering from the ring's own;
* with ``--python-us``, the plain writer again with that much Python before each write:
  what the interpreter's share of an append costs a writer;
* recovery scan speed for a ring filled with ``--recovery-mib`` of records.

    .venv/bin/python bench/device.py                 # full run (1 GiB recovery ring)
    .venv/bin/python bench/device.py --quick         # a few seconds, 128 MiB recovery ring

A/B against another build (``git archive`` of a commit, unpacked), runs alternated; on a
shared disk, ``--slices`` alternates ring and plain writer within each case, and ``--cpu``
measures the CPU per append apart from the disk:

    for i in 1 2 3; do .venv/bin/python bench/device.py --repeat 1 --no-recovery --slices 30 --build /tmp/before; \
        .venv/bin/python bench/device.py --repeat 1 --no-recovery --slices 30; done
    .venv/bin/python bench/device.py --no-recovery --threads 1 --depth 1 --seconds 0.2 --cpu /dev/shm
    .venv/bin/python bench/device.py --no-recovery --threads 1 --depth 1 --seconds 0.2 --cpu /dev/shm --noop-cpu
    .venv/bin/python bench/device.py --no-recovery --threads 1 --depth 1 --seconds 0.2 --thread-cpu 6
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import mmap
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

if "--build" in sys.argv[:-1]:  # before sediment is imported: another checkout, for A/B runs
    from small_writes_cpu import use_build

    use_build(sys.argv[sys.argv.index("--build") + 1])

from sediment.wal.device.log import DeviceLog  # noqa: E402
from sediment.wal.record import HEADER_SIZE, Record, RecordKind  # noqa: E402

MiB = 1024 * 1024


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def run_threads(work, threads: int) -> tuple[float, float, float]:
    """Run ``work(k)`` on ``threads`` threads; wall seconds, CPU seconds of the process (all
    threads) and its context switches (voluntary and not, every thread, ended ones too:
    each is a sleep or a preemption, which is where the interpreter lock's hand-offs show)."""
    u0 = resource.getrusage(resource.RUSAGE_SELF)
    c0 = time.process_time()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(work, range(threads)))  # re-raises a thread's failure
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - c0
    u1 = resource.getrusage(resource.RUSAGE_SELF)
    return elapsed, cpu, (u1.ru_nvcsw + u1.ru_nivcsw) - (u0.ru_nvcsw + u0.ru_nivcsw)


def interleave(*runs: Iterator[None]) -> list:
    """Drive generator benchmarks (:func:`bench_ring`, :func:`bench_plain`) a slice each in
    turn; their results. Why: the shared disk here swings by 2x within seconds, and a ring
    timed over one stretch against a plain writer timed over the next measured mostly which
    stretch was slower; slices alternated over the same seconds see the same disk."""
    results: list = [None] * len(runs)
    live = list(enumerate(runs))
    while live:
        for item in list(live):
            try:
                next(item[1])
            except StopIteration as stop:
                results[item[0]] = stop.value
                live.remove(item)
    return results


def summary(lats: list[list[float]], size: int, elapsed: float, cpu: float, switches: float) -> dict:
    all_l = [x for xs in lats for x in xs]
    n = max(1, len(all_l))
    return {"ops": len(all_l), "mbps": len(all_l) * size / elapsed / 1e6, "p50": pct(all_l, 0.5) * 1e3,
            "p99": pct(all_l, 0.99) * 1e3, "cpu_us": cpu / n * 1e6, "cs": switches / n}


def bench_ring(path: str, size: int, threads: int, seconds: float, ring_bytes: int, depth: int = 1,
               io_threads: int | None = None, slices: int = 1) -> Iterator[None]:
    """Appenders each append one record of ``size`` bytes (frame included) at a time
    (``depth`` 1: ``submit`` with an ``on_durable`` callback, then ``wait``, as the engine
    appends), or keep ``depth`` ``submit`` tickets in flight each. Latency: from the call
    to the moment the record is known durable. A generator of ``slices`` runs of
    ``seconds / slices`` each over the same ring (see :func:`interleave`); returns the
    summary."""
    if os.path.exists(path):
        os.unlink(path)
    kw = {} if io_threads is None else {"io_threads": io_threads}
    # os.pwrite itself, as the engine opens it: a counting wrapper cost the ring a Python call per
    # write that no engine append pays; the writer counts its data writes (appends per write)
    log = DeviceLog.open(path, ring_bytes, create=True, segment_bytes=ring_bytes // 8, full_timeout=60, **kw)
    log.set_finish_listener(log.trim)
    body = os.urandom(size - HEADER_SIZE)
    stop = 0.0
    lats: list[list[float]] = [[] for _ in range(threads)]

    durable = [0] * threads

    def work(k: int) -> None:
        mine = lats[k]

        def on_durable(records: list[Record]) -> None:
            durable[k] += len(records)

        if depth == 1:
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                log.submit([Record(RecordKind.UPDATES, relation_id=k, body=body)], on_durable).wait()
                mine.append(time.perf_counter() - t0)
            return
        q: collections.deque = collections.deque()
        while time.monotonic() < stop or q:
            if time.monotonic() < stop:
                q.append((time.perf_counter(), log.submit([Record(RecordKind.UPDATES, relation_id=k, body=body)])))
            if len(q) >= depth or time.monotonic() >= stop:
                t0, ticket = q.popleft()
                ticket.wait()
                mine.append(time.perf_counter() - t0)

    head0 = log.head.writes
    elapsed = cpu = switches = 0.0
    for _ in range(slices):
        yield
        stop = time.monotonic() + seconds / slices
        e, c, w = run_threads(work, threads)
        elapsed, cpu, switches = elapsed + e, cpu + c, switches + w
    direct = log.direct_io
    counts, heads = log.writer.counts, log.head.writes - head0
    log.close()
    os.unlink(path)
    out = summary(lats, size, elapsed, cpu, switches)
    assert depth > 1 or sum(durable) == out["ops"], "an acknowledged append missed its on_durable call"
    n = max(1, out["ops"])
    return {**out, "direct": direct, "per_write": out["ops"] / max(1, counts.writes), "waits": counts.waits_for_older / n,
            "qd": 1 + counts.inflight_at_start / max(1, counts.writes), "headers": heads / n}


class InOrder:
    """Completion in log order for the plain writer (``--ordered``): a writer takes a
    ticket before its write and, after it, returns only once every earlier ticket's write
    has returned, the last of them waking it; the least Python that acknowledging in log
    order takes, so the peer shows what the ring's ordering alone costs."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.next = 0
        self.done = 0  # every ticket below this has returned
        self.returned: set[int] = set()
        self.sleepers: dict[int, threading.Lock] = {}

    def ticket(self) -> int:
        with self.lock:
            self.next += 1
            return self.next - 1

    def finish(self, t: int) -> None:
        wake = []
        with self.lock:
            self.returned.add(t)
            while self.done in self.returned:
                self.returned.discard(self.done)
                w = self.sleepers.pop(self.done, None)
                if w is not None:
                    wake.append(w)
                self.done += 1
            mine = None
            if self.done <= t:
                mine = self.sleepers[t] = threading.Lock()
                mine.acquire()
        for w in wake:
            w.release()
        if mine is not None:
            mine.acquire()


def write_through(fd: int, size: int) -> None:
    """Write zeros over the first ``size`` bytes of ``fd`` (an O_DIRECT descriptor), untimed:
    a device has no unwritten extents, and a durable write into a fallocated one costs about
    twice a later write there (the ring writes its data area at creation for that reason)."""
    chunk = 4 << 20
    with mmap.mmap(-1, chunk) as buf:
        for at in range(0, size, chunk):
            os.pwrite(fd, memoryview(buf)[:min(chunk, size - at)], at)


def bench_plain(path: str, size: int, threads: int, seconds: float, file_bytes: int, python_us: float = 0,
                ordered: bool = False, slices: int = 1) -> Iterator[None]:
    """Each thread: aligned O_DIRECT|O_DSYNC pwrite of ``size`` bytes (a multiple of the
    512-byte logical block) at the next sequential offset, one at a time. ``python_us``:
    that many microseconds of Python (a busy loop, holding the interpreter lock) before
    each write, to show what the interpreter's share of an append costs a writer.
    ``ordered``: writes return in the order they were issued (:class:`InOrder`). A generator
    of slices, as :func:`bench_ring`."""
    wsize = (size + 511) // 512 * 512
    if os.path.exists(path):
        os.unlink(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT | os.O_DSYNC, 0o644)
    os.posix_fallocate(fd, 0, file_bytes)
    write_through(fd, file_bytes)
    slots = file_bytes // wsize
    counter = itertools.count()
    order = InOrder() if ordered else None
    stop = 0.0
    lats: list[list[float]] = [[] for _ in range(threads)]

    def work(k: int) -> None:
        buf = mmap.mmap(-1, wsize)
        buf[:] = os.urandom(wsize)
        view = memoryview(buf)
        mine = lats[k]
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            seq = next(counter) if order is None else order.ticket()
            if python_us:
                busy = t0 + python_us / 1e6
                while time.perf_counter() < busy:
                    pass
            os.pwrite(fd, view, seq % slots * wsize)
            if order is not None:
                order.finish(seq)
            mine.append(time.perf_counter() - t0)

    elapsed = cpu = switches = 0.0
    for _ in range(slices):
        yield
        stop = time.monotonic() + seconds / slices
        e, c, w = run_threads(work, threads)
        elapsed, cpu, switches = elapsed + e, cpu + c, switches + w
    os.close(fd)
    os.unlink(path)
    return summary(lats, size, elapsed, cpu, switches)


def bench_fio(path: str, size: int, threads: int, seconds: float, file_bytes: int) -> dict | None:
    if shutil.which("fio") is None:
        return None
    wsize = (size + 511) // 512 * 512
    cmd = ["fio", "--name=plain", f"--filename={path}", "--rw=write", f"--bs={wsize}", "--direct=1",
           "--sync=dsync", "--ioengine=psync", f"--numjobs={threads}", "--thread", "--group_reporting",
           f"--size={file_bytes}", "--time_based", f"--runtime={seconds}", "--output-format=json",
           f"--offset_increment={file_bytes}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if os.path.exists(path):
        os.unlink(path)
    if out.returncode:
        return None
    w = json.loads(out.stdout)["jobs"][0]["write"]
    pctl = w["clat_ns"].get("percentile", {})
    return {"mbps": w["bw_bytes"] * size / wsize / 1e6, "p50": pctl.get("50.000000", 0) / 1e6,
            "p99": pctl.get("99.000000", 0) / 1e6}


def median_run(runs: list[dict]) -> dict:
    """Per key, the median over repeated runs (the machine may be shared and noisy)."""
    return {k: (statistics.median(r[k] for r in runs) if isinstance(runs[0][k], float | int) and not
                isinstance(runs[0][k], bool) else runs[0][k]) for k in runs[0]}


def print_case(size: int, runs: list[tuple]) -> None:
    """One row: medians over the rounds, and the ratio's median and min-max per round;
    then the ring's waits for older writes per append, mean writes in flight when one
    starts and header writes per append; then fio and the ordered peer when measured."""
    r = median_run([x[0] for x in runs])
    p = median_run([x[1] for x in runs])
    ratios = [x[0]["mbps"] / x[1]["mbps"] for x in runs]
    f = median_run([x[2] for x in runs]) if all(x[2] for x in runs) else None
    fio = f"{f['mbps']:8.1f} {r['mbps'] / f['mbps']:6.2f}" if f else f"{'-':>8} {'-':>6}"
    o = median_run([x[3] for x in runs]) if all(x[3] for x in runs) else None
    ordered = (f" | {o['mbps']:8.1f} {statistics.median(x[3]['mbps'] / x[1]['mbps'] for x in runs):5.2f} "
               f"{statistics.median(x[0]['mbps'] / x[3]['mbps'] for x in runs):5.2f}" if o else "")
    spread = f"{min(ratios):.2f}-{max(ratios):.2f}"
    print(f"{size // 1024:>5}Ki | {r['mbps']:9.1f} {r['p50']:7.2f} {r['p99']:7.2f} | {p['mbps']:10.1f} "
          f"{p['p50']:7.2f} {p['p99']:7.2f} | {statistics.median(ratios):6.2f} {spread:>9} | "
          f"{r['cpu_us']:6.1f} {p['cpu_us']:6.1f} | {r['cs']:5.1f} {p['cs']:5.1f} | {r['per_write']:5.2f} "
          f"{r['waits']:5.2f} {r['qd']:4.1f} {r['headers']:6.4f} | {fio}{ordered}"
          + ("" if r["direct"] else "  (ring fell back to buffered I/O)"), flush=True)


def bench_recovery(path: str, fill_bytes: int, record: int) -> dict:
    cap = fill_bytes + 64 * MiB
    if os.path.exists(path):
        os.unlink(path)
    log = DeviceLog.open(path, cap, create=True, segment_bytes=1 << 62, max_block_bytes=1 * MiB)
    body = os.urandom(record - HEADER_SIZE)
    batch = 256
    written = 0
    t0 = time.perf_counter()
    while written < fill_bytes:
        log.append([Record(RecordKind.UPDATES, relation_id=1, body=body) for _ in range(batch)])
        written += batch * record
    fill_s = time.perf_counter() - t0
    # a crash image: copy the header as it is while running, then close
    with open(path, "rb") as f:
        header = f.read(8192)
    log.close()
    with open(path, "r+b") as f:
        f.write(header)
        f.flush()
        os.fsync(f.fileno())
    with open(path, "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    t0 = time.perf_counter()
    log = DeviceLog.open(path)
    secs = time.perf_counter() - t0
    n = log.report.records
    log.close()
    os.unlink(path)
    return {"bytes": written, "records": n, "secs": secs, "mbps": written / secs / 1e6, "fill_s": fill_s}


def noop_pwrite(fd: int, view: memoryview, offset: int) -> int:
    """A block write that writes nothing (``--noop-cpu``): the ring's own work alone."""
    return len(view)


def append_cpu(directory: str, size: int, pause_us: float, n: int = 2000, reps: int = 7,
               noop: bool = False) -> tuple[float, float]:
    """Thread CPU (us) per append of one ``size``-byte record (``submit`` with an
    ``on_durable`` callback, then ``wait``, as the engine appends) on a ring in ``directory``
    (tmpfs: no Direct I/O, the write is a copy into memory; ``noop``: the ring's block writes
    write nothing), and per aligned ``pwrite`` of the same size by a plain writer there;
    least of ``reps`` x ``n``. With ``pause_us``, each append (write) follows a sleep and
    only its own CPU counts: on a device the appender sleeps in every write and runs its
    path with cold caches.

    Why: the disk here swings the bandwidth ratios by 2x between seconds; the CPU an append
    costs the caller's thread is what a change to the ring's path moves."""
    path = os.path.join(directory, f"sediment-cpu-{os.getpid()}")
    log = DeviceLog.open(path, 64 * MiB, create=True, segment_bytes=8 * MiB, full_timeout=60, direct=False,
                         **({"pwrite": noop_pwrite} if noop else {}))
    log.set_finish_listener(log.trim)
    body = os.urandom(size - HEADER_SIZE)
    fd = os.open(path + ".plain", os.O_RDWR | os.O_CREAT, 0o644)
    buf = mmap.mmap(-1, size)
    view = memoryview(buf)
    slots = 64 * MiB // size
    ring_best = plain_best = float("inf")

    def noop(records: list[Record]) -> None:
        pass

    try:
        for _ in range(reps):
            for side in ("ring", "plain"):
                used = 0.0
                for i in range(n):
                    if pause_us:
                        time.sleep(pause_us / 1e6)
                    c0 = time.thread_time()
                    if side == "ring":
                        log.submit([Record(RecordKind.UPDATES, relation_id=1, body=body)], noop).wait()
                    else:
                        os.pwrite(fd, view, i % slots * size)
                    used += time.thread_time() - c0
                if side == "ring":
                    ring_best = min(ring_best, used / n * 1e6)
                else:
                    plain_best = min(plain_best, used / n * 1e6)
    finally:
        log.close()
        os.close(fd)
        for p in (path, path + ".plain"):
            os.unlink(p)
    return ring_best, plain_best


def disk_thread_cpu(directory: str, size: int, seconds: float) -> dict:
    """On the file system of ``directory``, one appender: the appending thread's CPU per
    append (user, and user + system) for the ring (``submit`` + ``wait``, as the engine
    appends) and for the plain writer (``pwrite``), alternating every 0.1 s, and their
    appends per second. Why: the whole process's CPU also counts the ring's I/O threads, and
    the disk's swings move the system time of both; the user time the appender adds over a
    plain writer is what a change to the ring's path moves."""
    ring = DeviceLog.open(os.path.join(directory, "cpu-ring"), 256 * MiB, create=True, segment_bytes=32 * MiB,
                          full_timeout=60)
    ring.set_finish_listener(ring.trim)
    plain = os.path.join(directory, "cpu-plain")
    fd = os.open(plain, os.O_RDWR | os.O_CREAT | os.O_DIRECT | os.O_DSYNC, 0o644)
    os.posix_fallocate(fd, 0, 256 * MiB)
    write_through(fd, 256 * MiB)
    buf = mmap.mmap(-1, size)
    buf[:] = os.urandom(size)
    view = memoryview(buf)
    body = os.urandom(size - HEADER_SIZE)
    slots, seq = 256 * MiB // size, 0
    acc = {side: [0.0, 0.0, 0, 0.0] for side in ("ring", "plain")}  # user, user + system, appends, seconds

    def noop(records: list[Record]) -> None:
        pass

    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for side, a in acc.items():
                stop = time.monotonic() + 0.1
                u0, c0, w0, n = resource.getrusage(resource.RUSAGE_THREAD), time.thread_time(), time.perf_counter(), 0
                while time.monotonic() < stop:
                    if side == "ring":
                        ring.submit([Record(RecordKind.UPDATES, relation_id=1, body=body)], noop).wait()
                    else:
                        os.pwrite(fd, view, seq % slots * size)
                        seq += 1
                    n += 1
                a[1] += time.thread_time() - c0
                a[0] += resource.getrusage(resource.RUSAGE_THREAD).ru_utime - u0.ru_utime
                a[2] += n
                a[3] += time.perf_counter() - w0
    finally:
        ring.close()
        os.close(fd)
        os.unlink(os.path.join(directory, "cpu-ring"))
        os.unlink(plain)
    return {side: {"user": a[0] / a[2] * 1e6, "cpu": a[1] / a[2] * 1e6, "rate": a[2] / a[3]} for side, a in acc.items()}


def interpreter_share(plain: str, a: argparse.Namespace, extra_us: list[float]) -> None:
    """The plain writer at the last appender count, with and without ``extra_us`` of Python
    before each write, rounds alternating: how much a writer's throughput depends on the
    Python it runs per write (the ring runs about 10 us per append on one thread)."""
    threads = int(a.threads.split(",")[-1])
    print(f"-- the interpreter's share: {threads} plain writers, N us of Python before each write, against none")
    for size in (int(x) for x in a.sizes.split(",")):
        rounds = [[interleave(bench_plain(plain, size, threads, a.seconds, a.ring_mib * MiB, us))[0]
                   for us in [0.0, *extra_us]] for _ in range(a.repeat)]
        for i, us in enumerate(extra_us, 1):
            ratios = [r[i]["mbps"] / r[0]["mbps"] for r in rounds]
            med = median_run([r[i] for r in rounds])
            print(f"{size // 1024:>5}Ki | +{us:g} us: {statistics.median(ratios):.2f} ({min(ratios):.2f}-"
                  f"{max(ratios):.2f}) of the plain writer | CPU {med['cpu_us']:.1f} us/write | "
                  f"{med['cs']:.1f} switches/write", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None, help="directory on the file system to test (default: a temp dir)")
    ap.add_argument("--threads", default="1,8", help="appender counts, comma-separated (a table each)")
    ap.add_argument("--io-threads", type=int, default=None, help="the ring's I/O slots (default: DeviceLog's)")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--ring-mib", type=int, default=256)
    ap.add_argument("--recovery-mib", type=int, default=1024)
    ap.add_argument("--recovery-record", type=int, default=4096)
    ap.add_argument("--sizes", default="1024,4096,65536", help="record sizes in bytes, frame included")
    ap.add_argument("--python-us", default="", help="also run the plain writer with these microseconds of "
                    "Python before each write (comma-separated), against none: the interpreter's share")
    ap.add_argument("--ordered", action="store_true", help="also run the plain writer with completion in "
                    "log order (the least Python that takes): what the ring's ordering alone costs")
    ap.add_argument("--depth", type=int, default=4, help="submit() tickets in flight per appender, second table")
    ap.add_argument("--repeat", type=int, default=3, help="runs per case, alternating; medians are shown")
    ap.add_argument("--quick", action="store_true", help="1.5 s per case, one run, 128 MiB recovery ring")
    ap.add_argument("--build", help="a checkout of the repository to run instead of this one (read before "
                    "sediment is imported; see bench/small_writes_cpu.py)")
    ap.add_argument("--slices", type=int, default=1, help="split each case's seconds into this many slices, "
                    "ring and plain writer alternating (the disk's swings then fall on both alike)")
    ap.add_argument("--cpu", metavar="DIR", help="also measure the thread CPU per append on a ring in DIR "
                    "(a tmpfs such as /dev/shm), back to back and after a sleep, beside a plain writer there")
    ap.add_argument("--noop-cpu", action="store_true", help="with --cpu: the ring's block writes write nothing "
                    "(its own CPU per append; least of 9 x 5,000 back to back, 5 x 1,000 after a sleep)")
    ap.add_argument("--thread-cpu", type=float, metavar="SECONDS", help="also measure, on the disk, the appending "
                    "thread's CPU per append of one appender against a plain writer, alternating every 0.1 s")
    ap.add_argument("--no-recovery", action="store_true", help="skip the recovery scan (A/B runs of appends)")
    a = ap.parse_args(argv)
    if a.quick:
        a.seconds, a.recovery_mib, a.repeat = 1.5, 128, 1
    d = tempfile.mkdtemp(prefix="sediment-bench-", dir=a.dir)
    try:
        ring = os.path.join(d, "ring")
        plain = os.path.join(d, "plain")
        print(f"dir={d} threads={a.threads} seconds={a.seconds} repeat={a.repeat} ring={a.ring_mib} MiB "
              f"fio={shutil.which('fio')} load={os.getloadavg()[0]:.1f} cpus={os.cpu_count()}")
        print(f"{'record':>7} | {'ring MB/s':>9} {'p50 ms':>7} {'p99 ms':>7} | {'plain MB/s':>10} {'p50 ms':>7} "
              f"{'p99 ms':>7} | {'ratio':>6} {'min-max':>9} | {'CPU us/append':>13} | {'switches':>11} | {'a/w':>5} "
              f"{'wt/a':>5} {'qd':>4} {'hdr/a':>6} | {'fio MB/s':>8} {'ratio':>6}"
              + (f" | {'ord MB/s':>8} {'o/pl':>5} {'r/o':>5}" if a.ordered else ""))
        cases = [(int(t), 1) for t in a.threads.split(",")] + ([(int(a.threads.split(",")[-1]), a.depth)]
                                                                  if a.depth > 1 else [])
        for threads, depth in cases:
            qd = threads * depth
            print(f"-- ring: {threads} appender(s), " + ("submit().wait() each" if depth == 1 else
                  f"{depth} submit() tickets in flight each") + f"; plain/fio: {qd} threads, one write each (QD {qd})")
            for size in (int(x) for x in a.sizes.split(",")):
                print_case(size, [(*interleave(
                                       bench_ring(ring, size, threads, a.seconds, a.ring_mib * MiB, depth, a.io_threads,
                                                  a.slices),
                                       bench_plain(plain, size, qd, a.seconds, a.ring_mib * MiB, slices=a.slices)),
                                   bench_fio(plain + ".fio", size, qd, max(1, int(a.seconds)), a.ring_mib * MiB // qd),
                                   interleave(bench_plain(plain, size, qd, a.seconds, a.ring_mib * MiB, ordered=True))[0]
                                   if a.ordered else None)
                                  for _ in range(a.repeat)])
        if a.python_us:
            interpreter_share(plain, a, [float(x) for x in a.python_us.split(",")])
        if a.cpu:
            runs = "9 x 5,000, after a sleep 5 x 1,000" if a.noop_cpu else "7 x 2,000, after a sleep 7 x 1,000"
            print(f"-- thread CPU per append on {a.cpu} (least of {runs}; load {os.getloadavg()[0]:.1f}): "
                  "ring (submit + wait" + (", its writes writing nothing" if a.noop_cpu else "")
                  + ") | plain pwrite of the same size")
            for size in (int(x) for x in a.sizes.split(",")):
                if a.noop_cpu:
                    hot = append_cpu(a.cpu, size, 0, n=5000, reps=9, noop=True)
                    cold = append_cpu(a.cpu, size, 100, n=1000, reps=5, noop=True)
                else:
                    hot = append_cpu(a.cpu, size, 0)
                    cold = append_cpu(a.cpu, size, 100, n=1000)
                print(f"{size // 1024:>5}Ki | back to back {hot[0]:6.2f} | {hot[1]:5.2f} us | after 100 us asleep "
                      f"{cold[0]:6.2f} | {cold[1]:5.2f} us", flush=True)
        if a.thread_cpu:
            print(f"-- one appender's thread CPU per append on the disk, ring against plain alternating every 0.1 s "
                  f"for {a.thread_cpu:g} s (load {os.getloadavg()[0]:.1f}): user | user + system | appends/s")
            for size in (int(x) for x in a.sizes.split(",")):
                c = disk_thread_cpu(d, size, a.thread_cpu)
                r, p = c["ring"], c["plain"]
                print(f"{size // 1024:>5}Ki | user {r['user']:6.1f} | {p['user']:6.1f} us (+{r['user'] - p['user']:.1f}) | "
                      f"all {r['cpu']:6.1f} | {p['cpu']:6.1f} us (+{r['cpu'] - p['cpu']:.1f}) | {r['rate']:6.0f} | "
                      f"{p['rate']:6.0f}/s ({r['rate'] / p['rate']:.3f}x)", flush=True)
        if not a.no_recovery:
            rec = bench_recovery(ring, a.recovery_mib * MiB, a.recovery_record)
            print(f"recovery: {rec['bytes'] / MiB:.0f} MiB, {rec['records']} records of {a.recovery_record} B in "
                  f"{rec['secs']:.2f} s = {rec['mbps']:.0f} MB/s (target: 1 GiB < 3 s); fill took {rec['fill_s']:.1f} s")
        print(f"load at the end: {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
