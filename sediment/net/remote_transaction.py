"""A write transaction held open on a sediment server, the client's half.

The server keeps the transaction by id between calls (sediment/net/txn_registry.py); this
object names it in each append and in its commit or abort, and tracks its state with the
engine's state machine (sediment/txn_state.py). What only the network has: a commit whose
answer was lost may have landed. The transaction stays open and in doubt then, and the
server's word decides a later ``commit`` or ``abort`` (OutcomeUnknown when it no longer
knows the transaction, never a claim that it was aborted).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

import pyarrow as pa

from sediment import errors
from sediment.errors import InvalidUpdates, TransactionError
from sediment.net.messages import Action
from sediment.net.wire_errors import error_line
from sediment.txn_state import ABORTED, COMMITTED, TxnState


class TxnClient(Protocol):
    """What a transaction needs of its client (:class:`sediment.client.Client`)."""

    def _append(self, name: str, table: pa.Table, txn: int | None = None) -> None: ...

    def _action(self, op: Action, **args: Any) -> Any: ...


def as_table(name: str, updates: object) -> pa.Table:
    """Tables and record batches travel as they are; anything else is refused here with the
    engine's own error, since it cannot be streamed."""
    if isinstance(updates, pa.RecordBatch):
        return pa.Table.from_batches([updates])
    if not isinstance(updates, pa.Table):
        raise InvalidUpdates(f"updates for {name!r} must be a pyarrow.Table, not {type(updates).__name__}")
    return updates



class RemoteTransaction:
    """A write transaction held open on the server; created by :meth:`Client.transaction`.
    Like :class:`sediment.Transaction`: appends are durable but invisible until ``commit()``;
    as a context manager it commits on success and aborts on an exception."""

    def __init__(self, client: TxnClient, txn_id: int) -> None:
        self._client = client
        self.id = txn_id
        self._txn = TxnState(txn_id)
        self._mutex = threading.Lock()
        self._in_doubt = False  # a commit went out and its answer never came: it may have landed

    @property
    def state(self) -> str:
        """``open``, ``committed`` or ``aborted``."""
        return self._txn.value

    def append(self, name: str, updates: pa.Table) -> None:
        """Add updates to the transaction; durable (but invisible) on return."""
        with self._mutex:
            self._txn.check_open()
            self._client._append(name, as_table(name, updates), txn=self.id)

    def commit(self, *, send: Callable[[int], str] | None = None) -> None:
        """Make every append visible at once; durable on return. Raises TransactionError (and
        the transaction is aborted) if one of its times was sealed meanwhile. ``send``: how
        the commit of this id goes, when not as one commit call to this client (the cluster
        client's keyed, retried commit); it returns the final state.

        A commit whose answer was lost (the connection broke, the call timed out) may have
        landed; calling ``commit`` again asks the server, and answers success if it did, or
        raises OutcomeUnknown if the server no longer knows (it restarted)."""
        with self._mutex:
            self._txn.check_open()
            try:
                state = send(self.id) if send is not None else self._client._action(Action.COMMIT, txn=self.id)
            except TransactionError as exc:
                if self._settle_refused(exc):
                    return
                raise
            except errors.NothingWritten:
                raise
            except BaseException:
                self._in_doubt = True
                raise
            self._txn.settle(state)

    def _settle_refused(self, refusal: TransactionError) -> bool:
        """After a refused commit: take the server's word on the transaction (aborted, unless it
        somehow finished otherwise; a server that no longer knows it has aborted it). True
        when an earlier commit whose answer was lost turns out to have committed it."""
        state = self.remote_state()
        if self._in_doubt:
            if state == COMMITTED:
                self._txn.settle(state)
                return True
            if state != ABORTED:
                raise self._unknown("commit", refusal)
        self._txn.settle(state or ABORTED)
        return False

    def _unknown(self, what: str, cause: BaseException) -> errors.OutcomeUnknown:
        return errors.OutcomeUnknown(
            f"{what} of transaction {self.id:#x}: an earlier commit of it whose answer was lost may have landed, "
            f"and the server no longer knows it ({error_line(cause)}); read the relations back to find out")

    def remote_state(self) -> str | None:
        """The server's word on the transaction; None when it cannot be asked."""
        try:
            return self._client._action(Action.TXN_STATE, txn=self.id)
        except Exception:  # noqa: BLE001 - the caller decides what no answer means
            return None

    def settle(self, state: str) -> None:
        """Take the state the server answered for this transaction (a commit_all's)."""
        self._txn.settle(state)
        self._in_doubt = False

    def mark_in_doubt(self) -> None:
        """A commit of it (a commit_all's) went out and its answer was lost: it may have landed."""
        self._in_doubt = True

    def abort(self) -> None:
        """Discard every append of the transaction. Aborting twice is harmless. After a commit
        whose answer was lost, the server's word decides: TransactionError if that commit
        landed, OutcomeUnknown if the server no longer knows."""
        with self._mutex:
            if not self._txn.is_open:
                return
            if not self._in_doubt:
                self._txn.finish(ABORTED)
                self._client._action(Action.ABORT, txn=self.id)
                return
            try:
                state = self._client._action(Action.ABORT, txn=self.id)
            except TransactionError as exc:
                raise self._unknown("abort", exc) from None
            if state not in (COMMITTED, ABORTED):  # in doubt on the server too: its log failed the sync
                raise errors.OutcomeUnknown(
                    f"abort of transaction {self.id:#x}: the server is in doubt whether its earlier commit is "
                    f"durable (state {state!r}: the log failed the sync); read the relations back after the "
                    "server reopens to find out")
            self._txn.settle(state)
            self._in_doubt = False
            if state == COMMITTED:
                raise TransactionError(f"transaction {self.id:#x} was committed by an earlier commit whose answer "
                                       "was lost; abort cannot undo it")

    def __enter__(self) -> RemoteTransaction:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()
