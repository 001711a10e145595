"""The reads of one control pass of an S3-only cluster member, one key at a time against
``READERS`` at a time (cluster/s3_layout.py ``get_all``), in one run.

Why: a member's pass reads every member's and relation's key from the S3 metadata store
(each a few requests: a listing of its slots, then the newest slot); one after another they
were about a second of an S3-only failover on moto (docs/benchmarks.md, session 31). Measured
here: ``s3_layout.read_view`` (members, assignment, relations) of a cluster of ``--members``
members and ``--relations`` relations, with ``READERS = 1`` (the reads one after another, as
before) beside ``READERS = 8``, against moto directly and through a proxy adding ``--delay``
seconds to every request (S3's latency; moto on this host answers in about a millisecond).
moto and the proxy run in a child process, so they do not share the reader's GIL. Rounds
are interleaved (every case once per round); figures are medians over rounds, min-max.

    .venv/bin/python bench/s3_cluster_pass.py [--rounds 5] [--reads 10] [--members 3]
                                             [--relations 8] [--delay 0.02]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid

from sediment.cluster import s3_layout
from sediment.metadata.s3 import S3MetadataStore

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(HERE), "tests")
SERVERS = """
import logging, sys
sys.path.insert(0, sys.argv[1])
logging.getLogger("werkzeug").setLevel(logging.WARNING)
from moto.server import ThreadedMotoServer
from support.faulty_proxy import FaultyProxy
moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
moto.start()
host, port = moto.get_host_and_port()
direct = f"http://{host}:{port}"
proxy = FaultyProxy(direct, delay=float(sys.argv[2]))
print(direct, proxy.endpoint, flush=True)
sys.stdin.read()
"""


def load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def seed(endpoint: str, bucket: str, prefix: str, members: int, relations: int) -> None:
    import boto3

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    store = S3MetadataStore(bucket, prefix, endpoint)
    try:
        for i in range(1, members + 1):
            store.compare_and_set(f"members/{s3_layout.member_id(i)}",
                                  s3_layout.encode("member", {"advertise": f"grpc://127.0.0.1:{9000 + i}"}), None)
        store.compare_and_set("assignment", s3_layout.encode("assignment", {"assignment": {}}), None)
        for i in range(relations):
            store.compare_and_set(f"relations/r{i}", s3_layout.encode("relation", {"partition": i % 4,
                                                                                   "record": "bench"}), None)
    finally:
        store.close()


def timed(store: S3MetadataStore, readers: int, reads: int) -> float:
    """Seconds per ``read_view`` with ``readers`` keys read at once (median of ``reads``)."""
    s3_layout.READERS = readers
    took = []
    for _ in range(reads):
        began = time.perf_counter()
        view = s3_layout.read_view(store)
        took.append(time.perf_counter() - began)
    assert view["members"] and view["relations"]
    return statistics.median(took)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reads", type=int, default=10, help="read_view calls per case and round")
    ap.add_argument("--members", type=int, default=3)
    ap.add_argument("--relations", type=int, default=8)
    ap.add_argument("--delay", type=float, default=0.02, help="seconds the proxy adds to every request")
    args = ap.parse_args()
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    proc = subprocess.Popen([sys.executable, "-c", SERVERS, TESTS, str(args.delay)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        direct, proxied = proc.stdout.readline().split()
        bucket, prefix = f"bench-{uuid.uuid4().hex[:12]}", "cluster"
        seed(direct, bucket, prefix, args.members, args.relations)
        stores = {"moto": S3MetadataStore(bucket, prefix, direct),
                  f"moto+{args.delay * 1000:g}ms": S3MetadataStore(bucket, prefix, proxied)}
        cases = [(where, readers) for where in stores for readers in (1, 8)]
        got: dict[tuple[str, int], list[float]] = {c: [] for c in cases}
        loads = [load()]
        for r in range(args.rounds):
            for where, readers in cases if r % 2 == 0 else reversed(cases):
                got[(where, readers)].append(timed(stores[where], readers, args.reads))
            loads.append(load())
        print(f"read_view of {args.members} members and {args.relations} relations, {args.rounds} rounds of "
              f"{args.reads} reads (load {loads[0]} at the start, {'-'.join(loads[1:])} after each round)")
        print("| S3 | one key at a time | 8 at a time | ratio (per round) |")
        print("|---|---|---|---|")
        for where in stores:
            one, eight = got[(where, 1)], got[(where, 8)]
            ratios = [a / b for a, b in zip(one, eight, strict=True)]
            print(f"| {where} | {1e3 * statistics.median(one):.1f} ms ({1e3 * min(one):.1f}-{1e3 * max(one):.1f}) "
                  f"| {1e3 * statistics.median(eight):.1f} ms ({1e3 * min(eight):.1f}-{1e3 * max(eight):.1f}) "
                  f"| {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) |")
        for store in stores.values():
            store.close()
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
