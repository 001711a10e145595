"""The state a cluster transaction has before its first append picks its partition.

A transaction over a cluster begins nowhere: the first append decides the partition (and
so the engine or member) that holds it, and every later append must be of that partition.
Until then there is no inner transaction to ask, so this keeps the state itself; after,
the inner transaction's state is the truth. The member's router and the network client's
cluster transaction both wrap a transaction this way.
"""

from __future__ import annotations

from typing import Any

from sediment.txn_state import ABORTED, COMMITTED, OPEN


class PartitionTransaction:
    """A transaction bound lazily to one partition's inner transaction (``inner``)."""

    def __init__(self) -> None:
        self.inner: Any = None
        self._state = OPEN

    @property
    def state(self) -> str:
        return self.inner.state if self.inner is not None else self._state

    def abort(self) -> None:
        if self.inner is not None:
            self.inner.abort()
        elif self._state == OPEN:
            self._state = ABORTED

    def finish_empty(self) -> None:
        """Commit of a transaction that appended nothing: it commits, writing nothing."""
        if self.inner is None and self._state == OPEN:
            self._state = COMMITTED
