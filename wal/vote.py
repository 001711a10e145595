"""The recovery vote on a partition's closing high-water mark (pure; no I/O, no clock).

When a new store session starts, the records the previous session acknowledged are
exactly those a write quorum made durable, but the coordinator that knew which ones
those were is gone. Each reachable replica reports its high-water mark X (its max
LSN) and so votes for every H <= X: it holds every record up to X. The highest H that
a quorum votes for is the closing high-water mark: everything at or below it may
have been acknowledged and is kept; nothing above it can have reached a write quorum,
so it is dirty and truncated.

Replicas that cannot be reached might hold anything, so a candidate that misses the
quorum but would reach it with the offline replicas' votes makes the vote
*undecidable*: the caller must wait until more replicas report (or a lagging one
catches up) and vote again. This is Waltz's "Quorum Checking in the Recovery Process".
"""

from __future__ import annotations

from collections.abc import Mapping

EMPTY = -1  # the high-water mark of a log that holds no record


def quorum_size(replica_count: int) -> int:
    """A majority: any two quorums share a replica, which is why a vote can see every ack."""
    if replica_count < 1:
        raise ValueError(f"a partition needs at least one replica, got {replica_count}")
    return replica_count // 2 + 1


def resolve_closing_hwm(reported: Mapping[str, int], replica_count: int) -> int | None:
    """The closing high-water mark, or None while it is undecidable.

    ``reported`` maps each reachable replica to its max LSN (-1: empty). Candidates are
    examined in descending order; the first with a quorum of votes wins, unless an
    earlier (higher) candidate had ``votes + offline >= quorum``: then the offline
    replicas could still give that higher mark a quorum, and the answer is None.
    Returns -1 when no record can have reached a quorum. The EMPTY candidate needs no
    reports: every replica, offline ones included, votes for it, so e.g. one replica of
    two reporting -1 decides -1 (but one of three does not: the other two may hold more) (a literal reading of the seed would wait instead; the
    brute-force test against all completions of the offline replicas shows -1 is exact).
    """
    if len(reported) > replica_count:
        raise ValueError(f"{len(reported)} replicas reported but the partition has {replica_count}")
    quorum = quorum_size(replica_count)
    offline = replica_count - len(reported)
    marks = sorted(reported.values(), reverse=True)
    if offline >= quorum:
        return None  # the offline replicas alone could hold a quorum above everything reported
    for candidate in sorted(set(marks) | {EMPTY}, reverse=True):
        if candidate == EMPTY:
            # Every replica, offline or not, holds the empty prefix: nothing lower can win.
            return EMPTY
        votes = sum(1 for x in marks if x >= candidate)
        if votes >= quorum:
            return candidate
        if votes + offline >= quorum:
            return None
    raise AssertionError("unreachable: the EMPTY candidate always resolves")
