"""Write paths of the file log's writer thread: vectored buffered writes, and big group
commits written with O_DIRECT from an aligned buffer (the page-cache write path was the
bottleneck for big appends, about 0.6 GB/s against 2 GB/s direct here)."""

from __future__ import annotations

import errno
import logging
import mmap
import os

log = logging.getLogger("sediment.wal.file_log")

_BLOCK = 4096

_IOV_MAX = 1024


def _pwritev_all(fd: int, buffers: list, offset: int) -> None:
    """Write the buffers back to back at ``offset`` without joining them first."""
    for start in range(0, len(buffers), _IOV_MAX):
        chunk = [memoryview(b).cast("B") for b in buffers[start:start + _IOV_MAX]]
        while chunk:
            n = os.pwritev(fd, chunk, offset)
            offset += n
            while chunk and n >= len(chunk[0]):
                n -= len(chunk[0])
                chunk.pop(0)
            if chunk and n:
                chunk[0] = chunk[0][n:]


def _allocate(fd: int, length: int) -> None:
    try:
        os.posix_fallocate(fd, 0, length)
    except OSError:  # file systems without fallocate: growing writes still work
        pass




class DirectWrites:
    """The O_DIRECT half of FileLog (which sets ``_direct_threshold``, ``_direct_fd``,
    ``_direct_buf``, ``_fd`` and ``dir``)."""

    def _open_direct(self, path: str) -> None:
        if self._direct_fd is not None:
            os.close(self._direct_fd)
            self._direct_fd = None
        if not self._direct_threshold or not hasattr(os, "O_DIRECT"):
            return
        try:
            self._direct_fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
        except OSError as exc:
            log.info("O_DIRECT refused for %s (%s); big appends use buffered writes", path, exc)
            self._direct_threshold = None

    def _write_direct(self, buffers: list, base: int, end: int) -> None:
        """One aligned O_DIRECT write of [block start, end): the partial first block is read
        back and rewritten with the same bytes; the last block is padded with zeros, which
        is what lies past the end of the log anyway."""
        start = base - base % _BLOCK
        size = -(-(end - start) // _BLOCK) * _BLOCK
        if self._direct_buf is None or len(self._direct_buf) < size:
            if self._direct_buf is not None:
                self._direct_buf.close()
            self._direct_buf = mmap.mmap(-1, max(size, 1 << 20))  # page-aligned, as O_DIRECT needs
        view = memoryview(self._direct_buf)
        done = 0
        try:
            off = base - start
            if off:
                view[:off] = os.pread(self._fd, off, start)
            for b in buffers:
                m = memoryview(b).cast("B")
                view[off:off + len(m)] = m
                off += len(m)
            view[off:size] = bytes(size - off)
            done = 0
            while done < size:
                done += os.pwrite(self._direct_fd, view[done:size], start + done)
        except OSError as exc:
            if done or exc.errno != errno.EINVAL:
                raise
            log.warning("O_DIRECT write refused for %s (%s); falling back to buffered writes", self.dir, exc)
            self._direct_threshold = None
            _pwritev_all(self._fd, buffers, base)
        finally:
            view.release()

