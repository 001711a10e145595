"""Durable append throughput and latency: one local FileLog vs three storage nodes at quorum two.

    python bench/replication.py [--seconds 3] [--threads 16] [--bytes 1024]

Writers append one record each per call, concurrently, so group commit (FileLog) and
batching plus pipelining (coordinator and nodes) both get to work. Each setup also
prints the CPU time per append of this process and of each storage node: on a small
machine the four processes share the cores, so CPU per append bounds the throughput.
Results go in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid

from sediment.engine.metadata_memory import MemoryMetadataStore
from sediment.wal import record as rec
from sediment.wal.file_log import FileLog
from sediment.wal.replicated_log import ReplicatedLog


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--bytes", type=int, default=1024)
    args = ap.parse_args()
    key = uuid.uuid4()
    with tempfile.TemporaryDirectory() as tmp:
        single = FileLog.open(os.path.join(tmp, "single"), cluster_key=key)
        before = cpu_seconds()
        one = run(single, args.seconds, args.threads, args.bytes)
        one_cpu = (cpu_seconds() - before) / (one[0] * args.seconds) * 1e6
        single.close()
        procs, addrs = [], []
        for i in range(3):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            addrs.append(f"127.0.0.1:{port}")
            p = subprocess.Popen([sys.executable, "-m", "sediment.wal.storage_node", "--dir",
                                  os.path.join(tmp, f"n{i}"), "--listen", addrs[-1], "--cluster-key", str(key)],
                                 stdout=subprocess.PIPE, text=True)
            p.stdout.readline()
            procs.append(p)
        try:
            log = ReplicatedLog.open(addrs, MemoryMetadataStore(), 0, key)
            before = [cpu_seconds(), *(cpu_seconds(p.pid) for p in procs)]
            three = run(log, args.seconds, args.threads, args.bytes)
            after = [cpu_seconds(), *(cpu_seconds(p.pid) for p in procs)]
            three_cpu = [(a - b) / (three[0] * args.seconds) * 1e6 for a, b in zip(after, before, strict=True)]
            log.close()
        finally:
            for p in procs:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()
    print("| setup | appends/s | p50 ms | p99 ms | CPU us/append: writer process | each node |")
    print("|---|---|---|---|---|---|")
    print(f"| FileLog, one local replica | {one[0]:.0f} | {one[1]:.2f} | {one[2]:.2f} | {one_cpu:.0f} | - |")
    nodes_cpu = " / ".join(f"{c:.0f}" for c in three_cpu[1:])
    print(f"| 3 storage nodes, quorum 2 | {three[0]:.0f} | {three[1]:.2f} | {three[2]:.2f} | {three_cpu[0]:.0f} "
          f"| {nodes_cpu} |")
    print(f"replicated / single = {three[0] / one[0]:.0%} ({args.threads} threads, {args.bytes}-byte records)")


if __name__ == "__main__":
    main()
