"""WAL tails held on the coordinator for a read plan's lease and fetched part by part
(sediment/net/held_tails.py, the ``plan`` ticket's ``hold_tail`` and the ``tail_part``
ticket): a real engine served over Flight on 127.0.0.1, the parts checked against the tail
the plan would have carried, and the bookkeeping against a clock passed in."""

from __future__ import annotations

import random
from collections import Counter
from types import SimpleNamespace

import pyarrow as pa
import pytest

import sediment
from sediment.clock import ManualClock
from sediment.errors import InvalidArgument
from sediment.net import held_tails
from sediment.net.held_tails import HeldTails

SCHEMA = pa.schema([("id", pa.int64()), ("item", pa.string())])


def rows_of(table: pa.Table) -> Counter:
    return Counter(zip(*(table.column(n).to_pylist() for n in ("id", "item", "time", "diff")), strict=True))


def big_tail(c, n: int) -> list[tuple]:
    rnd = random.Random(7)
    updates = [(rnd.choice([None, *range(n // 3)]), rnd.choice(["a", "b", None]), rnd.randrange(1, 4),
                rnd.choice([1, -1, 2])) for _ in range(n)]
    cols = list(zip(*updates, strict=True))
    c.engine.append("orders", pa.table({"id": pa.array(cols[0], pa.int64()), "item": pa.array(cols[1], pa.string()),
                                        "time": pa.array(cols[2], pa.int64()), "diff": pa.array(cols[3], pa.int64())}))
    c.engine.seal("orders", 3)
    return updates


def test_a_big_tail_stays_on_the_coordinator_and_its_parts_make_it_up(coordinator):
    c = coordinator(compact_interval=None)  # compaction runs when a segment fills: the rows stay WAL tail
    c.engine.add_relation("orders", SCHEMA)
    updates = big_tail(c, 30_000)
    assert c.engine.trace_info("orders")["batches"] == 0
    want = Counter(u for u in updates if u[2] <= 2)
    with sediment.connect(c.uri, c.token) as client:
        plan, held, cuts = client.plan_read_held("orders", 2, part_rows=4_000, max_parts=5)
        assert held == {"rows": sum(want.values()), "parts": 5, "key": "id"} and plan.tail.num_rows == 0
        assert plan.tail.schema.names == ["id", "item", "time", "diff"]
        assert len(cuts) == 4 and cuts.to_pylist() == sorted(set(cuts.to_pylist()))
        parts = [client.tail_part("orders", plan.lease, key="id", cuts=cuts, index=i) for i in range(len(cuts) + 1)]
        assert sum((rows_of(p) for p in parts), Counter()) == want  # every row in exactly one part
        bounds = [None, *cuts.to_pylist(), None]
        for i, p in enumerate(parts):
            ids = p.column("id").to_pylist()
            assert all((v is None and i == 0) or (v is not None and (bounds[i] is None or v >= bounds[i]) and
                                                  (bounds[i + 1] is None or v < bounds[i + 1])) for v in ids), i
            assert p.num_rows < 0.5 * held["rows"]  # quantiles spread the rows
        sliced = [client.tail_part("orders", plan.lease, start=s, stop=s + 7_000) for s in range(0, held["rows"], 7_000)]
        assert sum((rows_of(p) for p in sliced), Counter()) == want
        assert rows_of(client.tail_part("orders", plan.lease)) == want
        with pytest.raises(InvalidArgument, match="holds WAL-tail rows of relation 'orders'"):
            c.engine.add_relation("other", SCHEMA)
            client.tail_part("other", plan.lease)
        client.release_read(plan.lease)
        with pytest.raises(InvalidArgument, match="released or expired"):
            client.tail_part("orders", plan.lease, start=0, stop=10)
        small, none, _ = client.plan_read_held("orders", 2, part_rows=1 << 20)  # one part: the rows come inline
        assert none is None and rows_of(small.tail) == want
        client.release_read(small.lease)
        assert rows_of(client.plan_read("orders", 2).tail) == want  # the plain plan is unchanged


def test_the_servers_held_tails_expire_on_the_servers_clock(tmp_path):
    """The server gives its clock to the held tails: moved past the lease, the rows are gone
    (with the real clock they would still be held for ten minutes)."""
    from sediment.server import SedimentFlightServer

    clock = ManualClock()
    engine = sediment.open(tmp_path / "d", compact_interval=None)
    server = SedimentFlightServer(engine, "grpc://127.0.0.1:0", "t" * 32, clock=clock)
    try:
        engine.add_relation("orders", SCHEMA)
        big_tail(SimpleNamespace(engine=engine), 9_000)
        with sediment.connect(server.uri, "t" * 32) as client:
            plan, held, _ = client.plan_read_held("orders", 2, lease_seconds=30.0, part_rows=1_000)
            assert held is not None and client.tail_part("orders", plan.lease, start=0, stop=10).num_rows == 10
            clock.advance(30.0)
            with pytest.raises(InvalidArgument, match="released or expired"):
                client.tail_part("orders", plan.lease, start=0, stop=10)
    finally:
        server.stop(grace=10.0)
        engine.close()


def test_held_tails_are_bounded_in_bytes_and_end_with_their_lease():
    clock = ManualClock()
    held = HeldTails(max_bytes=10_000, clock=clock)
    table = pa.table({"id": pa.array(range(500), pa.int64()), "time": pa.repeat(pa.scalar(1, pa.int64()), 500)})
    assert held.hold(1, "r", table, 10.0)  # 8,000 bytes
    assert not held.hold(2, "r", table, 10.0)  # past the bound: the caller sends the rows inline
    clock.advance(10.0)  # lease 1's deadline
    assert held.leases() == [] and held.hold(2, "r", table, 10.0)
    with pytest.raises(InvalidArgument, match="lease 1"):
        held.part(1, "r")
    held.release(2)
    assert held.hold(3, "r", table, 10.0)  # the released bytes count no more


def test_range_index_and_quantile_cuts_match_a_model():
    rnd = random.Random(3)
    for _ in range(200):
        values = [rnd.choice([None, *range(30)]) for _ in range(rnd.randrange(0, 40))]
        parts = rnd.randrange(1, 6)
        cuts = held_tails.quantile_cuts(pa.chunked_array([pa.array(values, pa.int64())]), parts).to_pylist()
        assert cuts == sorted(set(cuts)) and len(cuts) <= max(0, parts - 1)
        known = sorted(v for v in values if v is not None)
        assert all(c in known for c in cuts)
        idx = held_tails.range_index(pa.array(values, pa.int64()), cuts).to_pylist()
        assert idx == [0 if v is None else sum(v >= c for c in cuts) for v in values]


@pytest.mark.parametrize("t", [pa.decimal32(5, 2), pa.decimal64(12, 2)])
def test_quantile_cuts_of_a_decimal_key_are_in_value_order(t):
    """pyarrow 26 cannot sort decimal32/decimal64 by itself: the cuts of a tail keyed by one
    failed with ArrowNotImplementedError."""
    import decimal
    values = [decimal.Decimal(v) for v in ("3.00", "-1.00", "2.56", "-300.00", "0.01", "-0.01", "1.00", "9.99")]
    cuts = held_tails.quantile_cuts(pa.chunked_array([pa.array([*values, None], t)]), 4).to_pylist()
    ordered = sorted(values)
    assert cuts == [ordered[2], ordered[4], ordered[6]]


def test_tail_part_cuts_that_do_not_compare_with_the_key_are_invalid_argument(coordinator):
    """Cut points come from the caller (a Spark task passes on the plan's): text cuts on the
    int64 key, or cuts that do not fit in it, are the caller's mistake (InvalidArgument naming
    the key and the types), not the server's failure (ServerError); the held rows stay."""
    c = coordinator(compact_interval=None)
    c.engine.add_relation("orders", SCHEMA)
    want = Counter(u for u in big_tail(c, 3_000) if u[2] <= 2)
    with sediment.connect(c.uri, c.token) as client:
        plan, held, cuts = client.plan_read_held("orders", 2, part_rows=500, max_parts=4)
        assert held is not None and cuts.type == pa.int64()
        for bad, why in ((pa.array(["a", "m"]), "cannot be compared"), (pa.array([1.5]), "do not fit"),
                         (pa.array([2**63], pa.uint64()), "do not fit")):
            with pytest.raises(InvalidArgument, match=f"key column 'id' of type int64 {why}"):
                client.tail_part("orders", plan.lease, key="id", cuts=bad, index=1)
        narrow = cuts.cast(pa.int32())  # cuts of another integer type that fit are taken as they are
        parts = [client.tail_part("orders", plan.lease, key="id", cuts=narrow, index=i) for i in range(len(cuts) + 1)]
        assert sum((rows_of(p) for p in parts), Counter()) == want
