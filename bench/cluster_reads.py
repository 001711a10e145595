"""What a cluster member's reads cost once each is confirmed against the membership store
(session 32: cluster/read_confirm.py), beside another build's members that answer from their
view: ``sealed()`` and a snapshot of a 1,000-row relation, p50 and p99 of one reader's
calls and of ``--readers`` concurrent readers' (the confirmations they share), on a
ZooKeeper cluster (three storage nodes) and on an S3-only cluster (moto), one member each.

Each round starts a cluster per (kind, build), builds alternating, and measures it for
``--seconds`` per figure; medians over the rounds with min-max, the load average beside each
round. moto runs in a process of its own, so the readers' threads do not slow S3's answers.

    cd /tmp && python /path/to/bench/cluster_reads.py --before /tmp/before [--rounds 3] [--seconds 4]
                                                      [--readers 8] [--kinds zk,s3]

``--before DIR``: a checkout with its own virtualenv (``DIR/.venv``, installed with
``pip install -e DIR``), whose members are measured as "before". Run from a directory
without a ``sediment`` folder: ``python -m sediment`` looks in the working directory first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import pyarrow as pa  # noqa: E402
from support.cluster_procs import TOKEN, Cluster, S3Cluster  # noqa: E402
from support.fixtures_zookeeper import ZooKeeperServer  # noqa: E402
from support.ports import free_port  # noqa: E402

import sediment  # noqa: E402
from sediment.client import Client  # noqa: E402

SCHEMA = pa.schema([("k", pa.int64())])
ROWS = 1000
CONFIRMATIONS = "sediment_cluster_read_confirmations_total"


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else float("nan")


def start_moto(bench_dir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log = open(bench_dir / "moto.log", "ab")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=log, stderr=log)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(endpoint, timeout=2).close()
            return proc, endpoint
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError(f"moto_server did not answer on {endpoint}; see {log.name}") from None
            time.sleep(0.1)


def confirmations(member) -> float | None:
    """The member's confirmation rounds, None for a build without them."""
    with urllib.request.urlopen(member.metrics_url, timeout=10) as page:
        for line in page.read().decode().splitlines():
            if line.startswith(CONFIRMATIONS + " "):
                return float(line.split()[1])
    return None


def timed(call, seconds: float, readers: int) -> tuple[list[float], int]:
    """Latencies (ms) of ``call(i)`` made back to back by ``readers`` threads (``i``: the
    thread's number) for ``seconds``."""
    out: list[list[float]] = [[] for _ in range(readers)]
    stop = time.monotonic() + seconds

    def run(i: int) -> None:
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            call(i)
            out[i].append((time.perf_counter() - t0) * 1000)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [x for mine in out for x in mine]
    return flat, len(flat)


def measure(cluster, seconds: float, readers: int) -> dict[str, tuple[float, float, float | None]]:
    """(p50 ms, p99 ms, reads per confirmation) per figure, on a one-member cluster."""
    member = cluster.start_member()
    cluster.wait_assigned([member])
    with sediment.connect(cluster.uri, token=TOKEN) as db:
        db.add_relation("r", SCHEMA, partition=0)
        db.append("r", pa.table({"k": pa.array(range(ROWS), pa.int64()), "time": pa.array([1] * ROWS, pa.int64()),
                                 "diff": pa.array([1] * ROWS, pa.int64())}))
        db.seal("r", 1)
        db.compact("r")
    clients = [Client(member.uri, TOKEN, timeout=60) for _ in range(readers)]
    figures = {"sealed, 1 reader": (lambda i: clients[i].sealed("r"), 1),
               "snapshot, 1 reader": (lambda i: clients[i].snapshot("r", 1), 1),
               f"sealed, {readers} readers": (lambda i: clients[i].sealed("r"), readers),
               f"snapshot, {readers} readers": (lambda i: clients[i].snapshot("r", 1), readers)}
    out = {}
    try:
        for c in clients:
            c.sealed("r")  # connected and warm
        for name, (call, n) in figures.items():
            before = confirmations(member)
            lat, count = timed(call, seconds, n)
            after = confirmations(member)
            per = count / (after - before) if before is not None and after > before else None
            out[name] = (statistics.median(lat), percentile(lat, 0.99), per)
    finally:
        for c in clients:
            c.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="a checkout with its own .venv, measured as 'before'")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--readers", type=int, default=8)
    ap.add_argument("--kinds", default="zk,s3")
    ap.add_argument("--workdir", help="keep the processes' files and logs here (default: a temporary directory)")
    args = ap.parse_args()
    if (Path.cwd() / "sediment" / "__init__.py").exists():
        sys.exit("run from a directory without a sediment folder (python -m sediment looks there first)")
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    builds = {"before": str(Path(args.before, ".venv", "bin", "python").absolute()), "after": sys.executable}
    kinds = args.kinds.split(",")
    results: dict[tuple[str, str, str], list[tuple[float, float, float | None]]] = {}
    loads: list[float] = []
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(args.workdir or scratch)
        tmp.mkdir(parents=True, exist_ok=True)
        moto, endpoint = start_moto(tmp)
        zk = ZooKeeperServer(tmp / "zk") if "zk" in kinds else None
        try:
            import boto3

            boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
            if zk is not None:
                zk.start()
            for r in range(args.rounds):
                order = list(builds.items()) if r % 2 == 0 else list(reversed(builds.items()))
                for kind in kinds:
                    for build, python in order:
                        root = tmp / f"{kind}-{build}-{r}"
                        if kind == "zk":
                            c = Cluster(root, f"127.0.0.1:{zk.port}", f"/reads-{uuid.uuid4().hex[:8]}", endpoint,
                                        "bench", partitions=1, session_timeout=10.0, python=python)
                        else:
                            c = S3Cluster(root, endpoint, "bench", partitions=1, lease_time=10.0, python=python)
                        try:
                            got = measure(c, args.seconds, args.readers)
                        finally:
                            c.close()
                        for name, v in got.items():
                            results.setdefault((kind, name, build), []).append(v)
                        loads.append(os.getloadavg()[0])
                        print(f"round {r + 1} {kind} {build}: " + ", ".join(
                            f"{n} {p50:.2f}/{p99:.2f} ms" for n, (p50, p99, _) in got.items())
                            + f" (load {loads[-1]:.1f})", flush=True)
        finally:
            if zk is not None:
                zk.stop()
            moto.kill()
            moto.wait()
    print(f"\n{args.rounds} rounds, {args.seconds:g} s per figure, load {min(loads):.1f}-{max(loads):.1f}")
    print("| cluster | read | before p50 | after p50 | before p99 | after p99 | reads per confirmation |")
    print("|---|---|---|---|---|---|---|")

    def cell(xs: list[float]) -> str:
        return f"{statistics.median(xs):.2f} ms ({min(xs):.2f}-{max(xs):.2f})"

    for kind in kinds:
        names = [n for (k, n, b) in results if k == kind and b == "after"]
        for name in names:
            before, after = results[(kind, name, "before")], results[(kind, name, "after")]
            per = [p for _, _, p in after if p is not None]
            print(f"| {'ZooKeeper' if kind == 'zk' else 'S3-only'} | {name} | {cell([b[0] for b in before])} | "
                  f"{cell([a[0] for a in after])} | {cell([b[1] for b in before])} | {cell([a[1] for a in after])} | "
                  f"{f'{statistics.median(per):.1f}' if per else '-'} |")


if __name__ == "__main__":
    main()
