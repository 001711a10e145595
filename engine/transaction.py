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
from collections.abc import Sequence
from contextlib import ExitStack
from typing import TYPE_CHECKING

import pyarrow as pa

from sediment.errors import TimeAlreadySealed, TransactionError
from sediment.wal.record import Record, RecordKind, encode_txn_ids

if TYPE_CHECKING:
    from sediment.engine.engine import Engine, _Relation


class Transaction:
    """Created by :meth:`Engine.transaction`. Use as a context manager: commits on success,
    aborts on an exception."""

    def __init__(self, engine: Engine, txn_id: int):
        self._engine = engine
        self.id = txn_id
        self._begun = False
        self._state = "open"
        self._touched: dict[str, tuple[_Relation, int]] = {}  # name -> (relation, least time)
        self._mutex = threading.Lock()

    @property
    def state(self) -> str:
        """``open``, ``committed`` or ``aborted``."""
        return self._state

    def _check(self) -> None:
        if self._state != "open":
            raise TransactionError(f"transaction {self.id:#x} is already {self._state}")

    def append(self, name: str, updates: pa.Table) -> None:
        """Add updates to the transaction; durable (but invisible) on return."""
        eng = self._engine
        with self._mutex:
            self._check()
            rel, table, bounds = eng._prepare(name, updates)
            if table.num_rows == 0:
                return
            t_min = bounds[0]
            records = eng._encode(rel, table, self.id, bounds)
            if not self._begun:
                records.insert(0, Record(RecordKind.BEGIN, txn_id=self.id))
            with eng._lock:
                eng._wait_backlog(records)
                eng._check_open()
                eng._admit(rel, name, t_min)
                ticket = eng._log.submit(records, eng._on_durable)
            self._begun = True
            prev = self._touched.get(name)
            self._touched[name] = (rel, t_min if prev is None else min(prev[1], t_min))
        ticket.wait()

    def commit(self) -> None:
        """Make every append of the transaction visible at once; durable on return.
        Raises TransactionError (and aborts) if one of its times was sealed meanwhile."""
        commit_all(self._engine, [self])

    def abort(self) -> None:
        """Discard every append of the transaction. Aborting twice is harmless."""
        with self._mutex:
            ticket = self._abort_locked()
        if ticket is not None:
            ticket.wait()

    def _abort_locked(self):
        """Abort with ``_mutex`` held; the ABORT record's ticket, if one was written."""
        if self._state != "open":
            return None
        self._state = "aborted"
        if not self._begun:
            return None
        eng = self._engine
        return eng._log.submit([Record(RecordKind.ABORT, txn_id=self.id)], eng._on_durable)

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def commit_all(engine: Engine, transactions: Sequence[Transaction]) -> None:
    """See :meth:`Engine.commit_all`."""
    txns = sorted({id(t): t for t in transactions}.values(), key=lambda t: t.id)
    for t in txns:
        if t._engine is not engine:
            raise TransactionError(f"transaction {t.id:#x} belongs to another engine")
    with ExitStack() as held:
        for t in txns:  # in id order, so two concurrent commit_all calls cannot deadlock
            held.enter_context(t._mutex)
        closed = [t for t in txns if t._state != "open"]
        if len(txns) == 1 and closed:
            closed[0]._check()  # "already committed" / "already aborted"
        if closed:
            tickets = [t._abort_locked() for t in txns]
            for tk in tickets:
                if tk is not None:
                    tk.wait()
            raise TransactionError("cannot commit " + ", ".join(f"{t.id:#x} ({t._state})" for t in closed) +
                                   ": already finished; every transaction of this commit was aborted")
        begun = [t for t in txns if t._begun]
        failure: BaseException | None = None
        ticket = None
        if not begun:  # nothing was written: nothing to log
            for t in txns:
                t._state = "committed"
            return
        with engine._lock:
            engine._check_open()
            try:
                for t in begun:
                    for name, (rel, t_min) in t._touched.items():
                        engine._admit(rel, name, t_min)
            except (TimeAlreadySealed, LookupError) as exc:
                failure = exc
                ticket = engine._log.submit([Record(RecordKind.ABORT, txn_id=t.id) for t in begun],
                                            engine._on_durable)
            else:
                ids = [t.id for t in begun]
                ticket = engine._log.submit([Record(RecordKind.COMMIT, txn_id=ids[0], body=encode_txn_ids(ids[1:]))],
                                            engine._on_durable)
            for t in txns:
                t._state = "aborted" if failure is not None else "committed"
    ticket.wait()
    if failure is not None:
        which = f"transaction {txns[0].id:#x} was" if len(txns) == 1 else f"transactions {[hex(t.id) for t in txns]} were"
        raise TransactionError(f"{which} aborted: {failure}") from failure
