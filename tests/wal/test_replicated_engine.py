"""The engine on a replicated log: three storage nodes on loopback, metadata in ZooKeeper."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
from support.replication import COORDINATOR, KEY, Node, start_all

import sediment

SCHEMA = pa.schema([("k", pa.int64())])
pytestmark = pytest.mark.zookeeper


def ups(ks, t):
    return pa.table({"k": pa.array(ks, pa.int64()), "time": pa.array([t] * len(ks), pa.int64()),
                     "diff": pa.array([1] * len(ks), pa.int64())})


def test_engine_over_three_storage_nodes_survives_a_dead_replica_and_a_restart(tmp_path, zookeeper, zk_root):
    nodes = [Node(tmp_path / f"node{i}") for i in range(3)]
    start_all(nodes)
    options = {"replicas": [n.address for n in nodes], "cluster_key": str(KEY),
               "metadata": f"zk://{zookeeper.hosts}{zk_root}",
               "blob": f"file://{tmp_path}/shared-blobs"}
    try:
        with sediment.open(tmp_path / "coordinator", **options) as eng:
            eng.add_relation("r", SCHEMA)
            for t in range(1, 11):
                eng.append("r", ups([t, t + 100], t))
                eng.seal("r", t)
                if t == 5:
                    nodes[2].kill()  # a quorum of two remains: writes go on
            assert eng.snapshot("r", 10).num_rows == 20
        with sediment.open(tmp_path / "coordinator", **options) as eng:
            assert eng.relations() == ["r"] and eng.sealed("r") == 10
            assert sorted(eng.snapshot("r", 10).column("k").to_pylist()) == sorted(
                [t for t in range(1, 11)] + [t + 100 for t in range(1, 11)])
    finally:
        for n in nodes:
            if n.proc is not None:
                n.kill()


def test_coordinator_killed_mid_stream_then_a_new_one_recovers(tmp_path, zookeeper, zk_root):
    import json
    import signal
    import subprocess
    import sys

    nodes = [Node(tmp_path / f"node{i}") for i in range(3)]
    start_all(nodes)
    options = {"replicas": [n.address for n in nodes], "cluster_key": str(KEY),
               "metadata": f"zk://{zookeeper.hosts}{zk_root}",
               "blob": f"file://{tmp_path}/shared-blobs"}
    data = str(tmp_path / "coordinator")
    try:
        proc = subprocess.Popen([sys.executable, "-c", COORDINATOR, data, json.dumps(options)],
                                stdout=subprocess.PIPE, text=True)
        acked = 0
        try:
            for line in proc.stdout:
                acked = int(line)
                if acked >= 60:
                    break
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        with sediment.open(data, **options) as eng:  # a new store session: recovery votes and truncates
            sealed = eng.sealed("r")
            assert sealed >= acked
            keys = eng.snapshot("r", sealed).column("k").to_pylist()
            assert keys == list(range(0, sealed + 1)), "every acknowledged append, nothing else below the seal"
            eng.append("r", ups([sealed + 1], sealed + 1))  # and writes resume
            eng.seal("r", sealed + 1)
            assert eng.snapshot("r", sealed + 1).num_rows == sealed + 2
    finally:
        for n in nodes:
            if n.proc is not None:
                n.kill()


def test_cli_reaches_a_replicated_engine_through_its_zookeeper_metadata(tmp_path, zookeeper, zk_root, capsys):
    from sediment.cli import main

    nodes = [Node(tmp_path / f"node{i}") for i in range(3)]
    start_all(nodes)
    spec = f"zk://{zookeeper.hosts}{zk_root}"
    try:
        with sediment.open(tmp_path / "c", replicas=[n.address for n in nodes], cluster_key=str(KEY),
                           metadata=spec, blob=f"file://{tmp_path}/shared-blobs") as eng:
            eng.add_relation("r", SCHEMA)
            eng.append("r", ups([7], 1))
            eng.seal("r", 1)
        capsys.readouterr()
        assert main(["--data-dir", str(tmp_path / "c"), "--metadata", spec, "read", "r", "--as-of", "1"]) == 0
        assert capsys.readouterr().out.splitlines() == ['"k","diff"', "7,1"]
        # the README's promise: later commands find the engine from the data directory alone
        assert main(["--data-dir", str(tmp_path / "c"), "read", "r", "--as-of", "1"]) == 0
        assert capsys.readouterr().out.splitlines() == ['"k","diff"', "7,1"]
        assert main(["--data-dir", str(tmp_path / "c"), "relation", "list"]) == 0
        assert "sealed=1" in capsys.readouterr().out
    finally:
        for n in nodes:
            if n.proc is not None:
                n.kill()


class SmallNode(Node):
    """A storage node with small segments, so that trimming shows in its files."""

    def __init__(self, directory) -> None:
        super().__init__(directory, extra_args=("--segment-bytes", str(1 << 14)))

    def segments(self) -> list[str]:
        d = self.dir / "0"
        return sorted(p.name for p in d.iterdir() if p.suffix == ".seg") if d.exists() else []


def test_compaction_trims_the_replicas_and_a_returning_replica_skips_ahead(tmp_path, zookeeper, zk_root):
    nodes = [SmallNode(tmp_path / f"node{i}") for i in range(3)]
    start_all(nodes)
    options = {"replicas": [n.address for n in nodes], "cluster_key": str(KEY),
               "metadata": f"zk://{zookeeper.hosts}{zk_root}",
               "blob": f"file://{tmp_path}/shared-blobs"}
    try:
        with sediment.open(tmp_path / "c", **options) as eng:
            eng.add_relation("r", SCHEMA)
            nodes[2].kill()  # away while the others compact and trim
            for t in range(1, 121):
                eng.append("r", ups(list(range(t * 10, t * 10 + 10)), t))
                eng.seal("r", t)
                if t % 20 == 0:
                    eng.compact()
            assert eng.wal.start_lsn > 0
        assert nodes[0].segments()[0] != "0000000000000000000.seg", "the live replicas dropped old segments"
        nodes[2].start()  # behind the others' trim point, and no coordinator holds the records in memory
        with sediment.open(tmp_path / "c", **options) as eng:
            for t in range(121, 141):
                eng.append("r", ups([t * 10], t))
                eng.seal("r", t)
            coordinator = eng.wal.coordinator
            assert eng.wal.wait_for(lambda: nodes[2].address in coordinator.in_sync(), 30), \
                "the returning replica never caught up"
            assert nodes[2].segments()[0] != "0000000000000000000.seg", "the returning replica was reset"
            nodes[0].kill()  # now the reset replica is needed for a quorum
            for t in range(141, 151):
                eng.append("r", ups([t * 10], t))
                eng.seal("r", t)
            assert eng.snapshot("r", 150).num_rows == 120 * 10 + 30
        with sediment.open(tmp_path / "c", **options) as eng:
            assert eng.snapshot("r", 150).num_rows == 120 * 10 + 30
    finally:
        for n in nodes:
            if n.proc is not None:
                n.kill()


def test_background_compacter_compacts_and_trims_the_nodes_without_compact_calls(tmp_path, zookeeper, zk_root):
    """Segments of the replicated log finish by size (no compact() call anywhere): the
    background compacter writes batches and the storage nodes drop old segments."""
    nodes = [SmallNode(tmp_path / f"node{i}") for i in range(3)]
    start_all(nodes)
    try:
        with sediment.open(tmp_path / "c", replicas=[n.address for n in nodes], cluster_key=str(KEY),
                           metadata=f"zk://{zookeeper.hosts}{zk_root}", blob=f"file://{tmp_path}/shared-blobs",
                           segment_bytes=1 << 13,
                           compact_interval=3600) as eng:  # an hour: finishing by size alone
            eng.add_relation("r", SCHEMA)
            for t in range(1, 201):
                eng.append("r", ups(list(range(t * 10, t * 10 + 10)), t))
                eng.seal("r", t)
            compacter = eng.scheduler
            deadline = time.monotonic() + 60
            while eng.trace_info("r")["batches"] == 0 or eng.wal.start_lsn == 0 or \
                    nodes[0].segments()[:1] == ["0000000000000000000.seg"]:
                assert time.monotonic() < deadline, f"no background compaction: {eng.trace_info('r')}"
                assert compacter.wait_passes(compacter.passes + 1, 10) or compacter.last_error is None
            assert compacter.last_error is None
            assert eng.trace_info("r")["upper"] > 1
            assert eng.snapshot("r", 200).num_rows == 2000
        with sediment.open(tmp_path / "c", replicas=[n.address for n in nodes], cluster_key=str(KEY),
                           metadata=f"zk://{zookeeper.hosts}{zk_root}", segment_bytes=1 << 13) as eng:
            assert eng.snapshot("r", 200).num_rows == 2000
    finally:
        for n in nodes:
            if n.proc is not None:
                n.kill()


def test_an_append_without_a_quorum_is_outcome_unknown_and_says_so(tmp_path, zookeeper, zk_root):
    """Two of three nodes gone: the append fails with QuorumLost, an OutcomeUnknown (it may
    be on the surviving node, and a later recovery may keep it), not a plain failure."""
    from sediment.errors import NothingWritten, OutcomeUnknown, QuorumLost, TimeAlreadySealed

    nodes = [Node(tmp_path / f"node{i}") for i in range(3)]
    start_all(nodes)
    try:
        with sediment.open(tmp_path / "c", replicas=[n.address for n in nodes], cluster_key=str(KEY),
                           metadata=f"zk://{zookeeper.hosts}{zk_root}", blob=f"file://{tmp_path}/shared-blobs") as eng:
            eng.add_relation("r", SCHEMA)
            eng.append("r", ups([1], 1))
            eng.seal("r", 1)
            with pytest.raises(TimeAlreadySealed) as refused:
                eng.append("r", ups([0], 1))
            assert isinstance(refused.value, NothingWritten) and not isinstance(refused.value, OutcomeUnknown)
            nodes[1].kill()
            nodes[2].kill()
            with pytest.raises(QuorumLost) as lost:
                eng.append("r", ups([2], 2))
            assert isinstance(lost.value, OutcomeUnknown) and not isinstance(lost.value, NothingWritten)
            assert "may or may not" in (type(lost.value).__doc__ or "")
    finally:
        for n in nodes:
            if n.proc is not None:
                n.kill()


def test_zookeeper_restart_and_session_expiry_during_appends_do_not_stop_the_coordinator(
        tmp_path, zookeeper, zk_root):
    """ZooKeeper stopped by PID and started again on the same port and data directory while
    appends go on, then the coordinator's ZooKeeper session expired (closed by another
    client with its id, as the server does after the timeout): no other coordinator took
    over, so the coordinator recovers a new store session in the same process and
    appends keep succeeding."""
    import threading

    from kazoo.client import KazooClient
    from kazoo.handlers.threading import KazooTimeoutError

    nodes = [Node(tmp_path / f"node{i}") for i in range(3)]
    start_all(nodes)
    try:
        with sediment.open(tmp_path / "c", replicas=[n.address for n in nodes], cluster_key=str(KEY),
                           metadata=f"zk://{zookeeper.hosts}{zk_root}",
                           blob=f"file://{tmp_path}/shared-blobs") as eng:
            eng.add_relation("r", SCHEMA)
            written = []

            def burst(n: int) -> None:
                for _ in range(n):
                    t = len(written) + 1
                    eng.append("r", ups([t], t))
                    eng.seal("r", t)
                    written.append(t)

            burst(10)
            log = eng.wal
            assert log.coordinator.fenced is None
            lost = threading.Event()
            eng.storage.meta.add_session_lost_listener(lost.set)
            sessions = log.coordinator.sessions_started
            for _attempt in range(5):  # our client may win its session back before the intruder closes it
                intruder = KazooClient(hosts=zookeeper.hosts, client_id=eng.storage.meta._client.client_id, timeout=4)
                try:
                    intruder.start(timeout=10)
                except KazooTimeoutError:  # a loaded server: try again, within the attempts
                    intruder.close()
                    continue
                intruder.stop()
                intruder.close()
                if lost.wait(10):
                    break
            assert lost.is_set(), "the ZooKeeper session did not expire"
            assert log.zk_rechecked.wait(30), "the coordinator did not re-check the partition metadata"
            burst(10)
            assert log.coordinator.fenced is None and log.zk_rechecks == 1
            zookeeper.stop()
            try:
                burst(10)  # the write path needs no ZooKeeper while the replicas are healthy
            finally:
                zookeeper.start()
            burst(10)
            assert log.coordinator.fenced is None
            assert log.coordinator.sessions_started > sessions, "a new store session was recovered"
            assert sorted(eng.snapshot("r", len(written)).column("k").to_pylist()) == written
    finally:
        for n in nodes:
            if n.proc is not None:
                n.kill()


FEEDER = """
import json, sys, pyarrow as pa, sediment
options = json.loads(sys.argv[2])
eng = sediment.open(sys.argv[1], **options)
eng.add_relation("r", pa.schema([("k", pa.int64())]))
t, told = 1, False
while True:
    eng.append("r", pa.table({"k": [t], "time": [t], "diff": [1]}))
    eng.seal("r", t)
    print(t, flush=True)
    if not told and eng.trace_info("r")["batches"] > 0:
        print("compacted", flush=True)
        told = True
    t += 1
"""


def test_killed_coordinator_is_replaced_on_another_data_directory_reading_back_from_s3(
        tmp_path, zookeeper, zk_root, s3_bucket):
    """A coordinator process with batches on S3 (moto) is SIGKILLed after its background
    compacter wrote batches; a new coordinator on another data directory opens from
    ``metadata=`` alone (the storage record is in ZooKeeper) and reads everything back."""
    import json
    import os
    import signal
    import subprocess
    import sys

    import boto3

    from sediment.errors import StorageRecordMismatch

    endpoint, bucket = s3_bucket
    nodes = [Node(tmp_path / f"node{i}") for i in range(3)]
    start_all(nodes)
    spec = f"zk://{zookeeper.hosts}{zk_root}"
    options = {"replicas": [n.address for n in nodes], "cluster_key": str(KEY), "metadata": spec,
               "blob": f"s3://{bucket}/trace", "s3_endpoint": endpoint, "segment_bytes": 1 << 12}
    first = str(tmp_path / "first")
    try:
        with pytest.raises(StorageRecordMismatch, match="blob store every coordinator can reach"):
            sediment.open(tmp_path / "no-blob", **{k: v for k, v in options.items() if k != "blob"})
        proc = subprocess.Popen([sys.executable, "-c", FEEDER, first, json.dumps(options)],
                                stdout=subprocess.PIPE, text=True)
        acked, compacted = 0, None
        try:
            for line in proc.stdout:
                if line.strip() == "compacted":
                    compacted = acked
                    continue
                acked = int(line)
                if compacted is not None and acked >= compacted + 20:
                    break
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        assert compacted is not None, "the feeder's background compacter never wrote a batch"
        keys = [o["Key"] for o in boto3.client("s3", endpoint_url=endpoint).list_objects_v2(
            Bucket=bucket, Prefix="trace/").get("Contents", [])]
        assert keys, "batches are on S3"
        assert not os.path.exists(os.path.join(first, "blobs")), "nothing in the coordinator's own directory"


        with sediment.open(tmp_path / "second", metadata=spec) as eng:  # everything else from ZooKeeper
            sealed = eng.sealed("r")
            assert sealed >= acked
            assert eng.trace_info("r")["batches"] > 0
            assert eng.snapshot("r", sealed).column("k").to_pylist() == list(range(1, sealed + 1))
            eng.append("r", ups([sealed + 1], sealed + 1))
            eng.seal("r", sealed + 1)
        with sediment.open(tmp_path / "third", metadata=spec) as eng:
            assert eng.snapshot("r", sealed + 1).num_rows == sealed + 1
    finally:
        for n in nodes:
            if n.proc is not None:
                n.kill()


def test_a_fenced_served_coordinator_closes_and_serve_exits_non_zero(tmp_path, zookeeper, zk_root):
    """`sediment serve` on one data directory; a second coordinator takes the partition over
    from another directory; the served one learns it was superseded from its watch on the
    partition metadata (no request reaches it), closes its engine, and the serve process
    exits 3 with the reason, naming the new owner."""
    import subprocess
    import sys

    from sediment.errors import SedimentError

    nodes = [Node(tmp_path / f"node{i}") for i in range(3)]
    start_all(nodes)
    spec = f"zk://{zookeeper.hosts}{zk_root}"
    try:
        with sediment.open(tmp_path / "a", replicas=[n.address for n in nodes], cluster_key=str(KEY),
                           metadata=spec, blob=f"file://{tmp_path}/shared-blobs") as eng:
            eng.add_relation("r", SCHEMA)
        serve = subprocess.Popen(
            [sys.executable, "-m", "sediment", "--data-dir", str(tmp_path / "a"), "--metadata", spec, "serve",
             "--listen", "127.0.0.1:0", "--token", "secret"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = serve.stdout.readline()
            assert line.startswith("serving"), (line, serve.stderr.read() if serve.poll() is not None else "")
            uri = line.split(" on ")[-1].strip()
            with sediment.connect(uri, token="secret") as client:
                client.append("r", ups([1], 1))
                with sediment.open(tmp_path / "b", metadata=spec) as newer:
                    newer.append("r", ups([2], 2))
                    assert serve.wait(timeout=60) == 3  # no request reached it: its watch told it
                    assert str(tmp_path / "b") in serve.stderr.read()
                    with pytest.raises(SedimentError):
                        client.append("r", ups([3], 3))
                    newer.seal("r", 2)
                    assert sorted(newer.snapshot("r", 2).column("k").to_pylist()) == [1, 2]
        finally:
            if serve.poll() is None:
                serve.kill()
                serve.wait()
    finally:
        for n in nodes:
            if n.proc is not None:
                n.kill()


def test_tail_reads_come_from_the_coordinators_cache_not_the_nodes(tmp_path, zookeeper, zk_root):
    """Every storage node is killed: snapshots and replays of the uncompacted tail still
    answer, from what the coordinator acknowledged; no read reached a node."""
    nodes = [Node(tmp_path / f"node{i}") for i in range(3)]
    start_all(nodes)
    try:
        with sediment.open(tmp_path / "c", replicas=[n.address for n in nodes], cluster_key=str(KEY),
                           metadata=f"zk://{zookeeper.hosts}{zk_root}", blob=f"file://{tmp_path}/shared-blobs",
                           compact_interval=3600) as eng:
            eng.add_relation("r", SCHEMA)
            for t in range(1, 31):
                eng.append("r", ups([t, -t], t))
                eng.seal("r", t)
            assert eng.trace_info("r")["tail_records"] == 30
            for n in nodes:
                n.kill()
            eng.view.bodies.drop_below(1 << 62)  # the engine's own copies gone: the reads go to the log
            cache = eng.wal.tail_cache
            misses = cache.misses
            for as_of in (1, 15, 30):
                assert eng.snapshot("r", as_of).num_rows == 2 * as_of
            assert sum(b.num_rows for b in eng.replay("r")) == 60
            assert cache.misses == misses and cache.hits >= 30
    finally:
        for n in nodes:
            if n.proc is not None:
                n.kill()


def test_storage_nodes_shared_by_two_zookeeper_roots_refuse_the_second_engine(tmp_path, zookeeper, zk_root):
    """Two engines under different ZooKeeper roots pointed at the same nodes with the same
    cluster key would both be partition 0: the second is refused with PartitionClaimed
    (naming the nodes and what to do), and the first keeps every record and keeps going."""
    from sediment.errors import PartitionClaimed

    nodes = [Node(tmp_path / f"node{i}") for i in range(3)]
    start_all(nodes)
    shared = {"replicas": [n.address for n in nodes], "cluster_key": str(KEY)}
    try:  # each engine has its own blob prefix: a shared one is refused first, by the prefix's owner marker
        with sediment.open(tmp_path / "a", metadata=f"zk://{zookeeper.hosts}{zk_root}/a",
                           blob=f"file://{tmp_path}/blobs-a", **shared) as a:
            a.add_relation("r", SCHEMA)
            a.append("r", ups([1], 1))
            with pytest.raises(PartitionClaimed, match="another engine") as refused:
                sediment.open(tmp_path / "b", metadata=f"zk://{zookeeper.hosts}{zk_root}/b",
                              blob=f"file://{tmp_path}/blobs-b", **shared)
            assert all(n.address in str(refused.value) for n in nodes)
            a.append("r", ups([2], 2))
            a.seal("r", 2)
            assert sorted(a.snapshot("r", 2).column("k").to_pylist()) == [1, 2]
    finally:
        for n in nodes:
            if n.proc is not None:
                n.kill()


def test_a_replaced_coordinator_refuses_reads_within_the_bound_without_any_write(tmp_path, zookeeper, zk_root):
    """Coordinator B takes the partition over from A and seals time 6; A hears of it from
    its ZooKeeper watch on the partition metadata (nothing is written through A) and, within
    the documented 2 s, refuses reads with CoordinatorSuperseded naming B."""
    import threading

    from sediment.errors import CoordinatorSuperseded

    nodes = [Node(tmp_path / f"node{i}") for i in range(3)]
    start_all(nodes)
    spec = f"zk://{zookeeper.hosts}{zk_root}"
    try:
        old = sediment.open(tmp_path / "a", replicas=[n.address for n in nodes], cluster_key=str(KEY),
                            metadata=spec, blob=f"file://{tmp_path}/shared-blobs")
        closed = threading.Event()
        old.superseded_listeners.append(lambda err: closed.set())
        old.add_relation("r", SCHEMA)
        for t in range(1, 6):
            old.append("r", ups([t], t))
            old.seal("r", t)
        assert old.sealed("r") == 5
        with sediment.open(tmp_path / "b", metadata=spec) as newer:
            taken_over = time.monotonic()
            assert closed.wait(2.0), "the replaced coordinator still serves 2 s after the takeover"
            refused_after = time.monotonic() - taken_over
            newer.append("r", ups([6], 6))
            newer.seal("r", 6)
            for read in (old.relations, lambda: old.sealed("r"), lambda: old.snapshot("r", 5)):
                with pytest.raises(CoordinatorSuperseded, match=str(tmp_path / "b")):
                    read()
            assert "another coordinator took over" in str(old.superseded)
            assert newer.snapshot("r", 6).num_rows == 6
        print(f"reads refused {refused_after * 1000:.0f} ms after the new coordinator opened")
        old.close()
    finally:
        for n in nodes:
            if n.proc is not None:
                n.kill()
