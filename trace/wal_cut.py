"""The pure part of taking WAL records into traces: where a pass's cut goes, where the log
may be trimmed, how the pending runs split at a new upper, and when the log's unfinished
segment is old enough to finish. The background scheduler that runs the passes is
engine/scheduler.py; the passes themselves are engine/compaction.py.

Segments finish by size (the log rolls them) and by age: a pass that finds durable
records that have sat unfinished for ``interval`` finishes the segment first
(:class:`SegmentAge`), so a quiet relation does not wait for 64 MiB of other traffic.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class WalCut:
    """What one WAL-to-batch pass may take: every record below ``safe`` (in finished
    segments, and before the first record of any open transaction)."""

    safe: int


def plan_wal_cut(finished_lsn: int, open_txn_first_lsns: Iterable[int]) -> WalCut:
    """Records below the finished LSN never change; a transaction still open may yet
    commit records that belong before its BEGIN's successors, so the cut stops there."""
    return WalCut(min([finished_lsn, *open_txn_first_lsns]))


def trim_point(cut: int, needed: Iterable[int]) -> int:
    """The LSN below which the log may be discarded: nothing still needed lies below it."""
    return min([cut, *needed])


def new_upper(trace_upper: int, progress_times: Iterable[int]) -> int:
    """The trace's upper after absorbing ``close t`` records: one past the greatest t."""
    return max([trace_upper, *(t + 1 for t in progress_times)])


@dataclass(frozen=True)
class PendingSplit:
    """How one pass treats the pending runs (unsealed updates already out of the WAL) once
    the trace's upper moves to ``upper``: runs wholly below it are ``folded`` into the new
    batch, runs across it are ``split`` (the part below into the batch, the rest rewritten
    as a run), runs wholly at or above it are ``kept`` as they are, unread. Indices into
    the pending tuple, ascending."""

    folded: tuple[int, ...]
    split: tuple[int, ...]
    kept: tuple[int, ...]


def split_pending(spans: Iterable[tuple[int, int]], upper: int) -> PendingSplit:
    """Pure: each run's ``[lower, upper)`` time span against the new trace upper. A pass reads
    only the runs whose times became sealed, so the total work of a stream is linear in it
    whether or not its times are sealed yet."""
    folded, split, kept = [], [], []
    for i, (lo, hi) in enumerate(spans):
        (folded if hi <= upper else kept if lo >= upper else split).append(i)
    return PendingSplit(tuple(folded), tuple(split), tuple(kept))


class SegmentAge:
    """When the log's unfinished part must be finished because its data is old.

    Pure: the caller passes the log's positions and the clock's time at each wake. Data
    first seen unfinished at a wake arrived after the previous wake, so its age is
    counted from that previous wake (an over-estimate, never an under-estimate). With
    wakes at most ``interval`` apart (the compacter's timer; finish notifications only
    add wakes), the first wake at least ``interval`` after that previous one comes less
    than ``2 * interval`` after the data arrived: every durable record is in a finished
    segment, and in a batch after that same pass, within ``2 * interval`` plus the
    passes' run time. ``started`` (when the scheduler started) counts as a wake, so records
    written before the engine opened count from the opening. A segment finished by size in between does not
    reset the age while records remain unfinished (they may be as old): at most one
    extra small segment per interval on a busy log, and never a delayed record."""

    def __init__(self, started: float | None = None) -> None:
        self.since: float | None = None  # the unfinished part holds no record older than this
        self.last_wake = started

    def due(self, finished_lsn: int, end_lsn: int, now: float, interval: float | None) -> bool:
        """Whether to finish the active segment now (call once per wake)."""
        previous, self.last_wake = self.last_wake, now
        if interval is None or end_lsn <= finished_lsn:
            self.since = None
            return False
        if self.since is None:
            self.since = previous if previous is not None else now
        return now - self.since >= interval

    def finished(self) -> None:
        """The segment was finished: records appended later start a new age."""
        self.since = None
