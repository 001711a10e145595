"""Compaction planning: which adjacent batches to merge next. Pure; no I/O.

The 2021 prototype merged everything once a trace had 10 batches, so one huge batch
was rewritten again and again to absorb a trickle of tiny ones. The rule here is the
size-tiered one of differential dataflow's spine (and of timsort-style run stacks):
walk the batches oldest to newest keeping a stack of merge groups, and merge the two
newest groups while the older is at most ``factor`` times the newer. Afterwards each
group is more than ``factor`` times its newer neighbour, so a trace holds
O(log_factor(rows / min_rows)) batches, and a row is only rewritten when its batch
joins one of comparable size, which bounds the total work to O(n log n) rows. A huge
batch is left alone until the batches after it add up to ``1/factor`` of it.

Batches with no rows (``key is None``: an interval with no updates) have no weight:
they ride along inside a merge that spans them, and runs of them coalesce for free.
Batches already being merged (``in_flight``) are walls no task crosses.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol


class BatchLike(Protocol):
    """What the planner reads of a batch (``sediment.trace.state.BatchRef`` fits)."""

    @property
    def key(self) -> str | None: ...
    @property
    def lower(self) -> int: ...
    @property
    def upper(self) -> int: ...
    @property
    def rows(self) -> int: ...
    @property
    def level(self) -> int: ...


@dataclass(frozen=True)
class MergeTask:
    """Merge ``batches[indices[0]] .. batches[indices[-1]]`` (contiguous, ascending) into one
    batch covering ``[lower, upper)``. ``rows`` is the input rows (an upper bound on the
    output); ``level`` is ``1 + max(input levels)``. A task whose inputs all have
    ``key is None`` needs no I/O: its result is one empty interval."""

    indices: tuple[int, ...]
    lower: int
    upper: int
    rows: int
    level: int

    @property
    def start(self) -> int:
        return self.indices[0]

    @property
    def stop(self) -> int:
        """One past the last index, for slicing."""
        return self.indices[-1] + 1


@dataclass
class _Group:
    start: int
    stop: int
    weight: int
    members: int


def _rows(b: BatchLike) -> int:
    return b.rows


def plan_merges(
    batches: Sequence[BatchLike],
    *,
    factor: float = 2.0,
    min_rows: int = 4096,
    in_flight: Collection[int] = (),
    weight: Callable[[BatchLike], int] = _rows,
) -> list[MergeTask]:
    """The merges to run now, as non-overlapping tasks over adjacent batches, oldest first.

    ``factor`` (> 1) is the size ratio under which neighbours merge: larger means
    fewer batches (each more than ``factor`` times its newer neighbour) but more
    rewrites; 2 rewrote ~0.6 n log2 n rows for n equal appends, 4 about n log2 n. ``min_rows`` rounds tiny batches up so that a run of
    tiny batches collapses instead of forming a deep stack. ``weight`` chooses the
    size measure (rows by default; pass ``lambda b: b.bytes`` for bytes). Running the
    tasks and planning again reaches a fixed point where no task is returned.
    """
    if factor <= 1:
        raise ValueError(f"factor={factor} must be > 1")
    busy = set(in_flight)
    tasks: list[MergeTask] = []
    segment: list[int] = []
    for i in range(len(batches) + 1):
        if i == len(batches) or i in busy:
            tasks.extend(_plan_segment(batches, segment, factor, min_rows, weight))
            segment = []
        else:
            segment.append(i)
    return tasks


def plan_full_merge(batches: Sequence[BatchLike]) -> MergeTask | None:
    """One task merging every batch, or None for fewer than two: the major compaction an
    explicit ``compact()`` runs on a relation with no history left (every time at its
    ``since``), where the result is its current state in one batch, read as stored."""
    return _task(batches, 0, len(batches)) if len(batches) >= 2 else None


def _task(batches: Sequence[BatchLike], start: int, stop: int) -> MergeTask:
    """The task merging ``batches[start:stop]``."""
    members = batches[start:stop]
    return MergeTask(tuple(range(start, stop)), members[0].lower, members[-1].upper,
                     sum(m.rows for m in members), 1 + max(m.level for m in members))


DEFAULT_MAJOR_REWRITE_RATIO = 8.0


def plan_major_merge(batches: Sequence[BatchLike], *, quiet_for: float, quiet_needed: float | None,
                     rewrite_ratio: float = DEFAULT_MAJOR_REWRITE_RATIO) -> MergeTask | None:
    """The background's major compaction of a relation with no history left (the caller
    checks that ``since`` is at its sealed time), or None.

    Size-tiered batches keep a stream's rewrites at O(n log n), but their rows interleave,
    so every snapshot sorts and gathers them again (0.33-0.45x of a plain read measured at
    4M and 16M rows in 2 batches). Once the relation has had no new data for ``quiet_needed`` seconds
    its batches are merged into one, read as stored, as RocksDB's periodic compaction
    rewrites what stopped changing. Two guards keep the rewrites bounded: a relation that
    keeps receiving data is never quiet, and the batches other than the largest must hold
    at least ``1 / rewrite_ratio`` of its rows, so a major compaction rewrites at most
    ``rewrite_ratio + 1`` times the rows that arrived since the largest batch was written."""
    if quiet_needed is None or quiet_for < quiet_needed:
        return None
    if rewrite_ratio <= 0:
        raise ValueError(f"rewrite_ratio={rewrite_ratio} must be > 0")
    sizes = [b.rows for b in batches if b.key is not None and b.rows]
    if len(sizes) < 2:
        return None
    largest = max(sizes)
    if (sum(sizes) - largest) * rewrite_ratio < largest:
        return None
    return plan_full_merge(batches)


def _plan_segment(
    batches: Sequence[BatchLike],
    idx: list[int],
    factor: float,
    min_rows: int,
    weight: Callable[[BatchLike], int],
) -> list[MergeTask]:
    stack: list[_Group] = []
    for i in idx:
        b = batches[i]
        if b.key is None or weight(b) == 0:
            continue
        stack.append(_Group(i, i + 1, max(weight(b), min_rows), 1))
        while len(stack) >= 2 and stack[-2].weight <= factor * stack[-1].weight:
            newer = stack.pop()
            older = stack[-1]
            older.stop = newer.stop
            older.weight = max(older.weight + newer.weight, min_rows)
            older.members += newer.members
    spans = [[g.start, g.stop] for g in stack if g.members >= 2]
    if not idx:
        return []
    lo_bound, hi_bound = idx[0], idx[-1] + 1
    taken = [False] * (hi_bound - lo_bound)
    for s in spans:
        for j in range(s[0], s[1]):
            taken[j - lo_bound] = True

    def is_empty(j: int) -> bool:
        return batches[j].key is None or weight(batches[j]) == 0

    # A merge that rewrites anyway takes the empty intervals beside it along for free.
    for s in spans:
        while s[0] > lo_bound and not taken[s[0] - 1 - lo_bound] and is_empty(s[0] - 1):
            s[0] -= 1
            taken[s[0] - lo_bound] = True
        while s[1] < hi_bound and not taken[s[1] - lo_bound] and is_empty(s[1]):
            taken[s[1] - lo_bound] = True
            s[1] += 1
    j = lo_bound
    while j < hi_bound:
        if not taken[j - lo_bound] and is_empty(j):
            k = j
            while k < hi_bound and not taken[k - lo_bound] and is_empty(k):
                k += 1
            if k - j >= 2:
                spans.append([j, k])
            j = k
        else:
            j += 1
    return [_task(batches, start, stop) for start, stop in sorted(spans)]


DEFAULT_MAX_PENDING_RUNS = 8


def plan_pending_merges(
    rows: Sequence[int], *, max_runs: int = DEFAULT_MAX_PENDING_RUNS, factor: float = 2.0, min_rows: int = 4096
) -> list[tuple[int, int]]:
    """Which adjacent pending runs (unsealed updates, oldest first, sizes ``rows``) to merge:
    ``[start, stop)`` spans, non-overlapping, ascending. Pure.

    Pending runs are left alone while there are at most ``max_runs`` of them, so a stream
    whose times are sealed a few passes later is written once as a run and once into a
    batch, never rewritten in between. Beyond that, the size-tiered stack rule of
    :func:`plan_merges` (merge neighbours while the older is at most ``factor`` times the
    newer) brings the count to O(log rows) with O(rows log rows) total work; if that still
    leaves more than ``max_runs``, the newest groups are merged into one until it does not.
    """
    if factor <= 1:
        raise ValueError(f"factor={factor} must be > 1")
    if max_runs < 1:
        raise ValueError(f"max_runs={max_runs} must be >= 1")
    if len(rows) <= max_runs:
        return []
    stack: list[list[int]] = []  # [start, stop, weight]
    for i, n in enumerate(rows):
        stack.append([i, i + 1, max(n, min_rows)])
        while len(stack) >= 2 and stack[-2][2] <= factor * stack[-1][2]:
            newer = stack.pop()
            stack[-1][1] = newer[1]
            stack[-1][2] += newer[2]
    while len(stack) > max_runs:
        newer = stack.pop()
        stack[-1][1] = newer[1]
        stack[-1][2] += newer[2]
    return [(start, stop) for start, stop, _w in stack if stop - start >= 2]


def with_raw_runs(spans: Sequence[tuple[int, int]], raw: Sequence[bool]) -> list[tuple[int, int]]:
    """``spans`` (from :func:`plan_pending_merges`) plus a one-run span for each raw run
    (a bulk load's file as written, ``raw[i]``) no span covers: a merge of one raw run
    rewrites it sorted and consolidated, so reads stop consolidating it. Pure."""
    covered = {i for start, stop in spans for i in range(start, stop)}
    return sorted([*spans, *((i, i + 1) for i, r in enumerate(raw) if r and i not in covered)])
