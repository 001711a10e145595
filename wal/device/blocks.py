"""What the ring writer hands around: a block (a run of frames written with one aligned
pwrite), an appender's ticket, and the writer's event counts. The writer
(wal/device/writer.py) owns their state; they live here so that the writer's module holds
only its logic."""

from __future__ import annotations

import mmap
from _thread import allocate_lock
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from sediment.wal.record import Record


class BlockWriter(Protocol):
    """What a ticket's wait calls: the ring's writer (wal/device/writer.py ``RingWriter``)."""

    def write_alone(self, blk: Block) -> bool: ...

    def await_block(self, blk: Block) -> None: ...


class Block:
    """A run of records written with one aligned pwrite. ``settled`` once the block is
    durable or the log failed (:meth:`settle`); ``tickets`` are its appends, dropped once
    they are told (a ticket refers to its block, so keeping them would make every block a
    cycle for the garbage collector, holding its records' bodies until a collection).

    A plain class that is its own completion flag (a lock held until settled, as
    wal/protocol.py ``DoneFlag``): one is made per block write, on the path of a lone
    appender, where a dataclass and a flag object of its own cost two more calls."""

    __slots__ = ("start", "buf", "pooled", "fill", "settled", "_gate", "taken", "written", "durable",
                 "frontiers_end", "tickets")

    def __init__(self, start: int, buf: mmap.mmap, pooled: bool) -> None:
        self.start = start
        self.buf = buf
        self.pooled = pooled
        self.fill = 0
        self.settled = self.taken = self.written = self.durable = False
        self._gate = allocate_lock()
        self._gate.acquire()
        self.frontiers_end = -1
        self.tickets: list[DeviceTicket] = []

    def settle(self) -> None:
        """Wake every waiter (once; the announcing thread and a failing one may both call it)."""
        if not self.settled:
            self.settled = True
            try:
                self._gate.release()
            except RuntimeError:  # the other caller released it between the test and here
                pass

    def wait_settled(self) -> None:
        if not self.settled:
            self._gate.acquire()
            try:
                self._gate.release()
            except RuntimeError:  # a second settle() released it meanwhile: open either way
                pass


@dataclass(slots=True, eq=False)
class DeviceTicket:
    """An append in flight (see ``DeviceLog.submit``)."""

    writer: BlockWriter
    records: Sequence[Record]
    on_durable: Callable[[Sequence[Record]], None] | None
    block: Block | None = None

    def wait(self) -> int:
        """Block until the records (and everything before them) are durable; the last
        record's LSN. Raises WalError if the log failed first."""
        block = self.block
        assert block is not None
        if not self.writer.write_alone(block):
            self.writer.await_block(block)
        return self.records[-1].lsn

    def settled(self) -> bool:
        return self.block is not None and self.block.settled


@dataclass(slots=True)
class WriterCounts:
    """Event counts for benchmarks and tests (updated under the writer's lock): data block
    writes, the writes already in flight summed over each write's start (their mean queue
    depth), and waits of a caller whose block was written but an older one not yet (the
    price of acknowledging in log order)."""

    writes: int = 0
    inflight_at_start: int = 0
    waits_for_older: int = 0
