"""The writes a file log's open makes after the shared reader (wal/log_reader.py) decided:
cuts, salvaged runs of records, copies kept before a repair cut. Each is durable."""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import suppress

from sediment._fs import fsync_dir, pwrite_all
from sediment.wal import manifest as mf
from sediment.wal.direct_io import allocate
from sediment.wal.log_reader import Plan
from sediment.wal.segment_writer import Segment


def keep_copy(src: str, dst: str) -> str:
    """Copy ``src`` to ``dst`` durably (file and directory fsynced)."""
    with open(src, "rb") as f, open(dst, "wb") as out:
        while chunk := f.read(8 << 20):
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    fsync_dir(os.path.dirname(dst))
    return dst


def write_new_file(path: str, data: bytes, allocate_to: int = 0) -> None:
    """Create (or empty) ``path`` holding ``data``, preallocated to ``allocate_to`` bytes, and
    fsync it; the caller fsyncs the directory once for every file it creates."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if allocate_to:
            allocate(fd, allocate_to)
        pwrite_all(fd, data, 0)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_salvage(src: str, start: int, end: int, header: bytes, new_path: str) -> None:
    """A new segment file: ``header`` then the frames ``src[start:end]`` (valid records found
    after damage), fsynced with its directory."""
    with open(src, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    write_new_file(new_path, header + data)
    fsync_dir(os.path.dirname(new_path))


def cut_file(path: str, offset: int, preallocate: int | None) -> None:
    """Cut the file at ``offset``; an active segment (``preallocate`` = its size) is
    zero-filled past it, so no stale frame can reappear."""
    fd = os.open(path, os.O_RDWR)
    try:
        os.ftruncate(fd, offset)
        if preallocate:
            allocate(fd, max(preallocate, offset))
        os.fsync(fd)
    finally:
        os.close(fd)


def carry_out(plan, pdir: str, header: Callable[[int], bytes], segment_bytes: int) -> list[str]:
    """Make the file changes of ``plan`` (wal/log_reader.Plan) in ``pdir``, the same way for
    the local log and a storage node's replica: delete garbage, write salvaged runs (each with
    ``header(first LSN)``), cut files (an active one zero-filled to ``segment_bytes``). A cut
    of damaged bytes first keeps a copy of the file; returns the copies' paths."""
    removed = False
    for path in plan.delete:
        with suppress(FileNotFoundError):
            os.unlink(path)
            removed = True
    if removed:
        fsync_dir(pdir)
    for src, start, end, first, new_path in plan.salvage:
        write_salvage(src, start, end, header(first), new_path)
    damaged = {p.path for p in plan.problems if p.fatal}
    preserved = []
    for path, offset, finished in plan.cuts:
        if path in damaged:  # a repair cut: the original bytes are kept aside, never destroyed
            preserved.append(keep_copy(path, f"{path}.pre-repair-{offset}"))
        cut_file(path, offset, None if finished else segment_bytes)
    return preserved


def create_segment_files(seg_path: str, idx_path: str, seg_header: bytes, idx_header: bytes,
                         segment_bytes: int) -> None:
    """A new, empty segment: the data file preallocated to ``segment_bytes`` (fdatasync on a
    growing file is slower) and its index, both with their headers, fsynced with the directory."""
    write_new_file(seg_path, seg_header, segment_bytes)
    write_new_file(idx_path, idx_header)
    fsync_dir(os.path.dirname(seg_path))


def record_open(root: str, plan: Plan, found: mf.Manifest | None, active: Segment, active_fd: int,
                repair: bool) -> None:
    """Record in ``plan``'s manifest the log as an open left it: ``active`` (the active
    segment, open as ``active_fd``) and a durable end at its last record. ``found``: the
    manifest as read from its file (None: new, or rebuilt by repair). Only what changed is
    written: nothing when the file already says it (a reopen after a clean close), the end
    slot in place when only the end moved on (records a crash left past the last
    checkpoint), else the whole file. Why: every open rewrote the file and fsynced the
    segment, three syncs and a rename for a log nothing had touched."""
    m = plan.manifest
    assert m is not None
    m.active_first = active.first_lsn
    end = max(m.durable_end, active.next_lsn) if not repair else active.next_lsn
    same = (found is not None and plan.new_active is None and not (plan.delete or plan.cuts or plan.salvage or plan.problems)
            and (m.start_lsn, m.active_first, m.finished) == (found.start_lsn, found.active_first, found.finished)
            and found.durable_end <= end)
    if same and found.durable_end == end:
        return  # every record below the recorded end was durable before that end was recorded
    os.fsync(active_fd)  # what was read back is now durable, so it may be recorded as the durable end
    if same:
        mf.write_end(root, m, end)
        return
    fsync_dir(os.path.dirname(active.path))  # names a killed roll or open left in the page cache only
    m.durable_end = end
    mf.write(root, m)
