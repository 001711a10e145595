"""Durable append throughput and latency: one local FileLog vs three storage nodes at quorum two.

    python bench/replication.py [--seconds 3] [--threads 16] [--bytes 1024]

Writers append one record each per call, concurrently, so group commit (FileLog) and
batching plus pipelining (coordinator and nodes) both get to work. Results go in
docs/benchmarks.md.
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
        one = run(single, args.seconds, args.threads, args.bytes)
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
            three = run(log, args.seconds, args.threads, args.bytes)
            log.close()
        finally:
            for p in procs:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()
    print("| setup | appends/s | p50 ms | p99 ms |\n|---|---|---|---|")
    print(f"| FileLog, one local replica | {one[0]:.0f} | {one[1]:.2f} | {one[2]:.2f} |")
    print(f"| 3 storage nodes, quorum 2 | {three[0]:.0f} | {three[1]:.2f} | {three[2]:.2f} |")
    print(f"replicated / single = {three[0] / one[0]:.0%} ({args.threads} threads, {args.bytes}-byte records)")


if __name__ == "__main__":
    main()
