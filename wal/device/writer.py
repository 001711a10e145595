"""Appending to the device ring. :class:`RingWriter` owns the write position, the open and
sealed blocks, the block writes and their completion in LSN order, and so the durable end
(the other parts of the ring and their owners are listed in wal/device/log.py)."""

from __future__ import annotations

import logging
import mmap
import threading
from collections import deque
from collections.abc import Callable

from sediment.clock import Clock
from sediment.errors import EngineClosed, WalError
from sediment.wal.device.block_io import RingFiles
from sediment.wal.device.blocks import Block, WriterCounts
from sediment.wal.device.format import SHUTDOWN_RUNNING, align_up
from sediment.wal.device.head import RingHead
from sediment.wal.device.placing import RingPlacement
from sediment.wal.device.segments import Segments
from sediment.wal.protocol import SegmentPreamble

_log = logging.getLogger("sediment.wal.device.log")
_ZEROS = memoryview(bytes(64 * 1024))


class RingWriter(RingPlacement):
    """Placement, the I/O slots and completion of one ring. ``io_threads`` bounds the block
    writes in flight. Appenders waiting for a block write it themselves when a slot is free,
    so an append costs no thread hand-off; the threads write only what no waiter can (a
    block no completing writer took, a FRONTIERS record's block, what is left when the ring
    is full or closing) and the header checkpoint every ``checkpoint_bytes``. The window
    (``head.window``) bounds how far past the oldest unfinished block a write may land,
    which is how far recovery looks past a gap.

    Concurrent appends share writes (group commit): each block write costs a syscall, the
    interpreter lock's hand-offs around it and, with several in flight, waits for older
    ones to finish in log order; one write for a group costs those once. So a block that
    is not full is written at once only when no write is in flight (a lone appender never
    waits for company); else it gathers the appends arriving while ``partial_writes`` writes
    are in flight, or until it holds as many as the block made durable last (woken
    together, they come back together), and the appender whose own block became durable
    on its write then writes it (``_lead_next``)."""

    def __init__(self, files: RingFiles, head: RingHead, *, path: str, block_size: int, max_block_bytes: int,
                 io_threads: int, checkpoint_bytes: int, full_timeout: float, clock: Clock,
                 partial_writes: int = 2) -> None:
        self.files, self.head, self.clock, self.path = files, head, clock, path
        self.block_size, self.header_bytes, self.data_capacity = block_size, 2 * block_size, 0
        self.max_block_bytes = max_block_bytes
        self.io_threads, self.checkpoint_bytes, self.full_timeout = io_threads, checkpoint_bytes, full_timeout
        self.partial_writes = min(partial_writes, io_threads)
        self.segments = Segments(0)
        self._lock = threading.Lock()
        self._work_cv = threading.Condition(self._lock)
        self._space_cv = threading.Condition(self._lock)
        self._alloc_lock = threading.Lock()
        self._pool: list[mmap.mmap] = []
        self._pool_size = align_up(max_block_bytes, block_size)
        self._pool_max = 2 * io_threads + 2  # buffers kept for reuse
        self._cur: Block | None = None
        self._next = 0
        self._pending: deque[Block] = deque()
        self._inflight: deque[Block] = deque()
        self._durable_end = 0
        self._failed: BaseException | None = None
        self._closed = False
        self._threads: list[threading.Thread] = []
        self._full_waiters = 0
        self._writing = 0
        self._done_q: deque[Block] = deque()
        self._notifying = False
        self._checkpoint_due = False  # an I/O thread is to write a header checkpoint
        self._checkpointing = False  # an I/O thread writes one
        self._backstop = False  # a completing thread writes one (the I/O threads fell behind)
        self._company = 1  # appends in the block made durable last
        self._stalled = 0  # waiters whose block is not taken and who found no slot: the threads write it
        self.counts = WriterCounts()

    # ---------------------------------------------------------------- state others read

    @property
    def next_lsn(self) -> int:
        """Where the next frame goes (the log's end)."""
        return self._next

    @property
    def durable_end(self) -> int:
        """Every record below this LSN is durable."""
        return self._durable_end

    @property
    def finished_lsn(self) -> int:
        return self.segments.finished

    @property
    def full_waiters(self) -> int:
        return self._full_waiters

    def wait_for_full_waiters(self, count: int, timeout: float) -> bool:
        with self._space_cv:
            return self._space_cv.wait_for(lambda: self._full_waiters >= count, timeout)

    def set_preamble(self, preamble: SegmentPreamble) -> None:
        with self._lock:
            self.segments.preamble = preamble

    def set_listener(self, callback: Callable[[int], None] | None) -> None:
        self.segments.listener = callback

    # ---------------------------------------------------------------- starting and stopping

    def start(self, data_capacity: int, next_lsn: int, durable_end: int, segments: Segments) -> None:
        """Begin appending at ``next_lsn`` (block-aligned) of a data area of ``data_capacity``
        bytes whose records below ``durable_end`` are durable; starts the I/O threads."""
        self.data_capacity = data_capacity
        self._next = next_lsn
        self._durable_end = max(durable_end, 0)
        segments.preamble, segments.listener = self.segments.preamble, self.segments.listener
        self.segments = segments
        for i in range(self.io_threads):
            t = threading.Thread(target=self._worker, name=f"sediment-wal-io-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def close(self) -> bool:
        """Write out the open block and stop the threads; True when this call closed a
        writer that had not failed (the log may then mark its header clean)."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            self._seal()
            self._work_cv.notify_all()
            self._space_cv.notify_all()
        for t in self._threads:
            t.join()
        return self._failed is None

    def release(self) -> None:
        """Free the pooled block buffers."""
        for b in self._pool:
            b.close()
        self._pool = []

    def clock_moved(self) -> None:
        with self._lock:
            self._work_cv.notify_all()
            self._space_cv.notify_all()

    # ---------------------------------------------------------------- trim

    def trim_target(self, lsn: int) -> int:
        """Where a trim to ``lsn`` may move the trim offset (see ``DeviceLog.trim``); -1 for
        nowhere new. WalError past the durable end."""
        with self._lock:
            self.check_open()
            if lsn > self._durable_end:
                raise WalError(
                    f"{self.path}: cannot trim to {lsn}: only records below {self._durable_end} are durable. "
                    "Trim only LSNs that append() returned and the compacter has finished with."
                )
            target = self.segments.trim_target(lsn)
            return target if target > self.head.trim else -1

    def trimmed(self, lsn: int) -> None:
        """The header now records trim offset ``lsn``: appenders waiting for room look again."""
        with self._lock:
            self.segments.forget_below(lsn)
            self._space_cv.notify_all()

    # ---------------------------------------------------------------- I/O slots

    def _eligible(self, blk: Block) -> bool:
        if not self._inflight:
            return True
        wlen = align_up(blk.fill, self.block_size)
        return blk.start + wlen <= self._inflight[0].start + self.head.window

    def _take(self) -> Block | None:
        """Under the lock: the next block to write, if an I/O slot is free and the window
        allows; seals the open block when nothing sealed waits and it is not gathering."""
        if self._failed is not None or self._writing >= self.io_threads:
            return None
        if not self._pending and self._cur is not None:
            if self._gathers(self._cur):
                return None
            self._seal()
        if self._pending and self._eligible(self._pending[0]):
            blk = self._pending.popleft()
            blk.taken = True
            self._inflight.append(blk)
            self.counts.writes += 1
            self.counts.inflight_at_start += self._writing
            self._writing += 1
            return blk
        return None

    def _gathers(self, cur: Block) -> bool:
        """Under the lock: whether the open block waits for company rather than being
        written now. Never while no write is in flight (a lone appender writes at once) or
        at close; always while ``partial_writes`` are in flight; else until it holds as many
        appends as the block written last (its appenders, woken together, come back
        together). A write in flight completes, and its writer then takes the block."""
        if self._writing == 0 or self._closed:
            return False
        return self._writing >= self.partial_writes or len(cur.tickets) < self._company

    def _run(self, blk: Block, own: Block | None = None) -> bool:
        """Write ``blk`` (a header copy first if it is wider than the window) and complete it;
        True when ``own`` (the caller's block) became durable here, and the caller then writes
        the block gathered meanwhile (:meth:`_lead_next`). A failed write fails the log
        (``_failed``) and returns False."""
        try:
            wlen = (blk.fill + self.block_size - 1) // self.block_size * self.block_size
            if wlen > self.head.window:
                self.head.write(SHUTDOWN_RUNNING, 0, self._durable_end, window=wlen)
            if wlen > blk.fill:
                blk.buf[blk.fill : wlen] = _ZEROS[: wlen - blk.fill]
            self.files.write_at(memoryview(blk.buf)[:wlen], self.header_bytes + blk.start % self.data_capacity)
        except BaseException as e:  # noqa: BLE001 - any failure poisons the log
            _log.error("%s: WAL write failed: %s", self.path, e)
            self._fail(e)
            return False
        return self._complete(blk, own)

    def _worker(self) -> None:
        while True:
            with self._lock:
                while True:
                    if self._failed is not None:
                        return
                    blk = self._take()
                    if blk is not None:
                        break
                    if self._checkpoint_due:  # unless a trim or segment finish recorded the end meanwhile
                        self._checkpoint_due = False
                        if self._durable_end - self.head.recorded_durable >= self.checkpoint_bytes:
                            self._checkpointing = True
                            break
                    if self._closed and not self._pending and not self._inflight and self._cur is None:
                        return
                    self._work_cv.wait()
            if blk is not None:
                self._run(blk)  # a failure is seen at the top of the loop
                continue
            try:
                self._checkpoint()
            finally:
                with self._lock:
                    self._checkpointing = False

    # ---------------------------------------------------------------- completion

    def _complete(self, blk: Block, own: Block | None = None) -> bool:
        """Advance the durable end over blocks finished in order; then (one thread at a
        time, no lock held, in log order) run callbacks and wake waiters. True when ``own``
        is durable now: its caller writes the next block itself, so no I/O thread is woken
        for waiters whose block is not taken."""
        lock = self._lock
        lock.acquire()  # not ``with`` (see place_fast)
        try:
            blk.written = True
            self._writing -= 1
            inflight = self._inflight
            while inflight and inflight[0].written:
                b = inflight.popleft()
                b.durable = True
                self._durable_end = b.start + b.fill
                self._company = len(b.tickets)
                if b.pooled and len(self._pool) < self._pool_max:
                    self._pool.append(b.buf)
                else:
                    b.buf.close()
                b.buf = None  # type: ignore[assignment]
                self._done_q.append(b)
            lead = own is not None and own.durable
            if self._closed:
                self._work_cv.notify_all()
            elif self._stalled and not lead and (self._pending or self._cur is not None):
                self._work_cv.notify()
            if self._notifying or not self._done_q:
                return lead
            self._notifying = True
        finally:
            lock.release()
        self._announce()
        return lead

    def _announce(self) -> None:
        """Run the callbacks and wake the waiters of the blocks completed in order
        (``_done_q``), one thread at a time (the caller set ``_notifying``), no lock held, in
        log order, until none is left; then, having given up announcing, write a header
        checkpoint if this thread is to (:meth:`_checkpoint_to_write`)."""
        done_q, lock = self._done_q, self._lock
        while True:
            while done_q:  # only the announcing thread takes from it (a deque's ends are thread-safe)
                b = done_q.popleft()
                for t in b.tickets:  # before a FRONTIERS record in it finishes the segment (_finished)
                    if t.on_durable is not None:
                        try:
                            t.on_durable(t.records)
                        except Exception:
                            _log.exception("%s: on_durable callback failed", self.path)
                b.tickets.clear()
                if b.frontiers_end >= 0:
                    self._finished(b.frontiers_end)
                b.settle()
            lock.acquire()
            try:
                if not done_q:
                    self._notifying = False
                    due = (self._durable_end - self.head.recorded_durable >= self.checkpoint_bytes
                           and self._checkpoint_to_write())
                    break
            finally:
                lock.release()
        if due:  # after giving up announcing: completions behind it are not held up by a header write
            try:
                self._checkpoint()
            finally:
                with self._lock:
                    self._backstop = False

    def _checkpoint_to_write(self) -> bool:
        """Under the lock, after completing: whether this thread writes a header checkpoint
        now. Once ``checkpoint_bytes`` of durable log are past the recorded durable end, an
        I/O thread writes one, so the appender whose completion made it due (a lone appender
        every 4 MiB) does not wait for the header write; only once the lag reaches twice
        that (the I/O threads starved or busy) does the completing thread write it itself,
        which bounds how far the header lags."""
        lag = self._durable_end - self.head.recorded_durable
        if lag < self.checkpoint_bytes:
            return False
        if lag >= 2 * self.checkpoint_bytes and not self._backstop:
            self._backstop = True
            return True
        if not self._checkpoint_due and not self._checkpointing:
            self._checkpoint_due = True
            self._work_cv.notify()
        return False

    def _finished(self, frontiers_end: int) -> None:
        """A FRONTIERS record ending at ``frontiers_end`` is durable and the callbacks of its
        block and every earlier one have run: the segment is finished. Only now: the
        compacter takes records below ``finished_lsn`` from what the callbacks applied, so a
        record it counts as finished must already have been applied."""
        with self._lock:
            self.segments.finished = max(self.segments.finished, frontiers_end)
        if self.segments.notify(frontiers_end):
            self._checkpoint()

    def _checkpoint(self) -> None:
        """Record the current durable end in the header (a lower bound: it may lag, never lead)."""
        try:
            self.head.write(SHUTDOWN_RUNNING, 0, self._durable_end)
        except EngineClosed:
            pass
        except WalError as e:
            _log.error("%s: WAL header checkpoint failed: %s", self.path, e)
            self._fail(e)

    def _fail(self, e: BaseException) -> None:
        with self._lock:
            if self._failed is None:
                self._failed = e
            blocks = list(self._inflight) + list(self._pending)
            if self._cur is not None:
                blocks.append(self._cur)
            self._work_cv.notify_all()
            self._space_cv.notify_all()
        for b in blocks:
            b.settle()

    def write_alone(self, blk: Block) -> bool:
        """When the caller's block is the open one and no write is in flight: seal, write and
        complete it on this thread in one pass; False, with nothing done, otherwise
        (:meth:`await_block` then decides). Raises WalError when the write fails.

        Why: a lone appender goes through this path every time, and the general one's
        steps (take, gather, eligibility, run, each its own call) cost about as much CPU as
        the write itself."""
        bs, lock = self.block_size, self._lock
        lock.acquire()  # not ``with`` (see place_fast)
        try:
            wlen = (blk.fill + bs - 1) // bs * bs
            if blk is not self._cur or self._writing or self._pending or self._failed is not None or self._closed \
                    or wlen > self.head.window:
                return False
            self._cur = None  # taken here, not sealed into the pending queue
            self._next = (self._next + bs - 1) // bs * bs
            blk.taken = True
            self._inflight.append(blk)
            self._writing = 1
            self.counts.writes += 1
        finally:
            lock.release()
        buf, fill = blk.buf, blk.fill  # as _run, one call fewer: the window was checked above
        try:
            if wlen > fill:
                buf[fill:wlen] = _ZEROS[: wlen - fill]
            self.files.write_at(memoryview(buf)[:wlen], self.header_bytes + blk.start % self.data_capacity)
        except BaseException as e:  # noqa: BLE001 - any failure poisons the log
            _log.error("%s: WAL write failed: %s", self.path, e)
            self._fail(e)
        else:  # _stalled is read after completing under the lock: a waiter stalled before it is counted
            if self._complete_alone(blk) and self._stalled:
                self._lead_next()
        if not blk.durable:
            raise WalError(f"{self.path}: the WAL failed before the append was durable: {self._failed}") from self._failed
        return True

    def _complete_alone(self, blk: Block) -> bool:
        """:meth:`_complete` for :meth:`write_alone`'s block written: when it is still the
        only block in flight and no thread announces, it becomes durable and this thread
        announces it, with no queue and no loop; else the general completion. True when
        it is durable (as ``_complete(blk, blk)``)."""
        lock = self._lock
        lock.acquire()
        if self._notifying or self._closed or len(self._inflight) != 1:
            lock.release()
            return self._complete(blk, blk)
        try:  # as _complete's loop for one block: it is the oldest (nothing was in flight when it was taken)
            self._inflight.popleft()
            blk.written = blk.durable = True
            self._writing -= 1
            self._durable_end = blk.start + blk.fill
            tickets = blk.tickets
            self._company = len(tickets)
            if blk.pooled and len(self._pool) < self._pool_max:
                self._pool.append(blk.buf)
            else:
                blk.buf.close()
            blk.buf = None  # type: ignore[assignment]
            self._notifying = True
        finally:
            lock.release()
        for t in tickets:  # as _announce for this one block
            if t.on_durable is not None:
                try:
                    t.on_durable(t.records)
                except Exception:
                    _log.exception("%s: on_durable callback failed", self.path)
        tickets.clear()
        if blk.frontiers_end >= 0:
            self._finished(blk.frontiers_end)
        blk.settle()
        lock.acquire()
        if self._done_q:  # blocks completed meanwhile: this thread announces them too
            lock.release()
            self._announce()
            return True
        self._notifying = False
        due = self._durable_end - self.head.recorded_durable >= self.checkpoint_bytes and self._checkpoint_to_write()
        lock.release()
        if due:  # the backstop (see _announce)
            try:
                self._checkpoint()
            finally:
                with lock:
                    self._backstop = False
        return True

    def await_block(self, blk: Block) -> None:
        """Wait until ``blk`` is durable, writing blocks (in log order, its own last) on
        this thread while an I/O slot is free: a lone appender writes its own block and
        wakes no other thread. When its block gathers company (``_gathers``) or no slot is
        free, it sleeps; the writer of the next block to complete writes it, or, failing
        that, an I/O thread that completion wakes. When its own write made its block
        durable, it writes the block gathered meanwhile before returning."""
        lead = False
        while not blk.settled:
            with self._lock:
                job = self._take()
                stalled = job is None and not blk.taken
                self._stalled += stalled
                self.counts.waits_for_older += job is None and blk.written and not blk.settled
            if job is None:
                try:
                    blk.wait_settled()
                finally:
                    if stalled:
                        with self._lock:
                            self._stalled -= 1
                break
            lead = self._run(job, blk)
        if lead:
            self._lead_next()
        if not blk.durable:
            err = self._failed
            raise WalError(f"{self.path}: the WAL failed before the append was durable: {err}") from err

    def _lead_next(self) -> None:
        """After the caller's own block became durable on its write: write the block that
        appends gathered while every slot for partial blocks was busy, once, if any waiter
        waits on it (as a group commit's leader writes the group queued behind its own)."""
        with self._lock:
            job = self._take() if self._stalled else None
        if job is not None:
            self._run(job)
