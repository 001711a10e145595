"""File-system primitives every on-disk component needs, in one place."""

from __future__ import annotations

import os


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a directory's entries (files created, renamed or deleted in it) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    """``pwrite`` until every byte is written (a single call may write fewer)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n
