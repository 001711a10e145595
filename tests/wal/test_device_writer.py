"""The device ring's writer: several block writes in flight at once (a block is sealed as
soon as an I/O slot is free, not after the write in flight), appenders writing their own
blocks, and when a submit nobody waits on is written."""

from __future__ import annotations

import os
import threading
import time
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


def test_an_appender_writes_its_own_block_and_wakes_no_thread(tmp_path: Path) -> None:
    """``submit`` + ``wait`` alone on the ring: the block is written on the caller's thread
    (no hand-off to an I/O thread and back), and the callback ran before ``wait`` returned."""
    writes = DataWrites()
    log = owned(DeviceLog.open(tmp_path / "ring", 1 << 20, create=True, pwrite=writes, clock=ManualClock()))
    done: list[int] = []
    before = io_threads_asleep()
    for i in range(20):
        assert log.submit([upd(i, 100)], lambda recs: done.extend(r.lsn for r in recs)).wait() == done[-1]
    assert io_thread_switches() == before  # no I/O thread was woken
    assert len(done) == 20 and set(writes.threads) == {threading.get_ident()}
    log.close()


def io_thread_switches() -> dict[int, int]:
    """Each ring I/O thread's count of voluntary context switches (Linux /proc): a thread
    woken from its wait and sleeping again adds to it."""
    out = {}
    for t in threading.enumerate():
        if t.name.startswith("sediment-wal-io-") and t.native_id is not None:
            with open(f"/proc/self/task/{t.native_id}/status") as f:
                out[t.native_id] = next(int(x.split()[1]) for x in f if x.startswith("voluntary_ctxt_switches"))
    assert out, "no ring I/O threads found"
    return out


def unchanged(read, timeout: float, what: str, ready=lambda now: True, gone=lambda: False):
    """Poll ``read()`` (deadline ``timeout``) until two reads 50 ms apart agree and ``ready``
    holds: threads asleep keep their voluntary switch counts, the interpreter lock free
    meanwhile; the last read. Stops early, returning None, once ``gone()``. A bounded poll
    for something that must not happen (a thread that stays asleep): no event can say so."""
    deadline = time.monotonic() + timeout
    last = read()
    while time.monotonic() < deadline and not gone():
        time.sleep(0.05)
        now = read()
        if now == last and ready(now):
            return now
        last = now
    if gone():
        return None
    raise AssertionError(f"{what} did not settle within {timeout}s")


def io_threads_asleep(timeout: float = 10.0) -> dict[int, int]:
    """Once the I/O threads have started and sleep: their switch counts."""
    return unchanged(io_thread_switches, timeout, "the ring's I/O threads", ready=lambda now: all(now.values()))


def test_a_submit_nobody_waits_on_is_written_by_the_next_waiter_or_close(tmp_path: Path) -> None:
    """The protocol's rule: a ticket nobody waits on is written once some caller waits (its
    block first: log order) or the log closes; its callback runs before the later one's."""
    writes = DataWrites()
    path = tmp_path / "ring"
    log = DeviceLog.open(path, 1 << 20, create=True, pwrite=writes, clock=ManualClock())
    order: list[int] = []
    first = log.submit([upd(1)], lambda recs: order.append(1))
    second = log.submit([upd(2)], lambda recs: order.append(2))
    n = upd(1).frame_size
    assert second.wait() == n and order == [1, 2] and log.durable_lsn == 2 * n
    assert first.wait() == 0
    log.submit([upd(3)], lambda recs: order.append(3))
    log.close()
    assert order == [1, 2, 3]
    log = owned(DeviceLog.open(path))
    assert [r.t_lo for r in log.scan()] == [1, 2, 3]
    log.close()


def test_a_finished_segment_is_told_without_a_wait(tmp_path: Path) -> None:
    """A submit that fills the segment places its FRONTIERS record; an I/O thread writes it
    and tells the finish listener though nobody waits (a compacter is not kept waiting for
    the next append)."""
    log = owned(DeviceLog.open(tmp_path / "ring", 1 << 20, create=True, segment_bytes=8 * BS,
                               clock=ManualClock()))
    progress = Progress()
    finished: list[int] = []

    def listener(lsn: int) -> None:
        finished.append(lsn)
        progress.changed()

    log.set_finish_listener(listener)
    tickets = [log.submit([upd(i)]) for i in range(3)]
    log.submit([upd(9, 6 * BS)])
    progress.wait_for(lambda: finished, 10, "the finish listener")
    assert log.finished_lsn == finished[0] and log.durable_lsn >= finished[0]
    assert [t.wait() for t in tickets] == [0, upd(0).frame_size, 2 * upd(0).frame_size]
    log.close()


class HeldFirstWrite:
    """A pwrite that holds the first data write until ``release`` is set, and notes every
    data write that returned (``returned``: offsets, signalled through ``progress``)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.progress = Progress()
        self.returned: list[int] = []
        self.held = False
        self.lock = threading.Lock()

    def __call__(self, fd: int, data, offset: int) -> int:
        if offset < HEADER_AREA:
            return os.pwrite(fd, data, offset)
        with self.lock:
            hold, self.held = not self.held, True
        if hold:
            self.progress.changed()
            assert self.release.wait(30)
        n = os.pwrite(fd, data, offset)
        self.returned.append(offset)
        self.progress.changed()
        return n


def thread_settled(t: threading.Thread, timeout: float = 10.0) -> None:
    """Poll (deadline ``timeout``) until ``t`` has ended or sleeps: the same count of
    voluntary context switches twice, the interpreter lock free meanwhile."""
    def switches() -> int | None:
        try:
            with open(f"/proc/self/task/{t.native_id}/status") as f:
                return next(int(x.split()[1]) for x in f if x.startswith("voluntary_ctxt_switches"))
        except FileNotFoundError:
            return None
    unchanged(switches, timeout, f"thread {t.name}", gone=lambda: not t.is_alive())


def test_a_later_block_written_first_is_acknowledged_only_after_the_earlier_one(tmp_path: Path) -> None:
    """Two block writes in flight, the later one finishing first: its append neither returns
    nor runs its callback until the earlier block is durable too (in-order acknowledgement:
    the durable log is a prefix). Fails if an append were acknowledged at its own write."""
    writes = HeldFirstWrite()
    log = owned(DeviceLog.open(tmp_path / "ring", 1 << 20, create=True, pwrite=writes, clock=ManualClock()))
    called: list[int] = []
    returned: list[int] = []

    def append(i: int) -> None:
        log.submit([upd(i)], lambda recs: called.append(i)).wait()
        returned.append(i)

    first = threading.Thread(target=append, args=(1,), name="first")
    second = threading.Thread(target=append, args=(2,), name="second")
    first.start()
    try:
        writes.progress.wait_for(lambda: writes.held, 10, "the first block's write, held")
        second.start()
        writes.progress.wait_for(lambda: writes.returned, 10, "the second block's write")
        assert writes.returned == [HEADER_AREA + BS]  # the later block, on disk while the first is held
        thread_settled(second)
        assert returned == [] and called == [] and log.durable_lsn == 0
    finally:
        writes.release.set()
    first.join(30)
    second.join(30)
    assert called == [1, 2] and sorted(returned) == [1, 2] and log.durable_lsn == BS + upd(2).frame_size
    counts = log.writer.counts
    assert (counts.writes, counts.inflight_at_start, counts.waits_for_older) == (2, 1, 1)  # the second waited
    log.close()


class HeldHeaderWrites:
    """A pwrite that, once ``armed``, holds every header write until ``release`` is set."""

    def __init__(self) -> None:
        self.armed = False
        self.release = threading.Event()
        self.progress = Progress()
        self.held = 0

    def __call__(self, fd: int, data, offset: int) -> int:
        if self.armed and offset < HEADER_AREA:
            self.held += 1
            self.progress.changed()
            assert self.release.wait(30)
        return os.pwrite(fd, data, offset)


def test_a_header_checkpoint_holds_up_no_other_appends_acknowledgement(tmp_path: Path) -> None:
    """The append whose completion makes a header checkpoint due writes it after handing
    back the completion of others: with that header write held, the next append is still
    written, acknowledged and returns; the checkpoint then records the durable end."""
    writes = HeldHeaderWrites()
    log = owned(DeviceLog.open(tmp_path / "ring", 1 << 20, create=True, pwrite=writes, checkpoint_bytes=BS,
                               clock=ManualClock()))
    writes.armed = True
    first = threading.Thread(target=log.append, args=([upd(1, 5000)],), name="checkpointing")
    first.start()
    try:
        writes.progress.wait_for(lambda: writes.held == 1, 10, "the checkpoint's header write, held")
        second = upd(2)
        done = threading.Event()
        threading.Thread(target=lambda: (log.append([second]), done.set()), daemon=True).start()
        assert done.wait(10), "an append waited for another thread's header checkpoint"
        assert log.durable_lsn == second.lsn + second.frame_size and first.is_alive() and writes.held == 1
    finally:
        writes.release.set()
    first.join(30)
    assert log.writer.head.recorded_durable >= upd(1, 5000).frame_size
    log.close()
