"""Repair of a device ring that keeps every record that verifies.

A damaged stretch of the ring followed by valid records (each record's header names its own
LSN, which is its position, so a record found after the damage is known to belong to this
pass round the ring) is a *hole*: the records in it are lost, the ones after it are not.
``DeviceLog.open(repair=True)`` calls :func:`fill_holes` before its recovery: each hole's
original bytes are copied to ``<ring>.pre-repair-<lsn>`` (fsynced, directory fsynced), then
the hole is overwritten by PADDING records that span it exactly, so the recovery walk steps
over it to the records after it. No LSN is reused: the hole's LSNs stay taken by the padding.
What cannot be bridged (no valid record within the in-flight window, or a hole across the
ring's physical end) is left to recovery's cut, with the cut range's original bytes kept the
same way. The file log's repair (wal/log_apply.py) keeps records after a hole the same way.
"""

from __future__ import annotations

import mmap
import os

from sediment._fs import fsync_dir
from sediment.errors import WalCorruption, WalShortened
from sediment.wal.device.format import SHUTDOWN_CLEAN, RingHeader, align_down, align_up
from sediment.wal.device.recovery import RingReader, check, pread_exact, recover
from sediment.wal.log_apply import write_new_file
from sediment.wal.record import HEADER, HEADER_SIZE, MAGIC, MAX_BODY, VERSION, Record, RecordKind, encode

MAX_HOLES = 1024


_MARK = HEADER.pack(0, MAGIC, VERSION, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)[4:7]  # magic + version bytes


def hole_end(log, hdr: RingHeader, stop: int) -> int | None:
    """The first position after ``stop`` holding a valid record of this pass round the ring
    (its header names that position as its LSN, both checksums hold), within the in-flight
    window where recovery itself looks and before the ring's physical end; else None. Every
    byte position is tried, so the records that follow a damaged one inside the same
    group-commit write are found too, not only those starting a block."""
    bs, d = log.block_size, log.data_capacity
    limit = min(stop + max(hdr.window, bs), hdr.trim + d, stop - stop % d + d)
    if limit <= stop + HEADER_SIZE:
        return None
    region = bytes(_read(log, stop, limit))
    rd = RingReader(log)
    try:
        i = region.find(_MARK, HEADER_SIZE + 4)
        while i >= 0:
            p = stop + i - 4
            if p + HEADER_SIZE <= limit and check(rd, p)[0] is not None:
                return p
            i = region.find(_MARK, i + 1)
    finally:
        rd.close()
    return None


def _read(log, lo: int, hi: int) -> bytes:
    """Ring bytes [lo, hi) (logical; may wrap round the physical end)."""
    d = log.data_capacity
    parts = []
    pos = lo
    while pos < hi:
        phys = pos % d
        n = min(hi - pos, d - phys)
        start = align_down(phys, log.block_size)
        parts.append(pread_exact(log, log.header_bytes + start, phys - start + n)[phys - start:])
        pos += n
    return b"".join(parts)


def preserve(log, lo: int, hi: int) -> str:
    """Copy ring bytes [lo, hi) (logical) to ``<ring>.pre-repair-<lo>``, durably."""
    path = f"{log.path}.pre-repair-{lo}"
    write_new_file(path, _read(log, lo, hi))
    fsync_dir(os.path.dirname(os.path.abspath(path)))
    return path


def _padding(lo: int, hi: int) -> bytes:
    """One PADDING frame covering ring bytes [lo, hi) exactly."""
    return encode(Record(RecordKind.PADDING, body=bytes(hi - lo - HEADER_SIZE)), lo)


def _fill(log, lo: int, hi: int) -> None:
    """Overwrite ring bytes [lo, hi) (same pass round the ring) with padding, keeping the
    other bytes of the blocks it touches; durable on return."""
    bs, d = log.block_size, log.data_capacity
    start, end = align_down(lo, bs), align_up(hi, bs)
    phys = start % d
    old = pread_exact(log, log.header_bytes + phys, end - start)
    frame = old[:lo - start] + _padding(lo, hi) + old[hi - start:]
    with mmap.mmap(-1, len(frame)) as buf:
        buf[:] = frame
        log.write_at(memoryview(buf), log.header_bytes + phys)
    os.fsync(log.files.fd)


def fill_holes(log, hdr: RingHeader) -> tuple[list[tuple[str, int, int, str]], list[str]]:
    """Bridge every hole recovery would refuse at (see the module doc). Returns the holes as
    OpenReport torn-tail entries and the files holding the original bytes. Where a hole
    cannot be bridged, keeps the bytes recovery is about to cut and stops."""
    bs, d = log.block_size, log.data_capacity
    notes: list[tuple[str, int, int, str]] = []
    kept: list[str] = []
    for _ in range(MAX_HOLES):
        try:
            recover(log, hdr, repair=False)
            break
        except (WalShortened, WalCorruption) as exc:
            stop, why = exc.offset, exc.reason
        if stop < hdr.trim:
            break
        q = hole_end(log, hdr, stop)
        if q is None or not HEADER_SIZE <= q - stop <= HEADER_SIZE + MAX_BODY or stop % d + (q - stop) > d:
            clean = hdr.shutdown == SHUTDOWN_CLEAN
            must = max(hdr.durable_end, hdr.clean_end if clean else 0)
            hi = min(max(must, stop + max(hdr.window, bs)), hdr.trim + d)
            if hi > stop:
                kept.append(preserve(log, stop, hi))
            break
        kept.append(preserve(log, stop, q))
        _fill(log, stop, q)
        notes.append((log.path, stop, q - stop,
                      f"hole: {why}; acknowledged LSN range [{stop}, {q}) lost and filled with padding "
                      f"(original bytes in {kept[-1]}); every valid record after it kept"))
    return notes, kept
