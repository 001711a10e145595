"""Raw I/O of the device ring: its file descriptors, aligned reads and writes (Direct I/O,
falling back to buffered O_DSYNC when the device refuses it), zeroing, and writing one
header copy. :class:`RingFiles` owns all of it; a DeviceLog holds one."""

from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
from collections.abc import Callable

from sediment.errors import WalError
from sediment.wal.device.format import SLOT, ZERO_CHUNK, RingHeader
from sediment.wal.dual_slot import slot_offset

_log = logging.getLogger("sediment.wal.device.log")


def pread_fully(fd: int, view: memoryview, offset: int, path: str) -> None:
    """Fill ``view`` from ``offset`` of ``fd``; WalError (naming ``path``) on a failed read or
    the end of the device."""
    got = 0
    while got < len(view):
        try:
            n = os.preadv(fd, [view[got:]], offset + got)
        except OSError as e:
            raise WalError(f"{path}: read of {len(view)} bytes at offset {offset} failed: {e}") from e
        if n == 0:
            raise WalError(f"{path}: unexpected end of device at offset {offset + got}")
        got += n


class RingFiles:
    """The ring's write descriptor (``fd``: O_DIRECT when the device takes it, else O_DSYNC)
    and read descriptor, and aligned I/O through them. ``pwrite``: the write call
    (``os.pwrite``'s signature), injectable for tests."""

    def __init__(self, path: str, block_size: int, *, direct: bool, pwrite: Callable[[int, memoryview, int], int]):
        self.path = path
        self.block_size = block_size
        self.header_bytes = 2 * block_size
        self.direct = False  # writes go through O_DIRECT
        self.fd = -1
        self._pwrite = pwrite
        self._want_direct = direct
        self._rdirect = False
        self._rfd = -1
        self._old_fds: list[int] = []
        self._lock = threading.Lock()
        self._header_lock = threading.Lock()
        self._header_buf: mmap.mmap | None = None
        self._warned = False

    def open(self, create: bool, missing: Callable[[str], Exception]) -> bool:
        """Open the write and read descriptors; whether the file was created now. ``missing``
        builds the error for a ring that is not there."""
        created = False
        flags = os.O_RDWR | os.O_DSYNC | os.O_CLOEXEC
        if create and not os.path.exists(self.path):
            flags |= os.O_CREAT | os.O_EXCL
            created = True
        try:
            self.fd = self._open_one(flags, write=True)
        except FileNotFoundError:
            raise missing(self.path) from None
        except OSError as e:
            raise WalError(f"{self.path}: cannot open the device ring: {e}") from e
        self._rfd = self._open_one(os.O_RDONLY | os.O_CLOEXEC, write=False)
        return created

    @property
    def closed(self) -> bool:
        return self._rfd < 0

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
                    self.direct = True
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

    def pread_into(self, view: memoryview, offset: int) -> None:
        """Fill ``view`` (aligned memory) from ``offset``; short reads past EOF are errors. A
        direct read the device refuses (EINVAL) is retried once, buffered."""
        try:
            pread_fully(self._rfd, view, offset, self.path)
        except WalError as e:
            cause = e.__cause__
            if not (self._rdirect and isinstance(cause, OSError) and cause.errno == errno.EINVAL):
                raise
            self._reopen_read_buffered()
            pread_fully(self._rfd, view, offset, self.path)

    def _reopen_read_buffered(self) -> None:
        with self._lock:
            if self._rdirect:
                self._old_fds.append(self._rfd)
                self._rfd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
                self._rdirect = False

    def write_at(self, view: memoryview, offset: int, pwrite: Callable[[int, memoryview, int], int] | None = None) -> None:
        """One aligned write of ``view`` at device ``offset``, durable on return (``pwrite``:
        the write call, else the injected one). The whole write in one call first, with no
        loop (every block write of the ring comes here); a short write or one that Direct
        I/O refused goes on in :meth:`_write_from`."""
        pwrite = self._pwrite if pwrite is None else pwrite
        fd = self.fd
        try:
            n = pwrite(fd, view, offset)
        except OSError as e:
            self._refused(fd, e, len(view), offset)
            self._write_from(0, view, offset, pwrite)
            return
        if n != len(view):
            if n <= 0:
                raise WalError(f"{self.path}: write at offset {offset} wrote nothing")
            self._write_from(n, view, offset, pwrite)

    def _write_from(self, done: int, view: memoryview, offset: int,
                    pwrite: Callable[[int, memoryview, int], int]) -> None:
        """The rest of :meth:`write_at` once ``done`` bytes are written (none after a write
        Direct I/O refused fell back to buffered I/O)."""
        size = len(view)
        while done < size:
            fd = self.fd
            try:
                n = pwrite(fd, view[done:] if done else view, offset + done)
            except OSError as e:
                self._refused(fd, e, size - done, offset + done)
                continue
            if n <= 0:
                raise WalError(f"{self.path}: write at offset {offset + done} wrote nothing")
            done += n

    def _refused(self, fd: int, e: OSError, size: int, offset: int) -> None:
        """A write of ``size`` bytes at ``offset`` raised ``e``: writes fall back from Direct I/O
        when the device refused it (EINVAL; the caller writes again), else the typed error."""
        if e.errno == errno.EINVAL and self.direct:
            self._fall_back(fd, e)
            return
        raise WalError(
            f"{self.path}: write of {size} bytes at offset {offset} failed: {e}. "
            "The log is unusable; check the device and reopen to recover."
        ) from e

    def _fall_back(self, fd: int, e: OSError) -> None:
        with self._lock:
            if self.direct and self.fd == fd:
                self._warn_fallback(f"Direct I/O write refused ({e})")
                self._old_fds.append(fd)
                self.fd = os.open(self.path, os.O_RDWR | os.O_DSYNC | os.O_CLOEXEC)
                self.direct = False

    def zero(self, lsn: int, n: int, data_capacity: int, keep: bytes = b"",
             pwrite: Callable[[int, memoryview, int], int] | None = None) -> None:
        """Write zeros over ring bytes [lsn, lsn + n) (block-aligned) of a data area of
        ``data_capacity`` bytes, with ``keep`` written first (to zero the tail of a partly
        valid block); ``pwrite`` as for :meth:`write_at`."""
        with mmap.mmap(-1, ZERO_CHUNK) as buf:
            first = True
            while n > 0:
                phys = lsn % data_capacity
                step = min(n, ZERO_CHUNK, data_capacity - phys)
                if first and keep:
                    buf[: len(keep)] = keep
                self.write_at(memoryview(buf)[:step], self.header_bytes + phys, pwrite)
                if first and keep:
                    buf[: len(keep)] = bytes(len(keep))
                first = False
                lsn += step
                n -= step
            assert lsn % self.block_size == 0

    def write_header(self, hdr: RingHeader) -> None:
        """Write one header copy into its slot (``hdr.seq`` picks it), durably, from one
        reused aligned buffer (a header write every few MiB need not map and unmap one)."""
        with self._header_lock:
            if self._header_buf is None:
                self._header_buf = mmap.mmap(-1, self.block_size)
            buf = self._header_buf
            buf[: SLOT.size + 4] = hdr.pack()
            self.write_at(memoryview(buf), slot_offset(0, self.block_size, hdr.seq))

    def close(self) -> None:
        """Close every descriptor (also what a failed open undoes)."""
        with self._lock:
            for fd in [self.fd, self._rfd, *self._old_fds]:
                if fd >= 0:
                    os.close(fd)
            self.fd = self._rfd = -1
            self._old_fds = []
        with self._header_lock:
            if self._header_buf is not None:
                self._header_buf.close()
                self._header_buf = None
