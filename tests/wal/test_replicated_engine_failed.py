"""An engine on a replicated log after an append whose outcome is unknown (QuorumLost: two of
three storage nodes gone, the record on the third, which the next recovery keeps) refuses
reads and writes with EngineFailed until it is reopened, and the reopened engine shows what
the recovery kept (the record, when it was durable on node 0, as it usually is): no read
answers from a state the reopen contradicts, and a retry of the append cannot write the row
a second time unseen."""

from __future__ import annotations

import pyarrow as pa
import pytest
from support.replication import KEY, Node, start_all

import sediment
from sediment.errors import EngineClosed, EngineFailed, QuorumLost

SCHEMA = pa.schema([("k", pa.int64())])
pytestmark = pytest.mark.zookeeper


def ups(ks, t):
    return pa.table({"k": pa.array(ks, pa.int64()), "time": pa.array([t] * len(ks), pa.int64()),
                     "diff": pa.array([1] * len(ks), pa.int64())})


def keys(eng) -> list[int]:
    return sorted(k for b in eng.replay("r") for k in b.column("k").to_pylist())


def test_after_quorum_lost_the_engine_refuses_reads_and_writes_until_reopened(tmp_path, zookeeper, zk_root):
    nodes = [Node(tmp_path / f"node{i}") for i in range(3)]
    start_all(nodes)
    options = {"replicas": [n.address for n in nodes], "cluster_key": str(KEY),
               "metadata": f"zk://{zookeeper.hosts}{zk_root}", "blob": f"file://{tmp_path}/shared-blobs",
               "compact_interval": 3600}
    try:
        eng = sediment.open(tmp_path / "c", **options)
        try:
            eng.add_relation("r", SCHEMA)
            eng.append("r", ups([1], 1))
            eng.seal("r", 1)
            sub = eng.subscribe("r", 1)
            nodes[1].kill()
            nodes[2].kill()
            with pytest.raises(QuorumLost):
                eng.append("r", ups([2], 2))  # sent to node 0 only, durable there or not
            # before: the replay answered [1] (and a snapshot as of 2 would once sealed) while a reopen answers [1, 2]
            with pytest.raises(EngineFailed, match="open it again") as refused:
                keys(eng)
            assert "QuorumLost" in str(refused.value) and str(tmp_path / "c") in str(refused.value)
            with pytest.raises(EngineFailed):
                eng.snapshot("r", 1)
            with pytest.raises(EngineFailed):
                eng.append("r", ups([2], 2))  # the retry is refused, not written a second time
            with pytest.raises(EngineFailed):
                eng.relations()
            with pytest.raises(EngineFailed):
                eng.compact()
            with pytest.raises(EngineClosed, match="reopening"):
                while sub.next(timeout=30) is not None:  # its feed ended: it never sees the kept record
                    pass
        finally:
            eng.close()
        nodes[1].start()  # node 2 stays away: the recovery's quorum is node 0 and node 1
        with sediment.open(tmp_path / "c", **options) as eng:
            assert keys(eng) in ([1], [1, 2])  # k=2 if it was durable on node 0 (usually), and never twice
    finally:
        for n in nodes:
            if n.proc is not None:
                n.kill()


def test_serve_opens_a_failed_engine_again_and_serves_what_the_log_kept(tmp_path, zookeeper, zk_root):
    """`sediment serve` of a replicated engine: an append loses its quorum (the record on node 0
    only), the engine fails; serve closes it and opens it again, in the same process and on the
    same port, once a quorum is back (node 1 restarted; node 0 holds the record), and serves the
    kept record: a client that retries reaches the reopened engine, and nothing is lost or
    written twice."""
    import queue
    import subprocess
    import sys
    import threading
    import time

    from sediment.errors import SedimentError

    nodes = [Node(tmp_path / f"node{i}") for i in range(3)]
    start_all(nodes)
    spec = f"zk://{zookeeper.hosts}{zk_root}"
    with sediment.open(tmp_path / "a", replicas=[n.address for n in nodes], cluster_key=str(KEY), metadata=spec,
                       blob=f"file://{tmp_path}/shared-blobs", compact_interval=3600) as eng:
        eng.add_relation("r", SCHEMA)
    serve = subprocess.Popen(
        [sys.executable, "-m", "sediment", "--data-dir", str(tmp_path / "a"), "serve", "--listen", "127.0.0.1:0",
         "--token", "secret"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in serve.stdout], daemon=True).start()

    def next_serving() -> str:
        """The next 'serving ... on URI' line, within 90 s."""
        while True:
            got = lines.get(timeout=90)
            if got.startswith("serving"):
                return got.split(" on ")[-1].strip()

    try:
        uri = next_serving()
        with sediment.connect(uri, token="secret", timeout=60) as client:
            client.append("r", ups([1], 1))
            nodes[1].kill()
            nodes[2].kill()
            with pytest.raises(SedimentError):
                client.append("r", ups([2], 2))  # sent to node 0 only: outcome unknown
        nodes[1].start()
        assert next_serving() == uri  # printed once the engine is open again, on the same address
        deadline = time.monotonic() + 60
        with sediment.connect(uri, token="secret", timeout=60) as client:
            while True:  # the client's first calls may still meet the stopped server's port
                try:
                    client.seal("r", 2)
                    break
                except SedimentError:
                    if time.monotonic() > deadline:
                        raise
            assert sorted(client.snapshot("r", 2).column("k").to_pylist()) in ([1], [1, 2])
        assert serve.poll() is None
        serve.terminate()
        assert serve.wait(timeout=60) == 0
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
        for n in nodes:
            if n.proc is not None:
                n.kill()
