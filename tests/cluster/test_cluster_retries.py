"""Writes whose outcome the cluster client cannot know (issue 29): an append, an append_many,
a seal and a transaction commit each reach the owner, which carries it out, and then lose
their answer, once with the owner alive (the connection is cut) and once with the owner
SIGKILLed. Each call returns success, and each write is applied exactly once.

Real processes: ZooKeeper, moto's S3, three storage nodes, ``sediment serve --cluster``
members, each advertised through a TCP proxy that withholds the answer to the request it is
armed for (tests/support/cut_proxy.py)."""

from __future__ import annotations

import signal
import threading
import time

import pyarrow as pa
import pytest
from support.cluster_procs import TOKEN, Cluster, running_cluster
from support.cut_proxy import CutProxy

import sediment
from sediment.client import Client

pytestmark = [pytest.mark.slow, pytest.mark.zookeeper, pytest.mark.s3, pytest.mark.timeout(300)]
SCHEMA = pa.schema([("k", pa.int64())])
PARTITION = 0  # every relation of the test: one owner to cut off


def rows(keys: list[int], t: int = 1) -> pa.Table:
    return pa.table({"k": pa.array(keys, pa.int64()), "time": pa.array([t] * len(keys), pa.int64()),
                     "diff": pa.array([1] * len(keys), pa.int64())})


def stored_keys(client, name: str) -> list[int]:
    """Every stored (committed) row's key, once per unit of diff."""
    out = []
    for batch in client.replay(name):
        for k, d in zip(batch.column("k").to_pylist(), batch.column("diff").to_pylist(), strict=True):
            out += [k] * d
    return sorted(out)


def wait_for(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.05)


class ProxiedCluster:
    """A cluster whose members each advertise a CutProxy in front of them."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.proxies: dict[str, CutProxy] = {}

    def start(self) -> None:
        proxy = CutProxy()
        member = self.cluster.start_member(advertise=proxy.uri)
        proxy.upstream = member.uri
        self.proxies[member.member_id] = proxy

    def owner(self):
        member = self.cluster.owner_of(PARTITION)
        return member, self.proxies[member.member_id]

    def close(self) -> None:
        for p in self.proxies.values():
            p.close()


@pytest.fixture
def proxied(tmp_path, zookeeper, zk_root, moto_server, s3_bucket):
    with running_cluster(tmp_path, zookeeper, zk_root, moto_server, s3_bucket) as c:
        p = ProxiedCluster(c)
        try:
            yield p
        finally:
            p.close()


def _kinds(db, round_: int) -> list[tuple[str, bytes, object, object]]:
    """(kind, the request's marker, what makes the call, whether the owner holds its effect
    (asked directly)). The commit's transaction is begun and written just before, at the
    partition's owner of the moment: durable and invisible when its commit is cut off."""

    def commit():
        tx = db.transaction()
        tx.append("tx", rows([40 + round_]))
        return tx.commit

    return [
        ("append", b'"seq":', lambda: lambda: db.append("ap", rows([10 + round_])),
         lambda c: 10 + round_ in stored_keys(c, "ap")),
        ("append_many", b"append_many",
         lambda: lambda: db.append_many({"m1": rows([20 + round_]), "m2": rows([30 + round_])}),
         lambda c: 20 + round_ in stored_keys(c, "m1")),
        ("seal", b"seal", lambda: lambda: db.seal("se", 5 + round_), lambda c: c.sealed("se") >= 5 + round_),
        ("commit", b"commit", commit, lambda c: 40 + round_ in stored_keys(c, "tx")),
    ]


def test_outcome_unknown_writes_are_retried_and_applied_once(proxied):
    cluster = proxied.cluster
    proxied.start()
    proxied.start()
    cluster.wait_assigned(cluster.live())
    with sediment.connect(cluster.uri, token=TOKEN) as db:
        for name in ("ap", "m1", "m2", "se", "tx"):
            db.add_relation(name, SCHEMA, partition=PARTITION)
        for round_, kill in enumerate((False, True)):
            for kind, marker, prepare, landed in _kinds(db, round_):
                owner, proxy = proxied.owner()
                call = prepare()
                proxy.arm(marker)
                failures: list[BaseException] = []

                def run(call=call, failures=failures) -> None:
                    try:
                        call()
                    except BaseException as exc:  # noqa: BLE001 - asserted empty below
                        failures.append(exc)

                worker = threading.Thread(target=run)
                worker.start()
                assert proxy.triggered.wait(30), f"{kind}: the request never went through the owner's proxy"
                try:
                    with Client(owner.uri, TOKEN) as direct:
                        wait_for(lambda landed=landed, direct=direct: landed(direct), f"{kind} to land at the owner")
                except AssertionError:
                    proxy.cut()
                    worker.join(90)
                    raise AssertionError(f"{kind} did not land at the owner; the call: {failures}") from None
                if kill:
                    owner.signal(signal.SIGKILL)
                    owner.wait()
                proxy.cut()
                worker.join(90)
                assert not worker.is_alive() and failures == [], (kind, kill, failures)
                if kill:  # keep two members for the next kind
                    proxied.start()
                    cluster.wait_assigned(cluster.live())
        assert stored_keys(db, "ap") == [10, 11]
        assert stored_keys(db, "m1") == [20, 21] and stored_keys(db, "m2") == [30, 31]
        assert stored_keys(db, "tx") == [40, 41]
        assert db.sealed("se") == 6
