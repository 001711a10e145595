"""What the ring writer hands around: a block (a run of frames written with one aligned
pwrite), an appender's ticket, and the writer's event counts. The writer
(wal/device/writer.py) owns their state; they live here so that the writer's module holds
only its logic."""

from __future__ import annotations

import mmap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sediment.wal.protocol import DoneFlag
from sediment.wal.record import Record


class BlockWriter(Protocol):
    """What a ticket's wait calls: the ring's writer (wal/device/writer.py ``RingWriter``)."""

    def write_alone(self, blk: Block) -> bool: ...

    def await_block(self, blk: Block) -> None: ...


@dataclass(slots=True, eq=False)
class Block:
    """A run of records written with one aligned pwrite."""

    start: int
    buf: mmap.mmap
    pooled: bool
    fill: int = 0
    flag: DoneFlag = field(default_factory=DoneFlag)  # set once durable, or once the log failed
    taken: bool = False
    written: bool = False
    durable: bool = False
    frontiers_end: int = -1
    tickets: list[DeviceTicket] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.start + self.fill


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
        return self.block is not None and self.block.flag.is_set()


@dataclass(slots=True)
class WriterCounts:
    """Event counts for benchmarks and tests (updated under the writer's lock): data block
    writes, the writes already in flight summed over each write's start (their mean queue
    depth), and waits of a caller whose block was written but an older one not yet (the
    price of acknowledging in log order)."""

    writes: int = 0
    inflight_at_start: int = 0
    waits_for_older: int = 0
