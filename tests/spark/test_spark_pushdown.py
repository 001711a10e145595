"""The pure logic behind the Spark source's pushdown and key ranges, against brute force:
statistics never rule out a row group that holds a matching row, the Arrow expression keeps
exactly the rows the filter means, and every value falls in exactly one key range."""

from __future__ import annotations

import itertools
import random

import pyarrow as pa
import pytest

pytest.importorskip("pyspark", reason="the Spark source needs PySpark")

from pyspark.sql.datasource import (  # noqa: E402
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    StringStartsWith,
)

from sediment.spark_jobs import batch_read, pushdown  # noqa: E402

OPS = {"=": lambda v, x: v == x, "<": lambda v, x: v < x, "<=": lambda v, x: v <= x,
       ">": lambda v, x: v > x, ">=": lambda v, x: v >= x}


def truth(f, v) -> bool:
    op, _, x = f
    if op == "isnull":
        return v is None
    if op == "notnull":
        return v is not None
    if v is None:
        return False
    if op == "in":
        return v in x
    return OPS[op](v, x)


def filters_over(values):
    for op in ("=", "<", "<=", ">", ">="):
        for x in values:
            yield (op, "a", x)
    for k in (1, 2):
        for xs in itertools.combinations(values, k):
            yield ("in", "a", xs)
    yield ("isnull", "a", None)
    yield ("notnull", "a", None)


def test_statistics_never_rule_out_a_matching_group_and_the_expression_is_exact():
    domain = [-2, 0, 1, 3, 5]
    for group in itertools.chain.from_iterable(
            itertools.combinations_with_replacement([*domain, None], n) for n in range(1, 4)):
        known = [v for v in group if v is not None]
        lo, hi = (min(known), max(known)) if known else (None, None)
        nulls = sum(v is None for v in group)
        table = pa.table({"a": pa.array(list(group), pa.int64())})
        for f in filters_over([-3, 0, 2, 5, 6]):
            matches = [v for v in group if truth(f, v)]
            if matches:
                assert pushdown.may_match(f, lo, hi, nulls, len(group)), (f, group)
            got = table.filter(pushdown.expression(f, pa.int64())).column("a").to_pylist()
            assert got == matches, (f, group)
            assert pushdown.apply(table, [f]).column("a").to_pylist() == matches, (f, group)
            for unknown in ((None, None, None), (lo, hi, None)):  # missing statistics: never skip
                if unknown[0] is None or f[0] in ("isnull", "notnull"):
                    assert pushdown.may_match(f, *unknown, len(group))


def test_spark_filters_translate_and_odd_ones_stay_with_spark():
    cols = ["a", "s"]
    assert pushdown.from_spark(EqualTo(("a",), 3), cols) == ("=", "a", 3)
    assert pushdown.from_spark(In(("a",), (1, 2)), cols) == ("in", "a", (1, 2))
    assert pushdown.from_spark(IsNull(("s",)), cols) == ("isnull", "s", None)
    assert pushdown.from_spark(IsNotNull(("s",)), cols) == ("notnull", "s", None)
    for f, op in ((LessThan(("a",), 1), "<"), (LessThanOrEqual(("a",), 1), "<="),
                  (GreaterThan(("a",), 1), ">"), (GreaterThanOrEqual(("a",), 1), ">=")):
        assert pushdown.from_spark(f, cols) == (op, "a", 1)
    assert pushdown.from_spark(EqualTo(("diff",), 1), cols) is None  # diff exists only after consolidation
    assert pushdown.from_spark(EqualTo(("a", "b"), 1), cols) is None  # nested
    assert pushdown.from_spark(StringStartsWith(("s",), "x"), cols) is None
    schema = pa.schema([("a", pa.int32()), ("s", pa.string()), ("f", pa.float64())])
    assert pushdown.usable(("=", "a", 7), schema)
    assert not pushdown.usable(("=", "a", 1 << 40), schema)  # would not fit the column: Spark decides
    assert not pushdown.usable(("=", "a", "x"), schema)
    assert not pushdown.usable(("=", "f", 1.0), schema)  # NaN orders differently in Spark and Arrow
    assert pushdown.usable(("in", "s", ("x", "y")), schema)


def test_every_value_falls_in_exactly_one_key_range_and_groups_meet_their_ranges():
    rnd = random.Random(5)
    for _ in range(200):
        values = [rnd.choice([None, *range(20)]) for _ in range(rnd.randrange(1, 30))]
        cuts = sorted(set(rnd.sample(range(1, 20), rnd.randrange(0, 4))))
        idx = batch_read.range_index(pa.array(values, pa.int64()), cuts).to_pylist()
        for v, i in zip(values, idx, strict=True):
            want = 0 if v is None else sum(v >= c for c in cuts)
            assert i == want
        known = [v for v in values if v is not None]
        g = batch_read.GroupStats(0, 0, len(values), (min(known) if known else None, max(known) if known else None,
                                                     values.count(None)), (0, 0))
        for i in set(idx):
            assert batch_read.meets(g, cuts, i), (values, cuts, i)


def test_range_cuts_are_increasing_and_balance_rows():
    groups = [batch_read.GroupStats(b, i, 100, (lo, lo + 9, 0), (0, 0))
              for b in range(3) for i, lo in enumerate(range(0, 100, 10))]
    cuts = batch_read.boundaries(groups, 600)
    assert cuts == sorted(set(cuts)) and 3 <= len(cuts) <= 5
    assert batch_read.boundaries(groups[:1], 10) == []
    col = pa.chunked_array([pa.array(list(range(1000)), pa.int64())])
    q = batch_read.quantile_cuts(col, 4)
    assert q == [250, 500, 750]
