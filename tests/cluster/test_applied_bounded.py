"""What a partition owner keeps for keyed appends (cluster/applied.py) while clients come and
go: no lock per client id ever seen, and no closed engine of a partition it no longer owns.
A plain local engine stands for the partition's (the bookkeeping is the same)."""

from __future__ import annotations

import gc
import weakref

import pyarrow as pa

import sediment
from sediment.cluster.applied import AppliedOnce, load

SCHEMA = pa.schema([("k", pa.int64())])


def rows(ks: list[int]) -> pa.Table:
    n = len(ks)
    return pa.table({"k": pa.array(ks, pa.int64()), "time": pa.array([1] * n, pa.int64()),
                     "diff": pa.array([1] * n, pa.int64())})


def keyed_append(applied: AppliedOnce, engine, client: str, seq: int, k: int) -> bool:
    return applied.append_many(engine, 0, {"r": rows([k])}, client, seq)


def test_client_ids_that_come_and_go_leave_no_lock_behind(tmp_path):
    applied = AppliedOnce()
    with sediment.open(tmp_path / "p0", compact_interval=None) as engine:
        engine.add_relation("r", SCHEMA)
        for i in range(40):  # a client (thread) per id, two appends each, the second one resent
            client = f"client-{i}"
            assert keyed_append(applied, engine, client, 1, i)
            assert keyed_append(applied, engine, client, 2, 100 + i)
            assert not keyed_append(applied, engine, client, 2, 100 + i)  # a retry: not applied again
        assert len(applied._client_locks) == 0
        engine.seal("r", 1)
        got = engine.snapshot("r", 1).column("k").to_pylist()
        assert sorted(got) == sorted([*range(40), *range(100, 140)])
        assert load(engine) == {f"client-{i}": 2 for i in range(40)}  # kept per client id ever (docs/formats.md)


def test_a_partition_engine_closed_and_replaced_is_not_kept(tmp_path):
    applied = AppliedOnce()
    engine = sediment.open(tmp_path / "p0", compact_interval=None)
    engine.add_relation("r", SCHEMA)
    assert keyed_append(applied, engine, "c", 1, 1)
    engine.close()  # the partition moved to another member
    old = weakref.ref(engine)
    del engine
    gc.collect()
    assert old() is None, "the owner's table still holds the closed engine"
    with sediment.open(tmp_path / "p0", compact_interval=None) as again:  # owned here again: the table is rebuilt
        assert not keyed_append(applied, again, "c", 1, 1)
        assert keyed_append(applied, again, "c", 2, 2)
        again.seal("r", 1)
        assert sorted(again.snapshot("r", 1).column("k").to_pylist()) == [1, 2]
