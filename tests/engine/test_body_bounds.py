"""A lone append's time bounds and null checks read from its serialized body
(engine/body_bounds.py): the same answer as pyarrow's (``small_bounds``) for every table
shape the short path takes, the refusals decided by the body itself once its layout is
known, and a reader whose layout disagrees with pyarrow turned off."""

from __future__ import annotations

import decimal
import random

import pyarrow as pa
import pytest

import sediment
from sediment.clock import ManualClock
from sediment.engine import body_bounds
from sediment.engine.body_bounds import BodyBounds
from sediment.engine.schema import small_bounds, update_schema

SCHEMAS = [
    pa.schema([("id", pa.int64()), ("payload", pa.binary())]),
    pa.schema([("k", pa.string())]),
    pa.schema([("a", pa.int8()), ("b", pa.bool_()), ("c", pa.float32()), ("d", pa.decimal128(20, 3)),
               ("e", pa.large_string()), ("f", pa.binary(3)), ("g", pa.timestamp("us", "UTC"))]),
]


def _column(t: pa.DataType, n: int, rng: random.Random) -> pa.Array:
    def one(i: int) -> object:
        if rng.random() < 0.2:
            return None
        if pa.types.is_integer(t):
            return rng.randint(-100, 100)
        if pa.types.is_boolean(t):
            return bool(i % 2)
        if pa.types.is_floating(t):
            return rng.random()
        if pa.types.is_decimal(t):
            return decimal.Decimal(rng.randint(0, 10**6)) / 1000
        if pa.types.is_fixed_size_binary(t):
            return bytes(rng.randrange(256) for _ in range(3))
        if pa.types.is_binary(t):
            return rng.randbytes(rng.randint(0, 90))
        if pa.types.is_timestamp(t):
            return rng.randint(0, 10**12)
        return "x" * rng.randint(0, 40)
    return pa.array([one(i) for i in range(n)], t)


def _table(schema: pa.Schema, n: int, rng: random.Random, *, times: list | None = None,
           diffs: list | None = None) -> pa.Table:
    target = update_schema(schema)
    columns = [_column(f.type, n, rng) for f in schema]
    times = times if times is not None else [rng.randint(0, 2**62) for _ in range(n)]
    diffs = diffs if diffs is not None else [rng.choice([1, -1, 0]) for _ in range(n)]
    return pa.Table.from_arrays([*columns, pa.array(times, pa.int64()), pa.array(diffs, pa.int64())],
                                schema=target)


def _bounds(reader: BodyBounds, table: pa.Table) -> tuple[int, int] | None:
    (batch,) = table.to_batches()
    return reader.bounds(batch.serialize(), table)


@pytest.mark.parametrize("schema", SCHEMAS, ids=["binary", "string", "mixed"])
def test_bounds_from_the_body_equal_pyarrow_s_for_every_shape(schema):
    """Random tables of 1-16 rows (nulls in the other columns, slices with an offset, times
    up to 2**62, negative times, nulls in time or diff): the body's answer is pyarrow's, and
    after the first one it comes from the layout learned (pyarrow is not asked)."""
    rng = random.Random(25)
    reader = BodyBounds(len(schema) + 2)
    tables = [_table(schema, rng.randint(1, 16), rng) for _ in range(150)]
    tables += [_table(schema, 20, rng).slice(3, 7), _table(schema, 2, rng, times=[-1, 5]),
               _table(schema, 1, rng, times=[None]), _table(schema, 3, rng, times=[1, None, 2]),
               _table(schema, 1, rng, diffs=[None]), _table(schema, 16, rng, diffs=[1] * 15 + [None]),
               _table(schema, 1, rng, times=[0]), _table(schema, 1, rng, times=[2**63 - 1])]
    _bounds(reader, tables[0])
    asked = []
    real = body_bounds.small_bounds
    body_bounds.small_bounds = lambda table: asked.append(table) or real(table)
    try:
        for table in tables:
            assert _bounds(reader, table) == small_bounds(table)
    finally:
        body_bounds.small_bounds = real
    assert reader.usable and asked == []
    assert [small_bounds(t) for t in tables[-6:-2]] == [None] * 4


def test_a_layout_that_disagrees_with_pyarrow_turns_the_reader_off():
    """A body that is not the table's (its times differ) is caught when its layout is
    learned: the reader answers with pyarrow's bounds from then on, also for later bodies."""
    rng = random.Random(3)
    schema = SCHEMAS[0]
    table = _table(schema, 2, rng, times=[4, 9])
    other = _table(schema, 2, rng, times=[100, 200]).to_batches()[0].serialize()
    reader = BodyBounds(len(schema) + 2)
    assert reader.bounds(other, table) == (4, 9)
    assert not reader.usable
    assert _bounds(reader, _table(schema, 1, rng, times=[7])) == (7, 7)
    assert reader.bounds(other, _table(schema, 1, rng, times=[8])) == (8, 8)


def test_a_message_that_is_not_a_record_batch_is_left_to_pyarrow():
    """Bytes that are no IPC record batch message (too short, no continuation marker, a
    schema message) give pyarrow's answer, and the reader stays on for real bodies."""
    rng = random.Random(4)
    schema = SCHEMAS[0]
    table = _table(schema, 1, rng, times=[3])
    reader = BodyBounds(len(schema) + 2)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema):
        pass
    for junk in (b"", b"\x00" * 64, sink.getvalue()):
        assert reader.bounds(pa.py_buffer(junk), table) == (3, 3)
    assert reader.usable
    assert _bounds(reader, table) == (3, 3)


def test_refusals_after_the_layout_is_learned_are_typed_and_write_nothing(tmp_path):
    """Through the lone path, once good appends taught the reader the layout: a null time,
    a null diff and a negative time are refused with InvalidUpdates and nothing reaches the
    log; the good appends read back."""
    schema = SCHEMAS[0]
    rng = random.Random(5)
    with sediment.open(tmp_path / "d", clock=ManualClock()) as engine:
        engine.add_relation("r", schema)
        for t in (1, 2):
            engine.append("r", _table(schema, 1, rng, times=[t], diffs=[1]))
        end = engine.wal.end_lsn
        for bad in (_table(schema, 1, rng, times=[None]), _table(schema, 2, rng, times=[3, 4], diffs=[1, None]),
                    _table(schema, 3, rng, times=[5, -2, 6])):
            with pytest.raises(sediment.errors.InvalidUpdates):
                engine.append("r", bad)
        assert engine.wal.end_lsn == end
        engine.seal("r", 2)
        assert engine.snapshot("r", as_of=2).num_rows == 2
