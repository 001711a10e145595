"""The small-append body built in Python (engine/small_encode.py) is byte for byte what
``RecordBatch.serialize`` writes, for every type it takes and many shapes; what it does not
take (nulls, sliced or chunked columns, other types) it leaves to ``serialize``; and 64
writers' one-row appends through it read back whole."""

from __future__ import annotations

import decimal
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa

import sediment
from sediment.clock import ManualClock
from sediment.engine.small_encode import SmallBodyEncoder

SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.binary()), ("s", pa.string()), ("f", pa.float64()),
                    ("ts", pa.timestamp("us")), ("d", pa.decimal128(10, 2)), ("fx", pa.binary(4)),
                    ("i8", pa.int8()), ("time", pa.int64()), ("diff", pa.int64())])


def _table(rng: random.Random, n: int) -> pa.Table:
    return pa.table({
        "id": pa.array([rng.randrange(-2**63, 2**63) for _ in range(n)], pa.int64()),
        "payload": pa.array([rng.randbytes(rng.choice([0, 1, 7, 76, 100])) for _ in range(n)], pa.binary()),
        "s": pa.array(["é" * rng.randrange(5) for _ in range(n)], pa.string()),
        "f": pa.array([rng.random() for _ in range(n)], pa.float64()),
        "ts": pa.array([rng.randrange(10**12) for _ in range(n)], pa.timestamp("us")),
        "d": pa.array([decimal.Decimal(rng.randrange(10**6)) / 100 for _ in range(n)], pa.decimal128(10, 2)),
        "fx": pa.array([rng.randbytes(4) for _ in range(n)], pa.binary(4)),
        "i8": pa.array([rng.randrange(-128, 128) for _ in range(n)], pa.int8()),
        "time": pa.array([rng.randrange(1, 9) for _ in range(n)], pa.int64()),
        "diff": pa.array([rng.choice([-1, 1]) for _ in range(n)], pa.int64())}, schema=SCHEMA)


def test_bodies_are_byte_identical_to_serialize():
    rng = random.Random(7)
    encoder = SmallBodyEncoder(SCHEMA)
    built = 0
    for _ in range(600):
        table = _table(rng, rng.choice([1, 1, 1, 2, 5, 64]))
        got = encoder.encode(table)
        if got is not None:
            built += 1
            assert got == table.to_batches()[0].serialize().to_pybytes()
    assert built == 600


def test_what_it_does_not_take_goes_back_to_serialize():
    rng = random.Random(8)
    encoder = SmallBodyEncoder(SCHEMA)
    table = _table(rng, 4)
    with_null = table.set_column(0, "id", pa.array([None, 1, 2, 3], pa.int64()))
    chunked = pa.concat_tables([table.slice(0, 2), table.slice(2)])
    sliced = _table(rng, 6).slice(2)
    for t in (with_null, chunked, sliced):
        assert encoder.encode(t) is None
    assert SmallBodyEncoder(pa.schema([("b", pa.bool_()), ("time", pa.int64()), ("diff", pa.int64())])).encode(
        pa.table({"b": [True], "time": [1], "diff": [1]})) is None


def test_many_writers_one_row_appends_read_back_whole(tmp_path):
    threads, each = 32, 20
    rng = random.Random(9)
    rows = [_table(rng, 1) for _ in range(threads * each)]
    with sediment.open(tmp_path / "d", clock=ManualClock()) as engine:
        engine.add_relation("r", pa.schema(list(SCHEMA)[:-2]))
        start = threading.Barrier(threads)

        def work(w: int) -> None:
            start.wait()
            for i in range(each):
                engine.append("r", rows[w * each + i])

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(work, range(threads)))
        engine.seal("r", 9)
        want = pa.concat_tables(rows).group_by([n for n in SCHEMA.names if n not in ("time", "diff")]).aggregate(
            [("diff", "sum")])
        got = engine.snapshot("r", as_of=9)
        key = ["id", "payload"]
        assert got.num_rows == want.num_rows == threads * each
        assert got.sort_by([(k, "ascending") for k in key]).column("s").to_pylist() == \
            want.sort_by([(k, "ascending") for k in key]).column("s").to_pylist()
        assert sorted(got.column("diff").to_pylist()) == sorted(want.column("diff_sum").to_pylist())
