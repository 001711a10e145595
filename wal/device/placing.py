"""Placing frames in the device ring: the open block, where each frame goes (padding at
the ring's end, seals, a segment's FRONTIERS record) and waiting for room in a full ring.
:class:`RingPlacement` is the part of the ring writer (wal/device/writer.py ``RingWriter``,
which holds the state named below) that appenders run before they wait; the writer's own
module then holds only the block writes and their completion."""

from __future__ import annotations

import mmap
import struct
import threading
from collections import deque
from collections.abc import Sequence

from sediment.clock import Clock
from sediment.errors import EngineClosed, WalError, WalFull
from sediment.wal.device.blocks import Block, DeviceTicket
from sediment.wal.device.format import align_up
from sediment.wal.device.head import RingHead
from sediment.wal.device.placement import Plan, plan_call
from sediment.wal.device.segments import Segments
from sediment.wal.record import (
    HEADER_CRC,
    HEADER_SIZE,
    HEADER_TAIL,
    MAGIC,
    VERSION,
    Record,
    RecordKind,
    crc32c_raw,
    encode_header,
)

_pack_tail, _pack_crc_into, _crc = HEADER_TAIL.pack, HEADER_CRC.pack_into, crc32c_raw


class RingPlacement:
    """Where frames go; every method but :meth:`place` runs under the writer's ``_lock``
    (or takes it), and :meth:`place` also holds ``_alloc_lock`` so that appends waiting
    for room keep their order."""

    path: str
    head: RingHead
    clock: Clock
    segments: Segments
    block_size: int
    data_capacity: int
    max_block_bytes: int
    full_timeout: float
    _lock: threading.Lock
    _alloc_lock: threading.Lock
    _work_cv: threading.Condition
    _space_cv: threading.Condition
    _pool: list[mmap.mmap]
    _pool_size: int
    _cur: Block | None
    _next: int
    _pending: deque[Block]
    _full_waiters: int
    _closed: bool
    _failed: BaseException | None

    def check_open(self) -> None:
        if self._closed:
            raise EngineClosed(f"{self.path}: the WAL is closed")
        if self._failed is not None:
            raise WalError(f"{self.path}: the WAL failed earlier and accepts no appends: {self._failed!r}")

    def _seal(self) -> None:
        cur = self._cur
        if cur is not None:
            self._cur = None
            self._next = align_up(self._next, self.block_size)
            self._pending.append(cur)

    def place(self, records: Sequence[Record], crcs: list[int], sizes: list[int], force_frontiers: bool,
              ticket: DeviceTicket | None) -> Block | None:
        """Place the frames (and a FRONTIERS record at a segment boundary), waiting up to
        ``full_timeout`` for room; returns the FRONTIERS record's block, if one was placed."""
        total = sum(sizes)
        if not self._alloc_lock.acquire(timeout=self.full_timeout):
            raise self._full(total)
        try:
            with self._lock:
                room = self._wait_room(records, sizes, total, force_frontiers)
                if room is None:
                    return None
                boundary, fsize = room
                blk, fblk = self._place_planned(records, crcs, sizes, boundary, fsize)
                if ticket is not None:
                    ticket.block = blk
                    blk.tickets.append(ticket)
                if fblk is not None:  # a finished segment is told without waiting for the next append
                    self._work_cv.notify()
                return fblk
        finally:
            self._alloc_lock.release()

    def place_one(self, record: Record, crc: int, size: int, ticket: DeviceTicket) -> bool:
        """Place one record's frame (``size`` bytes, body CRC ``crc``) in the common case:
        the conditions of :meth:`place_fast`, checked for one frame. Packs its header into
        the block (encode_header's bytes: the CRC of the 60 bytes after it, then those) and
        copies the body after it, the body's one copy on its way to the device. False, with
        nothing done, when the case is not the common one or a header field does not fit
        its type (``check_appendable`` then names it: its check of the integer fields is
        this pack).

        Why: most appends are one record, and an appender alone on the ring pays every
        interpreter step between its writes after the write's sleep, when they run cold."""
        lock = self._lock
        lock.acquire()  # not ``with`` (see place_fast)
        try:
            nxt, seg, cur = self._next, self.segments, self._cur
            bs, d = self.block_size, self.data_capacity
            fill = 0 if cur is None else cur.fill
            if self._full_waiters or self._closed or self._failed is not None \
                    or nxt + size - seg.seg_start >= seg.segment_bytes \
                    or (nxt + bs - 1) // bs * bs + 2 * size + 8 * bs > self.head.trim + d \
                    or nxt % d + size > d or fill + size > (self._pool_size if cur is None else len(cur.buf)) \
                    or fill >= self.max_block_bytes:
                return False
            try:
                tail = _pack_tail(MAGIC, VERSION, record.kind, size - HEADER_SIZE, crc, nxt, record.relation_id,
                                  record.txn_id, record.t_lo, record.t_hi, record.count, record.schema_version)
            except struct.error:
                return False
            if cur is None:  # _open_block, one call fewer
                pool = self._pool
                cur = self._cur = Block(nxt, pool.pop() if pool else mmap.mmap(-1, self._pool_size), True)
            buf = cur.buf
            _pack_crc_into(buf, fill, _crc(tail))
            buf[fill + 4 : fill + HEADER_SIZE] = tail
            end = fill + size
            buf[fill + HEADER_SIZE : end] = record.body
            record.lsn = nxt
            cur.fill = end
            self._next = nxt + size
            if end >= self.max_block_bytes:
                self._seal()
            seg.preamble.observe(ticket.records)  # Segments.placed without a segment boundary
            seg.seg_records += 1
            ticket.block = cur
            cur.tickets.append(ticket)
            return True
        finally:
            lock.release()

    def place_fast(self, records: Sequence[Record], crcs: list[int], sizes: list[int], ticket: DeviceTicket) -> bool:
        """Place the frames of several records in the common case with the fewest steps: no
        one waiting for room, room without waiting, no segment boundary, and the frames fit
        the open block (or a fresh pooled one) before the ring's physical end and before the
        block is full. False, with nothing done, otherwise (:meth:`place` then does it, by
        the plan, which puts frames that fit the same way). One record: :meth:`place_one`.

        Why: an appender alone on the ring pays every interpreter step between its writes,
        and the general path's steps cost about as much CPU as a 4 KiB write."""
        total, pad = sum(sizes), max(sizes)
        lock = self._lock
        lock.acquire()  # not ``with``: its two method calls cost as much as the lock, once per append
        try:
            nxt, seg, cur = self._next, self.segments, self._cur
            bs, d = self.block_size, self.data_capacity
            fill = 0 if cur is None else cur.fill
            if self._full_waiters or self._closed or self._failed is not None \
                    or nxt + total - seg.seg_start >= seg.segment_bytes \
                    or (nxt + bs - 1) // bs * bs + total + pad + 2 * (len(sizes) + 3) * bs > self.head.trim + d \
                    or nxt % d + total > d or fill + total > (self._pool_size if cur is None else len(cur.buf)) \
                    or fill + total - sizes[-1] >= self.max_block_bytes:
                return False
            if cur is None:  # _open_block, one call fewer
                pool = self._pool
                cur = self._cur = Block(nxt, pool.pop() if pool else mmap.mmap(-1, self._pool_size), True)
            buf = cur.buf
            for r, crc, n in zip(records, crcs, sizes, strict=True):
                buf[fill : fill + HEADER_SIZE] = encode_header(r, nxt, crc)
                buf[fill + HEADER_SIZE : fill + n] = r.body
                r.lsn = nxt
                fill += n
                nxt += n
            cur.fill = fill
            self._next = nxt
            if fill >= self.max_block_bytes:
                self._seal()
            seg.preamble.observe(records)  # Segments.placed without a segment boundary
            seg.seg_records += len(records)
            ticket.block = cur
            cur.tickets.append(ticket)
            return True
        finally:
            lock.release()

    def _wait_room(self, records: Sequence[Record], sizes: list[int], total: int,
                   force: bool) -> tuple[Record | None, int] | None:
        """Under the lock: wait until the frames (and the segment's FRONTIERS record, if
        they finish it) fit before the trim point; the boundary record and its size, or None
        when there is nothing to place."""
        deadline = None
        while True:
            self.check_open()
            boundary = self.segments.boundary(records, force, self._next, total)
            if not records and boundary is None:
                return None
            fsize = boundary.frame_size if boundary is not None else 0
            bs, d = self.block_size, self.data_capacity
            pad = max(max(sizes, default=0), fsize)
            limit = self.head.trim + d
            if align_up(self._next, bs) + total + fsize + pad + 2 * (len(sizes) + 3) * bs <= limit:
                return boundary, fsize
            end = plan_call(self._plan(), sizes, fsize, None)
            if end - self._next > d:
                raise WalError(
                    f"{self.path}: an append of {total} bytes can never fit the "
                    f"{d}-byte ring; raise the WAL capacity or append less at once."
                )
            if end <= limit:
                return boundary, fsize
            now = self.clock.current_time()
            deadline = now + self.full_timeout if deadline is None else deadline
            if deadline - now <= 0:
                raise self._full(total)
            self._full_waiters += 1
            self._space_cv.notify_all()  # wakes wait_for_full_waiters; appenders re-check
            self._work_cv.notify()  # blocks nobody waits on become durable, so they can be trimmed
            try:
                self._space_cv.wait(deadline - now)
            finally:
                self._full_waiters -= 1

    def _plan(self) -> Plan:
        cur = self._cur
        return Plan(self._next, cur is not None, cur.start if cur else 0, cur.fill if cur else 0,
                    len(cur.buf) if cur else 0, self.block_size, self.data_capacity, self._pool_size,
                    self.max_block_bytes)

    def _open_block(self, start: int, cap: int) -> Block:
        pooled = cap == self._pool_size
        buf = self._pool.pop() if pooled and self._pool else mmap.mmap(-1, cap)
        self._cur = Block(start, buf, pooled)
        return self._cur

    def _place_planned(self, records: Sequence[Record], crcs: list[int], sizes: list[int],
                       boundary: Record | None, fsize: int) -> tuple[Block, Block | None]:
        """Place by the plan (padding at the ring's end, block seals, the FRONTIERS record);
        the last record's block and the FRONTIERS record's block."""
        out: list = []
        plan_call(self._plan(), sizes, fsize, out)
        frames: list[tuple[Record, int | None]] = list(zip(records, crcs, strict=True))
        if boundary is not None:
            frames.append((boundary, None))
        placed = self._apply(out, frames)
        for r, (lsn, _) in zip(records, placed, strict=False):
            r.lsn = lsn
        fblk = None
        flsn = -1
        if boundary is not None:
            flsn, fblk = placed[-1]
            fblk.frontiers_end = flsn + fsize
        self.segments.placed(records, boundary, flsn)
        return placed[len(records) - 1][1] if records else placed[-1][1], fblk

    def _apply(self, out: list, frames: list[tuple[Record, int | None]]) -> list[tuple[int, Block]]:
        """Carry out a plan; returns each frame's LSN and block."""
        placed: list[tuple[int, Block]] = []
        fi = 0
        for step in out:
            op = step[0]
            if op == "open":
                self._open_block(step[1], step[2])
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

    def _full(self, n: int) -> WalFull:
        return WalFull(
            f"{self.path}: WAL ring full: no room for {n} bytes within {self.full_timeout}s "
            f"(trim offset {self.head.trim}, write offset {self._next}, data capacity {self.data_capacity}). "
            "Raise the WAL capacity or let the compacter catch up and trim."
        )
