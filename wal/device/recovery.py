"""Recovery of a device ring: reading its header and walking its records.

One code path serves ``DeviceLog.open`` and ``sediment verify``: :func:`load_header` and
:func:`recover` only read, and decide everything (what is kept, what is a torn tail, what is
damage) before the log writes anything, so :func:`inspect` -- the same two calls on a
read-only file descriptor -- is exactly open's recovery run without its side effects. A
verdict of verify therefore cannot drift from open's (the rules are in docs/formats.md,
"Device WAL format", "Recovery").
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from crc32c import crc32c as _crc

from sediment.errors import WalCorruption, WalError, WalMissing, WalShortened
from sediment.wal.device.block_io import pread_fully
from sediment.wal.device.format import (
    DEFAULT_BLOCK_SIZE,
    READ_CHUNK,
    SHUTDOWN_CLEAN,
    RingHeader,
    align_down,
    align_up,
    choose_header,
)
from sediment.wal.record import (
    HEADER_SIZE,
    RecordKind,
    check_header,
)
from sediment.wal.record import decode_header as _decode_header


class RingSource(Protocol):
    """What recovery reads through: a ring's geometry and an aligned positional read."""

    path: str
    block_size: int
    header_bytes: int
    data_capacity: int

    def pread_into(self, view: memoryview, offset: int) -> None: ...


def pread_exact(src: RingSource, offset: int, n: int) -> bytes:
    with mmap.mmap(-1, align_up(max(n, 1), src.block_size)) as buf:
        src.pread_into(memoryview(buf)[: len(buf)], offset)
        return bytes(buf[:n])


class RingReader:
    """Aligned, chunked reads of the data area (Direct I/O when the fd allows it). A
    sequential reader reads the next chunk on a helper thread while the caller parses
    the current one (preadv releases the GIL), which keeps recovery disk-bound."""

    def __init__(self, log: RingSource, chunk: int = READ_CHUNK, sequential: bool = False) -> None:
        self.log = log
        self.chunk = min(max(chunk, log.block_size), log.data_capacity)
        self.bufs = [mmap.mmap(-1, self.chunk)] + ([mmap.mmap(-1, self.chunk)] if sequential else [])
        self.views = [memoryview(b) for b in self.bufs]
        self.cur = 0
        self.lo = 0
        self.hi = 0
        self.base = -1
        self.pool: ThreadPoolExecutor | None = ThreadPoolExecutor(1) if sequential else None
        self.ahead: tuple[int, int, int, Future[None]] | None = None

    def close(self) -> None:
        if self.ahead is not None:
            self.ahead[3].exception()
        if self.pool is not None:
            self.pool.shutdown()
        for v in self.views:
            v.release()
        for b in self.bufs:
            b.close()

    def _read(self, idx: int, base: int, lo: int, length: int) -> None:
        self.log.pread_into(self.views[idx][:length], self.log.header_bytes + lo)

    def at(self, lsn: int, n: int) -> tuple[memoryview, int]:
        """(view, offset) such that view[offset:offset + n] are ring bytes [lsn, lsn + n);
        the range must not cross the physical end. Valid until the next call."""
        log = self.log
        d = log.data_capacity
        phys = lsn % d
        base = lsn - phys
        if self.base == base and self.lo <= phys and phys + n <= self.hi:
            return self.views[self.cur], phys - self.lo
        bs = log.block_size
        lo = align_down(phys, bs)
        want = align_up(phys + n, bs) - lo
        if want > self.chunk:
            big = mmap.mmap(-1, want)
            log.pread_into(memoryview(big), log.header_bytes + lo)
            return memoryview(big), phys - lo
        ahead = self.ahead
        if ahead is not None and ahead[0] == base and ahead[1] <= lo and phys + n <= ahead[1] + ahead[2]:
            ahead[3].result()
            self.cur = 1 - self.cur
            self.base, self.lo, self.hi = base, ahead[1], ahead[1] + ahead[2]
            self.ahead = None
        else:
            if ahead is not None:
                ahead[3].exception()
                self.ahead = None
            length = min(self.chunk, d - lo)
            self._read(self.cur, base, lo, length)
            self.base, self.lo, self.hi = base, lo, lo + length
        if self.pool is not None:
            nlo, nbase = self.hi, self.base
            if nlo >= d:
                nlo, nbase = 0, nbase + d
            length = min(self.chunk, d - nlo)
            fut = self.pool.submit(self._read, 1 - self.cur, nbase, nlo, length)
            self.ahead = (nbase, nlo, length, fut)
        return self.views[self.cur], phys - self.lo

    def get(self, lsn: int, n: int) -> memoryview:
        view, off = self.at(lsn, n)
        return view[off : off + n]


def check(rd: RingReader, pos: int) -> tuple[tuple | None, str]:
    """The valid record at ``pos`` as the unpacked header tuple (see record.HEADER),
    or (None, why not). Same checks as record.check_header plus position and body
    CRC, without building objects: recovery speed rests on this loop."""
    d = rd.log.data_capacity
    phys = pos % d
    if d - phys < HEADER_SIZE:
        return None, "too close to the ring end for a header"
    view, o = rd.at(pos, HEADER_SIZE)
    u = check_header(view, o)
    if u is None:
        blank = not any(view[o : o + HEADER_SIZE])
        return None, ("blank (never written)" if blank else "bad record header (checksum/magic)")
    if u[6] != pos:
        return None, f"stale record (lsn {u[6]}, from an earlier pass round the ring)"
    n = u[4]
    if phys + HEADER_SIZE + n > d:
        return None, "record crosses the ring end"
    o += HEADER_SIZE
    if phys + HEADER_SIZE + n > rd.hi or rd.base != pos - phys:
        view, o = rd.at(pos + HEADER_SIZE, n)
    if _crc(view[o : o + n]) != u[5]:
        return None, "body checksum mismatch"
    return u, ""


def walk(rd: RingReader, pos: int, limit: int, stop: list) -> Iterator[tuple[int, tuple]]:
    """Valid records from ``pos`` while they chain; zero block tails are stepped
    over. Ends at ``limit`` or the first invalid position; ``stop[0]`` is then
    (position, why) with why empty at ``limit``."""
    bs = rd.log.block_size
    stop[:] = [(pos, "")]
    while pos < limit:
        u, why = check(rd, pos)
        if u is None:
            if pos % bs:
                up = min(align_up(pos, bs), limit)
                if not any(rd.get(pos, up - pos)):
                    pos = up
                    continue
                why = f"{why}; block tail not blank"
            stop[0] = (pos, why)
            return
        yield pos, u
        pos += HEADER_SIZE + u[4]
    stop[0] = (pos, "")


@dataclass
class Recovered:
    """What recovery found, before anything is written: the kept prefix ``[trim,
    last_end)``, the segment boundaries (FRONTIERS records), and what was cut (``torn_tails``, as in OpenReport)."""

    trim: int
    clean: bool
    window: int
    last_end: int
    records: int = 0
    frontier_lsns: list[int] = field(default_factory=list)
    finished: int = 0
    seg_start: int = 0
    seg_records: int = 0
    stop: int = 0
    why: str = ""
    found_end: int = 0
    torn_tails: list[tuple[str, int, int, str]] = field(default_factory=list)
    lost_acknowledged: tuple[int, int] | None = None  # [from, to) LSNs a repair cut below the durable end


def recover(src: RingSource, hdr: RingHeader, repair: bool) -> Recovered:
    """Walk the ring described by ``hdr`` and decide what the log holds. Raises
    WalShortened when the valid records end before the header's durable end (or clean
    end), WalCorruption when valid records follow a gap further than any write could have
    been in flight; with ``repair`` both become a reported cut instead. Reads only."""
    bs, d = src.block_size, src.data_capacity
    trim = hdr.trim
    clean = hdr.shutdown == SHUTDOWN_CLEAN
    limit = hdr.clean_end if clean else trim + d
    res = Recovered(trim=trim, clean=clean, window=max(hdr.window, bs), last_end=trim)
    rd = RingReader(src, sequential=True)
    try:
        stopped: list = []
        for pos, u in walk(rd, trim, limit, stopped):
            kind = u[3]
            res.last_end = pos + HEADER_SIZE + u[4]
            res.records += kind != RecordKind.PADDING
            if kind == RecordKind.FRONTIERS:  # a segment boundary; its body is the owner's
                res.frontier_lsns.append(pos)
                res.finished = res.seg_start = res.last_end
                res.seg_records = 0
            elif kind != RecordKind.PADDING:
                res.seg_records += 1
        stop, why = stopped[0]
        res.stop, res.why = stop, why
        window = res.window
        found_end, found = stop, 0
        if why:
            q = align_up(stop + 1, bs)
            while q < min(stop + window, trim + d):
                if check(rd, q)[0] is None:
                    q += bs
                    continue
                for p2, u2 in walk(rd, q, trim + d, []):
                    found += 1
                    found_end = p2 + HEADER_SIZE + u2[4]
                q = align_up(max(found_end, q + 1), bs)
        res.found_end = found_end
    finally:
        rd.close()
    must = max(hdr.durable_end, hdr.clean_end if clean else 0)
    short = bool(why) and stop < must
    damaged = bool(why) and (clean or short or found_end > stop + window)
    where = f"logical offset {stop} (device offset {src.header_bytes + stop % d})"
    if damaged and not repair:
        fix = ("Refusing to open; restore the device from a copy, or reopen with repair=True "
               "(sediment verify --repair) to cut the log there once the loss is accepted.")
        if short or clean:
            state = "the ring was shut down cleanly" if clean else "a header checkpoint recorded it"
            raise WalShortened(
                f"{src.path}: the log ends at {where}: {why}, but its durable end is {must} ({state}): "
                f"acknowledged records in LSN range [{stop}, {must}) are missing or damaged. {fix}",
                path=src.path, offset=stop, reason=why, lost_from=stop, lost_to=must,
            )
        raise WalCorruption(
            f"{src.path}: WAL damaged at {where}: {why}, yet {found} valid records follow it up to "
            f"{found_end}, beyond the {window}-byte in-flight window, so they were acknowledged "
            f"(LSN range [{stop}, {found_end})). {fix}",
            path=src.path, offset=stop, reason=why,
        )
    normal_end = why.startswith(("blank", "stale")) and not found and not damaged
    if why and not normal_end:
        kind = "damage" if damaged else "torn tail"
        cut = max(found_end, align_up(stop + 1, bs)) - stop
        extra = f"; discarded {found} unacknowledged records after it, up to {found_end}" if found else ""
        if short:
            extra += f"; lost acknowledged LSN range [{stop}, {must})"
            res.lost_acknowledged = (stop, must)
        res.torn_tails.append((src.path, stop, cut, f"{kind}: {why}{extra}"))
    res.finished = max(res.finished, trim)
    res.seg_start = max(res.seg_start, trim)
    return res


def load_header(src: RingSource, size: int, capacity: int | None, create: bool) -> tuple[RingHeader | None, int]:
    """The header describing the ring (and how many copies are valid), checked against the
    device size and the configured capacity; (None, 0) when the header area is blank and
    ``create`` allows initialising a ring there. Everything else that cannot be opened raises."""
    bs, hb = src.block_size, src.header_bytes
    raw = pread_exact(src, 0, hb) if size >= hb else b""
    hdr, nvalid = choose_header(raw, bs)
    if hdr is None:
        if raw and any(raw):
            raise WalCorruption(
                f"{src.path}: both ring header copies (bytes 0-{hb}) are invalid and not blank: this is a "
                "damaged sediment ring or foreign data, and cannot be recovered. If its contents may be "
                f"discarded, zero the first {hb} bytes and open with create=True.",
                path=src.path, offset=0, reason="both header copies invalid",
            )
        if not create:
            short = f"; the device is only {size} bytes" if size < hb else ""
            raise WalMissing(
                f"{src.path}: no sediment ring header found (both copies blank{short}): either no ring was "
                "ever created here or its header area was wiped. If this ring held a data directory's log, "
                "restore the device from a copy (nothing can be recovered without its header). A new device "
                "is initialised only by an explicit create=True (sediment.open does so on the first open of "
                "a data directory).",
                path=src.path,
            )
        return None, 0
    if hdr.block_size != bs:
        raise WalError(
            f"{src.path}: ring was created with block size {hdr.block_size}, not {bs}; "
            f"open it with block_size={hdr.block_size}."
        )
    if capacity is not None and capacity != hdr.capacity:
        raise WalError(
            f"{src.path}: ring capacity is fixed at {hdr.capacity} bytes, but {capacity} was "
            f"configured; open with capacity={hdr.capacity} (or None), or create a new ring."
        )
    if size < hdr.capacity:
        raise WalCorruption(
            f"{src.path}: device is {size} bytes but the ring header says {hdr.capacity}; "
            "the device shrank or is the wrong one. Restore the device or create a new ring.",
            path=src.path, offset=size, reason="device shorter than the ring",
        )
    return hdr, nvalid


def find_frames(src: RingSource, end: int) -> tuple[int, int]:
    """(count, first device offset) of valid record frame headers at block starts in the
    data area up to device offset ``end``: a blank header area over these was a ring."""
    bs, hb = src.block_size, src.header_bytes
    count, first, off = 0, -1, hb
    while off + bs <= end:
        n = align_down(min(READ_CHUNK, end - off), bs)
        buf = pread_exact(src, off, n)
        for o in range(0, n, bs):
            if _decode_header(buf, o) is not None:
                count += 1
                first = off + o if first < 0 else first
        off += n
    return count, first


class ReadOnlyRing:
    """A ring opened for reading only (buffered reads): what ``verify`` recovers through."""

    def __init__(self, path: str, block_size: int) -> None:
        self.path = path
        self.block_size = block_size
        self.header_bytes = 2 * block_size
        self.data_capacity = 0
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    @property
    def size(self) -> int:
        return os.lseek(self._fd, 0, os.SEEK_END)

    def pread_into(self, view: memoryview, offset: int) -> None:
        pread_fully(self._fd, view, offset, self.path)

    def close(self) -> None:
        os.close(self._fd)


def missing(path: str) -> WalMissing:
    return WalMissing(
        f"{path}: the device ring is missing (no such file or device). The log lives there: restore it "
        "(or the device node), or give the right wal='device:<path>'. A ring is created only by an explicit "
        "create=True, which sediment.open passes only on the first open of a data directory.",
        path=path,
    )


@dataclass
class Inspection:
    header: RingHeader
    valid_copies: int
    recovered: Recovered


def inspect(path: str, *, block_size: int = DEFAULT_BLOCK_SIZE, capacity: int | None = None) -> Inspection:
    """Open's recovery (``create=False, repair=False``) run read-only: returns what open would
    find and cut, or raises the typed error open would raise."""
    if not os.path.exists(path):
        raise missing(path)
    try:
        ring = ReadOnlyRing(path, block_size)
    except OSError as e:
        raise WalError(f"{path}: cannot open the device ring: {e}") from e
    try:
        hdr, nvalid = load_header(ring, ring.size, capacity, create=False)
        assert hdr is not None
        ring.data_capacity = hdr.capacity - ring.header_bytes
        return Inspection(hdr, nvalid, recover(ring, hdr, repair=False))
    finally:
        ring.close()
