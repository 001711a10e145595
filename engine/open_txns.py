"""Transactions begun but not finished: per transaction the LSN of its first record (the
compaction cut and the log trim stop there) and its UPDATES records, which join their
relations' tails at COMMIT. Pure: no I/O, no locking (the engine lock guards it)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sediment.engine.relation import TailEntry


class _Txn:
    __slots__ = ("entries", "first_lsn", "relation_ids")

    def __init__(self, first_lsn: int) -> None:
        self.first_lsn = first_lsn
        self.relation_ids: list[int] = []  # side by side with entries: no pair per record
        self.entries: list[TailEntry] = []


class OpenTxns:
    """Transactions with a durable record but no durable COMMIT or ABORT yet: per transaction
    the LSN of its first record (compaction's cut and the log's trim stop there) and its
    UPDATES records, which join their relations' tails at COMMIT."""

    def __init__(self) -> None:
        self._txns: dict[int, _Txn] = {}

    def begin(self, txn_id: int, lsn: int) -> None:
        """A record of the transaction at ``lsn``; the first one seen opens it."""
        if txn_id not in self._txns:
            self._txns[txn_id] = _Txn(lsn)

    def add(self, txn_id: int, lsn: int, relation_id: int, entry: TailEntry) -> None:
        """An UPDATES record of the transaction (opening it if this is its first record)."""
        self.begin(txn_id, lsn)
        txn = self._txns[txn_id]
        txn.relation_ids.append(relation_id)
        txn.entries.append(entry)

    def extend(self, txn_id: int, lsn: int, relation_ids: Iterable[int], entries: Iterable[TailEntry]) -> None:
        """Several UPDATES records of the transaction, in log order, the first at ``lsn``:
        as many calls of :meth:`add` (an open's replay adds them in bulk)."""
        self.begin(txn_id, lsn)
        txn = self._txns[txn_id]
        txn.relation_ids.extend(relation_ids)
        txn.entries.extend(entries)
        if len(txn.relation_ids) != len(txn.entries):
            raise ValueError(f"transaction {txn_id}: {len(txn.relation_ids)} relation ids for "
                             f"{len(txn.entries)} entries")

    def finish(self, txn_id: int) -> list[tuple[int, TailEntry]]:
        """Close the transaction (COMMIT or ABORT); its ``(relation id, entry)`` updates."""
        return list(zip(*self.finish_columns(txn_id), strict=True))

    def finish_columns(self, txn_id: int) -> tuple[list[int], list[TailEntry]]:
        """:meth:`finish`, as the updates' relation ids and entries side by side."""
        txn = self._txns.pop(txn_id, None)
        return ([], []) if txn is None else (txn.relation_ids, txn.entries)

    def order_by_first_lsn(self) -> None:
        """Put the transactions in the order their first records came in the log, the order
        record-by-record application leaves them in (a bulk replay opens them out of order)."""
        self._txns = dict(sorted(self._txns.items(), key=lambda item: item[1].first_lsn))

    def first_lsns(self) -> list[int]:
        return [t.first_lsn for t in self._txns.values()]

    def entries(self) -> list[TailEntry]:
        """Every UPDATES record of the open transactions (still in the WAL, still uncommitted)."""
        return [e for t in self._txns.values() for e in t.entries]

    def ids(self) -> list[int]:
        return sorted(self._txns)

    def __len__(self) -> int:
        return len(self._txns)
