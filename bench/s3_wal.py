"""Durable appends with the log on S3, beside the local file log, in one run.

Why: an append on S3 is acknowledged when its object's PUT is, and a PUT takes
milliseconds (S3 Express about 5-10 ms, S3 Standard tens of ms), so throughput must come
from group commit: every append queued while one PUT is in flight goes into the next
object. The target (issue 25): with 60 ms per PUT and 64 writers, at least 500 single-row
durable appends/s. Measured, at the log's interface (``WriteAheadLog.append``, durable on
return), for 1, 16 and 64 writer threads each appending one ~100 B UPDATES record (the size
of a one-row append) and waiting:

* ``file``: the local file log (fdatasync per group), the peer;
* ``s3``: the log on S3 against moto's server directly;
* ``s3+20ms`` / ``s3+60ms``: the same through a proxy adding 20 ms / 60 ms to every request.

moto and the proxies run in a child process, so they do not share the writers' GIL. Rounds
are interleaved (every case once per round), figures are the median over rounds with
min-max. Also reported: appends per object (group size) and S3 requests per GB appended
(record frames), counted by the log itself.

    .venv/bin/python bench/s3_wal.py              # 3 rounds x 3 s per case, about 3 minutes
    .venv/bin/python bench/s3_wal.py --quick      # 3 rounds x 1 s per case
    .venv/bin/python bench/s3_wal.py --json out.json
    .venv/bin/python bench/s3_wal.py --engine     # 64 writers of one-row Engine.append, local vs S3 only at 60 ms
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

from sediment.wal import record as rec
from sediment.wal.file_log import FileLog
from sediment.wal.s3_log import S3Log

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(HERE), "tests")
WRITERS = (1, 16, 64)
BACKENDS = ("file", "s3", "s3+20ms", "s3+60ms")
DELAYS = {"s3+20ms": 0.020, "s3+60ms": 0.060}
BODY = b"x" * 100

SERVERS = """
import logging, sys, time
sys.path.insert(0, sys.argv[1])
logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a line per request on the bench's stderr
from moto.server import ThreadedMotoServer
from support.faulty_proxy import FaultyProxy
moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
moto.start()
host, port = moto.get_host_and_port()
direct = f"http://{host}:{port}"
proxies = [FaultyProxy(direct, delay=float(d)) for d in sys.argv[2:]]
print(direct, *(p.endpoint for p in proxies), flush=True)
sys.stdin.read()
"""


def start_servers() -> tuple[subprocess.Popen, dict[str, str]]:
    env = dict(os.environ, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    proc = subprocess.Popen([sys.executable, "-c", SERVERS, TESTS, *(str(DELAYS[b]) for b in ("s3+20ms", "s3+60ms"))],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    direct, p20, p60 = proc.stdout.readline().split()
    return proc, {"s3": direct, "s3+20ms": p20, "s3+60ms": p60}


def open_log(backend: str, endpoints: dict[str, str], bucket: str, tmp: str):
    if backend == "file":
        return FileLog.open(os.path.join(tmp, f"wal-{uuid.uuid4().hex}"), create=True)
    return S3Log.open(f"s3://{bucket}/{uuid.uuid4().hex}?endpoint={endpoints[backend]}", create=True)


def run_case(log, writers: int, seconds: float) -> dict:
    """``writers`` threads appending one record each, durable on return, for ``seconds``."""
    latencies: list[list[float]] = [[] for _ in range(writers)]
    start = threading.Barrier(writers + 1)
    stop = threading.Event()

    def writer(i: int) -> None:
        mine = latencies[i]
        start.wait()
        while not stop.is_set():
            t0 = time.perf_counter()
            log.append([rec.Record(rec.RecordKind.UPDATES, relation_id=1, t_lo=1, t_hi=1, count=1, body=BODY)])
            mine.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    before = dict(getattr(log, "requests", {}))
    start.wait()
    began = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    every = sorted(x for xs in latencies for x in xs)
    after = getattr(log, "requests", {})
    requests = sum(after.values()) - sum(before.values()) if after else 0
    appended = len(every) * (rec.HEADER_SIZE + len(BODY))
    return {"appends_per_s": len(every) / elapsed, "p50_ms": 1e3 * every[len(every) // 2],
            "p99_ms": 1e3 * every[min(len(every) - 1, int(len(every) * 0.99))],
            "appends_per_put": len(every) / max(1, after.get("put", 0) - before.get("put", 0)) if after else None,
            "requests_per_gb": requests / (appended / 1e9) if after and appended else None}


def open_engine(backend: str, endpoints: dict[str, str], bucket: str, tmp: str):
    """An engine whose log is ``backend`` (file: everything local; s3+60ms: log, metadata and
    batches in S3 through the 60 ms proxy), with one relation ``r`` of one int64 column."""
    import pyarrow as pa

    import sediment

    run = uuid.uuid4().hex
    options: dict = {}
    if backend != "file":
        endpoint = endpoints[backend]
        options = {"wal": f"s3://{bucket}/{run}/wal", "metadata": f"s3://{bucket}/{run}/meta?endpoint={endpoint}",
                   "blob": f"s3://{bucket}/{run}/blobs", "s3_endpoint": endpoint}
    eng = sediment.open(os.path.join(tmp, run), **options)
    eng.add_relation("r", pa.schema([("k", pa.int64())]))
    return eng


class EngineAppends:
    """``log.append`` for run_case: one single-row ``Engine.append`` (durable on return)."""

    def __init__(self, engine) -> None:
        import pyarrow as pa

        self.engine = engine
        self.row = pa.table({"k": pa.array([1], pa.int64()), "time": pa.array([1], pa.int64()),
                             "diff": pa.array([1], pa.int64())})

    def append(self, records) -> None:
        self.engine.append("r", self.row)

    def close(self) -> None:
        self.engine.close()


def run_engine(endpoints: dict[str, str], bucket: str, tmp: str, rounds: int, seconds: float) -> None:
    """64 writers, single-row ``Engine.append``: the local engine beside the S3-only one at 60 ms."""
    results: dict[str, list[dict]] = {}
    for _ in range(rounds):
        for backend in ("file", "s3+60ms"):
            appends = EngineAppends(open_engine(backend, endpoints, bucket, tmp))
            try:
                results.setdefault(backend, []).append(run_case(appends, 64, seconds))
            finally:
                appends.close()
    print("| engine (log, metadata, batches) | writers | appends/s | p50 ms | p99 ms |")
    print("| --- | --- | --- | --- | --- |")
    for backend, rs in results.items():
        cells = [summarize([r[k] for r in rs]) for k in ("appends_per_s", "p50_ms", "p99_ms")]
        print(f"| {'local' if backend == 'file' else 'S3 only, 60 ms per request'} | 64 | " + " | ".join(cells) + " |")


def summarize(values: list[float]) -> str:
    med = statistics.median(values)
    return f"{med:,.1f} ({min(values):,.1f}-{max(values):,.1f})" if med < 100 else \
        f"{med:,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json")
    parser.add_argument("--engine", action="store_true",
                        help="instead: 64 writers of single-row Engine.append, local beside S3-only at 60 ms")
    args = parser.parse_args()
    seconds = 1.0 if args.quick else 3.0
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    servers, endpoints = start_servers()
    tmp = tempfile.mkdtemp(prefix="sediment-bench-s3wal-")
    bucket = f"bench-{uuid.uuid4().hex[:12]}"
    results: dict[tuple[str, int], list[dict]] = {}
    try:
        import boto3

        boto3.client("s3", endpoint_url=endpoints["s3"], region_name="us-east-1").create_bucket(Bucket=bucket)
        if args.engine:
            run_engine(endpoints, bucket, tmp, args.rounds, seconds)
            return 0
        for _ in range(args.rounds):
            for writers in WRITERS:
                for backend in BACKENDS:
                    log = open_log(backend, endpoints, bucket, tmp)
                    try:
                        results.setdefault((backend, writers), []).append(run_case(log, writers, seconds))
                    finally:
                        log.close()
    finally:
        servers.stdin.close()
        servers.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{args.rounds} interleaved rounds x {seconds:.0f} s per case; median (min-max); one ~100 B record per "
          "append, durable on return")
    print("| log | writers | appends/s | p50 ms | p99 ms | appends per PUT | S3 requests per GB |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for writers in WRITERS:
        for backend in BACKENDS:
            rs = results[(backend, writers)]
            cells = [summarize([r[k] for r in rs]) for k in ("appends_per_s", "p50_ms", "p99_ms")]
            extra = [summarize([r[k] for r in rs]) if rs[0][k] is not None else "-"
                     for k in ("appends_per_put", "requests_per_gb")]
            print(f"| {backend} | {writers} | " + " | ".join(cells + extra) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{b}/{w}": rs for (b, w), rs in results.items()}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
