"""Durable append throughput and latency: one local FileLog vs three storage nodes at quorum two.

    python bench/replication.py [--seconds 3] [--threads 1,16,64] [--bytes 1024]

Writers append one record each per call, concurrently, so group commit (FileLog) and
batching plus pipelining (coordinator and nodes) both get to work. Each setup runs at
every writer count; the target compares the two setups' peak throughput (each at the
writer count where it does best), and the ratio at each writer count is printed too:
a quorum round trip costs more latency than a local fsync, so with few writers the
replicated log is latency-bound, not throughput-bound. Each setup also
prints the CPU time per append of this process and of each storage node: on a small
machine the four processes share the cores, so CPU per append bounds the throughput.
Results go in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

from sediment.metadata.memory import MemoryMetadataStore
from sediment.wal import record as rec
from sediment.wal.file_log import FileLog
from sediment.wal.replication.replicated_log import ReplicatedLog


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU time of a process (this one when ``pid`` is None)."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(log, seconds: float, threads: int, size: int) -> tuple[float, float, float]:
    body = os.urandom(size)
    lat: list[float] = []
    stop = time.monotonic() + seconds

    def worker() -> None:
        mine = []
        while time.monotonic() < stop:
            t = time.perf_counter()
            log.append([rec.Record(rec.RecordKind.UPDATES, relation_id=1, body=body)])
            mine.append(time.perf_counter() - t)
        lat.extend(mine)

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    start = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    elapsed = time.monotonic() - start
    lat.sort()
    return len(lat) / elapsed, lat[len(lat) // 2] * 1e3, lat[int(len(lat) * 0.99)] * 1e3


def measure(log, seconds: float, threads: list[int], size: int, pids: list[int]) -> list[tuple]:
    """Per writer count: (writers, appends/s, p50 ms, p99 ms, CPU us/append of this process
    and then of each pid)."""
    out = []
    for n in threads:
        before = [cpu_seconds(), *(cpu_seconds(p) for p in pids)]
        rate, p50, p99 = run(log, seconds, n, size)
        after = [cpu_seconds(), *(cpu_seconds(p) for p in pids)]
        cpu = [(a - b) / (rate * seconds) * 1e6 for a, b in zip(after, before, strict=True)]
        out.append((n, rate, p50, p99, cpu))
    return out


def start_node(directory: str, key: uuid.UUID, procs: list[subprocess.Popen]) -> str:
    """A storage node on port 0 (no race with other processes for a port picked before it
    binds): its address, from the ``listening on HOST:PORT`` line it prints."""
    p = subprocess.Popen([sys.executable, "-m", "sediment.wal.replication.node.storage_node", "--dir", directory,
                          "--listen", "127.0.0.1:0", "--cluster-key", str(key)], stdout=subprocess.PIPE, text=True)
    procs.append(p)
    line = p.stdout.readline()
    if not line.startswith("listening on "):
        raise SystemExit(f"storage node in {directory} did not start: {line!r}")
    return line.split()[-1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--threads", default="1,16,64", help="writer counts, comma-separated")
    ap.add_argument("--bytes", type=int, default=1024)
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    key = uuid.uuid4()
    with tempfile.TemporaryDirectory() as tmp:
        single = FileLog.open(os.path.join(tmp, "single"), cluster_key=key, create=True)
        one = measure(single, args.seconds, threads, args.bytes, [])
        single.close()
        procs: list[subprocess.Popen] = []
        try:
            addrs = [start_node(os.path.join(tmp, f"n{i}"), key, procs) for i in range(3)]
            log = ReplicatedLog.open(addrs, MemoryMetadataStore(), 0, key)
            three = measure(log, args.seconds, threads, args.bytes, [p.pid for p in procs])
            log.close()
        finally:
            for p in procs:
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGKILL)
                p.wait()
    print(f"{args.bytes}-byte records, {args.seconds:g} s per case")
    print("| setup | writers | appends/s | p50 ms | p99 ms | CPU us/append: writer process | each node |")
    print("|---|---|---|---|---|---|---|")
    for name, rows in (("FileLog, one local replica", one), ("3 storage nodes, quorum 2", three)):
        for n, rate, p50, p99, cpu in rows:
            nodes = " / ".join(f"{c:.0f}" for c in cpu[1:]) or "-"
            print(f"| {name} | {n} | {rate:.0f} | {p50:.2f} | {p99:.2f} | {cpu[0]:.0f} | {nodes} |")
    for (n, r1, *_), (_, r3, *_) in zip(one, three, strict=True):
        print(f"{n} writers: replicated / single = {r3 / r1:.0%}")
    peak1 = max(one, key=lambda row: row[1])
    peak3 = max(three, key=lambda row: row[1])
    print(f"peak throughput: replicated {peak3[1]:.0f}/s ({peak3[0]} writers) / single {peak1[1]:.0f}/s "
          f"({peak1[0]} writers) = {peak3[1] / peak1[1]:.0%} (target >= 50%)")


if __name__ == "__main__":
    main()
