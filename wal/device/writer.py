"""Appending to the device ring: placing records into blocks (a dry-run plan, then the
same plan applied), the I/O threads that write blocks, and completion in LSN order. A
mixin of :class:`sediment.wal.device.log.DeviceLog`, kept apart so the log's own module stays
readable; it uses the log's attributes set in its ``__init__``."""

from __future__ import annotations

import logging
import mmap
import threading
from collections.abc import Callable, Sequence

from sediment.errors import EngineClosed, WalError, WalFull
from sediment.wal.device.format import SHUTDOWN_RUNNING, align_up
from sediment.wal.record import HEADER_SIZE, Record, RecordKind, encode_header

_log = logging.getLogger("sediment.wal.device.log")
_ZEROS = bytes(64 * 1024)
_align_up = align_up


class _Block:
    """A run of records written with one aligned pwrite."""

    __slots__ = ("start", "fill", "buf", "pooled", "event", "done", "durable", "frontiers_end", "born", "tickets")

    def __init__(self, start: int, buf: mmap.mmap, pooled: bool, born: float) -> None:
        self.start = start
        self.fill = 0
        self.buf = buf
        self.pooled = pooled
        self.event = threading.Event()
        self.done = False
        self.durable = False
        self.frontiers_end = -1
        self.born = born
        self.tickets: list[DeviceTicket] = []

    @property
    def end(self) -> int:
        return self.start + self.fill


class _Plan:
    """Allocation state; planned twice per append (a dry run to check for room, then
    for real) through the same code, so the room check is exact."""

    __slots__ = ("next", "open", "start", "fill", "cap")

    def __init__(self, next_: int, open_: bool, start: int, fill: int, cap: int) -> None:
        self.next = next_
        self.open = open_
        self.start = start
        self.fill = fill
        self.cap = cap



class DeviceTicket:
    """An append in flight (see ``DeviceLog.submit``)."""

    __slots__ = ("records", "on_durable", "block", "log", "sync")

    def __init__(self, log: RingWriter, records: Sequence[Record],
                 on_durable: Callable[[Sequence[Record]], None] | None) -> None:
        self.log = log
        self.records = records
        self.on_durable = on_durable
        self.block: _Block | None = None
        self.sync = False

    def wait(self) -> int:
        """Block until the records (and everything before them) are durable; the last
        record's LSN. Raises WalError if the log failed first."""
        assert self.block is not None
        self.log._await(self.block)
        return self.records[-1].lsn


class RingWriter:
    """Placement, the I/O threads and completion (see DeviceLog)."""

    # ---------------------------------------------------------------- threads

    def _start(self) -> None:
        self._durable_end = max(self._durable_end, 0)
        for i in range(self.io_threads):
            t = threading.Thread(target=self._worker, name=f"sediment-wal-io-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def _eligible(self, blk: _Block) -> bool:
        if not self._inflight:
            return True
        wlen = _align_up(blk.fill, self.block_size)
        return blk.start + wlen <= self._inflight[0].start + self._window

    def _seal(self) -> None:
        cur = self._cur
        if cur is not None:
            self._cur = None
            self._next = _align_up(self._next, self.block_size)
            self._pending.append(cur)

    def _take(self) -> _Block | None:
        """Under the lock: the next block to write, if an I/O slot is free and the window
        allows. Seals the open block when no write is in flight (nothing to wait for) or
        when it is ``max_block_age`` old."""
        if self._failed is not None or self._writing >= self.io_threads:
            return None
        cur = self._cur
        if not self._pending and cur is not None:
            if not self._inflight or self.clock.current_time() - cur.born >= self.max_block_age:
                self._seal()
        if self._pending and self._eligible(self._pending[0]):
            blk = self._pending.popleft()
            self._inflight.append(blk)
            self._writing += 1
            return blk
        return None

    def _run(self, blk: _Block) -> bool:
        try:
            self._write_block(blk)
        except BaseException as e:  # noqa: BLE001 - any failure poisons the log
            _log.error("%s: WAL write failed: %s", self.path, e)
            self._fail(e)
            return False
        self._complete(blk)
        return True

    def _worker(self) -> None:
        while True:
            with self._lock:
                while True:
                    if self._failed is not None:
                        return
                    blk = self._take()
                    if blk is not None:
                        break
                    if self._closed and not self._pending and not self._inflight and self._cur is None:
                        return
                    timeout = None
                    cur = self._cur
                    if cur is not None and not self._pending and self._writing < self.io_threads:
                        timeout = max(0.0, self.max_block_age - (self.clock.current_time() - cur.born))
                    self._work_cv.wait(timeout)
            if not self._run(blk):
                return

    def _write_block(self, blk: _Block) -> None:
        bs = self.block_size
        wlen = _align_up(blk.fill, bs)
        if wlen > self._window:
            self._write_header(SHUTDOWN_RUNNING, 0, window=wlen)
        if wlen > blk.fill:
            blk.buf[blk.fill : wlen] = _ZEROS[: wlen - blk.fill]
        self.write_at(memoryview(blk.buf)[:wlen], self.header_bytes + blk.start % self.data_capacity)

    def _complete(self, blk: _Block) -> None:
        """Advance the durable end over blocks finished in order; then (one thread at a
        time, no lock held, in log order) run callbacks and wake waiters."""
        with self._lock:
            blk.done = True
            self._writing -= 1
            while self._inflight and self._inflight[0].done:
                b = self._inflight.popleft()
                b.durable = True
                self._durable_end = b.end
                if b.frontiers_end >= 0:
                    self._finished = b.frontiers_end
                if b.pooled and len(self._pool) < 2 * self.io_threads + 2:
                    self._pool.append(b.buf)
                else:
                    b.buf.close()
                b.buf = None  # type: ignore[assignment]
                self._done_q.append(b)
            if self._closed:
                self._work_cv.notify_all()
            elif self._pending or self._cur is not None:
                self._work_cv.notify()
            if self._notifying:
                return
            self._notifying = True
        while True:
            with self._lock:
                if not self._done_q:
                    self._notifying = False
                    return
                batch = list(self._done_q)
                self._done_q.clear()
            for b in batch:
                for t in b.tickets:
                    if t.on_durable is not None:
                        try:
                            t.on_durable(t.records)
                        except Exception:
                            _log.exception("%s: on_durable callback failed", self.path)
                if b.frontiers_end > self._notified:
                    self._notified = b.frontiers_end
                    cb = self._listener
                    if cb is not None:
                        try:
                            cb(b.frontiers_end)
                        except Exception:
                            _log.exception("%s: finish listener failed", self.path)
                    self._checkpoint()
                b.event.set()
            if self._durable_end - self._hdr_durable >= self.checkpoint_bytes:
                self._checkpoint()

    def _clock_moved(self) -> None:
        with self._lock:
            self._work_cv.notify_all()
            self._space_cv.notify_all()

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
            b.event.set()

    # ---------------------------------------------------------------- appending

    def _plan_block(self, p: _Plan, n: int, out: list | None) -> int:
        """Reserve ``n`` bytes in the open block (opening or sealing as needed); the
        caller has made sure they do not cross the ring end."""
        if p.open and p.fill + n > p.cap:
            self._plan_seal(p, out)
        if not p.open:
            p.open, p.start, p.fill = True, p.next, 0
            p.cap = self._pool_size if n <= self._pool_size else _align_up(n, self.block_size)
            if out is not None:
                out.append(("open", p.start, p.cap))
        lsn = p.next
        p.fill += n
        p.next += n
        return lsn

    def _plan_seal(self, p: _Plan, out: list | None) -> None:
        if p.open:
            p.open = False
            p.next = _align_up(p.next, self.block_size)
            if out is not None:
                out.append(("seal",))

    def _plan_frame(self, p: _Plan, n: int, out: list | None) -> int:
        d = self.data_capacity
        while True:
            phys = p.next % d
            if phys + n <= d:
                break
            gap = d - phys
            if gap < HEADER_SIZE:
                p.fill += gap
                p.next += gap
                if out is not None:
                    out.append(("zeros", gap))
            elif p.open and p.fill + gap > p.cap:
                self._plan_seal(p, out)
                continue
            else:
                lsn = self._plan_block(p, gap, out)
                if out is not None:
                    out.append(("pad", lsn, gap))
            self._plan_seal(p, out)
        lsn = self._plan_block(p, n, out)
        if out is not None:
            out.append(("frame", lsn, n))
        if p.fill >= self.max_block_bytes:
            self._plan_seal(p, out)
        return lsn

    def _plan_call(self, sizes: Sequence[int], fsize: int, out: list | None) -> int:
        cur = self._cur
        p = _Plan(self._next, cur is not None, cur.start if cur else 0, cur.fill if cur else 0,
                  len(cur.buf) if cur else 0)
        for n in sizes:
            self._plan_frame(p, n, out)
        if fsize:
            self._plan_frame(p, fsize, out)
            self._plan_seal(p, out)
        return _align_up(p.next, self.block_size)

    def _apply(self, out: list, frames: list[tuple[Record, int | None]]) -> list[tuple[int, _Block]]:
        """Carry out a plan; returns each frame's LSN and block."""
        placed: list[tuple[int, _Block]] = []
        fi = 0
        for step in out:
            op = step[0]
            if op == "open":
                _, start, cap = step
                if cap == self._pool_size and self._pool:
                    buf = self._pool.pop()
                else:
                    buf = mmap.mmap(-1, cap)
                self._cur = _Block(start, buf, cap == self._pool_size, self.clock.current_time())
            elif op == "seal":
                self._seal()
            else:
                cur = self._cur
                assert cur is not None
                n = step[-1]
                at = cur.fill
                if op == "zeros":
                    cur.buf[at : at + n] = bytes(n)
                else:
                    lsn = step[1]
                    assert lsn == self._next
                    if op == "pad":
                        rec, crc = Record(RecordKind.PADDING, body=bytes(n - HEADER_SIZE)), None
                    else:
                        rec, crc = frames[fi]
                        fi += 1
                        placed.append((lsn, cur))
                    cur.buf[at : at + HEADER_SIZE] = encode_header(rec, lsn, crc)
                    cur.buf[at + HEADER_SIZE : at + n] = rec.body
                cur.fill += n
                self._next += n
        return placed

    def _place(self, records: Sequence[Record], crcs: list[int], sizes: list[int],
               force_frontiers: bool, ticket: DeviceTicket | None) -> _Block | None:
        """Place the frames (and a FRONTIERS record at a segment boundary); returns the
        FRONTIERS record's block, if one was written."""
        deadline = self.clock.current_time() + self.full_timeout
        total = sum(sizes)
        if not self._alloc_lock.acquire(timeout=self.full_timeout):
            raise self._full(total)
        try:
            with self._lock:
                while True:
                    self._check_open()
                    seg_records = self._seg_records + len(records)
                    finish = seg_records > 0 and (
                        force_frontiers or self._next + total - self._seg_start >= self.segment_bytes
                    )
                    if not records and not finish:
                        return None
                    boundary = self._preamble.record(records) if finish else None
                    fsize = boundary.frame_size if boundary is not None else 0
                    bs = self.block_size
                    pad = max(max(sizes, default=0), fsize)
                    bound = _align_up(self._next, bs) + total + fsize + pad + 2 * (len(sizes) + 3) * bs
                    if bound <= self._trim + self.data_capacity:
                        break
                    end = self._plan_call(sizes, fsize, None)
                    if end - self._next > self.data_capacity:
                        raise WalError(
                            f"{self.path}: an append of {total} bytes can never fit the "
                            f"{self.data_capacity}-byte ring; raise the WAL capacity or append less at once."
                        )
                    if end <= self._trim + self.data_capacity:
                        break
                    left = deadline - self.clock.current_time()
                    if left <= 0:
                        raise self._full(total)
                    self._full_waiters += 1
                    self._space_cv.notify_all()  # wakes wait_for_full_waiters; appenders re-check
                    try:
                        self._space_cv.wait(left)
                    finally:
                        self._full_waiters -= 1
                out: list = []
                self._plan_call(sizes, fsize, out)
                frames: list[tuple[Record, int | None]] = list(zip(records, crcs, strict=True))
                if boundary is not None:
                    frames.append((boundary, None))
                placed = self._apply(out, frames)
                for r, (lsn, _) in zip(records, placed, strict=False):
                    r.lsn = lsn
                if ticket is not None:
                    ticket.block = placed[len(records) - 1][1]
                    ticket.block.tickets.append(ticket)
                self._preamble.observe(records)
                if boundary is not None:
                    self._preamble.observe((boundary,))
                self._seg_records = seg_records
                fblk = None
                if finish:
                    flsn, fblk = placed[-1]
                    fblk.frontiers_end = flsn + fsize
                    self._frontier_lsns.append(flsn)
                    self._seg_start = flsn + fsize
                    self._seg_records = 0
                if ticket is not None and not ticket.sync:
                    self._work_cv.notify()
                return fblk
        finally:
            self._alloc_lock.release()

    def _await(self, blk: _Block) -> None:
        """Wait until ``blk`` is durable, writing blocks on this thread meanwhile when an
        I/O slot is free (saves two thread hand-offs per append)."""
        while not blk.event.is_set():
            with self._lock:
                job = self._take()
            if job is None:
                blk.event.wait()
                break
            self._run(job)
        if not blk.durable:
            err = self._failed
            raise WalError(f"{self.path}: the WAL failed before the append was durable: {err}") from err

    def _full(self, n: int) -> WalFull:
        return WalFull(
            f"{self.path}: WAL ring full: no room for {n} bytes within {self.full_timeout}s "
            f"(trim offset {self._trim}, write offset {self._next}, data capacity {self.data_capacity}). "
            "Raise the WAL capacity or let the compacter catch up and trim."
        )

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosed(f"{self.path}: the WAL is closed")
        if self._failed is not None:
            raise WalError(f"{self.path}: the WAL failed earlier and accepts no appends: {self._failed!r}")
