"""The raw-device WAL backend: a ring buffer of 4 KiB-aligned blocks on a block device
or a preallocated file, written with Direct I/O by a small pool of threads.

Why a ring: the WAL only buffers what the compacter has not yet turned into batches,
so a fixed region reused round and round needs no file system, no allocation and no
file deletion, and recovery reads one contiguous range. See docs/formats.md ("Device WAL format")
for the byte layout and the recovery rules; the short version:

* LSN = the record's logical byte offset; it only grows. Physical position =
  header area + LSN mod data capacity. A record's ``lsn`` field must equal its
  position, which is how bytes left by an earlier pass round the ring are rejected.
* Records are packed into blocks starting at block-aligned LSNs; a block is one
  aligned write, zero-filled to the block size. A record never straddles the
  physical end: a PADDING record (or, for gaps under 64 bytes, zeros) fills it.
* Appends are acknowledged in LSN order, so the durable log is always a prefix.
  Recovery keeps exactly the valid prefix from the trim offset; records found after
  the first invalid position (blocks that parallel I/O threads landed out of order)
  were never acknowledged and are discarded and reported, and the space they used is
  zeroed before new writes, so they can never be resurrected behind newer records.
* ``trim(lsn)`` moves the trim offset to the last finished FRONTIERS record at or
  below ``lsn`` (a clamp, never an error) and raises past the durable end.
* An appender waiting for its block writes pending blocks itself when one of the
  ``io_threads`` slots is free; the threads do the rest (``submit``, sealing by age).
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from sediment._fs import fsync_dir
from sediment.errors import EngineClosed, WalCorruption, WalError, WalExists, WalFull
from sediment.wal.device_format import (
    MIN_DATA_BYTES,
    RING_MAGIC,
    SHUTDOWN_CLEAN,
    SHUTDOWN_RUNNING,
    SLOT,
    ZERO_CHUNK,
    RingHeader,
    align_down,
    align_up,
)
from sediment.wal.device_recovery import (
    Recovered,
    RingReader,
    check,
    find_frames,
    load_header,
    missing,
    record_of,
    recover,
    walk,
)
from sediment.wal.protocol import OpenReport
from sediment.wal.record import HEADER_SIZE, Record, RecordKind, crc32c, encode_frontiers, encode_header

__all__ = ["RING_MAGIC", "SHUTDOWN_CLEAN", "SHUTDOWN_RUNNING", "DeviceLog", "DeviceTicket", "RingHeader"]

_log = logging.getLogger(__name__)

PWrite = Callable[[int, Any, int], int]
_ZEROS = bytes(64 * 1024)
_align_up = align_up
_align_down = align_down


class _Block:
    """A run of records written with one aligned pwrite."""

    __slots__ = ("start", "fill", "buf", "pooled", "event", "done", "durable", "frontiers_end", "born", "tickets")

    def __init__(self, start: int, buf: mmap.mmap, pooled: bool) -> None:
        self.start = start
        self.fill = 0
        self.buf = buf
        self.pooled = pooled
        self.event = threading.Event()
        self.done = False
        self.durable = False
        self.frontiers_end = -1
        self.born = time.monotonic()
        self.tickets: list[DeviceTicket] = []

    @property
    def end(self) -> int:
        return self.start + self.fill


class DeviceTicket:
    """An append in flight (see ``DeviceLog.submit``)."""

    __slots__ = ("records", "on_durable", "block", "log", "sync")

    def __init__(self, log: DeviceLog, records: Sequence[Record],
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


class DeviceLog:
    """A write-ahead log in a ring on a raw device or preallocated file.

    Implements :class:`sediment.wal.protocol.WriteAheadLog`. Use :meth:`open`.
    """

    report: OpenReport

    # ---------------------------------------------------------------- opening

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        capacity: int | None = None,
        *,
        create: bool = False,
        block_size: int = 4096,
        max_block_bytes: int = 256 * 1024,
        max_block_age: float = 0.001,
        io_threads: int = 4,
        window_bytes: int | None = None,
        segment_bytes: int = 64 * 1024 * 1024,
        full_timeout: float = 10.0,
        direct: bool = True,
        repair: bool = False,
        pwrite: PWrite = os.pwrite,
        checkpoint_bytes: int = 4 * 1024 * 1024,
    ) -> DeviceLog:
        """Open (recovering) the ring at ``path``. Creating a ring is explicit: only with
        ``create`` is a missing file created or a blank device initialised, and ``create``
        over a ring that holds records raises WalExists; without it, a missing or blank
        ring raises WalMissing (never a silent fresh start). ``capacity`` counts the whole
        ring, header area included; it is fixed at creation. The header records the durable
        end at every segment finish, trim, close and every ``checkpoint_bytes`` of log, and
        open refuses (WalShortened) a log that ends before it. ``window_bytes`` (default ``io_threads * 2 *
        max_block_bytes``) bounds the bytes in flight, and so how far past the first gap
        recovery looks. ``repair`` cuts the log at damage instead of refusing to open.
        ``pwrite`` is the write call (``os.pwrite`` signature), injectable for tests."""
        log = cls(
            os.fspath(path), block_size=block_size, max_block_bytes=max_block_bytes,
            max_block_age=max_block_age, io_threads=io_threads, window_bytes=window_bytes,
            segment_bytes=segment_bytes, full_timeout=full_timeout, direct=direct, pwrite=pwrite,
            checkpoint_bytes=checkpoint_bytes,
        )
        try:
            log._open(capacity, create, repair)
        except BaseException:
            log._close_fds()
            raise
        return log

    def __init__(
        self, path: str, *, block_size: int, max_block_bytes: int, max_block_age: float,
        io_threads: int, window_bytes: int | None, segment_bytes: int, full_timeout: float,
        direct: bool, pwrite: PWrite, checkpoint_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        if block_size < 4096 or block_size > 65536 or block_size & (block_size - 1):
            raise ValueError(f"block_size must be a power of two from 4096 to 65536, not {block_size}")
        if io_threads < 1:
            raise ValueError("io_threads must be >= 1")
        self.path = path
        self.block_size = block_size
        self.header_bytes = 2 * block_size
        self.max_block_bytes = max(block_size, max_block_bytes)
        self.max_block_age = max_block_age
        self.io_threads = io_threads
        self.configured_window = _align_up(
            window_bytes if window_bytes is not None else io_threads * 2 * self.max_block_bytes, block_size
        )
        self.segment_bytes = segment_bytes
        self.checkpoint_bytes = max(block_size, checkpoint_bytes)
        self.full_timeout = full_timeout
        self._pwrite = pwrite
        self._want_direct = direct
        self._direct = False
        self._rdirect = False
        self._fd = -1
        self._rfd = -1
        self._old_fds: list[int] = []
        self._fd_lock = threading.Lock()
        self._warned = False
        self.report = OpenReport()
        self.capacity = 0
        self.data_capacity = 0
        self._hdr_lock = threading.Lock()
        self._seq = 0
        self._trim = 0
        self._hdr_durable = 0
        self._window = self.configured_window
        self._lock = threading.Lock()
        self._work_cv = threading.Condition(self._lock)
        self._space_cv = threading.Condition(self._lock)
        self._alloc_lock = threading.Lock()
        self._pool: list[mmap.mmap] = []
        self._pool_size = _align_up(self.max_block_bytes, block_size)
        self._cur: _Block | None = None
        self._next = 0
        self._pending: deque[_Block] = deque()
        self._inflight: deque[_Block] = deque()
        self._durable_end = 0
        self._finished = 0
        self._notified = -1
        self._frontiers: dict[int, int] = {}
        self._frontier_lsns: deque[int] = deque()
        self._seg_start = 0
        self._seg_records = 0
        self._listener: Callable[[int], None] | None = None
        self._failed: BaseException | None = None
        self._closed = False
        self._threads: list[threading.Thread] = []
        self._full_waiters = 0
        self._writing = 0
        self._done_q: deque[_Block] = deque()
        self._notifying = False
        self._sealed: dict[int, int] = {}

    def _open_fds(self, create: bool) -> bool:
        """Open the write and read fds; returns whether the file was created now."""
        created = False
        flags = os.O_RDWR | os.O_DSYNC | os.O_CLOEXEC
        if create and not os.path.exists(self.path):
            flags |= os.O_CREAT | os.O_EXCL
            created = True
        try:
            self._fd = self._open_one(flags, write=True)
        except FileNotFoundError:
            raise missing(self.path) from None
        except OSError as e:
            raise WalError(f"{self.path}: cannot open the device ring: {e}") from e
        self._rfd = self._open_one(os.O_RDONLY | os.O_CLOEXEC, write=False)
        return created

    def _open_one(self, flags: int, *, write: bool) -> int:
        if self._want_direct:
            try:
                fd = os.open(self.path, flags | os.O_DIRECT, 0o644)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                self._warn_fallback(f"open with O_DIRECT failed ({e})")
            else:
                if write:
                    self._direct = True
                else:
                    self._rdirect = True
                return fd
        return os.open(self.path, flags & ~os.O_EXCL, 0o644)

    def _warn_fallback(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            _log.warning(
                "%s: %s; falling back to buffered writes with O_DSYNC (same bytes on disk, "
                "but page-cache traffic). Put the WAL on a device or file system with Direct I/O.",
                self.path, why,
            )

    def _open(self, capacity: int | None, create: bool, repair: bool) -> None:
        created = self._open_fds(create)
        regular = stat.S_ISREG(os.fstat(self._fd).st_mode)
        size = os.lseek(self._fd, 0, os.SEEK_END)
        hdr, _ = load_header(self, size, capacity, create)
        if hdr is None:
            self._init_ring(capacity, size, regular, created)
            return
        self.capacity = hdr.capacity
        self.data_capacity = hdr.capacity - self.header_bytes
        self._seq = hdr.seq
        self._trim = hdr.trim
        self._hdr_durable = hdr.durable_end
        res = recover(self, hdr, repair)
        if create and (res.records or hdr.trim or hdr.durable_end):
            raise WalExists(
                f"{self.path}: create=True, but a sediment ring holding {res.records} records (LSNs "
                f"[{hdr.trim}, {res.last_end})) is already there; creating would discard them. Open it "
                "without create; to start over, zero the device's first "
                f"{self.header_bytes} bytes and data area yourself.",
                path=self.path,
            )
        if regular:
            os.posix_fallocate(self._fd, 0, self.capacity)
        self._recover(hdr, res)
        self._start()

    def _init_ring(self, capacity: int | None, size: int, regular: bool, created: bool) -> None:
        """Initialise a new ring; refuses a blank header area over data that holds record
        frames (a wiped ring, not a new device)."""
        bs = self.block_size
        if capacity is None:
            raise WalError(f"{self.path}: creating a ring needs a capacity (bytes, a multiple of {bs}).")
        if capacity % bs or capacity - self.header_bytes < MIN_DATA_BYTES:
            raise WalError(
                f"{self.path}: capacity {capacity} must be a multiple of {bs} and leave at least "
                f"{MIN_DATA_BYTES} bytes after the {self.header_bytes}-byte header area."
            )
        if size < capacity and not regular:
            raise WalError(
                f"{self.path}: device is {size} bytes, smaller than the configured capacity {capacity}; "
                "use a bigger device or a smaller capacity."
            )
        if not created:
            self.data_capacity = capacity - self.header_bytes
            count, first = find_frames(self, min(size, capacity))
            if count:
                raise WalCorruption(
                    f"{self.path}: the ring header area is blank, but the data area holds {count} sediment "
                    f"record frames (the first at device offset {first}): this is a ring whose header was "
                    "wiped, not a new device. Refusing to create a ring over it; restore the device from a "
                    "copy, or zero it completely if its log may be discarded.",
                    path=self.path, offset=0, reason="blank header over a ring's records",
                )
        if regular:
            os.posix_fallocate(self._fd, 0, capacity)
            os.fsync(self._fd)
            if created:
                fsync_dir(os.path.dirname(os.path.abspath(self.path)))
        self.capacity = capacity
        self.data_capacity = capacity - self.header_bytes
        if not (created and regular):
            self._zero(0, self.data_capacity)
        self._seq = 0
        self._trim = 0
        self._write_header(SHUTDOWN_RUNNING, 0, window=min(self.configured_window, self.data_capacity), durable=0)
        self._start()

    # ---------------------------------------------------------------- raw I/O

    def _pread_into(self, view: memoryview, offset: int) -> None:
        """Fill ``view`` (aligned memory) from ``offset``; short reads past EOF are errors."""
        got = 0
        while got < len(view):
            try:
                n = os.preadv(self._rfd, [view[got:]], offset + got)
            except OSError as e:
                if e.errno == errno.EINVAL and self._rdirect:
                    self._reopen_read_buffered(e)
                    continue
                raise WalError(f"{self.path}: read of {len(view)} bytes at offset {offset} failed: {e}") from e
            if n == 0:
                raise WalError(f"{self.path}: unexpected end of device at offset {offset + got}")
            got += n

    def _pread_exact(self, offset: int, n: int) -> bytes:
        buf = mmap.mmap(-1, _align_up(n, self.block_size))
        try:
            self._pread_into(memoryview(buf)[: len(buf)], offset)
            return bytes(buf[:n])
        finally:
            buf.close()

    def _reopen_read_buffered(self, e: OSError) -> None:
        with self._fd_lock:
            if self._rdirect:
                self._old_fds.append(self._rfd)
                self._rfd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
                self._rdirect = False

    def _write_at(self, view: memoryview, offset: int) -> None:
        """One aligned write of ``view`` at device ``offset``, durable on return."""
        done = 0
        while done < len(view):
            fd = self._fd
            try:
                n = self._pwrite(fd, view[done:], offset + done)
            except OSError as e:
                if e.errno == errno.EINVAL and self._direct:
                    self._fall_back(fd, e)
                    continue
                raise WalError(
                    f"{self.path}: write of {len(view) - done} bytes at offset {offset + done} failed: {e}. "
                    "The log is unusable; check the device and reopen to recover."
                ) from e
            if n <= 0:
                raise WalError(f"{self.path}: write at offset {offset + done} wrote nothing")
            done += n

    def _fall_back(self, fd: int, e: OSError) -> None:
        with self._fd_lock:
            if self._direct and self._fd == fd:
                self._warn_fallback(f"Direct I/O write refused ({e})")
                self._old_fds.append(fd)
                self._fd = os.open(self.path, os.O_RDWR | os.O_DSYNC | os.O_CLOEXEC)
                self._direct = False

    def _zero(self, lsn: int, n: int, keep: bytes = b"") -> None:
        """Write zeros over ring bytes [lsn, lsn + n) (block-aligned), with ``keep``
        written first (to zero the tail of a partly valid block)."""
        bs = self.block_size
        d = self.data_capacity
        buf = mmap.mmap(-1, ZERO_CHUNK)
        try:
            first = True
            while n > 0:
                phys = lsn % d
                step = min(n, ZERO_CHUNK, d - phys)
                if first and keep:
                    buf[: len(keep)] = keep
                self._write_at(memoryview(buf)[:step], self.header_bytes + phys)
                if first and keep:
                    buf[: len(keep)] = bytes(len(keep))
                first = False
                lsn += step
                n -= step
            assert lsn % bs == 0
        finally:
            buf.close()

    def _write_header(self, shutdown: int, clean_end: int, window: int | None = None, trim: int | None = None,
                      durable: int | None = None) -> None:
        """Write the next header copy (slot = seq % 2); new values take effect only once
        it is durable. Every copy records the durable end as of now (``durable`` overrides
        it: recovery sets the end it found), so the header always knows what open must find."""
        with self._hdr_lock:
            if self._fd < 0:
                raise EngineClosed(f"{self.path}: the WAL is closed")
            window = self._window if window is None else window
            trim = self._trim if trim is None else max(trim, self._trim)
            durable = max(self._hdr_durable, self._durable_end) if durable is None else durable
            hdr = RingHeader(self.block_size, self.capacity, trim, self._seq + 1, window, shutdown, clean_end,
                             max(durable, trim))
            buf = mmap.mmap(-1, self.block_size)
            try:
                buf[: SLOT.size + 4] = hdr.pack()
                self._write_at(memoryview(buf), (hdr.seq % 2) * self.block_size)
            finally:
                buf.close()
            self._seq, self._window, self._trim, self._hdr_durable = hdr.seq, window, trim, hdr.durable_end

    def _checkpoint(self) -> None:
        """Record the current durable end in the header (a lower bound: it may lag, never lead)."""
        try:
            self._write_header(SHUTDOWN_RUNNING, 0)
        except EngineClosed:
            pass
        except WalError as e:
            _log.error("%s: WAL header checkpoint failed: %s", self.path, e)
            self._fail(e)

    # ---------------------------------------------------------------- recovery

    def _recover(self, hdr: RingHeader, res: Recovered) -> None:
        """Take over what recovery found (device_recovery.recover decided it, reading only),
        then make it safe to write: blank what lies after the kept prefix and write a header
        copy whose durable end is the recovered end (lower than before only after a repair)."""
        bs = self.block_size
        d = self.data_capacity
        trim = hdr.trim
        self._frontiers = dict(res.frontiers)
        self._frontier_lsns = deque(res.frontier_lsns)
        self._finished = res.finished
        self._seg_start = res.seg_start
        self._seg_records = res.seg_records
        self.report.records = res.records
        self.report.torn_tails.extend(res.torn_tails)
        self._sealed = dict(res.frontiers)
        last_end = res.last_end
        self._durable_end = last_end
        self._next = _align_up(last_end, bs)
        if not res.clean or res.why:
            zero_to = min(max(self._next + res.window, _align_up(res.found_end, bs)), _align_down(trim + d, bs))
            lo = _align_down(last_end, bs)
            keep = self._pread_exact(self.header_bytes + lo % d, last_end - lo) if last_end > lo else b""
            if zero_to > lo:
                self._zero(lo, zero_to - lo, keep)
        self._write_header(SHUTDOWN_RUNNING, 0, window=min(self.configured_window, self.data_capacity),
                           durable=last_end)

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
            if not self._inflight or time.monotonic() - cur.born >= self.max_block_age:
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
                        timeout = max(0.0, self.max_block_age - (time.monotonic() - cur.born))
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
        self._write_at(memoryview(blk.buf)[:wlen], self.header_bytes + blk.start % self.data_capacity)

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
                    for r in t.records:
                        if r.kind == RecordKind.PROGRESS:
                            self._sealed[r.relation_id] = max(self._sealed.get(r.relation_id, r.t_hi), r.t_hi)
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
                self._cur = _Block(start, buf, cap == self._pool_size)
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

    def append(self, records: Sequence[Record]) -> int:
        """Append ``records`` contiguously; return once they and everything before them
        are durable. Waits up to ``full_timeout`` for room, then raises WalFull."""
        return self.submit(records, _sync=True).wait()

    def submit(self, records: Sequence[Record],
               on_durable: Callable[[Sequence[Record]], None] | None = None, *, _sync: bool = False) -> DeviceTicket:
        """Place ``records`` in the ring (placement order is log order) and return a
        ticket whose ``wait()`` returns once they are durable; ``on_durable(records)``
        runs on an I/O thread right after that, in log order, before any waiter wakes.
        Returns at once unless the ring is full (then waits up to ``full_timeout``)."""
        if not records:
            raise ValueError("submit needs at least one record")
        crcs = [crc32c(r.body) for r in records]
        sizes = [r.frame_size for r in records]
        d = self.data_capacity
        for n in sizes:
            if n > d:
                raise WalError(
                    f"{self.path}: a record of {n} bytes cannot fit a ring whose data area is {d} bytes; "
                    "raise the WAL capacity or split the record."
                )
        ticket = DeviceTicket(self, records, on_durable)
        ticket.sync = _sync
        self._place(records, crcs, sizes, False, ticket)
        return ticket

    def _place(self, records: Sequence[Record], crcs: list[int], sizes: list[int],
               force_frontiers: bool, ticket: DeviceTicket | None) -> _Block | None:
        """Place the frames (and a FRONTIERS record at a segment boundary); returns the
        FRONTIERS record's block, if one was written."""
        deadline = time.monotonic() + self.full_timeout
        total = sum(sizes)
        if not self._alloc_lock.acquire(timeout=self.full_timeout):
            raise self._full(total)
        try:
            with self._lock:
                while True:
                    self._check_open()
                    frontiers = self._frontiers
                    progress = [r for r in records if r.kind == RecordKind.PROGRESS]
                    if progress:
                        frontiers = dict(frontiers)
                        for r in progress:
                            frontiers[r.relation_id] = max(frontiers.get(r.relation_id, r.t_hi), r.t_hi)
                    seg_records = self._seg_records + len(records)
                    finish = seg_records > 0 and (
                        force_frontiers or self._next + total - self._seg_start >= self.segment_bytes
                    )
                    if not records and not finish:
                        return None
                    fbody = encode_frontiers(frontiers) if finish else b""
                    fsize = HEADER_SIZE + len(fbody) if finish else 0
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
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise self._full(total)
                    self._full_waiters += 1
                    try:
                        self._space_cv.wait(left)
                    finally:
                        self._full_waiters -= 1
                out: list = []
                self._plan_call(sizes, fsize, out)
                frames: list[tuple[Record, int | None]] = list(zip(records, crcs, strict=True))
                if finish:
                    frames.append((Record(RecordKind.FRONTIERS, count=len(frontiers), body=fbody), None))
                placed = self._apply(out, frames)
                for r, (lsn, _) in zip(records, placed, strict=False):
                    r.lsn = lsn
                if ticket is not None:
                    ticket.block = placed[len(records) - 1][1]
                    ticket.block.tickets.append(ticket)
                self._frontiers = frontiers
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

    # ---------------------------------------------------------------- segments and trim

    def set_finish_listener(self, callback: Callable[[int], None] | None) -> None:
        self._listener = callback

    def finish_segment(self) -> None:
        """Append a FRONTIERS record now (if the segment holds any record) and wait until
        it is durable and the listener has been told."""
        blk = self._place([], [], [], True, None)
        if blk is not None:
            self._await(blk)

    def trim(self, lsn: int) -> None:
        """Let the ring reuse space below ``lsn``. The trim offset moves to the start of
        the last finished FRONTIERS record at or below ``lsn`` (never past a finished
        segment, and the kept FRONTIERS record carries every relation's frontier across
        restarts); trimming past the durable end raises WalError."""
        with self._lock:
            self._check_open()
            if lsn > self._durable_end:
                raise WalError(
                    f"{self.path}: cannot trim to {lsn}: only records below {self._durable_end} are durable. "
                    "Trim only LSNs that append() returned and the compacter has finished with."
                )
            target = -1
            for f in self._frontier_lsns:
                if f > lsn or f >= self._finished:
                    break
                target = f
            if target <= self._trim:
                return
        self._write_header(SHUTDOWN_RUNNING, 0, trim=target)
        with self._lock:
            while self._frontier_lsns and self._frontier_lsns[0] < target:
                self._frontier_lsns.popleft()
            self._space_cv.notify_all()

    # ---------------------------------------------------------------- reading

    @property
    def start_lsn(self) -> int:
        return self._trim

    @property
    def end_lsn(self) -> int:
        return self._next

    @property
    def durable_lsn(self) -> int:
        """Every record below this offset is durable."""
        return self._durable_end

    @property
    def finished_lsn(self) -> int:
        return self._finished

    @property
    def sealed_frontiers(self) -> dict[int, int]:
        """The greatest ``close t`` of each relation id in the durable log, including what
        FRONTIERS records carried over from trimmed segments."""
        return dict(self._sealed)

    @property
    def full_waiters(self) -> int:
        """Appends now waiting for room in a full ring (for metrics and tests)."""
        return self._full_waiters

    @property
    def direct_io(self) -> bool:
        """Whether writes currently bypass the page cache."""
        return self._direct

    def read(self, lsn: int) -> Record:
        """The record at ``lsn`` (both CRCs verified)."""
        if self._rfd < 0:
            raise EngineClosed(f"{self.path}: the WAL is closed")
        if lsn < self._trim or lsn >= self._durable_end:
            raise WalError(
                f"{self.path}: no durable record at {lsn}: the log holds [{self._trim}, {self._durable_end})."
            )
        rd = RingReader(self, chunk=self.block_size * 2)
        try:
            u, why = check(rd, lsn)
            if u is None:
                raise WalError(f"{self.path}: no valid record at logical offset {lsn}: {why}")
            rec = record_of(u, rd.get(lsn + HEADER_SIZE, u[4]))
        finally:
            rd.close()
        if lsn < self._trim:
            raise WalError(f"{self.path}: record {lsn} was trimmed while being read")
        return rec

    def scan(self, start: int | None = None) -> Iterator[Record]:
        """Records from ``start`` (default and minimum: the trim offset) to the durable end
        as of the call, in order; PADDING is skipped. Damage raises WalCorruption."""
        pos = self._trim if start is None else max(start, self._trim)
        limit = self._durable_end
        rd = RingReader(self, sequential=True)
        stopped: list = []
        try:
            for p, u in walk(rd, pos, limit, stopped):
                if u[3] == RecordKind.PADDING:
                    continue
                rec = record_of(u, rd.get(p + HEADER_SIZE, u[4]))
                if p < self._trim:
                    raise WalError(f"{self.path}: records at {p} were trimmed during the scan")
                yield rec
            stop, why = stopped[0]
            if why and stop == pos and start is not None and start > self._trim:
                raise WalError(f"{self.path}: scan start {start} is not the LSN of a record: {why}")
            if why:
                raise WalCorruption(
                    f"{self.path}: invalid record at logical offset {stop} below the durable end {limit}: "
                    f"{why}. Run sediment verify.", path=self.path, offset=stop, reason=why,
                )
        finally:
            rd.close()

    # ---------------------------------------------------------------- closing

    def close(self) -> None:
        """Write out the open block, stop the threads, and mark the header clean."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._seal()
            self._work_cv.notify_all()
            self._space_cv.notify_all()
        for t in self._threads:
            t.join()
        if self._failed is None:
            self._write_header(SHUTDOWN_CLEAN, self._durable_end, durable=self._durable_end)
        self._close_fds()

    def _close_fds(self) -> None:
        with self._hdr_lock, self._fd_lock:
            for fd in [self._fd, self._rfd, *self._old_fds]:
                if fd >= 0:
                    os.close(fd)
            self._fd = self._rfd = -1
            self._old_fds = []
        for b in self._pool:
            b.close()
        self._pool = []

    def __enter__(self) -> DeviceLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

