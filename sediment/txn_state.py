"""The life of a write transaction, shared by the engine's ``Transaction`` and the network
client's ``RemoteTransaction``: ``open``, then once ``committed`` or ``aborted``. A commit
whose COMMIT record went to the log but whose sync failed (the log failed, the engine
closed) is ``in doubt``: the record may be durable or not, so it is neither committed nor
abortable; replay at the next open decides.

Pure state (no I/O, no locking): the owners hold their own mutex around it, so that the
two kinds of transaction cannot drift apart in what a finished one refuses.
"""

from __future__ import annotations

from sediment.errors import TransactionError

OPEN, COMMITTED, ABORTED, IN_DOUBT = "open", "committed", "aborted", "in doubt"


class TxnState:
    """``open`` until :meth:`finish` moves it to ``committed`` or ``aborted``, for good."""

    __slots__ = ("txn_id", "value")

    def __init__(self, txn_id: int) -> None:
        self.txn_id = txn_id
        self.value = OPEN

    @property
    def is_open(self) -> bool:
        return self.value == OPEN

    def check_open(self) -> None:
        """Raise TransactionError unless the transaction may still append or commit."""
        if self.value != OPEN:
            raise TransactionError(f"transaction {self.txn_id:#x} is already {self.value}")

    def finish(self, state: str) -> None:
        """Move to a final state (``committed`` or ``aborted``); a finished one stays as it is."""
        if state not in (COMMITTED, ABORTED):
            raise ValueError(f"a transaction finishes as committed or aborted, not {state!r}")
        if self.value == OPEN:
            self.value = state

    def start_commit(self) -> None:
        """The COMMIT record is submitted but not yet durable: ``in doubt`` until
        :meth:`commit_durable`, and for good if the sync fails."""
        if self.value == OPEN:
            self.value = IN_DOUBT

    def commit_durable(self) -> None:
        """The COMMIT record is synced: only now is the transaction ``committed``."""
        if self.value == IN_DOUBT:
            self.value = COMMITTED

    def settle(self, state: str) -> None:
        """Take the state another party decided (the server's word after a refused commit): a
        known final state as it is, anything else (an unknown or still open transaction the
        caller can no longer reach) as aborted."""
        self.value = state if state in (COMMITTED, ABORTED) else ABORTED
