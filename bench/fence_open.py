"""What fencing costs an S3-only open (metadata/fence.py): a coordinator taking over rewrites
every catalog entry and trace state once by compare-and-set before it sweeps.

Against moto on loopback (``--endpoint`` for another S3), an engine with ``--relations``
relations (each with one committed trace state) is made once; then, rounds interleaved:

* ``load``: reading the catalog and the trace states as the open did before the fence;
* ``fenced load``: the same keys rewritten (what the open does now);
* ``open``: a whole ``sediment.open`` of the engine (claim, fenced load, replay, sweep).

Each figure is printed beside its peer, wall and CPU of this process (moto runs in it too
when started here), as median (min-max), with the load average.

    .venv/bin/python bench/fence_open.py --relations 100 --rounds 3
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import statistics
import tempfile
import time
import uuid

import pyarrow as pa

import sediment
from sediment.clock import ManualClock
from sediment.engine.catalog import Catalog
from sediment.metadata.open_store import open_metadata_store
from sediment.trace.store import TraceStore


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(call) -> tuple[float, float]:
    w, c = time.perf_counter(), cpu()
    call()
    return time.perf_counter() - w, cpu() - c


def make(root: str, opts: dict, relations: int) -> None:
    with sediment.open(os.path.join(root, "made"), clock=ManualClock(), **opts) as eng:
        for i in range(relations):
            name = f"r{i:04d}"
            eng.add_relation(name, pa.schema([("k", pa.int64())]))
            eng.append(name, pa.table({"k": [i], "time": [1], "diff": [1]}))
            eng.seal(name, 1)
        eng.compact()


def load(meta, take_over: bool) -> None:
    entries = list(Catalog(meta).load(take_over=take_over).values())
    TraceStore(meta, None).load_many([e.id for e in entries], take_over=take_over)  # type: ignore[arg-type]


def fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1000:8.1f} ms ({min(xs) * 1000:.1f}-{max(xs) * 1000:.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--relations", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--endpoint", default=None, help="an S3 endpoint (default: moto started here)")
    args = ap.parse_args()
    server = None
    endpoint = args.endpoint
    if endpoint is None:
        from moto.server import ThreadedMotoServer

        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a line per request (bench/failover.py)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
    import boto3

    bucket = f"fence-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    opts = {"wal": f"s3://{bucket}/wal", "metadata": f"s3://{bucket}/meta?endpoint={endpoint}",
            "blob": f"s3://{bucket}/blobs", "s3_endpoint": endpoint, "compact_interval": None}
    figures: dict[str, list[tuple[float, float]]] = {"load": [], "fenced load": [], "open": []}
    loads = []
    try:
        with tempfile.TemporaryDirectory(prefix="fence-open-") as root:
            make(root, opts, args.relations)
            meta = open_metadata_store(opts["metadata"])
            for i in range(args.rounds):
                loads.append(os.getloadavg()[0])
                figures["load"].append(timed(lambda: load(meta, False)))
                figures["fenced load"].append(timed(lambda: load(meta, True)))

                def whole(i=i) -> None:
                    sediment.open(os.path.join(root, f"open{i}"), metadata=opts["metadata"],
                                  clock=ManualClock(), compact_interval=None).close()

                figures["open"].append(timed(whole))
            meta.close()
    finally:
        if server is not None:
            server.stop()
    print(f"{args.relations} relations on S3 metadata ({'moto' if server else endpoint}), {args.rounds} rounds, "
          f"load average {min(loads):.1f}-{max(loads):.1f}")
    for name, got in figures.items():
        print(f"  {name:12s} wall {fmt([w for w, _ in got])}   CPU {fmt([c for _, c in got])}")
    ratio = [f[0] / b[0] for b, f in zip(figures["load"], figures["fenced load"], strict=True)]
    print(f"  fenced load / load (wall, per round): {statistics.median(ratio):.2f}x "
          f"({min(ratio):.2f}-{max(ratio):.2f})")


if __name__ == "__main__":
    main()
