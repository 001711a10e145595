"""Where a storage node keeps one partition's replica: segment files (the simulations keep
it in memory, tests/support/memory_store.py).

Stores refuse a truncation outside [first record - 1, last record] and a low-water mark
below the stored one (Waltz refuses both): the request path in storage_node.py checks
first and answers BAD_REQUEST; these are the backstop. The layout and recovery rules are
in docs/formats.md, "Storage node layout".
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from array import array
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from sediment._fs import fsync_dir, lock_file, makedirs_durable
from sediment.errors import DataDirLocked, InvalidArgument, WalError, WalMissing
from sediment.wal import log_reader as lr
from sediment.wal import manifest as mf
from sediment.wal import segment as sg
from sediment.wal.control import CONTROL_NAME, ControlFile, PartitionState
from sediment.wal.log_apply import carry_out, create_segment_files
from sediment.wal.log_open import open_replica_manifest
from sediment.wal.preallocation import FileRoom
from sediment.wal.segment_writer import ActiveSegment, Segment, finished_below

log = logging.getLogger(__name__)

DEFAULT_SEGMENT_BYTES = 64 << 20
FIRST_SEGMENT_BYTES = 1 << 20  # a replica's segment is preallocated this far, then in doublings
DEFAULT_CHECKPOINT = 1000  # records between durable ends recorded in the manifest (as FileLog's index interval)


@runtime_checkable
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
        """Append the record frames in ``payload`` (their sizes in ``sizes``) durably; WalError
        unless ``first_lsn == next_lsn``."""
        ...

    def read(self, start: int, max_bytes: int) -> bytes:
        """Whole record frames from ``start`` on, at least one (if any) and about ``max_bytes``."""
        ...

    def truncate(self, lsn: int) -> None:
        """Drop every record with LSN >= ``lsn``, durably. WalError unless ``start_lsn <= lsn
        <= next_lsn``."""
        ...

    def trim_prefix(self, lsn: int) -> None:
        """Records below ``lsn`` are in the engine's batches: the store may drop them (never
        one at or above ``lsn``); ``start_lsn`` says what it kept."""
        ...

    def reset(self, lsn: int) -> None:
        """Drop every record and continue at ``lsn`` (``start_lsn == next_lsn == lsn``), durably."""
        ...

    def close(self) -> None: ...


class FilePartitionStore:
    """One partition's replica in segment files (the WAL's file layout), its manifest and the
    storage directory's control file. It opens and recovers exactly as the local log does
    (log_open, log_reader, log_apply), so damage is refused (the node answers FAILED for the
    partition), never served as a shorter replica. Unlike FileLog it writes no records of its
    own: LSNs are the coordinator's, and every replica must hold the same record at each."""

    blocking = True

    def __init__(self, root: str, partition: int, control: ControlFile, control_lock: threading.Lock,
                 segment_bytes: int = DEFAULT_SEGMENT_BYTES, checkpoint_records: int = DEFAULT_CHECKPOINT) -> None:
        self.root = root
        self.partition = partition
        self.control = control
        self._control_lock = control_lock
        self.cluster_key = control.header.cluster_key
        self.segment_bytes = max(segment_bytes, sg.HEADER_SIZE + 4096)
        self.checkpoint_records = max(1, checkpoint_records)
        self.dir = os.path.join(root, str(partition))
        self._lock = threading.Lock()
        self._segs: list[Segment] = []
        self._active: ActiveSegment | None = None
        self._room: FileRoom | None = None
        self.problems: list[lr.Problem] = []
        with control_lock:
            self._manifest, created = open_replica_manifest(root, partition, control)
            if created:
                control.add_partition(partition)
        if created:
            self._new_segment(0)
            mf.write(root, self._manifest)
        else:
            self._recover()
        self._checkpoint = self.next_lsn

    def _recover(self) -> None:
        """The local log's recovery: plan with the shared reader, refuse on a fatal problem,
        carry out the cuts and deletions, record the durable end reached."""
        m = self._manifest
        plan = lr.plan(self.dir, m)
        if self._interrupted_reset(plan):
            self._new_segment(m.active_first)
            self._segs.clear()
            plan = lr.plan(self.dir, m)
        if plan.fatal:
            raise lr.refusal(self.dir, plan.fatal)
        self.problems = plan.problems
        for p in plan.problems:
            if p.kind != "garbage":
                log.warning("replica %s: %s", self.dir, p.describe())
        carry_out(plan, self.dir, lambda first: self._header(sg.SEG_MAGIC, first), self.segment_bytes)
        for k in plan.segments:
            self._segs.append(Segment.in_dir(self.dir, k.first_lsn, k.offsets, k.end))
        assert plan.manifest is not None
        self._manifest = plan.manifest
        if not self._segs:
            self._new_segment(self._manifest.active_first)
        else:
            self._open_active()
        active = self._segs[-1]
        files = self._files()
        os.ftruncate(files.idx_fd, sg.HEADER_SIZE + 8 * len(active.offsets))
        self._space().reserve(active.end)  # a finished segment made active by a truncation
        os.fsync(files.fd)  # what was read back is now durable, so it may be recorded as the durable end
        self._manifest.active_first = active.first_lsn
        self._manifest.durable_end = max(self._manifest.durable_end, active.next_lsn)
        fsync_dir(self.dir)  # names a killed roll left in the page cache only: the manifest records them now
        mf.write(self.root, self._manifest)

    def _interrupted_reset(self, plan: lr.Plan) -> bool:
        """A reset records its new start in the manifest, then creates the new active segment:
        a crash between leaves the active segment missing with nothing recorded in it."""
        m = self._manifest
        return (len(plan.fatal) == 1 and plan.fatal[0].kind == "missing" and not plan.fatal[0].lost
                and not m.finished and m.durable_end <= m.active_first == m.start_lsn
                and not os.path.exists(os.path.join(self.dir, sg.segment_name(m.active_first))))

    def _header(self, magic: bytes, first: int) -> bytes:
        return sg.SegmentHeader(magic, sg.VERSION, 0, self.cluster_key, self.partition, first, 0).pack()

    def _new_segment(self, first: int) -> None:
        seg = Segment.in_dir(self.dir, first)
        create_segment_files(seg.path, seg.idx_path, self._header(sg.SEG_MAGIC, first),
                             self._header(sg.IDX_MAGIC, first), min(FIRST_SEGMENT_BYTES, self.segment_bytes))
        self._segs.append(seg)
        self._open_active()

    def _open_active(self) -> None:
        if self._active is not None:
            self._active.close()
        self._active = ActiveSegment(self._segs[-1])
        self._new_room()

    def _new_room(self, end: int | None = None) -> None:
        """The active file's room (wal/preallocation.py), preallocated in doublings up to
        ``segment_bytes`` from FIRST_SEGMENT_BYTES: a storage node holds many partitions, most
        of them idle, so none costs a whole segment of disk until it is written that far."""
        at = self._segs[-1].end if end is None else end
        self._room = FileRoom(self._files().fd, at, self.segment_bytes, FIRST_SEGMENT_BYTES)

    def _space(self) -> FileRoom:
        assert self._room is not None, "the store's active segment is open from construction to close"
        return self._room

    def _files(self) -> ActiveSegment:
        assert self._active is not None, "the store's active segment is open from construction to close"
        return self._active

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
            self._roll_over(seg)
            seg = self._segs[-1]
        files = self._files()
        end = seg.end + len(payload)
        room = self._space()
        room.reserve(end)
        zeros = room.pad(seg.end, end)
        files.write([payload] if zeros is None else [payload, zeros], seg.end)
        offs = array("Q")
        pos = seg.end
        for s in sizes:
            offs.append(pos)
            pos += s
        files.add(offs, pos, self._lock)
        if seg.next_lsn - self._checkpoint >= self.checkpoint_records:
            self._record_end()

    def _record_end(self) -> None:
        """The durable end into the manifest (one pwrite, one fdatasync), as the local log's
        index checkpoints do: below it, a missing record is loss, not a torn tail."""
        end = self.next_lsn
        mf.write_end(self.root, self._manifest, end)
        self._checkpoint = end

    def _roll_over(self, old: Segment) -> None:
        """Finish ``old`` (cut to its data) and start the next segment; the manifest records
        the finished one only once the new file is durable, as the local log's rollover does."""
        self._files().finish()
        self._new_segment(old.next_lsn)
        self._manifest.durable_end = max(self._manifest.durable_end, old.next_lsn)
        mf.record_rollover(self.root, self._manifest, mf.FinishedSegment(old.first_lsn, old.next_lsn - 1, old.end))
        self._checkpoint = old.next_lsn

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
        """Drop every record from ``lsn`` on. The manifest is rewritten first with the lower
        end (and the dropped segments out of it); then the later segments are deleted newest
        first and the kept one is cut, so a crash anywhere leaves a log the next open reads
        cleanly: the truncation finished, or not yet begun past its recorded end."""
        check_truncate(lsn, self.start_lsn, self.next_lsn, self.dir)
        if lsn == self.next_lsn:
            return
        n = len(self._segs)
        while n > 1 and self._segs[n - 1].first_lsn >= lsn:
            n -= 1
        seg = self._segs[n - 1]
        m = self._manifest
        m.finished = [f for f in m.finished if f.first_lsn < seg.first_lsn]
        m.active_first = seg.first_lsn
        m.durable_end = lsn
        mf.write(self.root, m)
        with self._lock:
            dropped = self._segs[n:]
            del self._segs[n:]
        for old in reversed(dropped):
            sg.remove_segment_files(self.dir, [old])
        keep = lsn - seg.first_lsn
        cut = seg.offsets[keep] if keep < len(seg.offsets) else seg.end
        self._open_active()
        files = self._files()
        os.ftruncate(files.fd, cut)  # drops the frames; zeros follow, so no stale frame can reappear
        self._new_room(cut)
        os.fsync(files.fd)
        os.ftruncate(files.idx_fd, sg.HEADER_SIZE + 8 * keep)
        os.fsync(files.idx_fd)
        with self._lock:
            del seg.offsets[keep:]
            seg.end = cut
        self._checkpoint = lsn

    def trim_prefix(self, lsn: int) -> None:
        """Drop whole segments whose records all lie below ``lsn`` (never the active one): the
        new start goes into the manifest first, then the files go oldest first, so a crash
        leaves only garbage below the recorded start, never a hole (as FileLog.trim)."""
        with self._lock:
            n = finished_below(self._segs, lsn)
            if n == 0:
                return
            start = self._segs[n].first_lsn
        mf.record_start(self.root, self._manifest, start)
        with self._lock:
            dropped = self._segs[:n]
            del self._segs[:n]
        for old in dropped:
            sg.remove_segment_files(self.dir, [old])

    def reset(self, lsn: int) -> None:
        """Forget every record and continue at ``lsn``: the records below it were trimmed
        from the other replicas (they live in the engine's batches), so this one cannot be
        caught up record by record. The manifest says so first; the old files are then
        garbage below its start."""
        m = self._manifest
        m.start_lsn = m.active_first = lsn
        m.finished = []
        m.durable_end = lsn
        mf.write(self.root, m)
        with self._lock:
            old, self._segs = self._segs, []
        self._files().close()
        sg.remove_segment_files(self.dir, old)
        self._new_segment(lsn)
        self._checkpoint = lsn

    def close(self) -> None:
        files = self._files()
        if files.fd >= 0 and self.next_lsn > self._manifest.durable_end:
            os.fsync(files.fd)
            self._record_end()
        files.close()


def check_truncate(lsn: int, start: int, next_lsn: int, where: str) -> None:
    """A truncation keeps records up to ``lsn - 1``, which must lie in [first - 1, last]: a
    replica cannot keep less than nothing or more than it has (Waltz refuses both)."""
    if not start <= lsn <= next_lsn:
        raise WalError(f"{where}: truncate to keep LSNs below {lsn} is outside [{start}, {next_lsn}] (first "
                       f"record {start}, next {next_lsn}); the coordinator's view of this replica is stale")


LOCK_NAME = "LOCK"


def lock_directory(directory: str) -> int:
    """The storage directory's exclusive lock (an open descriptor, held for the process's
    life), taken before anything in it is read or made: two nodes started on one ``--dir``
    both served it, each appending to the same segment files. DataDirLocked if another
    process holds it; the directory is made if missing (the node's first start would)."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise InvalidArgument(f"storage node --dir {directory} exists and is not a directory; give a directory "
                              "(missing or empty for a new node)")
    makedirs_durable(directory)
    path = os.path.join(directory, LOCK_NAME)
    fd = lock_file(path)
    if fd is None:
        raise DataDirLocked(f"storage node directory {directory} is in use by another process (lock {path}); "
                            "stop that node, or give each node its own --dir")
    return fd


def open_directory(directory: str, cluster_key: uuid.UUID,
                   segment_bytes: int = DEFAULT_SEGMENT_BYTES,
                   checkpoint_records: int = DEFAULT_CHECKPOINT) -> Callable[[int], PartitionStore]:
    """A factory of FilePartitionStores under ``directory``; refuses another cluster's directory.

    A node's storage is created only on its first start: a missing or empty ``directory``
    gets a new control file, which from then on lists the partitions the node holds. A
    directory holding anything else but no control file lost it: WalMissing, naming the file
    (the node must not come back empty and answer as a replica that lost nothing)."""
    ctl_path = os.path.join(directory, CONTROL_NAME)
    leftovers = [n for n in os.listdir(directory) if not n.endswith(".tmp") and n not in ("lost+found", LOCK_NAME)] \
        if os.path.isdir(directory) else []  # an interrupted first start, or a fresh file system's root
    if not os.path.exists(ctl_path) and not leftovers:
        makedirs_durable(directory)
        control = ControlFile.create(directory, cluster_key)
    elif not os.path.exists(ctl_path):
        raise WalMissing(f"storage node directory {directory} holds {', '.join(sorted(leftovers)[:4])} but its "
                         f"control file {ctl_path} is missing: the node cannot tell which partitions and records "
                         "it must hold, so it refuses to start. Restore the control file, or move the directory "
                         "away to start this node empty (the coordinator then catches it up from its peers)",
                         path=ctl_path, reason="control file missing")
    else:
        control = ControlFile.open(directory)
        control.check_cluster(cluster_key)
    lock = threading.Lock()

    def open_store(pid: int) -> PartitionStore:
        return FilePartitionStore(directory, pid, control, lock, segment_bytes, checkpoint_records)

    return open_store
