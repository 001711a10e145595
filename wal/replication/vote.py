"""The recovery vote on a partition's closing high-water mark (pure; no I/O, no clock).

Waltz's rule ("Quorum Checking in the Recovery Process", and its recovery manager).
Every replica named in the partition metadata that reports is classified first
(wal/replication/recovery.py does it): a *voting* replica was engaged in the last store session
with consistent storage and may hold records that session wrote but never
acknowledged; a *non-voting* replica was truncated to a mark that is already known to
be committed (its stored low-water mark, or its closing high-water mark), or is too
far behind to have taken part in the last session's writes. Replicas new to the
metadata take no part at all; *absent* replicas are metadata replicas that have not
reported (removed ones still in the metadata included): they might hold anything.

The rule over the reported marks, in descending order, is in docs/formats.md ("The vote").
A mark below the lowest voting mark decides nothing because some voter holds more and it
may have been acknowledged; the replicas below are caught up and the vote runs again
(catch-up only raises marks, so this terminates). A mark below ``floor``, the highest
low-water mark a reporter stored and still holds, decides nothing either: that mark was
resolved by an earlier recovery whose metadata update may never have landed; it never
moves backwards, so a lower closing mark could never be set on that replica (recovery
would hang), and everything at or below it was a valid closing mark: catch up to it.

While no replica votes, nothing is decided as long as some replica is absent (it may
be a voter holding more; Waltz waits the same way). With no voter and nobody absent,
the highest reported mark plays the lowest voting mark's part: everything a
non-voting replica holds is committed, so nothing below the top may be chosen (Waltz
would wait for ever there; we catch up to the top instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

EMPTY = -1  # the high-water mark of a log that holds no record


def quorum_size(replica_count: int) -> int:
    """A majority: any two quorums share a replica, which is why a vote can see every ack."""
    if replica_count < 1:
        raise ValueError(f"a partition needs at least one replica, got {replica_count}")
    return replica_count // 2 + 1


@dataclass(frozen=True)
class Decision:
    """The vote's outcome: ``resolved`` (the closing mark) or why there is none yet.

    ``catch_up``: some reporters are below the highest reported mark and the rule needs
    them raised before it can decide. ``undecidable``: the absent replicas could still
    change the answer; wait for them (catch-ups may also help)."""

    resolved: int | None = None
    undecidable: bool = False
    catch_up: bool = False


def decide(voting: Sequence[int], non_voting: Sequence[int], absent: int, quorum: int,
           floor: int = EMPTY) -> Decision:
    """Apply the rule above to the reported marks (-1: empty); ``floor``: the highest stored
    low-water mark a reporter holds (at or below its mark)."""
    if quorum < 1 or absent < 0:
        raise ValueError(f"quorum {quorum} and absent {absent} must be >= 1 and >= 0")
    marks = list(voting) + list(non_voting)
    behind = bool(marks) and min(marks) < max(marks)
    if absent >= quorum:  # the absent alone could hold a quorum above everything reported
        return Decision(undecidable=True, catch_up=behind)
    if not marks:
        return Decision(resolved=EMPTY)
    if not voting and absent:  # as in Waltz: nothing is decided before a voter (maybe absent) reports
        return Decision(undecidable=True, catch_up=behind)
    lowest = max(min(voting) if voting else max(marks), floor)
    for h in sorted(set(marks), reverse=True):
        if h < lowest:
            return Decision(catch_up=True)
        if h == EMPTY:  # every replica, absent or not, holds the empty prefix
            return Decision(resolved=EMPTY)
        supports = sum(1 for m in marks if m >= h)
        if supports >= quorum:
            return Decision(resolved=h)
        if supports + absent >= quorum:
            return Decision(undecidable=True, catch_up=behind)
    return Decision(undecidable=True, catch_up=behind)
