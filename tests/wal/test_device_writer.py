"""The device ring's writer: several block writes in flight at once (a block is sealed as
soon as an I/O slot is free, not after the write in flight), and a submit nobody waits on
made durable by an I/O thread."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from support.waiting import Progress
from support.wal_backends import owned

from sediment.clock import ManualClock
from sediment.wal.device.log import DeviceLog
from sediment.wal.record import Record, RecordKind

BS = 4096
HEADER_AREA = 2 * BS


def upd(i: int, n: int = 3000) -> Record:
    return Record(RecordKind.UPDATES, relation_id=1, t_lo=i, t_hi=i, count=1, body=bytes([i % 251]) * n)


class DataWrites:
    """A pwrite that notes which thread wrote each data block, and can hold the first
    ``gate`` data writes until that many are inside pwrite at once."""

    def __init__(self, gate: int = 0) -> None:
        self.threads: list[int] = []
        self.lock = threading.Lock()
        self.barrier = threading.Barrier(gate, timeout=10) if gate else None
        self.gated = 0

    def __call__(self, fd: int, data, offset: int) -> int:
        if offset >= HEADER_AREA:
            with self.lock:
                self.threads.append(threading.get_ident())
                hold = self.barrier is not None and self.gated < self.barrier.parties
                self.gated += hold
            if hold:
                self.barrier.wait()  # raises BrokenBarrierError (failing the log) if they come one by one
        return os.pwrite(fd, data, offset)


def test_two_appenders_have_two_block_writes_in_flight_at_once(tmp_path: Path) -> None:
    """The second appender's block is written while the first is still in flight (a manual
    clock that never moves: no block is sealed by age)."""
    writes = DataWrites(gate=2)
    log = owned(DeviceLog.open(tmp_path / "ring", 1 << 20, create=True, pwrite=writes, clock=ManualClock()))
    errors: list[BaseException] = []
    records = [upd(1), upd(2)]

    def append(r: Record) -> None:
        try:
            log.append([r])
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=append, args=(r,)) for r in records]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and not writes.barrier.broken
    assert len(writes.threads) == 2 and {r.lsn for r in records} == {0, BS}
    assert [log.read(r.lsn).body for r in records] == [r.body for r in records]
    log.close()


def test_a_submit_nobody_waits_on_becomes_durable(tmp_path: Path) -> None:
    """An I/O thread writes a block whose ticket is never waited on, even on a test clock
    that never moves (no block waits for an age)."""
    writes = DataWrites()
    log = owned(DeviceLog.open(tmp_path / "ring", 1 << 20, create=True, pwrite=writes, clock=ManualClock()))
    progress = Progress()
    done: list[Record] = []

    def on_durable(recs) -> None:
        done.extend(recs)
        progress.changed()

    ticket = log.submit([upd(7)], on_durable)
    progress.wait_for(lambda: done, 10, "the unwaited submit to become durable")
    assert done[0].lsn == 0 and log.durable_lsn >= done[0].frame_size
    assert writes.threads and threading.get_ident() not in writes.threads
    assert ticket.wait() == 0
    log.close()
