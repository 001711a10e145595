"""File-system primitives every on-disk component needs, in one place."""

from __future__ import annotations

import fcntl
import os
import shutil


def lock_file(path: str) -> int | None:
    """An exclusive, non-blocking ``flock`` on ``path`` (made if missing): its open descriptor,
    held until closed (or the process ends), or None when another process holds it. The one
    lock every directory sediment owns is guarded by (a data directory, a metadata journal, a
    storage node's directory); each caller words its own refusal."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def flock_holder(path: str) -> int | None:
    """The id of another process holding a ``flock`` on ``path``, read from Linux's
    ``/proc/locks`` without taking the lock (taking it, even shared and for a moment, could
    make an engine opening the directory just then fail); None when none does, or where
    ``/proc/locks`` cannot be read."""
    try:
        st = os.stat(path)
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return None
    where = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    for line in lines:
        parts = line.split()  # "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"; a waiter's has "->" after the number
        if "->" in parts or len(parts) < 6 or parts[1] != "FLOCK":
            continue
        try:
            major, minor, inode = parts[5].split(":")
            pid = int(parts[4])
            if (int(major, 16), int(minor, 16), int(inode)) == where and pid != os.getpid():
                return pid
        except ValueError:
            continue
    return None


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


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """``write`` until every byte is written (a single call may write fewer)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def replace_durably(path: str, data: bytes, mode: int = 0o644, tmp: str | None = None) -> None:
    """Make ``path`` hold ``data``, whole or not at all, durably: a temporary file beside it
    (``tmp``, or a name ending with this process's id, so two writers never share one), fsync,
    rename over ``path``, fsync of the directory."""
    tmp = tmp or f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        pwrite_all(fd, data, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def makedirs_durable(path: str | os.PathLike[str]) -> str | None:
    """``os.makedirs(path, exist_ok=True)``, but every directory it creates is made durable:
    after each ``mkdir`` its parent is fsynced, so a power cut cannot forget a directory
    whose files were already synced (POSIX makes an entry durable only when its parent
    directory is synced). Returns the outermost directory it created (None: none), which
    is what to remove to undo it."""
    path = os.path.abspath(os.fspath(path))
    missing: list[str] = []
    probe = path
    while not os.path.isdir(probe):
        missing.append(probe)
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    top = None
    for d in reversed(missing):
        try:
            os.mkdir(d)
        except FileExistsError:
            if not os.path.isdir(d):
                raise
            continue
        fsync_dir(os.path.dirname(d))
        top = top or d
    return top


def remove_tree_durable(path: str | os.PathLike[str]) -> None:
    """Remove a directory and everything in it, durably: once its parent is fsynced, nothing
    under it can come back after a power cut."""
    shutil.rmtree(path)
    fsync_dir(os.path.dirname(os.path.abspath(os.fspath(path))))


def undo_makedirs(top: str | None, path: str, *, whole: bool) -> None:
    """Undo, durably, the making of directory ``path``: ``top`` is what :func:`makedirs_durable`
    returned (None: ``path`` was there already, empty). ``whole`` (the caller held the
    directory's lock, so all in ``path`` is the caller's): remove ``path`` and everything in
    it, or empty it again when it was there before. Then the empty directories above
    ``path`` up to ``top``, stopping at the first that is not empty: the lock covers
    ``path`` only, and another open may have begun to use a directory made beside it (a
    cluster member opens its partitions' directories under one parent at once)."""
    d = os.path.abspath(path)
    if whole and top is None:
        for entry in os.scandir(path):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        fsync_dir(path)
        return
    if whole:
        remove_tree_durable(d)
        if d == top:
            return
        d = os.path.dirname(d)
    while top is not None:
        try:
            os.rmdir(d)
        except OSError:  # not empty (or gone): leave it and what is above it
            return
        fsync_dir(os.path.dirname(d))
        if d == top:
            return
        d = os.path.dirname(d)
