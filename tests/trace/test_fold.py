"""trace/fold.py: the compacter's consolidation routes against consolidate() itself."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from sediment.errors import DiffOverflow
from sediment.trace.consolidate import consolidate
from sediment.trace.fold import fold


def table(rnd: random.Random, n: int, kind: str) -> pa.Table:
    if kind == "repeats":  # few distinct rows: the hash route
        ks = [rnd.choice([None, 1, 2, 3]) for _ in range(n)]
    elif kind == "fresh":  # distinct first column: the no-runs route
        ks = rnd.sample(range(10 * n + 1), n)
    else:
        ks = [rnd.randint(0, n) for _ in range(n)]
    return pa.table({
        "k": pa.array(ks, pa.int64()),
        "v": pa.array([rnd.choice(["a", "b", None, "cc"]) for _ in range(n)], pa.string()),
        "b": pa.array([rnd.choice([b"x", b"", None]) for _ in range(n)], pa.binary()),
        "time": pa.array([rnd.randint(0, 6) for _ in range(n)], pa.int64()),
        "diff": pa.array([rnd.choice([1, -1, 0, 2, -2]) for _ in range(n)], pa.int64()),
    })


@pytest.mark.parametrize("kind", ["repeats", "fresh", "mixed"])
def test_fold_equals_consolidate(kind):
    rnd = random.Random(kind)
    for _ in range(400):
        t = table(rnd, rnd.randint(0, 40), kind)
        since = rnd.choice([None, 0, 3, 7])
        keys = rnd.choice([["k", "v", "b"], ["v", "k"], ["b"], ["k"]])
        got, want = fold(t, keys, since), consolidate(t, keys, since)
        assert got.equals(want), (keys, since, t.to_pylist())


def test_float_keys_and_chunked_input_take_the_general_route():
    rnd = random.Random(5)
    for _ in range(100):
        n = rnd.randint(0, 30)
        t = pa.table({"f": pa.array([rnd.choice([1.0, float("nan"), None, 2.5]) for _ in range(n)], pa.float64()),
                      "time": pa.array([1] * n, pa.int64()), "diff": pa.array([1] * n, pa.int64())})
        t = pa.concat_tables([t.slice(0, n // 2), t.slice(n // 2)])
        assert repr(fold(t, ["f"], None).to_pylist()) == repr(consolidate(t, ["f"], None).to_pylist())


def test_diffs_that_could_overflow_raise_as_consolidate_does():
    big = (1 << 62)
    t = pa.table({"k": pa.array([1, 1, 1], pa.int64()), "time": pa.array([0, 0, 0], pa.int64()),
                  "diff": pa.array([big, big, big], pa.int64())})
    with pytest.raises(DiffOverflow):
        consolidate(t, ["k"])
    with pytest.raises(DiffOverflow):
        fold(t, ["k"])
    ok = pa.table({"k": pa.array([1, 1, 2], pa.int64()), "time": pa.array([0, 0, 0], pa.int64()),
                   "diff": pa.array([big, -big, big], pa.int64())})
    assert fold(ok, ["k"]).equals(consolidate(ok, ["k"]))


def test_the_hash_route_is_taken_only_when_rows_repeat_as_a_whole():
    """A counter (the same 1,000 rows appended 200 times) hashes; a first column with few
    values over distinct rows (a tenant id before fresh ids, 200k rows) sorts, where hashing
    ~n groups cost 4x the sort. Both give consolidate's answer."""
    from sediment.trace.fold import _few_groups

    n = 200_000
    counter = pa.table({"k": pa.array([i % 1000 for i in range(n)], pa.int64()),
                        "v": pa.array([f"row-{i % 1000}" for i in range(n)]),
                        "time": pa.array([7] * n, pa.int64()), "diff": pa.array([1] * n, pa.int64())})
    tenants = pa.table({"k": pa.array([i % 10 for i in range(n)], pa.int64()),
                        "v": pa.array([f"id-{i}" for i in range(n)]),
                        "time": pa.array([i % 50 for i in range(n)], pa.int64()),
                        "diff": pa.array([1] * n, pa.int64())})
    assert _few_groups(counter, ["k", "v"], n)
    assert not _few_groups(tenants, ["k", "v"], n)
    for table in (counter, tenants):
        assert fold(table, ["k", "v"], 3).equals(consolidate(table, ["k", "v"], 3))


def test_fresh_ids_in_order_are_taken_as_they_are(monkeypatch):
    """Ids increasing row by row (a stream of fresh keys) are sorted and distinct already: the
    fold neither counts distinct values nor sorts, drops zero diffs, advances times, and gives
    consolidate's answer; ids that tie or fall back take the other routes, with the same answer."""
    from sediment.trace import fold as fold_mod

    def refuse(*args, **kwargs):
        raise AssertionError("fresh ids in order must not be counted or sorted")

    fresh = pa.table({"k": pa.array(range(10, 20_010), pa.int64()), "v": pa.array([b"p" * 100] * 20_000),
                      "time": pa.array([i % 7 for i in range(20_000)], pa.int64()),
                      "diff": pa.array([0 if i % 13 == 0 else 1 for i in range(20_000)], pa.int64())})
    expected = consolidate(fresh, ["k", "v"], 3)
    with monkeypatch.context() as m:
        m.setattr(fold_mod, "_few_groups", refuse)
        m.setattr(fold_mod, "sorted_table", refuse)
        got = fold(fresh, ["k", "v"], 3)
    assert got.equals(expected) and got.num_rows == 20_000 - len(range(0, 20_000, 13))
    tied = fresh.set_column(0, "k", pa.array([10 + i // 2 for i in range(20_000)], pa.int64()))
    back = fresh.set_column(0, "k", pa.array(range(20_000, 0, -1), pa.int64()))
    for table in (tied, back):
        assert fold(table, ["k", "v"], 3).equals(consolidate(table, ["k", "v"], 3))


def test_interleaved_fresh_ids_are_judged_on_a_sample_not_by_hashing_every_row(monkeypatch):
    """Four writers' fresh ids interleaved append by append (``_increasing`` fails) take the
    sort route, decided on a sample: counting the distinct values of the whole first column
    hashed every row, a third of a compaction pass's CPU. The answer is consolidate's."""
    import pyarrow.compute as pc

    from sediment.trace import fold as fold_mod

    counted = []
    real = pc.count_distinct

    def counting(values, *args, **kwargs):
        counted.append(len(values))
        return real(values, *args, **kwargs)

    monkeypatch.setattr(pc, "count_distinct", counting)
    pieces = [pa.table({"k": pa.array(range((w << 40) + 1000 * a, (w << 40) + 1000 * (a + 1)), pa.int64()),
                        "v": pa.array([b"x" * 20] * 1000), "time": pa.array([a] * 1000, pa.int64()),
                        "diff": pa.array([1] * 1000, pa.int64())})
              for a in range(100) for w in range(4)]
    table = pa.concat_tables(pieces)
    n = table.num_rows
    assert not fold_mod._few_groups(table, ["k", "v"], n)
    assert counted and max(counted) <= 2 * fold_mod.SAMPLE_ROWS < n
    repeated = pa.concat_tables([pieces[0]] * 400)  # the same 1,000 rows again and again: still hashed
    assert fold_mod._few_groups(repeated, ["k", "v"], n)
    assert fold(table, ["k", "v"], 50).equals(consolidate(table, ["k", "v"], 50))
