"""The log protocol every WAL backend implements (file segments, device ring, replicated).

One log serves a whole engine: records of every relation go into it, tagged with
the relation's id, so one fdatasync makes a group of appends to many relations
durable and a transaction over several relations commits with one record. The
engine decides what records mean; the log only keeps frames, in order, durably, and
asks its owner (a SegmentPreamble) for the record each segment boundary carries.

Positions (LSNs) are integers that only grow; the file and replicated backends number
records 0, 1, 2, ...; the device backend uses logical byte offsets. Callers must only
compare them, never do arithmetic on them. tests/wal/test_wal_conformance.py holds every
backend to the same behaviour.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, runtime_checkable

from sediment.errors import EngineClosed, WalError
from sediment.wal.record import Record, RecordKind

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class OpenReport:
    """What a log found and did when it opened: torn tails cut, index entries rebuilt."""

    torn_tails: list[tuple[str, int, int, str]] = field(default_factory=list)  # (file, offset, bytes cut, reason)
    rebuilt_index_entries: int = 0
    records: int = 0

    def describe(self) -> list[str]:
        return [f"{path}: cut torn tail at offset {off} ({n} bytes): {why}" for path, off, n, why in self.torn_tails]


class DoneFlag:
    """A one-shot completion flag for a thread waiting on an append: a lock held until
    set. Cheaper than threading.Event (no condition variable, one futex wake), which
    matters with dozens of threads appending single rows. Any number of threads may wait."""

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._set = False

    def set(self) -> None:
        if not self._set:
            self._set = True
            self._lock.release()

    def is_set(self) -> bool:
        return self._set

    def wait(self) -> None:
        if not self._set:
            self._lock.acquire()
            self._lock.release()


def check_usable(where: str, closed: bool, failed: BaseException | None) -> None:
    """Refuse a write to a closed log (EngineClosed) or to one whose writer failed (WalError:
    nothing after that failure was acknowledged, so the engine must reopen to recover)."""
    if closed:
        raise EngineClosed(f"the write-ahead log at {where} is closed")
    if failed is not None:
        raise WalError(f"the write-ahead log at {where} failed earlier ({failed}); nothing after "
                       "that failure was acknowledged. Close and reopen the engine to recover") from failed


def check_trim(where: str, lsn: int, end: int) -> None:
    """Refuse a trim past the end of the log (WalError, nothing changed)."""
    if lsn > end:
        raise WalError(f"{where}: cannot trim to {lsn}: the log ends at {end}. Trim only LSNs that append() "
                       "returned and the compacter has finished with")


def notify(callbacks: Iterable[Callable[[T], None] | None], arg: T, what: str) -> None:
    """Call each callback with ``arg`` on a log's own thread: one that raises is logged and
    stops neither the others nor that thread."""
    for callback in callbacks:
        if callback is not None:
            try:
                callback(arg)
            except Exception:  # noqa: BLE001 - a listener must not stop the writer
                log.exception("%s failed", what)


@dataclass
class PendingAppend:
    """An append in flight in a group-committing log: queued, then written, then durable.
    Also the caller's ticket (``submit`` returns it)."""

    records: Sequence[Record]
    crcs: list[int]
    on_durable: Callable[[Sequence[Record]], None] | None = None
    done: DoneFlag = field(default_factory=DoneFlag)
    last_lsn: int = -1
    error: BaseException | None = None

    def wait(self) -> int:
        """Block until the records are durable; their last LSN. Raises the write's error."""
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.last_lsn

    def settled(self) -> bool:
        return self.done.is_set()


class Ticket(Protocol):
    """An append in flight."""

    def wait(self) -> int:
        """Block until durable; the last record's LSN. Raises the write's error."""
        ...

    def settled(self) -> bool:
        """Whether ``wait`` would return (or raise) at once: durable, or failed. Why: a caller
        with appends in flight acknowledges the durable ones before it waits on the next."""
        ...


class SegmentPreamble(Protocol):
    """The log's owner's side of a segment boundary. A log knows frames only: the owner
    decides what its records mean and which FRONTIERS record (kind 6) a boundary carries,
    so that the segments a trim keeps still say everything the dropped ones said (for the
    engine: each relation's sealed frontier; see engine/frontiers.py)."""

    def observe(self, records: Sequence[Record]) -> None:
        """``records`` were written (or placed, for the device ring) in log order. Called
        from the thread writing them (a writer thread, or the file log's leading caller);
        must be quick and must not raise."""
        ...

    def record(self, pending: Sequence[Record] = ()) -> Record:
        """The FRONTIERS record for a boundary now, as if ``pending`` (records placed
        before the boundary but not observed yet) had been observed."""
        ...


class _NoPreamble:
    """What a log uses until its owner sets a preamble: an empty FRONTIERS record."""

    def observe(self, records: Sequence[Record]) -> None:
        pass

    def record(self, pending: Sequence[Record] = ()) -> Record:
        return Record(RecordKind.FRONTIERS)


NO_PREAMBLE: SegmentPreamble = _NoPreamble()


@runtime_checkable
class WriteAheadLog(Protocol):
    """An append-only, checksummed, durable sequence of records."""

    report: OpenReport

    def append(self, records: Sequence[Record]) -> int:
        """Append ``records`` contiguously (no other call's records come between them) and
        return once they are durable. Sets each record's ``lsn`` and returns the last one.
        Safe to call from many threads: concurrent calls share one fdatasync. An empty list,
        or a record the frame cannot carry (a field out of range, an unknown kind, PADDING),
        raises InvalidArgument and appends nothing."""
        ...

    def submit(self, records: Sequence[Record],
               on_durable: Callable[[Sequence[Record]], None] | None = None) -> Ticket:
        """Queue ``records`` (queue order is log order) and return at once; the ticket's
        ``wait()`` returns when they are durable. ``on_durable(records)`` runs right after
        they become durable, in log order, before any waiter wakes, on whichever thread
        wrote them (the file log's: the waiting caller that led the group); it must not
        raise. A backend may pass the records of several submissions with one callback to
        one call, and may write them only once some caller waits on a ticket, finishes a
        segment or closes the log: wait on every ticket whose records must be durable."""
        ...

    def set_preamble(self, preamble: SegmentPreamble | None) -> None:
        """Have ``preamble`` observe every record written from now on and supply the
        FRONTIERS record of each segment boundary. Set it before the first append after
        open, from the records the open replayed; without one (None) a boundary carries an
        empty FRONTIERS record, so an owner that trims must set one."""
        ...

    def scan(self, start: int | None = None) -> Iterator[Record]:
        """Every record from ``start`` (default: the oldest kept) to the end, in order."""
        ...

    def read(self, lsn: int) -> Record:
        """The record at ``lsn``. Raises WalError if it lies below ``start_lsn`` (trimmed) or
        was never written."""
        ...

    def read_many(self, lsns: Sequence[int]) -> list[Record]:
        """The records at ``lsns``, in that order; the same errors as :meth:`read` for any
        of them. Why: neighbouring records come with one read of the store, where a read a
        record gave up the interpreter lock (a syscall or more) once or twice a record, and
        beside threads running Python each such call waits for the lock again (a compaction
        pass over 100,000 small records read back after a reopen, a snapshot of a long tail)."""
        ...

    @property
    def start_lsn(self) -> int:
        """The oldest LSN still kept (records below it were trimmed)."""
        ...

    @property
    def end_lsn(self) -> int:
        """The LSN the next record will get (for the device: may skip padding)."""
        ...

    @property
    def finished_lsn(self) -> int:
        """Every record below this LSN lies in a finished segment: it will never move or
        change, and the compacter may turn it into batches. It never passes a record whose
        ``on_durable`` callback has not returned: the compacter reads what the callbacks
        applied, so a record counted as finished before its callback ran would be skipped."""
        ...

    def set_finish_listener(self, callback: Callable[[int], None] | None) -> None:
        """Call ``callback(finished_lsn)`` (from the writer's thread; keep it short) each
        time a segment is finished."""
        ...

    def finish_segment(self) -> None:
        """Finish the current segment now if it holds any record (tests, shutdown, tools)."""
        ...

    def trim(self, lsn: int) -> None:
        """Records below ``lsn`` are no longer needed; the log may discard them. Never
        discards a record at or above ``lsn``, nor anything not yet finished, nor the
        FRONTIERS record (the preamble's) at the boundary the kept records start from; ``start_lsn``
        then stays at or below both ``lsn`` and ``finished_lsn``. WalError (and no change)
        when ``lsn`` lies past the end of the log."""
        ...

    def close(self) -> None:
        """Flush and release files and threads. Appends after close raise EngineClosed."""
        ...
