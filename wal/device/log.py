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
* An appender waiting for its block writes pending blocks itself (oldest first) when one
  of the ``io_threads`` slots is free, waking no other thread; the I/O threads write only
  what no waiter can (``submit``), and the header checkpoint every ``checkpoint_bytes``, so
  no appender waits for it. Concurrent appends share writes: while
  ``partial_writes`` block writes are in flight (or until it holds as many appends as the
  block made durable last) the open block gathers the appends that arrive, and the
  appender whose own block became durable on its write writes it (a group commit's
  leader); a lone appender, finding no write in flight, writes at once, through a short
  path (``RingWriter.place_one`` or ``place_fast`` and ``write_alone``) without the planning
  and slot steps.
* Creating a ring is explicit (``create=True``); a missing or blank ring is WalMissing,
  and every header copy records the durable end, which open must reach (WalShortened).

Parts, each the one owner of its state: ``format`` (header bytes), ``recovery`` (read-only
recovery, shared with ``sediment verify``), ``block_io`` (descriptors, aligned I/O), ``head``
(the header copies: trim point, window, recorded durable end), ``writer`` (write position,
blocks, I/O slots, completion, durable end; its blocks and tickets in ``blocks``, and the
appender's placing of frames in ``placing``), ``placement`` (where frames go: the plan),
``segments`` (FRONTIERS bookkeeping); this module is the log that holds them and opens the ring.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import crc32c

from sediment._fs import fsync_dir
from sediment.clock import MONOTONIC, Clock
from sediment.errors import EngineClosed, WalCorruption, WalError, WalExists
from sediment.progress import Progress
from sediment.wal.device.block_io import RingFiles
from sediment.wal.device.blocks import DeviceTicket
from sediment.wal.device.format import (
    DEFAULT_BLOCK_SIZE,
    HOLD_GIL_CRC_BYTES,
    MIN_DATA_BYTES,
    RING_MAGIC,
    SHUTDOWN_CLEAN,
    SHUTDOWN_RUNNING,
    RingHeader,
    align_down,
    align_up,
    body_crc,
)
from sediment.wal.device.head import RingHead
from sediment.wal.device.recovery import (
    Recovered,
    RingReader,
    check,
    find_frames,
    load_header,
    missing,
    pread_exact,
    recover,
    walk,
)
from sediment.wal.device.segments import Segments
from sediment.wal.device.writer import RingWriter
from sediment.wal.protocol import NO_PREAMBLE, OpenReport, SegmentPreamble
from sediment.wal.record import (
    APPENDABLE,
    HEADER_SIZE,
    MAX_BODY,
    Record,
    RecordKind,
    check_appendable,
    record_of,
)

__all__ = ["RING_MAGIC", "SHUTDOWN_CLEAN", "SHUTDOWN_RUNNING", "DeviceLog", "DeviceTicket", "RingHeader"]

PWrite = Callable[[int, Any, int], int]
_INIT_STEP = 64 << 20  # zeros written between two progress updates when a ring is initialised
MANY_CHUNK = 1 << 20  # bytes read_many reads at once: the records near each other, not a recovery chunk
_align_up = align_up
_align_down = align_down
_crc32c = crc32c.crc32c


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
        block_size: int = DEFAULT_BLOCK_SIZE,
        max_block_bytes: int = 256 * 1024,
        max_block_age: float = 0.001,
        io_threads: int = 8,
        partial_writes: int = 2,
        window_bytes: int | None = None,
        segment_bytes: int = 64 * 1024 * 1024,
        full_timeout: float = 10.0,
        direct: bool = True,
        repair: bool = False,
        pwrite: PWrite = os.pwrite,
        checkpoint_bytes: int = 4 * 1024 * 1024,
        clock: Clock | None = None,
    ) -> DeviceLog:
        """Open (recovering) the ring at ``path``. Creating a ring is explicit: only with
        ``create`` is a missing file created or a blank device initialised, and ``create``
        over a ring that holds records raises WalExists; without it, a missing or blank
        ring raises WalMissing (never a silent fresh start). ``capacity`` counts the whole
        ring, header area included; it is fixed at creation. The header records the durable
        end at every segment finish, trim, close and every ``checkpoint_bytes`` of log, and
        open refuses (WalShortened) a log that ends before it. ``io_threads`` bounds the block
        writes in flight, ``partial_writes`` those of blocks not yet full, so that concurrent
        appends share fewer, larger writes (1 to ``io_threads``); ``window_bytes`` (default ``io_threads * 2 * max_block_bytes``) bounds
        how far past the oldest unfinished block they land, and so how far past the first gap
        recovery looks. ``repair`` cuts the log at damage instead of refusing to open.
        ``pwrite`` is the write call (``os.pwrite`` signature), injectable for tests; ``clock``
        (a :class:`sediment.clock.Clock`, real by default) times the wait for room
        (``full_timeout``). ``max_block_age`` is accepted for compatibility and unused: a
        block no longer waits to age, it is written as soon as an I/O slot is free."""
        log = cls(
            os.fspath(path), block_size=block_size, max_block_bytes=max_block_bytes,
            io_threads=io_threads, partial_writes=partial_writes, window_bytes=window_bytes,
            segment_bytes=segment_bytes, full_timeout=full_timeout, direct=direct, pwrite=pwrite,
            checkpoint_bytes=checkpoint_bytes, clock=clock,
        )
        try:
            log._open(capacity, create, repair)
        except BaseException:
            log.close_fds()
            raise
        return log

    def __init__(
        self, path: str, *, block_size: int, max_block_bytes: int, io_threads: int, window_bytes: int | None, segment_bytes: int, full_timeout: float,
        direct: bool, pwrite: PWrite, checkpoint_bytes: int = 4 * 1024 * 1024, clock: Clock | None = None,
        partial_writes: int = 2,
    ) -> None:
        if block_size < 4096 or block_size > 65536 or block_size & (block_size - 1):
            raise ValueError(f"block_size must be a power of two from 4096 to 65536, not {block_size}")
        if io_threads < 1 or partial_writes < 1:
            raise ValueError("io_threads and partial_writes must be >= 1")
        self.path = path
        self.block_size = block_size
        self.header_bytes = 2 * block_size
        self.max_block_bytes = max(block_size, max_block_bytes)
        self.io_threads = io_threads
        self.configured_window = _align_up(
            window_bytes if window_bytes is not None else io_threads * 2 * self.max_block_bytes, block_size
        )
        self.segment_bytes = segment_bytes
        self.checkpoint_bytes = max(block_size, checkpoint_bytes)
        self.clock: Clock = clock if clock is not None else MONOTONIC
        self.files = RingFiles(path, block_size, direct=direct, pwrite=pwrite)
        self.head = RingHead(self.files, block_size, self.configured_window)
        self.writer = RingWriter(
            self.files, self.head, path=path, block_size=block_size, max_block_bytes=self.max_block_bytes,
            io_threads=io_threads, checkpoint_bytes=self.checkpoint_bytes,
            full_timeout=full_timeout, clock=self.clock, partial_writes=partial_writes,
        )
        if hasattr(self.clock, "on_advance"):  # a clock moved by hand: waiters look at it again
            self.clock.on_advance(self.writer.clock_moved)
        self.report = OpenReport()
        self.lost_acknowledged: tuple[int, int] | None = None  # set when repair=True cut acknowledged records
        self.preserved: list[str] = []  # after repair=True: files holding the original bytes of what it changed
        self.capacity = 0
        self.data_capacity = 0

    # the ring's I/O, through the files it owns (recovery and salvage read and write through the log)
    def pread_into(self, view: memoryview, offset: int) -> None:
        self.files.pread_into(view, offset)

    def write_at(self, view: memoryview, offset: int) -> None:
        self.files.write_at(view, offset)

    def close_fds(self) -> None:
        """Close the ring's descriptors and free the block buffers (also what a failed open undoes)."""
        self.head.close()
        self.writer.release()

    def _open(self, capacity: int | None, create: bool, repair: bool) -> None:
        created = self.files.open(create, missing)
        regular = stat.S_ISREG(os.fstat(self.files.fd).st_mode)
        size = os.lseek(self.files.fd, 0, os.SEEK_END)
        hdr, _ = load_header(self, size, capacity, create)
        if hdr is None:
            self._init_ring(capacity, size, regular, created)
            return
        self.capacity = hdr.capacity
        self.data_capacity = hdr.capacity - self.header_bytes
        self.head.load(hdr)
        holes: list = []
        if repair and not create:  # keep every record that verifies: bridge holes, keep cut bytes
            from sediment.wal.device.salvage import fill_holes

            holes, self.preserved = fill_holes(self, hdr)
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
            os.posix_fallocate(self.files.fd, 0, self.capacity)
        self._recover(hdr, res)
        self.report.torn_tails[:0] = holes
        if holes and self.lost_acknowledged is None:
            self.lost_acknowledged = (holes[0][1], holes[0][1] + holes[0][2])

    def _init_ring(self, capacity: int | None, size: int, regular: bool, created: bool) -> None:
        """Initialise a new ring; refuses a blank header area over data that holds record
        frames (a wiped ring, not a new device).

        The data area is written with zeros, a new file's too. Why: a file's fallocated
        extents are unwritten, and a durable O_DIRECT write into one must also record its
        conversion, which made the first pass round a new ring about 2.2x slower per write
        (4 and 64 KiB, measured here) than every later pass; written once at creation, the
        file behaves like the device it stands in for from the first append on. A new file is
        written with the plain write call, not the injected one (which sees the ring's own
        writes: its blocks and headers)."""
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
            os.posix_fallocate(self.files.fd, 0, capacity)
            os.fsync(self.files.fd)
            if created:
                fsync_dir(os.path.dirname(os.path.abspath(self.path)))
        self.capacity = self.head.capacity = capacity
        self.data_capacity = capacity - self.header_bytes
        pwrite = os.pwrite if created and regular else None
        with Progress(total=self.data_capacity, label=f"{self.path}: zeros over the new ring's data area",
                      unit="B") as bar:  # a device of some GiB takes seconds
            for lo in range(0, self.data_capacity, _INIT_STEP):
                n = min(_INIT_STEP, self.data_capacity - lo)
                self.files.zero(lo, n, self.data_capacity, pwrite=pwrite)
                bar.update(n)
        self.head.write(SHUTDOWN_RUNNING, 0, 0, window=min(self.configured_window, self.data_capacity), exact=True)
        self.writer.start(self.data_capacity, 0, 0, Segments(self.segment_bytes))

    # ---------------------------------------------------------------- recovery

    def _recover(self, hdr: RingHeader, res: Recovered) -> None:
        """Take over what recovery found (device_recovery.recover decided it, reading only),
        then make it safe to write: blank what lies after the kept prefix and write a header
        copy whose durable end is the recovered end (lower than before only after a repair)."""
        bs = self.block_size
        d = self.data_capacity
        trim = hdr.trim
        self.report.records = res.records
        self.report.torn_tails.extend(res.torn_tails)
        self.lost_acknowledged = res.lost_acknowledged
        last_end = res.last_end
        next_lsn = _align_up(last_end, bs)
        if not res.clean or res.why:
            zero_to = min(max(next_lsn + res.window, _align_up(res.found_end, bs)), _align_down(trim + d, bs))
            lo = _align_down(last_end, bs)
            keep = pread_exact(self, self.header_bytes + lo % d, last_end - lo) if last_end > lo else b""
            if zero_to > lo:
                self.files.zero(lo, zero_to - lo, d, keep)
        elif last_end % bs:  # clean: the last block's tail must be blank, or the next walk stops there
            lo = _align_down(last_end, bs)
            block = pread_exact(self, self.header_bytes + lo % d, bs)
            if any(block[last_end - lo:]):
                self.files.zero(lo, bs, d, block[:last_end - lo])
        self.head.write(SHUTDOWN_RUNNING, 0, last_end, window=min(self.configured_window, self.data_capacity),
                        exact=True)
        segments = Segments(self.segment_bytes, res.frontier_lsns, res.finished, res.seg_start, res.seg_records)
        self.writer.start(d, next_lsn, last_end, segments)

    # ---------------------------------------------------------------- appending

    def append(self, records: Sequence[Record]) -> int:
        """Append ``records`` contiguously; return once they and everything before them
        are durable. Waits up to ``full_timeout`` for room, then raises WalFull."""
        return self.submit(records).wait()

    def submit(self, records: Sequence[Record],
               on_durable: Callable[[Sequence[Record]], None] | None = None) -> DeviceTicket:
        """Place ``records`` in the ring (placement order is log order) and return a
        ticket whose ``wait()`` returns once they are durable; ``on_durable(records)``
        runs right after that, in log order, before any waiter wakes, on the thread that
        completed the write. Returns at once unless the ring is full (then waits up to
        ``full_timeout``). Placing wakes no thread: the block is written by the first
        caller that waits (this one's or a later one's), or by an I/O thread at a segment
        boundary, when the ring is full, or at close (the WAL protocol's rule)."""
        writer = self.writer
        if len(records) == 1:  # check_appendable's checks, the integer fields' by place_one's header pack
            r = records[0]
            body = r.body
            n = len(body)
            if r.kind not in APPENDABLE or n > MAX_BODY:
                check_appendable(records, self.path)
            crc = _crc32c(body, 0, 0 if n <= HOLD_GIL_CRC_BYTES else 1)  # body_crc, one call fewer
            ticket = DeviceTicket(writer, records, on_durable)
            if writer.place_one(r, crc, HEADER_SIZE + n, ticket):
                return ticket
            check_appendable(records, self.path)
            crcs, sizes = [crc], [HEADER_SIZE + n]
        else:
            check_appendable(records, self.path)
            crcs = [body_crc(r.body) for r in records]
            sizes = [r.frame_size for r in records]
            ticket = DeviceTicket(writer, records, on_durable)
            if writer.place_fast(records, crcs, sizes, ticket):
                return ticket
        d = self.data_capacity
        for n in sizes:
            if n > d:
                raise WalError(
                    f"{self.path}: a record of {n} bytes cannot fit a ring whose data area is {d} bytes; "
                    "raise the WAL capacity or split the record."
                )
        writer.place(records, crcs, sizes, False, ticket)
        return ticket

    @property
    def durable_lsn(self) -> int:
        """Every record below this offset is durable."""
        return self.writer.durable_end

    # ---------------------------------------------------------------- segments and trim

    def set_finish_listener(self, callback: Callable[[int], None] | None) -> None:
        self.writer.set_listener(callback)

    def finish_segment(self) -> None:
        """Append a FRONTIERS record now (if the segment holds any record) and wait until
        it is durable and the listener has been told."""
        blk = self.writer.place([], [], [], True, None)
        if blk is not None:
            self.writer.await_block(blk)

    def trim(self, lsn: int) -> None:
        """Let the ring reuse space below ``lsn``. The trim offset moves to the start of
        the last finished FRONTIERS record at or below ``lsn`` (never past a finished
        segment, and the kept FRONTIERS record carries every relation's frontier across
        restarts); trimming past the durable end raises WalError."""
        target = self.writer.trim_target(lsn)
        if target < 0:
            return
        self.head.write(SHUTDOWN_RUNNING, 0, self.writer.durable_end, trim=target)
        self.writer.trimmed(target)

    # ---------------------------------------------------------------- reading

    @property
    def start_lsn(self) -> int:
        return self.head.trim

    @property
    def end_lsn(self) -> int:
        return self.writer.next_lsn

    @property
    def finished_lsn(self) -> int:
        return self.writer.finished_lsn

    def set_preamble(self, preamble: SegmentPreamble | None) -> None:
        self.writer.set_preamble(NO_PREAMBLE if preamble is None else preamble)

    @property
    def full_waiters(self) -> int:
        """Appends now waiting for room in a full ring (for metrics and tests)."""
        return self.writer.full_waiters

    def wait_for_full_waiters(self, count: int, timeout: float) -> bool:
        """Wait until ``count`` appends wait for room (a ring that filled up is observable
        without polling); False after ``timeout`` seconds."""
        return self.writer.wait_for_full_waiters(count, timeout)

    @property
    def full_timeout(self) -> float:
        """Seconds an append waits for room in a full ring before WalFull (settable)."""
        return self.writer.full_timeout

    @full_timeout.setter
    def full_timeout(self, seconds: float) -> None:
        self.writer.full_timeout = seconds

    @property
    def direct_io(self) -> bool:
        """Whether writes currently bypass the page cache."""
        return self.files.direct

    def read(self, lsn: int) -> Record:
        """The record at ``lsn`` (both CRCs verified)."""
        if self.files.closed:
            raise EngineClosed(f"{self.path}: the WAL is closed")
        if lsn < self.head.trim or lsn >= self.writer.durable_end:
            raise WalError(
                f"{self.path}: no durable record at {lsn}: the log holds [{self.head.trim}, {self.writer.durable_end})."
            )
        rd = RingReader(self, chunk=self.block_size * 2)
        try:
            u, why = check(rd, lsn)
            if u is None:
                raise WalError(f"{self.path}: no valid record at logical offset {lsn}: {why}")
            rec = record_of(u, rd.get(lsn + HEADER_SIZE, u[4]))
        finally:
            rd.close()
        if lsn < self.head.trim:
            raise WalError(f"{self.path}: record {lsn} was trimmed while being read")
        return rec

    def read_many(self, lsns: Sequence[int]) -> list[Record]:
        """The records at ``lsns`` through one reader: neighbours share its chunk's read."""
        if self.files.closed:
            raise EngineClosed(f"{self.path}: the WAL is closed")
        got: dict[int, Record] = {}
        rd = RingReader(self, chunk=MANY_CHUNK)
        try:
            for lsn in sorted(set(lsns)):
                if lsn < self.head.trim or lsn >= self.writer.durable_end:
                    raise WalError(f"{self.path}: no durable record at {lsn}: the log holds [{self.head.trim}, "
                                   f"{self.writer.durable_end}).")
                u, why = check(rd, lsn)
                if u is None:
                    raise WalError(f"{self.path}: no valid record at logical offset {lsn}: {why}")
                got[lsn] = record_of(u, rd.get(lsn + HEADER_SIZE, u[4]))
        finally:
            rd.close()
        if got and min(got) < self.head.trim:
            raise WalError(f"{self.path}: record {min(got)} was trimmed while being read")
        return [got[lsn] for lsn in lsns]

    def scan(self, start: int | None = None) -> Iterator[Record]:
        """Records from ``start`` (default and minimum: the trim offset) to the durable end
        as of the call, in order; PADDING is skipped. Damage raises WalCorruption."""
        pos = self.head.trim if start is None else max(start, self.head.trim)
        limit = self.writer.durable_end
        rd = RingReader(self, sequential=True)
        stopped: list = []
        try:
            for p, u in walk(rd, pos, limit, stopped):
                if u[3] == RecordKind.PADDING:
                    continue
                rec = record_of(u, rd.get(p + HEADER_SIZE, u[4]))
                if p < self.head.trim:
                    raise WalError(f"{self.path}: records at {p} were trimmed during the scan")
                yield rec
            stop, why = stopped[0]
            if why and stop == pos and start is not None and start > self.head.trim:
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
        if self.writer.close():
            end = self.writer.durable_end
            self.head.write(SHUTDOWN_CLEAN, end, end, exact=True)
        self.close_fds()

    def __enter__(self) -> DeviceLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

