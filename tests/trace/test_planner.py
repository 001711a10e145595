"""The compaction planner: shape of its tasks and the amortised cost of following it."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sediment.trace.planner import MergeTask, plan_merges
from sediment.trace.state import BatchRef


def refs(sizes: list[int]) -> list[BatchRef]:
    return [BatchRef(None if s == 0 else f"k{i}", i, i + 1, s, 0, 0) for i, s in enumerate(sizes)]


def run(batches: list[BatchRef], tasks: list[MergeTask]) -> tuple[list[BatchRef], int]:
    """Apply tasks (as the compacter would); returns the new list and rows rewritten."""
    rewritten = 0
    for t in sorted(tasks, key=lambda t: -t.start):
        rows = sum(b.rows for b in batches[t.start : t.stop])
        rewritten += rows
        key = None if rows == 0 else f"m{t.lower}-{t.upper}"
        batches[t.start : t.stop] = [BatchRef(key, t.lower, t.upper, rows, 0, t.level)]
    return batches, rewritten


def settle(batches: list[BatchRef], **kw) -> tuple[list[BatchRef], int]:
    total = 0
    for _ in range(100):
        tasks = plan_merges(batches, **kw)
        if not tasks:
            return batches, total
        batches, r = run(batches, tasks)
        total += r
    raise AssertionError("planning did not reach a fixed point")


def simulate(sizes: list[int], **kw) -> tuple[int, list[BatchRef], int]:
    """Append one batch at a time, settling after each; returns (rows rewritten, final list, max length)."""
    batches: list[BatchRef] = []
    total = longest = 0
    for i, s in enumerate(sizes):
        batches.append(BatchRef(None if s == 0 else f"a{i}", i, i + 1, s, 0, 0))
        batches, r = settle(batches, **kw)
        total += r
        longest = max(longest, len(batches))
    return total, batches, longest


sizes_st = st.lists(st.sampled_from([0, 0, 1, 5, 100, 1000, 10**5]), max_size=40)


@settings(max_examples=300, deadline=None)
@given(sizes_st, st.sets(st.integers(0, 39), max_size=5), st.sampled_from([1.5, 2.0, 4.0]), st.sampled_from([1, 64]))
def test_tasks_are_adjacent_disjoint_and_described(sizes, busy, factor, min_rows):
    batches = refs(sizes)
    tasks = plan_merges(batches, factor=factor, min_rows=min_rows, in_flight=busy)
    used: set[int] = set()
    for t in tasks:
        assert len(t.indices) >= 2
        assert list(t.indices) == list(range(t.start, t.stop))
        assert not used & set(t.indices)
        assert not busy & set(t.indices)
        used |= set(t.indices)
        assert (t.lower, t.upper) == (batches[t.start].lower, batches[t.stop - 1].upper)
        assert t.rows == sum(b.rows for b in batches[t.start : t.stop])
        assert t.level == 1 + max(b.level for b in batches[t.start : t.stop])
    assert [t.start for t in tasks] == sorted(t.start for t in tasks)


@settings(max_examples=200, deadline=None)
@given(sizes_st, st.sampled_from([2.0, 4.0]))
def test_fixed_point_is_geometric(sizes, factor):
    batches, _ = settle(refs(sizes), factor=factor, min_rows=1)
    data = [b.rows for b in batches if b.rows]
    for older, newer in zip(data, data[1:], strict=False):
        assert older > factor * newer
    for a, b in zip(batches, batches[1:], strict=False):
        assert not (a.key is None and b.key is None), "adjacent empty intervals should coalesce"


@pytest.mark.parametrize("factor,bound", [(2.0, 1.0), (4.0, 1.5)])
def test_equal_appends_cost_n_log_n(factor, bound):
    n, s = 4096, 100
    rewritten, final, longest = simulate([s] * n, factor=factor, min_rows=1)
    assert rewritten <= bound * n * s * math.log2(n)
    assert len(final) <= math.log(n, factor) + 2
    assert longest <= 2 * math.log(n, factor) + 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 10**6), min_size=2, max_size=300))
def test_any_append_sizes_cost_n_log_n(sizes):
    rewritten, final, _ = simulate(sizes, factor=2.0, min_rows=1)
    total = sum(sizes)
    assert rewritten <= 2 * total * math.log2(len(sizes) + 1)
    assert len(final) <= math.log2(total) + 2


def test_huge_batch_is_not_rewritten_for_a_trickle_of_small_ones():
    batches = [BatchRef("huge", 0, 1, 10**7)]
    rewrites_of_huge = 0
    for i in range(1, 3001):
        batches.append(BatchRef(f"s{i}", i, i + 1, 1000))
        tasks = plan_merges(batches, min_rows=1)
        rewrites_of_huge += sum(1 for t in tasks if t.start == 0)
        batches, _ = run(batches, tasks)
        batches, _ = settle(batches, min_rows=1)
    # 3M rows of small batches against 10M: the huge one joins once the tail reaches half its size.
    assert rewrites_of_huge <= 1
    assert len(batches) <= 2 * math.log2(3000) + 2


def test_tiny_batches_collapse_under_min_rows():
    final, _ = settle(refs([3] * 500), min_rows=4096)
    assert len(final) == 1


def test_empty_intervals_ride_along_or_coalesce():
    b = refs([0, 0, 0, 10**6, 0, 100, 0, 100, 0, 0])
    tasks = plan_merges(b, min_rows=1)
    # Three empties coalesce without I/O; the two 100s merge and take the empties around them.
    assert [(t.start, t.stop, t.rows) for t in tasks] == [(0, 3, 0), (4, 10, 200)]


def test_a_big_newer_batch_absorbs_the_small_older_ones_once():
    b = refs([100, 10, 10**6])
    assert [(t.start, t.stop) for t in plan_merges(b, min_rows=1)] == [(0, 3)]
    final, rewritten = settle(b, min_rows=1)
    assert len(final) == 1 and rewritten == 10**6 + 110


def test_in_flight_batches_are_walls():
    b = refs([100] * 6)
    tasks = plan_merges(b, min_rows=1, in_flight={2})
    assert all(2 not in t.indices for t in tasks)
    assert any(t.indices == (0, 1) for t in tasks)


def test_factor_must_exceed_one():
    with pytest.raises(ValueError, match="factor"):
        plan_merges(refs([1, 1]), factor=1.0)


def test_planning_by_bytes():
    b = [BatchRef(f"k{i}", i, i + 1, rows=1, bytes=s) for i, s in enumerate([10**6, 10**6])]
    assert plan_merges(b, min_rows=1, weight=lambda r: r.bytes)
    b = [BatchRef(f"k{i}", i, i + 1, rows=1, bytes=s) for i, s in enumerate([10**9, 10**6])]
    assert not plan_merges(b, min_rows=1, weight=lambda r: r.bytes)


# --- pending runs (unsealed updates out of the WAL) --------------------------------------------

from itertools import product  # noqa: E402

from sediment.trace.planner import plan_pending_merges  # noqa: E402
from sediment.trace.wal_cut import split_pending  # noqa: E402


def test_split_pending_brute_force():
    """Every run of small spans against every upper: folded iff wholly below, kept iff wholly
    at or above, split otherwise; every index in exactly one class, ascending."""
    spans = [(lo, hi) for lo in range(5) for hi in range(lo + 1, 6)]
    for a, b in product(spans, repeat=2):
        for upper in range(7):
            got = split_pending([a, b], upper)
            assert sorted(got.folded + got.split + got.kept) == [0, 1]
            for cls in (got.folded, got.split, got.kept):
                assert list(cls) == sorted(cls)
            for i, (lo, hi) in enumerate((a, b)):
                if i in got.folded:
                    assert hi <= upper
                elif i in got.kept:
                    assert lo >= upper
                else:
                    assert lo < upper < hi


def apply_pending(rows: list[int], spans: list[tuple[int, int]]) -> tuple[list[int], int]:
    out, rewritten = list(rows), 0
    for start, stop in reversed(spans):
        rewritten += sum(out[start:stop])
        out[start:stop] = [sum(out[start:stop])]
    return out, rewritten


@pytest.mark.parametrize("max_runs", [1, 2, 3, 8])
def test_pending_merge_plan_brute_force(max_runs):
    """All run lists of up to 7 runs of a few sizes: nothing to do at or under ``max_runs``;
    otherwise disjoint ascending spans of >= 2 runs that leave at most ``max_runs``."""
    sizes = [1, 5000, 20000, 100000]
    for n in range(0, 8):
        for rows in product(sizes, repeat=n):
            spans = plan_pending_merges(list(rows), max_runs=max_runs)
            if n <= max_runs:
                assert spans == []
                continue
            prev = 0
            for start, stop in spans:
                assert prev <= start and stop - start >= 2 and stop <= n
                prev = stop
            after, _ = apply_pending(list(rows), spans)
            assert len(after) <= max_runs and sum(after) == sum(rows)


def test_pending_merges_amortise_to_n_log_n():
    """Appending equal runs and following the plan each time rewrites O(n log n) rows and keeps
    at most ``max_runs`` runs; with sealing never coming the runs still stay few."""
    runs: list[int] = []
    total = 0
    for _ in range(1000):
        runs.append(10_000)
        runs, rewritten = apply_pending(runs, plan_pending_merges(runs, max_runs=8))
        total += rewritten
        assert len(runs) <= 8
    n = 1000 * 10_000
    assert total <= 2 * n * math.log2(1000)


@given(st.lists(st.integers(min_value=0, max_value=10**6), max_size=12))
def test_plan_full_merge_covers_every_batch_in_one_task(sizes):
    from sediment.trace.planner import plan_full_merge

    batches = refs(sizes)
    task = plan_full_merge(batches)
    if len(batches) < 2:
        assert task is None
        return
    assert task.indices == tuple(range(len(batches)))
    assert (task.lower, task.upper) == (batches[0].lower, batches[-1].upper)
    assert task.rows == sum(sizes) and task.level == 1 + max(b.level for b in batches)


@given(st.lists(st.integers(min_value=0, max_value=10**6), max_size=12),
       st.floats(min_value=0, max_value=100), st.sampled_from([None, 0.0, 10.0, 50.0]),
       st.sampled_from([1.0, 4.0, 8.0]))
def test_plan_major_merge_against_its_rule(sizes, quiet_for, quiet_needed, ratio):
    """Merge everything exactly when quiet long enough, at least two batches hold rows, and
    the rows outside the largest are at least 1/ratio of it (brute force over the rule)."""
    from sediment.trace.planner import plan_full_merge, plan_major_merge

    batches = refs(sizes)
    task = plan_major_merge(batches, quiet_for=quiet_for, quiet_needed=quiet_needed, rewrite_ratio=ratio)
    holding = sorted((s for s in sizes if s), reverse=True)
    due = (quiet_needed is not None and quiet_for >= quiet_needed and len(holding) >= 2
           and sum(holding[1:]) * ratio >= holding[0])
    assert task == (plan_full_merge(batches) if due else None)
    if task is not None:  # the rewrite is bounded by the new rows
        assert task.rows <= (ratio + 1) * sum(holding[1:])


def test_major_merges_of_a_growing_relation_rewrite_a_bounded_multiple_of_its_rows():
    """A relation that grows by 1% between quiet periods is rewritten whole only once the new
    rows reach 1/8 of the big batch (about every 12 periods, never every period), so the
    major compactions rewrite at most 9x the rows that arrived."""
    from sediment.trace.planner import plan_major_merge

    batches, major_rows, majors = refs([1_000_000]), 0, 0
    for i in range(200):
        batches.append(BatchRef(f"n{i}", len(batches), len(batches) + 1, 10_000, 0, 0))
        batches, _r = settle(batches)
        task = plan_major_merge(batches, quiet_for=60.0, quiet_needed=10.0)
        if task is not None:
            batches, r = run(batches, [task])
            major_rows += r
            majors += 1
    assert 8 <= majors <= 10  # 1M * (9/8)^9 ~ 2.9M rows: one rewrite per 1/8 of growth
    assert major_rows <= 9 * 2_000_000
