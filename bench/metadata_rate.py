"""Compare-and-set rate of the ZooKeeper metadata store on this machine (for docs/scale.md).

    python bench/metadata_rate.py                 # 1 and 16 writers, 3 s each
    python bench/metadata_rate.py --seconds 5 --writers 1,4,16

Starts one ZooKeeper server (Debian's package, as the tests do; tickTime 2000, one node,
its transaction log on this machine's disk), then each writer thread repeats
``compare_and_set`` on its own key with the version it last got back (the trace store's
and the partition metadata's pattern: one ZooKeeper write, ``setData`` with a version).
Prints writes per second and per-write latency; the ZooKeeper write ceiling docs/scale.md
divides by.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from support.fixtures_zookeeper import ZooKeeperServer  # noqa: E402

from sediment.metadata.zookeeper import ZooKeeperMetadataStore  # noqa: E402


def run(hosts: str, writers: int, seconds: float) -> tuple[int, list[float]]:
    stores = [ZooKeeperMetadataStore(hosts, root=f"/bench{writers}") for _ in range(min(writers, 4))]
    done = time.monotonic() + seconds
    lat: list[list[float]] = [[] for _ in range(writers)]

    def writer(i: int) -> None:
        store = stores[i % len(stores)]
        key = f"w/{i}"
        version = None
        value = b"x" * 200
        while time.monotonic() < done:
            t = time.perf_counter()
            version = store.compare_and_set(key, value, version)
            lat[i].append(time.perf_counter() - t)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in stores:
        s.close()
    flat = sorted(x for part in lat for x in part)
    return len(flat), flat


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--writers", default="1,16", help="comma-separated writer-thread counts")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="sediment-zk-bench-") as tmp:
        zk = ZooKeeperServer(Path(tmp))
        zk.start()
        try:
            for w in (int(x) for x in args.writers.split(",")):
                n, flat = run(zk.hosts, w, args.seconds)
                print(f"{w:3d} writers: {n / args.seconds:8.0f} compare-and-sets/s, p50 "
                      f"{flat[len(flat) // 2] * 1e3:.2f} ms, p99 {flat[int(len(flat) * 0.99)] * 1e3:.2f} ms")
        finally:
            zk.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
