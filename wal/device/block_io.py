"""Raw I/O of the device ring: aligned reads and writes (Direct I/O, falling back to
buffered O_DSYNC when the device refuses it), zeroing, and the header copies. A mixin of
:class:`sediment.wal.device.log.DeviceLog`, kept apart so the log's own module stays readable;
it uses the log's attributes (``path``, ``block_size``, ``_fd`` ...) set in its ``__init__``."""

from __future__ import annotations

import errno
import logging
import mmap
import os

from sediment.errors import EngineClosed, WalError
from sediment.wal.device.format import SHUTDOWN_RUNNING, SLOT, ZERO_CHUNK, RingHeader
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


class RingIO:
    """Aligned I/O on the ring's file descriptors (see DeviceLog)."""

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

    # ---------------------------------------------------------------- raw I/O

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
        with self._fd_lock:
            if self._rdirect:
                self._old_fds.append(self._rfd)
                self._rfd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
                self._rdirect = False

    def write_at(self, view: memoryview, offset: int) -> None:
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
                self.write_at(memoryview(buf)[:step], self.header_bytes + phys)
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
                self.write_at(memoryview(buf), slot_offset(0, self.block_size, hdr.seq))
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

    def close_fds(self) -> None:
        """Close every descriptor of the ring (also what a failed open undoes)."""
        with self._hdr_lock, self._fd_lock:
            for fd in [self._fd, self._rfd, *self._old_fds]:
                if fd >= 0:
                    os.close(fd)
            self._fd = self._rfd = -1
            self._old_fds = []
        for b in self._pool:
            b.close()
        self._pool = []
