"""Writes whose outcome the cluster client cannot know (issue 29): an append, an append_many,
a seal, a transaction commit, a commit_all, appends and append_many with locks, and an alter
each reach the owner, which carries it out, and then lose their answer, once with the owner
alive (the connection is cut) and once with the owner SIGKILLed. Each call returns success
(an alter, the version it made), and each write is applied exactly once.

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

    return _first_kinds(db, round_, commit) + _more_kinds(db, round_)


def _first_kinds(db, round_: int, commit) -> list[tuple[str, bytes, object, object]]:
    return [
        ("append", b'"seq":', lambda: lambda: db.append("ap", rows([10 + round_])),
         lambda c: 10 + round_ in stored_keys(c, "ap")),
        ("append_many", b"append_many",
         lambda: lambda: db.append_many({"m1": rows([20 + round_]), "m2": rows([30 + round_])}),
         lambda c: 20 + round_ in stored_keys(c, "m1")),
        ("seal", b"seal", lambda: lambda: db.seal("se", 5 + round_), lambda c: c.sealed("se") >= 5 + round_),
        ("commit", b"commit", commit, lambda c: 40 + round_ in stored_keys(c, "tx")),
    ]


def _more_kinds(db, round_: int) -> list[tuple[str, bytes, object, object]]:
    """commit_all of two transactions, locked appends (the lock's high-water mark is past every
    time written, so only a second application could conflict) and an alter."""
    locks = sediment.Locks(high_water=100, write=[("lk", round_)])

    def commit_all():
        txns = [db.transaction(), db.transaction()]
        for i, tx in enumerate(txns):
            tx.append("ca", rows([50 + 2 * round_ + i]))
        return lambda: db.commit_all(txns)

    def alter():
        return lambda: versions.append(db.alter_relation("al", add=[pa.field(f"c{round_}", pa.int64())]))

    versions = ALTERED.setdefault(round_, [])
    return [
        ("commit_all", b"commit_all", commit_all, lambda c: 50 + 2 * round_ in stored_keys(c, "ca")),
        ("locked append", b'"locks":{', lambda: lambda: db.append("la", rows([60 + round_]), locks=locks),
         lambda c: 60 + round_ in stored_keys(c, "la")),
        ("locked append_many", b'"locks": {',
         lambda: lambda: db.append_many({"lm": rows([70 + round_])}, locks=sediment.Locks(100, write=[("lm", round_)])),
         lambda c: 70 + round_ in stored_keys(c, "lm")),
        ("alter", b"alter_relation", alter, lambda c: c.schema_version("al") == round_ + 1),
    ]


ALTERED: dict[int, list[int]] = {}  # round -> what the alter call returned
RELATIONS = ("ap", "m1", "m2", "se", "tx", "ca", "la", "lm", "al")


@pytest.mark.parametrize("kinds", ["append append_many seal commit", "commit_all locked alter"])
def test_outcome_unknown_writes_are_retried_and_applied_once(proxied, kinds):
    cluster = proxied.cluster
    proxied.start()
    proxied.start()
    cluster.wait_assigned(cluster.live())
    ALTERED.clear()
    with sediment.connect(cluster.uri, token=TOKEN) as db:
        for name in RELATIONS:
            db.add_relation(name, SCHEMA, partition=PARTITION)
        for round_, kill in enumerate((False, True)):
            for kind, marker, prepare, landed in _kinds(db, round_):
                if kind.split()[0] not in kinds.split():
                    continue
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
        if "append" in kinds.split():
            assert stored_keys(db, "ap") == [10, 11]
            assert stored_keys(db, "m1") == [20, 21] and stored_keys(db, "m2") == [30, 31]
            assert stored_keys(db, "tx") == [40, 41]
            assert db.sealed("se") == 6
        else:
            assert stored_keys(db, "ca") == [50, 51, 52, 53]
            assert stored_keys(db, "la") == [60, 61] and stored_keys(db, "lm") == [70, 71]
            assert ALTERED == {0: [1], 1: [2]} and db.schema_version("al") == 2
            assert db.schema("al").names == ["k", "c0", "c1"]
