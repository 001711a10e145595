"""Linearizable reads at a cluster member: before a read's answer leaves, the member confirms
that it still owns the partition, by a read of the assignment from the membership store that
began after the read arrived; the reads waiting at one moment share one such read.

Why a member's own view is not enough: it is its last control pass's, and the log fences
writes, not reads. A member deposed by a move while live and in touch (a rebalance, a
hand-over) would answer from state the new owner has moved past until its next pass.

Why this read is enough: a new owner serves only once the assignment names it, so any write
it acknowledged before a read arrived here was acknowledged after the assignment changed;
an assignment read begun after the read arrived sees that change (``Membership.assignment_now``
is linearizable: ZooKeeper's ``sync`` then ``get``, S3's strongly consistent GET). The
engine's state the read answers from holds every write this member acknowledged before.

The sharing is ReadIndex's: one round (one assignment read) at a time; a read waits for a
round that began after it arrived (the one in flight when it arrived began before it, so it
waits for the next), and every read waiting when a round begins rides on it. The first
waiter that finds no round in flight makes the next one on its own thread. A round's answer
is the whole assignment, so one round serves every partition of the member. A read waits
at most ``timeout`` seconds (the round it leads is bounded by the store's own call bound):
CallUnanswered, never a hang.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from sediment.cluster.membership import CallUnanswered

Assignment = dict[int, tuple[str, int]]


class ReadConfirmer:
    """Rounds of ``read()`` (the assignment as the store holds it now) shared by concurrent reads."""

    def __init__(self, read: Callable[[], Assignment], timeout: float,
                 on_round: Callable[[], None] = lambda: None) -> None:
        self._read = read
        self.timeout = timeout
        self._on_round = on_round
        self._cond = threading.Condition()
        self._begun = 0  # rounds begun; round n + 1 begins only once round n is done
        self._done = 0  # the last round done, whose answer is _answer
        self._answer: Assignment | CallUnanswered = {}
        self.waiting = 0  # reads waiting for a round (for tests and benchmarks)

    def confirm(self) -> Assignment:
        """The assignment read by a round that began after this call did (CallUnanswered: no
        round answered within ``timeout`` seconds, or the read failed)."""
        deadline = time.monotonic() + self.timeout
        with self._cond:
            need = self._begun + 1
            self.waiting += 1
            try:
                while self._done < need:
                    if self._begun == self._done:  # no round in flight: this read makes the next one
                        self._begun += 1
                        break
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise CallUnanswered(f"no assignment read answered within {self.timeout:g} s")
                    self._cond.wait(left)
                else:
                    return self._answered(self._answer)
            finally:
                self.waiting -= 1
            number = self._begun
        try:
            answer: Assignment | CallUnanswered = self._read()
        except CallUnanswered as exc:
            answer = exc
        except Exception as exc:  # noqa: BLE001 - whatever failed, the ownership stays unconfirmed
            answer = CallUnanswered(f"{type(exc).__name__}: {exc}")
        self._on_round()
        with self._cond:
            self._done, self._answer = number, answer
            self._cond.notify_all()
        return self._answered(answer)

    @staticmethod
    def _answered(answer: Assignment | CallUnanswered) -> Assignment:
        if isinstance(answer, CallUnanswered):
            raise CallUnanswered(answer.why)  # a new one per read: reads raise it on many threads
        return answer
