"""The engine's bookkeeping, one structure per fact, so that no two dictionaries have to be
kept in step by hand: relations by name and by id (:class:`Relations`), transactions begun
but not finished (:class:`OpenTxns`), and who may still be reading what compaction would
delete (:class:`ReaderPins`). Pure: no I/O, no locking (the engine lock guards them all);
time only from the clock passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from sediment.clock import Clock

if TYPE_CHECKING:
    from sediment.engine.relation import TailEntry, _Relation


class Relations(Mapping[str, "_Relation"]):
    """The engine's relations: a mapping by name that also finds a relation by its id (WAL
    records carry ids). Adding and removing go through one call each, which keeps both
    indexes in step."""

    def __init__(self) -> None:
        self._by_name: dict[str, _Relation] = {}
        self._by_id: dict[int, _Relation] = {}

    def __getitem__(self, name: str) -> _Relation:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def by_id(self, relation_id: int) -> _Relation | None:
        """The relation with this catalog id, or None (never created, or dropped)."""
        return self._by_id.get(relation_id)

    def add(self, rel: _Relation) -> None:
        self._by_name[rel.entry.name] = rel
        self._by_id[rel.entry.id] = rel

    def remove(self, rel: _Relation) -> None:
        del self._by_name[rel.entry.name]
        del self._by_id[rel.entry.id]


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


class ReaderPins:
    """Readers that may still need the batches and log records a compaction replaces: reads
    in progress (:meth:`pin` / :meth:`unpin`) and read plans' leases, each until released or
    until its deadline on the clock. Replaced objects are deleted, and the log trimmed, only
    while :attr:`idle`."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.pins = 0
        self.leases: dict[int, float] = {}  # lease id -> deadline (clock seconds)
        self._last_lease = 0

    def pin(self) -> None:
        self.pins += 1

    def unpin(self) -> None:
        self.pins -= 1

    def lease(self, seconds: float) -> int:
        """A new lease, held for ``seconds`` from now; its id."""
        self._last_lease += 1
        self.leases[self._last_lease] = self.clock.current_time() + seconds
        return self._last_lease

    def release(self, lease: int) -> bool:
        """End a lease; False if it had already ended (released, or expired)."""
        return self.leases.pop(lease, None) is not None

    def expire(self) -> list[int]:
        """End every lease whose deadline has come; their ids."""
        now = self.clock.current_time()
        ended = [lease for lease, deadline in self.leases.items() if deadline <= now]
        for lease in ended:
            del self.leases[lease]
        return ended

    @property
    def idle(self) -> bool:
        return not self.pins and not self.leases
