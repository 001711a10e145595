"""Where a storage node keeps one partition's replica: segment files, or memory (simulations).

:class:`FilePartitionStore` keeps the WAL's file layout (``<dir>/<partition>/<first
LSN>.seg``/``.idx``, record frames of wal/record.py) and the partition's state in the
storage directory's control file; :class:`MemoryPartitionStore` keeps frames in a list
for deterministic simulations. Both refuse a truncation outside [first record - 1, last
record] and a low-water mark below the stored one (Waltz refuses both): the request
path in wal/storage_node.py checks first and answers BAD_REQUEST; these are the backstop.
"""

from __future__ import annotations

import os
import threading
from array import array
from dataclasses import dataclass, field
from typing import Protocol

from sediment._fs import makedirs_durable
from sediment._fs import pwrite_all as _pwrite_all
from sediment.errors import LowWaterMarkRegression, WalCorruption, WalError
from sediment.wal import segment as sg
from sediment.wal.control import ControlFile, PartitionState, fsync_dir

DEFAULT_SEGMENT_BYTES = 64 << 20


class PartitionStore(Protocol):
    """Where one partition's replica lives. ``blocking``: its calls wait for the disk, so they
    run in the partition's writer thread (and READs in a worker thread); otherwise they run
    at once in the trio thread."""

    blocking: bool

    @property
    def next_lsn(self) -> int: ...

    @property
    def start_lsn(self) -> int: ...

    def read_state(self) -> PartitionState: ...

    def write_state(self, state: PartitionState) -> None: ...

    def write(self, payload: bytes, first_lsn: int, sizes: list[int]) -> None:
        """Append the record frames in ``payload`` (their sizes in ``sizes``) durably."""
        ...

    def read(self, start: int, max_bytes: int) -> bytes:
        """Whole record frames from ``start`` on, at least one (if any) and about ``max_bytes``."""
        ...

    def truncate(self, lsn: int) -> None:
        """Drop every record with LSN >= ``lsn``, durably."""
        ...

    def close(self) -> None: ...


@dataclass
class _Seg:
    first_lsn: int
    path: str
    idx_path: str
    offsets: array = field(default_factory=lambda: array("Q"))
    end: int = sg.HEADER_SIZE

    @property
    def next_lsn(self) -> int:
        return self.first_lsn + len(self.offsets)


class FilePartitionStore:
    """One partition's replica in segment files (the WAL's file layout) plus the control file.

    Unlike FileLog it never writes records of its own (no FRONTIERS at segment ends):
    LSNs are the coordinator's, and every replica must hold the same record at each.
    """

    blocking = True

    def __init__(self, root: str, partition: int, control: ControlFile, control_lock: threading.Lock,
                 segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
        self.root = root
        self.partition = partition
        self.control = control
        self._control_lock = control_lock
        self.cluster_key = control.header.cluster_key
        self.segment_bytes = max(segment_bytes, sg.HEADER_SIZE + 4096)
        self.dir = os.path.join(root, str(partition))
        makedirs_durable(self.dir)
        self._lock = threading.Lock()
        self._segs: list[_Seg] = []
        self._fd = -1
        self._idx_fd = -1
        self._recover()

    def _recover(self) -> None:
        firsts = sorted(p[0] for name in os.listdir(self.dir) if (p := sg.parse_name(name)) and p[1] == "seg")
        for i, first in enumerate(firsts):
            path = os.path.join(self.dir, sg.segment_name(first))
            scan = sg.scan_segment(path, first)
            last = i == len(firsts) - 1
            if not scan.clean:
                if not last or scan.valid_after_bad:
                    raise WalCorruption(f"replica segment {path} is damaged at offset {scan.bad_offset} "
                                        f"({scan.reason}); move the partition directory away and let the "
                                        "coordinator catch this replica up from its peers",
                                        path=path, offset=scan.bad_offset, reason=scan.reason)
                fd = os.open(path, os.O_RDWR)
                try:
                    os.ftruncate(fd, scan.bad_offset)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            if self._segs and first != self._segs[-1].next_lsn:
                raise WalCorruption(f"replica segment {path} starts at LSN {first} but the previous one ends "
                                    f"before {self._segs[-1].next_lsn}; move the partition directory away",
                                    path=path, offset=0, reason="gap")
            self._segs.append(_Seg(first, path, os.path.join(self.dir, sg.index_name(first)), scan.offsets,
                                   scan.end))
        if not self._segs:
            self._new_segment(0)
        else:
            self._open_active()

    def _header(self, magic: bytes, first: int) -> bytes:
        return sg.SegmentHeader(magic, sg.VERSION, 0, self.cluster_key, self.partition, first, 0).pack()

    def _new_segment(self, first: int) -> None:
        seg = _Seg(first, os.path.join(self.dir, sg.segment_name(first)), os.path.join(self.dir, sg.index_name(first)))
        for path, magic in ((seg.path, sg.SEG_MAGIC), (seg.idx_path, sg.IDX_MAGIC)):
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                if magic == sg.SEG_MAGIC:
                    try:
                        os.posix_fallocate(fd, 0, self.segment_bytes)
                    except OSError:
                        pass
                _pwrite_all(fd, self._header(magic, first), 0)
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(self.dir)
        self._segs.append(seg)
        self._open_active()

    def _open_active(self) -> None:
        for fd in (self._fd, self._idx_fd):
            if fd >= 0:
                os.close(fd)
        seg = self._segs[-1]
        self._fd = os.open(seg.path, os.O_RDWR)
        self._idx_fd = os.open(seg.idx_path, os.O_RDWR | os.O_CREAT, 0o644)

    @property
    def next_lsn(self) -> int:
        return self._segs[-1].next_lsn

    @property
    def start_lsn(self) -> int:
        return self._segs[0].first_lsn

    def read_state(self) -> PartitionState:
        with self._control_lock:
            return self.control.read_state(self.partition)

    def write_state(self, state: PartitionState) -> None:
        with self._control_lock:
            self.control.write_state(self.partition, state)

    def write(self, payload: bytes, first_lsn: int, sizes: list[int]) -> None:
        seg = self._segs[-1]
        if first_lsn != seg.next_lsn:
            raise WalError(f"replica {self.dir}: write at LSN {first_lsn}, next is {seg.next_lsn}")
        if seg.end > sg.HEADER_SIZE and seg.end + len(payload) > self.segment_bytes:
            os.ftruncate(self._fd, seg.end)
            os.fsync(self._fd)
            os.fsync(self._idx_fd)
            self._new_segment(seg.next_lsn)
            seg = self._segs[-1]
        _pwrite_all(self._fd, payload, seg.end)
        os.fdatasync(self._fd)
        offs = array("Q")
        pos = seg.end
        for s in sizes:
            offs.append(pos)
            pos += s
        _pwrite_all(self._idx_fd, offs.tobytes(), sg.HEADER_SIZE + 8 * len(seg.offsets))
        with self._lock:
            seg.offsets.extend(offs)
            seg.end = pos

    def read(self, start: int, max_bytes: int) -> bytes:
        with self._lock:
            for seg in self._segs:
                if seg.first_lsn <= start < seg.next_lsn:
                    break
            else:
                return b""
            i = start - seg.first_lsn
            begin = seg.offsets[i]
            end = begin
            j = i
            while j < len(seg.offsets):
                stop = seg.offsets[j + 1] if j + 1 < len(seg.offsets) else seg.end
                if end > begin and stop - begin > max_bytes:
                    break
                end = stop
                j += 1
            path = seg.path
        with open(path, "rb") as f:
            f.seek(begin)
            return f.read(end - begin)

    def truncate(self, lsn: int) -> None:
        check_truncate(lsn, self.start_lsn, self.next_lsn, self.dir)
        if lsn == self.next_lsn:
            return
        while len(self._segs) > 1 and self._segs[-1].first_lsn >= lsn:
            seg = self._segs.pop()
            for path in (seg.path, seg.idx_path):
                os.unlink(path)
        seg = self._segs[-1]
        keep = lsn - seg.first_lsn
        cut = seg.offsets[keep] if keep < len(seg.offsets) else seg.end
        self._open_active()
        os.ftruncate(self._fd, cut)  # drops the frames; zeros follow, so no stale frame can reappear
        try:
            os.posix_fallocate(self._fd, 0, max(self.segment_bytes, cut))
        except OSError:
            pass
        os.fsync(self._fd)
        os.ftruncate(self._idx_fd, sg.HEADER_SIZE + 8 * keep)
        os.fsync(self._idx_fd)
        fsync_dir(self.dir)
        with self._lock:
            del seg.offsets[keep:]
            seg.end = cut

    def trim_prefix(self, lsn: int) -> None:
        """Drop whole segments whose records all lie below ``lsn`` (never the active one)."""
        dropped = []
        with self._lock:
            while len(self._segs) > 1 and self._segs[0].next_lsn <= lsn:
                dropped.append(self._segs.pop(0))
        sg.remove_segment_files(self.dir, dropped)

    def reset(self, lsn: int) -> None:
        """Forget every record and continue at ``lsn``: the records below it were trimmed
        from the other replicas (they live in the engine's batches), so this one cannot be
        caught up record by record."""
        with self._lock:
            old, self._segs = self._segs, []
        for fd in (self._fd, self._idx_fd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._idx_fd = -1
        sg.remove_segment_files(self.dir, old)
        self._new_segment(lsn)

    def close(self) -> None:
        for fd in (self._fd, self._idx_fd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._idx_fd = -1


class MemoryPartitionStore:
    """A replica kept in memory: for deterministic simulations (everything is durable at once)."""

    blocking = False

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.state = PartitionState()

    @property
    def next_lsn(self) -> int:
        return len(self.frames)

    @property
    def start_lsn(self) -> int:
        return 0

    def read_state(self) -> PartitionState:
        return self.state

    def write_state(self, state: PartitionState) -> None:
        if (state.low_water_mark < self.state.low_water_mark
                or state.local_low_water_mark < self.state.local_low_water_mark):
            raise LowWaterMarkRegression(f"memory replica: low-water marks {state} below the stored {self.state}")
        self.state = PartitionState(state.session_id, state.low_water_mark, state.local_low_water_mark,
                                    self.state.sequence + 1)

    def write(self, payload: bytes, first_lsn: int, sizes: list[int]) -> None:
        assert first_lsn == len(self.frames)
        pos = 0
        for s in sizes:
            self.frames.append(payload[pos:pos + s])
            pos += s

    def read(self, start: int, max_bytes: int) -> bytes:
        out = bytearray()
        for f in self.frames[start:]:
            if out and len(out) + len(f) > max_bytes:
                break
            out += f
        return bytes(out)

    def trim_prefix(self, lsn: int) -> None:
        """Simulations keep everything (trimming only saves space)."""

    def reset(self, lsn: int) -> None:
        raise WalError("an in-memory replica never trims, so it is never reset")

    def truncate(self, lsn: int) -> None:
        check_truncate(lsn, self.start_lsn, self.next_lsn, "memory replica")
        del self.frames[lsn:]

    def close(self) -> None:
        pass


def check_truncate(lsn: int, start: int, next_lsn: int, where: str) -> None:
    """A truncation keeps records up to ``lsn - 1``, which must lie in [first - 1, last]: a
    replica cannot keep less than nothing or more than it has (Waltz refuses both)."""
    if not start <= lsn <= next_lsn:
        raise WalError(f"{where}: truncate to keep LSNs below {lsn} is outside [{start}, {next_lsn}] (first "
                       f"record {start}, next {next_lsn}); the coordinator's view of this replica is stale")
