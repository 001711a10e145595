"""Write transactions: appends to any relations that become visible together, or never.

In the log a transaction is a BEGIN record, UPDATES records carrying its id (which
may interleave with other appends), then COMMIT or ABORT (the NiFi design). Replay
discards a transaction that has no COMMIT, so a crash, an abort, or a failed
Spark job leaves nothing visible.

Times are checked twice: at each append (against the frontier then) and at commit,
because a relation may be sealed while the transaction is open; a commit whose
times are now sealed is aborted instead.

:func:`commit_all` commits several transactions with one COMMIT record whose body
lists the others' ids: all of them become visible together, or (after a crash before
the record is durable) none does.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from contextlib import ExitStack
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa

from sediment.errors import TransactionError
from sediment.txn_state import ABORTED, COMMITTED, TxnState
from sediment.wal.protocol import Ticket
from sediment.wal.record import Record, RecordKind, encode_txn_ids

if TYPE_CHECKING:
    from sediment.engine.relation import Relation

Admission = tuple["Relation", str, int]
"""What is checked when a transaction's records are submitted: (relation, its name, the least
time written to it) -- the relation still exists and is not sealed at that time."""


class TxnWriter(Protocol):
    """All a transaction needs from its engine: its writer (:class:`sediment.engine.writer.Writer`)."""

    def txn_records(self, name: str, updates: pa.Table, txn_id: int) -> tuple[Admission, list[Record]] | None:
        """The UPDATES records of one append (None: nothing to append), and its admission."""
        ...

    def txn_submit(self, records: list[Record], admit: Sequence[Admission] | None = None,
                    refused: list[Record] | None = None) -> tuple[Ticket, BaseException | None]:
        """Submit ``records`` once every admission holds, atomically with the checks; when one
        does not, submit ``refused`` instead and return the error (or raise it without
        ``refused``). With ``admit`` None, submit without checks."""
        ...

    def txn_wait(self, ticket: Ticket) -> None:
        """``ticket.wait()``; a failure of unknown outcome fails the engine first."""
        ...

    def txn_abandoned(self, txn: TxnState) -> None:
        """A begun transaction's object was garbage collected: abort it if still open. Called
        by a finalizer, on any thread and at any moment: it must only note it."""
        ...


class Transaction:
    """Created by :meth:`Engine.transaction`. Use as a context manager: commits on success,
    aborts on an exception. One that wrote and is garbage collected while still open is
    aborted by the engine's next compaction pass: nothing can commit it any more, and an open
    transaction holds back the WAL cut, and so every relation's compaction and the log's trim."""

    def __init__(self, writer: TxnWriter, txn_id: int):
        self._writer = writer
        self.id = txn_id
        self._begun = False
        self._txn = TxnState(txn_id)  # open, then committed or aborted: shared with RemoteTransaction
        self._touched: dict[str, tuple[Relation, int]] = {}  # name -> (relation, least time)
        self._mutex = threading.Lock()

    @property
    def state(self) -> str:
        """``open``, ``committed``, ``aborted``, or ``in doubt`` (a commit whose COMMIT record
        was submitted and is not known to be durable: waiting for its sync, or the sync failed)."""
        return self._txn.value

    def _check(self) -> None:
        self._txn.check_open()

    def append(self, name: str, updates: pa.Table) -> None:
        """Add updates to the transaction; durable (but invisible) on return."""
        with self._mutex:
            self._check()
            prepared = self._writer.txn_records(name, updates, self.id)
            if prepared is None:
                return
            (rel, _name, t_min), records = prepared
            if not self._begun:
                records.insert(0, Record(RecordKind.BEGIN, txn_id=self.id))
            ticket, _ = self._writer.txn_submit(records, [(rel, name, t_min)])
            if not self._begun:  # the finalizer holds the state, not the transaction
                weakref.finalize(self, self._writer.txn_abandoned, self._txn)
            self._begun = True
            prev = self._touched.get(name)
            self._touched[name] = (rel, t_min if prev is None else min(prev[1], t_min))
        self._writer.txn_wait(ticket)

    def commit(self) -> None:
        """Make every append of the transaction visible at once; durable on return.
        Raises TransactionError (and aborts) if one of its times was sealed meanwhile."""
        commit_all(self._writer, [self])

    def abort(self) -> None:
        """Discard every append of the transaction. Aborting twice is harmless."""
        with self._mutex:
            ticket = self._abort_locked()
        if ticket is not None:
            self._writer.txn_wait(ticket)

    def _abort_locked(self):
        """Abort with ``_mutex`` held; the ABORT record's ticket, if one was written."""
        if not self._txn.is_open:
            return None
        self._txn.finish(ABORTED)
        if not self._begun:
            return None
        return self._writer.txn_submit([Record(RecordKind.ABORT, txn_id=self.id)])[0]

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def commit_all(writer: TxnWriter, transactions: Sequence[Transaction]) -> None:
    """See :meth:`Engine.commit_all`."""
    txns = sorted({id(t): t for t in transactions}.values(), key=lambda t: t.id)
    for t in txns:
        if t._writer is not writer:
            raise TransactionError(f"transaction {t.id:#x} belongs to another engine")
    with ExitStack() as held:
        for t in txns:  # in id order, so two concurrent commit_all calls cannot deadlock
            held.enter_context(t._mutex)
        closed = [t for t in txns if not t._txn.is_open]
        if len(txns) == 1 and closed:
            closed[0]._check()  # "already committed" / "already aborted"
        if closed:
            tickets = [t._abort_locked() for t in txns]
            for tk in tickets:
                if tk is not None:
                    writer.txn_wait(tk)
            raise TransactionError("cannot commit " + ", ".join(f"{t.id:#x} ({t.state})" for t in closed) +
                                   ": already finished; every transaction of this commit was aborted")
        begun = [t for t in txns if t._begun]
        if not begun:  # nothing was written: nothing to log
            for t in txns:
                t._txn.finish(COMMITTED)
            return
        ids = [t.id for t in begun]
        ticket, failure = writer.txn_submit(
            [Record(RecordKind.COMMIT, txn_id=ids[0], body=encode_txn_ids(ids[1:]))],
            [(rel, name, t_min) for t in begun for name, (rel, t_min) in t._touched.items()],
            refused=[Record(RecordKind.ABORT, txn_id=t.id) for t in begun])
        for t in txns:
            if failure is not None:
                t._txn.finish(ABORTED)
            else:
                t._txn.start_commit()
    writer.txn_wait(ticket)  # a failed sync leaves them in doubt: the COMMIT record may or may not be durable
    for t in txns:
        t._txn.commit_durable()
    if failure is not None:
        which = f"transaction {txns[0].id:#x} was" if len(txns) == 1 else f"transactions {[hex(t.id) for t in txns]} were"
        raise TransactionError(f"{which} aborted: {failure}") from failure
