"""The device ring's writer: several block writes in flight at once (a block is sealed as
soon as an I/O slot is free, not after the write in flight), appenders writing their own
blocks, and when a submit nobody waits on is written."""

from __future__ import annotations

import errno
import gc
import os
import threading
import time
import weakref
from pathlib import Path

import pytest
from support.waiting import Progress, poll_until
from support.wal_backends import owned

from sediment.clock import ManualClock
from sediment.errors import WalError
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


def told_finishes(log: DeviceLog) -> tuple[Progress, list[int]]:
    """A finish listener on ``log`` noting each finished LSN (signalled through the Progress)."""
    progress = Progress()
    finished: list[int] = []

    def listener(lsn: int) -> None:
        finished.append(lsn)
        progress.changed()

    log.set_finish_listener(listener)
    return progress, finished


def test_a_finished_segment_is_told_without_a_wait(tmp_path: Path) -> None:
    """A submit that fills the segment places its FRONTIERS record; an I/O thread writes it
    and tells the finish listener though nobody waits (a compacter is not kept waiting for
    the next append)."""
    log = owned(DeviceLog.open(tmp_path / "ring", 1 << 20, create=True, segment_bytes=8 * BS,
                               clock=ManualClock()))
    progress, finished = told_finishes(log)
    tickets = [log.submit([upd(i)]) for i in range(3)]
    log.submit([upd(9, 6 * BS)])
    progress.wait_for(lambda: finished, 10, "the finish listener")
    assert log.finished_lsn == finished[0] and log.durable_lsn >= finished[0]
    assert [t.wait() for t in tickets] == [0, upd(0).frame_size, 2 * upd(0).frame_size]
    log.close()


def test_an_io_thread_keeps_serving_after_the_blocks_it_wrote(tmp_path: Path) -> None:
    """Finished segments told without a wait, more times than there are I/O threads: each is
    written by an I/O thread, which then waits for the next job. Fails if a thread left after
    a write that succeeded (the third finish was never written, and an appender whose block
    only a thread could write waited for ever)."""
    log = owned(DeviceLog.open(tmp_path / "ring", 1 << 20, create=True, segment_bytes=8 * BS, io_threads=2,
                               clock=ManualClock()))
    progress, finished = told_finishes(log)
    tickets = []
    for k in range(5):
        tickets += [log.submit([upd(10 * k + i)]) for i in range(3)]
        tickets.append(log.submit([upd(10 * k + 9, 6 * BS)]))
        progress.wait_for(lambda k=k: len(finished) > k, 10, f"finish {k + 1} told by an I/O thread")
    assert all(t.is_alive() for t in log.writer._threads)
    assert sorted(t.wait() for t in tickets) == [t.records[-1].lsn for t in tickets]
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
    """A pwrite that, once ``armed``, holds every header write until ``release`` is set, and
    notes the thread of each header write once armed (``threads``)."""

    def __init__(self) -> None:
        self.armed = False
        self.release = threading.Event()
        self.progress = Progress()
        self.held = 0
        self.threads: list[int] = []

    def __call__(self, fd: int, data, offset: int) -> int:
        if self.armed and offset < HEADER_AREA:
            self.threads.append(threading.get_ident())
            self.held += 1
            self.progress.changed()
            assert self.release.wait(30)
        return os.pwrite(fd, data, offset)


def test_a_header_checkpoint_is_written_off_the_appenders_path(tmp_path: Path) -> None:
    """The append whose completion makes a header checkpoint due hands the header write to
    an I/O thread: with that write held, it and the next append are written, acknowledged
    and return; once let go, the header records the first one's durable end."""
    writes = HeldHeaderWrites()
    log = owned(DeviceLog.open(tmp_path / "ring", 1 << 20, create=True, pwrite=writes, checkpoint_bytes=2 * BS,
                               clock=ManualClock()))
    writes.armed = True
    first, second = upd(1, 9000), upd(2)  # the second leaves the header less than two checkpoints behind
    appenders: list[int] = []
    done = threading.Event()

    def append_both() -> None:
        appenders.append(threading.get_ident())
        log.append([first])
        writes.progress.wait_for(lambda: writes.held == 1, 10, "the checkpoint's header write, held")
        log.append([second])
        done.set()

    threading.Thread(target=append_both, daemon=True).start()
    try:
        assert done.wait(10), "an append waited for a header checkpoint"
        assert log.durable_lsn == second.lsn + second.frame_size and writes.held == 1
        assert writes.threads[0] not in appenders, "the appender wrote the header checkpoint"
    finally:
        writes.release.set()
    poll_until(lambda: log.writer.head.recorded_durable >= first.lsn + first.frame_size, 10,
               "the header checkpoint to record the first append")
    log.close()


def test_the_appender_writes_the_checkpoint_once_the_header_lags_two(tmp_path: Path) -> None:
    """While the I/O thread's header checkpoint is held, the appender whose completion puts
    the durable end two checkpoints past the header writes one itself (after the held one):
    the header never lags further than that behind a lone appender."""
    writes = HeldHeaderWrites()
    log = owned(DeviceLog.open(tmp_path / "ring", 1 << 20, create=True, pwrite=writes, checkpoint_bytes=BS,
                               io_threads=1, clock=ManualClock()))
    writes.armed = True
    recs = [upd(1, 5000), upd(2, 5000)]
    second = threading.Event()

    def append_both() -> None:
        log.append([recs[0]])
        writes.progress.wait_for(lambda: writes.held == 1, 10, "the I/O thread's header checkpoint, held")
        second.set()
        log.append([recs[1]])

    appender = threading.Thread(target=append_both, daemon=True)
    appender.start()
    try:
        assert second.wait(10), "the first append or its checkpoint's header write did not come"
        assert writes.threads[0] != appender.ident
    finally:
        writes.release.set()
    appender.join(10)
    assert not appender.is_alive()
    assert writes.threads[1:] == [appender.ident], "the appender left the header two checkpoints behind"
    assert log.writer.head.recorded_durable == recs[1].lsn + recs[1].frame_size
    log.close()


class HeldThenFailing:
    """A pwrite that holds the first data write until ``release`` is set, fails the data
    writes listed in ``fail`` (0-based, EIO), and notes every data write that returned:
    (offset, length, thread) in ``returned``."""

    def __init__(self, fail: tuple[int, ...] = ()) -> None:
        self.release = threading.Event()
        self.progress = Progress()
        self.fail = fail
        self.started = 0
        self.returned: list[tuple[int, int, int]] = []
        self.lock = threading.Lock()

    def __call__(self, fd: int, data, offset: int) -> int:
        if offset < HEADER_AREA:
            return os.pwrite(fd, data, offset)
        with self.lock:
            k, self.started = self.started, self.started + 1
        if k == 0:
            self.progress.changed()
            assert self.release.wait(30)
        if k in self.fail:
            raise OSError(errno.EIO, "injected write failure")
        n = os.pwrite(fd, data, offset)
        with self.lock:
            self.returned.append((offset, len(data), threading.get_ident()))
        self.progress.changed()
        return n

    def covers(self, lsn: int, size: int) -> bool:
        """Whether a data write that returned holds ring bytes [lsn, lsn + size)."""
        with self.lock:
            return any(o - HEADER_AREA <= lsn and lsn + size <= o - HEADER_AREA + n for o, n, _ in self.returned)


def gathered_appends(log: DeviceLog, writes: HeldThenFailing, count: int):
    """One appender whose write is held, then ``count`` appenders (real threads) that
    submit and wait while it is in flight: with ``partial_writes=1`` they gather in the open
    block. Returns (first thread, the others, their records, callbacks run, outcomes)."""
    records = [upd(i) for i in range(count + 1)]
    called: list[tuple[int, bool]] = []
    outcome: dict[int, object] = {}

    def append(i: int) -> None:
        def durable(recs) -> None:
            called.append((i, writes.covers(recs[0].lsn, recs[0].frame_size)))
        try:
            outcome[i] = log.submit([records[i]], durable).wait()
        except BaseException as e:  # noqa: BLE001
            outcome[i] = e

    first = threading.Thread(target=append, args=(0,), name="first")
    first.start()
    writes.progress.wait_for(lambda: writes.started == 1, 10, "the first block's write, held")
    others = [threading.Thread(target=append, args=(i,), name=f"appender-{i}") for i in range(1, count + 1)]
    for t in others:
        t.start()
    for t in others:
        thread_settled(t)  # asleep on its block: no slot for a partial block was free
    assert writes.started == 1 and not called
    writes.release.set()
    for t in [first, *others]:
        t.join(30)
    return first, records, called, outcome


def test_appends_waiting_together_share_one_write_led_by_the_appender_that_finished(tmp_path: Path) -> None:
    """Three appenders (real threads) that submit and wait while a write is in flight share
    one block write, which the first appender writes on its own thread once its own block is
    durable (no I/O thread is woken). Every append is acknowledged exactly once, in log
    order, only after the write holding it returned. Fails if each wrote its own block."""
    writes = HeldThenFailing()
    log = owned(DeviceLog.open(tmp_path / "ring", 1 << 20, create=True, pwrite=writes, partial_writes=1,
                               clock=ManualClock()))
    before = io_threads_asleep()
    first, records, called, outcome = gathered_appends(log, writes, 3)
    assert called == [(i, True) for i in range(4)]  # in log order, each after its write returned
    assert outcome == {i: r.lsn for i, r in enumerate(records)}
    assert [r.lsn for r in records] == sorted(r.lsn for r in records)
    assert len(writes.returned) == 2 and writes.returned[1][2] == first.ident
    assert writes.returned[1][0] - HEADER_AREA == records[1].lsn  # the second write holds appends 1-3
    assert log.writer.counts.writes == 2 and io_thread_switches() == before
    log.close()
    log = owned(DeviceLog.open(tmp_path / "ring"))
    assert [r.t_lo for r in log.scan()] == [0, 1, 2, 3]
    log.close()


def test_a_failed_shared_write_fails_every_append_in_it_and_acknowledges_none(tmp_path: Path) -> None:
    """The shared write of three gathered appends fails (EIO): each of them raises WalError,
    none of their callbacks runs, the durable end stays at the append written before, and
    the log refuses further appends; reopening finds only that append."""
    writes = HeldThenFailing(fail=(1,))
    path = tmp_path / "ring"
    log = DeviceLog.open(path, 1 << 20, create=True, pwrite=writes, partial_writes=1, clock=ManualClock())
    _, records, called, outcome = gathered_appends(log, writes, 3)
    assert called == [(0, True)] and outcome[0] == 0
    assert all(isinstance(outcome[i], WalError) and "failed before the append was durable" in str(outcome[i])
               for i in (1, 2, 3))
    assert log.durable_lsn == records[0].frame_size
    with pytest.raises(WalError):
        log.append([upd(9)])
    log.close()
    log = owned(DeviceLog.open(path))
    assert [r.t_lo for r in log.scan()] == [0]
    log.close()


def test_eight_appenders_share_writes_and_each_append_is_acknowledged_once_in_order(tmp_path: Path) -> None:
    """Eight threads appending one record at a time (the engine's submit + wait) with the
    defaults: appends share block writes (fewer data writes than appends), every append's
    callback runs exactly once, in LSN order, after the write holding it returned, and
    before its wait returns; reopening finds every record in order."""
    writes = HeldThenFailing()
    writes.release.set()
    path = tmp_path / "ring"
    log = owned(DeviceLog.open(path, 8 << 20, create=True, pwrite=writes))
    called: list[tuple[int, int, bool]] = []
    returned: dict[tuple[int, int], int] = {}
    per_thread = 60

    def appender(k: int) -> None:
        for j in range(per_thread):
            rec = Record(RecordKind.UPDATES, relation_id=1, t_lo=k, t_hi=j, count=1, body=bytes([k]) * 3000)

            def durable(recs, k=k, j=j) -> None:
                called.append((k, j, writes.covers(recs[0].lsn, recs[0].frame_size)))
            lsn = log.submit([rec], durable).wait()
            assert (k, j, True) in called
            returned[(k, j)] = lsn

    threads = [threading.Thread(target=appender, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    n = 8 * per_thread
    assert len(returned) == n and len(called) == n and all(ok for _, _, ok in called)
    assert [returned[(k, j)] for k, j, _ in called] == sorted(returned.values())  # callbacks in log order
    assert log.writer.counts.writes < n  # shared writes
    log.close()
    log = owned(DeviceLog.open(path))
    assert [(r.t_lo, r.t_hi) for r in log.scan()] == [(k, j) for k, j, _ in called]
    log.close()


class Body(bytearray):
    """A record body that can be watched for being freed (bytes takes no weak reference)."""


def test_an_acknowledged_append_is_freed_without_the_garbage_collector(tmp_path: Path) -> None:
    """Once told, a block lets go of its appends: a ticket refers to its block, so a block
    that kept its tickets was a reference cycle, and every acknowledged record and its
    body stayed in memory until the collector ran. Lone appends (written by their own
    caller) and appends sharing one write (written at close) alike."""
    log = owned(DeviceLog.open(tmp_path / "ring", 1 << 20, create=True, clock=ManualClock()))
    gc.disable()
    try:
        bodies = [Body(b"x" * 900) for _ in range(4)]
        watched = [weakref.ref(b) for b in bodies]
        log.append([Record(RecordKind.UPDATES, relation_id=1, body=bodies[0])])
        log.submit([Record(RecordKind.UPDATES, relation_id=1, body=bodies[1])], lambda _: None).wait()
        shared = [log.submit([Record(RecordKind.UPDATES, relation_id=1, body=b)]) for b in bodies[2:]]
        assert shared[0].block is shared[1].block  # placed in one open block, written once
        shared[1].wait()
        del bodies, shared
        assert [w() for w in watched] == [None] * 4, "an acknowledged append is still referenced"
    finally:
        gc.enable()
    log.close()
