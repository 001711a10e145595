"""The writes a file log's open makes after the shared reader (wal/log_reader.py) decided:
cuts, salvaged runs of records, copies kept before a repair cut. Each is durable."""

from __future__ import annotations

import os

from sediment._fs import fsync_dir, pwrite_all
from sediment.wal.direct_io import _allocate


def keep_copy(src: str, dst: str) -> str:
    """Copy ``src`` to ``dst`` durably (file and directory fsynced)."""
    with open(src, "rb") as f, open(dst, "wb") as out:
        while chunk := f.read(8 << 20):
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    fsync_dir(os.path.dirname(dst))
    return dst


def write_salvage(src: str, start: int, end: int, header: bytes, new_path: str) -> None:
    """A new segment file: ``header`` then the frames ``src[start:end]`` (valid records found
    after damage), fsynced with its directory."""
    with open(src, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    fd = os.open(new_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        pwrite_all(fd, header + data, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(os.path.dirname(new_path))


def cut_file(path: str, offset: int, preallocate: int | None) -> None:
    """Cut the file at ``offset``; an active segment (``preallocate`` = its size) is
    zero-filled past it, so no stale frame can reappear."""
    fd = os.open(path, os.O_RDWR)
    try:
        os.ftruncate(fd, offset)
        if preallocate:
            _allocate(fd, max(preallocate, offset))
        os.fsync(fd)
    finally:
        os.close(fd)
