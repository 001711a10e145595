"""The file-segment log: one partition directory of ``.seg``/``.idx`` files, group-committed.

Appenders queue their records and wait; the first waiter finding the log idle leads
(wal/group_commit.py): it takes everything queued, writes it with one ``pwrite`` and
one fdatasync in its own thread, and only then wakes the others: concurrent appends
share one sync, none is acknowledged before its bytes are durable, and a lone appender
hands nothing to another thread. Finishing a segment runs on a background thread.
Appends submitted as joinable (``submit_joinable``) that stand next to each other in a
group are written as one record (wal/group_records.py).

A segment is finished when it grows past ``segment_bytes``: a FRONTIERS record
ends it, the file is cut to its data, and the next segment begins with the same
kind of record, so each segment starts and ends with a progress record (the
Materialize design). The log does not read those bodies: the owner's preamble
(protocol.SegmentPreamble; the engine's says every relation's sealed frontier)
supplies them and sees every record written. Segments are preallocated:
fdatasync on a growing file measured about 1.8x slower here. A new log's first
segment starts at FIRST_SEGMENT_BYTES and its preallocation doubles as it fills, so
an empty data directory does not hold 64 MiB of zeros; later segments are
preallocated whole.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import os
import struct
import threading
import time
import uuid
from array import array
from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa

from sediment._fs import pwrite_all as _pwrite_all
from sediment.arrow_codec import is_group_body
from sediment.errors import InvalidArgument, WalCorruption, WalError
from sediment.wal import log_reader as lr
from sediment.wal import manifest as mf
from sediment.wal import record as rec
from sediment.wal import segment as sg
from sediment.wal.control import PartitionState
from sediment.wal.direct_io import DirectWriter, pwritev_all
from sediment.wal.group_commit import GroupAppend, GroupCommit
from sediment.wal.group_records import MAX_JOINED_BODY, encode_alone, join_group, settle_joined
from sediment.wal.log_apply import carry_out, create_segment_files, record_open
from sediment.wal.log_open import open_control_and_manifest
from sediment.wal.preallocation import FileRoom
from sediment.wal.protocol import NO_PREAMBLE, OpenReport, SegmentPreamble, check_trim, notify
from sediment.wal.recycle import SegmentPool, reuse_segment_file
from sediment.wal.segment_writer import ActiveSegment, Segment, finished_below, rewrite_index

log = logging.getLogger(__name__)

DEFAULT_SEGMENT_BYTES = 64 << 20
FIRST_SEGMENT_BYTES = 1 << 20  # a new log's first segment is preallocated this far, then in doublings
DEFAULT_INDEX_INTERVAL = 1000
DEFAULT_DIRECT_THRESHOLD = 1 << 20
_UPDATES = rec.RecordKind.UPDATES
_END_MARK, _END_LEN = sg.END_MARK, len(sg.END_MARK)


class FileLog:
    """A WriteAheadLog over segment files. Create with :meth:`open`."""

    def __init__(self) -> None:
        raise TypeError("use FileLog.open(directory, ...)")

    @classmethod
    def open(
        cls,
        directory: str,
        *,
        partition: int = 0,
        cluster_key: uuid.UUID | None = None,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        index_interval: int = DEFAULT_INDEX_INTERVAL,
        repair: bool = False,
        create: bool = False,
        direct_threshold: int | None = DEFAULT_DIRECT_THRESHOLD,
        keep_recovered: bool = False,
    ) -> FileLog:
        """Open the log of ``partition`` under ``directory``.

        Creating a log is explicit: with ``create`` a directory holding no log gets a new
        one; without it (and whenever any part of a log exists) the log must be whole.
        Every record is verified against the manifest (wal/log_reader.py): a torn tail
        past the recorded durable end is cut and reported in ``report``; a missing or
        shortened file raises WalMissing and damage raises WalCorruption unless
        ``repair`` is set, in which case every readable record is kept, the loss is
        reported in ``problems`` and appends resume past it.

        Group commits of at least ``direct_threshold`` bytes are written with O_DIRECT
        (wal/direct_io.py); None disables it.

        ``keep_recovered``: keep what open verified for one call of :meth:`recovered` (the
        engine replays it instead of reading the log a second time).
        """
        self = object.__new__(cls)
        self._keep_recovered = keep_recovered
        self._direct = DirectWriter(direct_threshold, os.path.join(directory, str(partition)))
        limit = self._direct.threshold  # _write_one takes bodies below O_DIRECT's size and 64 KiB
        self._one_max = 65536 if limit is None else max(0, min(65536, limit - rec.HEADER_SIZE))
        self._init(directory, partition, cluster_key, segment_bytes, index_interval, repair, create)
        return self

    def _init(self, directory, partition, cluster_key, segment_bytes, index_interval, repair, create) -> None:
        self.root = directory
        self.partition = partition
        self.segment_bytes = max(segment_bytes, sg.HEADER_SIZE + 4096)
        self.index_interval = max(1, index_interval)
        self.report = OpenReport()
        self.dir = os.path.join(directory, str(partition))
        self._where = f"the write-ahead log at {self.dir}"  # for refusals; built once, not per append
        self._preamble: SegmentPreamble = NO_PREAMBLE
        self._segments: list[Segment] = []
        self._lock = threading.Lock()  # what readers see: the segments and their offsets
        self._trim_lock = threading.Lock()  # one trim at a time: manifest first, then files oldest first
        self._mlock = threading.Lock()  # every manifest write
        self._closed = False
        self._listener: Callable[[int], None] | None = None
        self._read_fds: dict[str, int] = {}
        self.control, manifest, how = open_control_and_manifest(directory, partition, cluster_key,
                                                                create=create, repair=repair)
        self.cluster_key = self.control.header.cluster_key
        self.created = how == "new"
        self._pool = SegmentPool(self.dir, self.segment_bytes)
        plan = lr.Plan(manifest=manifest) if self.created else \
            lr.plan(self.dir, manifest, repair=repair, rebuilt=how == "rebuilt", keep_heads=self._keep_recovered)
        self._recovered = [(k.heads, k.bodies) for k in plan.segments] if self._keep_recovered else None
        self._apply(plan, repair, manifest if how == "read" else None)
        state = self.control.read_state(partition)
        last = self._segments[-1].next_lsn - 1
        if state.session_id == 0 or (state.low_water_mark, state.local_low_water_mark) != (last, last):
            self.control.write_state(partition, PartitionState(state.session_id + 1, last, last), rewind=True)
        self._group = GroupCommit(self.dir, self._write_group, self._background,
                                  lambda: self._segments[-1].end >= self.segment_bytes, f"wal-finisher-{partition}")

    # --- recovery ------------------------------------------------------------------------------

    def recovered(self) -> Iterator[rec.Record] | None:
        """Every record this open read and verified, in log order (UPDATES without their
        bodies: see record.HeadRecord), once; None when not kept or already taken. The
        engine applies these at open, so the log is read and checksummed once."""
        segments, self._recovered = self._recovered, None
        if segments is None:
            return None
        return itertools.chain.from_iterable(rec.head_records(heads, bodies) for heads, bodies in segments)

    def _apply(self, plan: lr.Plan, repair: bool, found: mf.Manifest | None) -> None:
        """Carry out what the shared reader (wal/log_reader.py) decided: refuse on a fatal
        problem unless repairing, else delete garbage, make the cuts, record the manifest.
        ``found``: the manifest as read from its file (None: new or rebuilt)."""
        self.problems = plan.problems
        fatal = plan.fatal
        if fatal and not repair:
            raise lr.refusal(self.dir, fatal)
        for p in plan.problems:
            if p.kind != "stray":
                self.report.torn_tails.append((p.path, max(p.offset, 0), p.dropped_bytes, f"{p.kind}: {p.reason}"))
            if p.fatal or p.kind != "garbage":
                log.warning("%s", p.describe())
        self.preserved = carry_out(plan, self.dir, lambda first: self._header(sg.SEG_MAGIC, first),
                                   self.segment_bytes)
        for k in plan.segments:
            self._segments.append(Segment.in_dir(self.dir, k.first_lsn, k.offsets, k.end))
            self.report.records += len(k.offsets)
        self._manifest = plan.manifest
        done = {f.first_lsn for f in plan.manifest.finished}
        if plan.new_active is not None or not self._segments:
            self._create_segment(plan.new_active if plan.new_active is not None else plan.manifest.active_first)
        elif self._segments[-1].first_lsn in done:  # a finished file is never grown as the active one
            self._create_segment(self._segments[-1].next_lsn)
        for seg in self._segments:
            self._rebuild_index(seg)
        active = self._segments[-1]
        self._active = ActiveSegment(active)
        self._direct.open(active.path)
        self._room = FileRoom(self._active.fd, active.end, self.segment_bytes, FIRST_SEGMENT_BYTES)
        self._idx_checkpoint = len(active.offsets)
        record_open(self.root, plan, found, active, self._active.fd, repair)

    def _rebuild_index(self, seg: Segment) -> None:
        header, entries = sg.read_index(seg.idx_path)
        trusted = 0
        if header is not None and header.first_lsn == seg.first_lsn and len(entries) <= len(seg.offsets) \
                and entries == seg.offsets[:len(entries)]:
            trusted = len(entries)  # else missing, or disagrees with the data: rebuilt whole
        missing = len(seg.offsets) - trusted
        if missing == 0 and header is not None and header.checkpoint == len(seg.offsets):
            return
        self.report.rebuilt_index_entries += missing
        rewrite_index(seg, trusted, self._header(sg.IDX_MAGIC, seg.first_lsn, len(seg.offsets)), header is None)

    def _header(self, magic: bytes, first: int, checkpoint: int = 0, flags: int = 0) -> bytes:
        return sg.SegmentHeader(magic, sg.VERSION, time.time_ns(), self.cluster_key, self.partition, first,
                                checkpoint, flags).pack()

    def _create_segment(self, first: int) -> Segment:
        seg = Segment.in_dir(self.dir, first)
        pooled = self._pool.take()
        if pooled is None:
            create_segment_files(seg.path, seg.idx_path, self._header(sg.SEG_MAGIC, first), self._header(
                sg.IDX_MAGIC, first), self.segment_bytes if self._segments else min(FIRST_SEGMENT_BYTES, self.segment_bytes))
        else:
            reuse_segment_file(pooled, seg.path, seg.idx_path, self._header(sg.SEG_MAGIC, first, flags=sg.FLAG_RECYCLED),
                               self._header(sg.IDX_MAGIC, first), self.segment_bytes)
        self._segments.append(seg)
        return seg

    # --- writing -------------------------------------------------------------------------------

    def append(self, records: Sequence[rec.Record]) -> int:
        return self.submit(records).wait()

    def submit(self, records: Sequence[rec.Record],
               on_durable: Callable[[Sequence[rec.Record]], None] | None = None) -> GroupAppend:
        """Queue ``records`` and return a ticket whose ``wait()`` returns once they are durable.

        Queue order is log order, so a caller holding its own lock while submitting gets
        its check-then-append atomic without holding that lock through the fdatasync.
        ``on_durable(records)`` runs right after the sync (on the leader's thread), in log
        order, before any waiter wakes. Only queues: the records are written when a caller
        waits (this one or a later one), or at ``finish_segment`` or ``close``.
        """
        rec.check_appendable(records, self._where)
        crc = rec.crc32c_raw
        crcs = [crc(records[0].body)] if len(records) == 1 else [crc(r.body) for r in records]
        return self._group.submit(GroupAppend(self._group, records, crcs, on_durable))

    def submit_joinable(self, record: rec.Record, on_durable: Callable[[Sequence[rec.Record]], None] | None = None,
                        max_body: int = MAX_JOINED_BODY, table: pa.Table | None = None,
                        size: int = 0) -> GroupAppend:
        """:meth:`submit` of one plain UPDATES record (txn 0, a plain body) that may be
        written joined with the neighbouring joinable records of its group of the same
        relation, schema version and callback: one record whose group body holds theirs in
        queue order (wal/group_records.py), of at most ``max_body`` bytes (the engine's
        ``max_record_bytes``), given to ``on_durable`` as one record. Every ticket of a
        joined record gets its LSN.

        With ``table`` (the record's rows, already checked, in the relation's update schema
        of the record's version; the record's body empty) and ``size`` (a bound on its
        body), the body is left to the leader: a run of such appends becomes one record
        with one plain body of all their rows in queue order, an append alone its own."""
        if table is not None:
            if record.kind != rec.RecordKind.UPDATES or record.txn_id or record.body or not 0 < size <= max_body:
                raise InvalidArgument(f"{self._where}: a record whose body the log encodes must be a plain UPDATES "
                                      f"record with an empty body and a size bound of 1-{max_body} bytes, not "
                                      f"{record.kind!r}, txn {record.txn_id}, {len(record.body)}-byte body, "
                                      f"bound {size}; nothing was appended")
            rec.check_appendable((record,), self._where)
            p = GroupAppend(self._group, (record,), [], on_durable, min(max_body, MAX_JOINED_BODY))
            p.table = table
            p.size = size
            return self._group.submit(p)
        rec.check_appendable((record,), self._where)
        if record.kind != rec.RecordKind.UPDATES or record.txn_id or is_group_body(record.body):
            return self.submit((record,), on_durable)
        return self._group.submit(GroupAppend(self._group, (record,), [rec.crc32c_raw(record.body)], on_durable,
                                              min(max_body, MAX_JOINED_BODY)))

    def lead_lone(self, record: rec.Record) -> bytes | None:
        """Under the caller's lock (the one its submits are made under): when the log is idle,
        take the lead for ``record`` and return its frame header (its LSN set); the caller
        must then write it with :meth:`write_lone`. None, with nothing changed, when the log
        is busy, closed or failed, or the record is not a small plain UPDATES record the frame
        can carry (the caller then submits, and :meth:`submit` refuses what it cannot carry).
        Why: wal/group_commit.py ``lead_idle``; packing the header here, where the LSN is
        fixed, is also the range check of the record's fields."""
        if record.kind != _UPDATES or len(record.body) >= self._one_max or not self._group.lead_idle():
            return None
        try:
            lsn = self._segments[-1].next_lsn
            header = rec.encode_header(record, lsn, rec.crc32c_raw(record.body))
        except BaseException as exc:  # a field out of range (submit's check says which), or Ctrl-C: no lead kept
            self._group.drop_lead()
            if isinstance(exc, (struct.error, TypeError, ValueError)):
                return None
            raise
        record.lsn = lsn
        return header

    def write_lone(self, record: rec.Record, header: bytes,
                   on_durable: Callable[[Sequence[rec.Record]], None] | None) -> None:
        """With the lead and the ``header`` from :meth:`lead_lone`: write and sync ``record``
        (``on_durable`` called with it, as for :meth:`submit`), then end the lead. Returns
        once it is durable; raises WalError, with the log failed, if the write failed."""
        try:
            self._write_one(record, header, on_durable)
        except BaseException as exc:  # noqa: BLE001 - the log fails, as after a failed group
            raise self._group.fail_lead(exc) from exc
        self._group.end_lead(self._segments[-1].end >= self.segment_bytes)

    def drop_lone(self) -> None:
        """Give back a lead from :meth:`lead_lone` whose record was not written (the caller was
        interrupted before :meth:`write_lone` took it over); nothing if this thread holds none."""
        self._group.drop_lead()

    def _write_group(self, batch: list[GroupAppend]) -> None:
        """The group commit's write: one small record by :meth:`_write_one`, else :meth:`_write_batch`."""
        if len(batch) != 1 or len(batch[0].records) != 1:
            self._write_batch(batch)
            return
        p = batch[0]
        if p.table is not None:
            encode_alone(p)
        r = p.records[0]
        if len(r.body) >= self._one_max:
            self._write_batch(batch)
            return
        r.lsn = p.last_lsn = self._segments[-1].next_lsn
        self._write_one(r, rec.encode_header(r, r.lsn, p.crcs[0]), p.on_durable)

    def _write_one(self, r: rec.Record, header: bytes, on_durable: Callable[[Sequence[rec.Record]], None] | None) -> None:
        """One record below ``_one_max`` (its LSN set, ``header`` its frame header) without
        :meth:`_write_batch`'s lists: frame and end mark in one ``pwrite``, one fdatasync, then
        the offset and the callback. In one method: each frame on a lone append's path is room
        on the interpreter's frame stack, and a call that crosses the end of one of its 16 KiB
        chunks allocates and frees a chunk each time (bench/caller_depth.py)."""
        seg = self._segments[-1]
        pos = seg.end
        data = header + r.body + _END_MARK
        end = pos + len(data) - _END_LEN
        fd = self._active.fd
        room = self._room
        if end + _END_LEN > room.written:  # preallocate, or zeros ahead (wal/preallocation.py)
            room.reserve(end + _END_LEN)
            pwritev_all(fd, [data, room.pad(pos, end + _END_LEN) or b""], pos)
        else:  # one pwrite, more only if it comes back short
            n = os.pwrite(fd, data, pos)
            if n != len(data):
                _pwrite_all(fd, memoryview(data)[n:], pos + n)
        os.fdatasync(fd)
        records = (r,)
        self._preamble.observe(records)
        with self._lock:
            seg.offsets.append(pos)
            seg.end = end
        if len(seg.offsets) - self._idx_checkpoint >= self.index_interval:
            self._checkpoint_index(seg)
        if on_durable is not None:
            on_durable(records)

    def _write_batch(self, batch: list[GroupAppend]) -> None:
        joined = None
        if len(batch) > 1:
            batch, joined = join_group(batch)
        elif len(batch) == 1 and batch[0].table is not None:
            encode_alone(batch[0])
        seg = self._segments[-1]
        buffers: list = []
        offsets = []
        lsn = seg.next_lsn
        base = pos = seg.end
        small = bytearray()  # headers and small bodies are joined; large bodies are written in place
        header = rec.encode_header
        for p in batch:
            records = p.records
            for r, crc in zip(records, p.crcs, strict=True):
                r.lsn = lsn
                offsets.append(pos)
                small += header(r, lsn, crc)
                body = r.body
                size = len(body)
                if size >= 65536:
                    buffers.append(bytes(small))
                    small = bytearray()
                    buffers.append(body)
                elif size:
                    small += body
                pos += rec.HEADER_SIZE + size
                lsn += 1
            p.last_lsn = lsn - 1
        if joined:
            settle_joined(joined)
        small += sg.END_MARK  # overwritten by the next group; in a recycled file it marks the end
        buffers.append(small)
        room = self._room
        room.reserve(pos + _END_LEN)
        if self._direct.takes(pos - base):
            self._direct.write(self._active.fd, buffers, base, pos + _END_LEN)
            room.wrote(pos + _END_LEN)
            os.fdatasync(self._active.fd)
        else:
            zeros = room.pad(base, pos + _END_LEN)
            if zeros is not None:
                buffers.append(zeros)
            self._active.write(buffers, base)
        if len(batch) == 1:  # a lone writer's group: its own records, no lists to build
            every = batch[0].records
            self._preamble.observe(every)
            self._commit_offsets(seg, offsets, pos)
            if batch[0].on_durable is not None and every:
                batch[0].on_durable(every)
            return
        self._preamble.observe([r for p in batch for r in p.records])
        self._commit_offsets(seg, offsets, pos)
        callbacks: dict = {}  # one call per callback per group commit, records in log order
        for p in batch:
            if p.on_durable is not None and p.records:
                callbacks.setdefault(p.on_durable, []).extend(p.records)
        for callback, records in callbacks.items():
            callback(records)

    def _commit_offsets(self, seg: Segment, offsets: list[int], end: int) -> None:
        """Index entries go to the file at each checkpoint only (one pwrite per group fewer):
        the index is synced only there, and an open rebuilds entries past its checkpoint."""
        self._active.add(array("Q", offsets), end, self._lock, index=False)
        if len(seg.offsets) - self._idx_checkpoint >= self.index_interval:
            self._checkpoint_index(seg)

    def _checkpoint_index(self, seg: Segment) -> None:
        idx_fd = self._active.idx_fd
        self._active.write_index(self._idx_checkpoint)
        os.fdatasync(idx_fd)
        _pwrite_all(idx_fd, self._header(sg.IDX_MAGIC, seg.first_lsn, len(seg.offsets)), 0)
        os.fdatasync(idx_fd)
        self._idx_checkpoint = len(seg.offsets)
        with self._mlock:
            mf.write_end(self.root, self._manifest, seg.next_lsn)

    def _boundary(self) -> GroupAppend:
        """The boundary record (the owner's FRONTIERS record, see protocol.SegmentPreamble)."""
        r = self._preamble.record()
        return GroupAppend(None, [r], [rec.crc32c(r.body)])

    def _background(self, requested: bool) -> None:
        """With the lead, off the callers' threads: finish the active segment when asked or full."""
        if requested or self._segments[-1].end >= self.segment_bytes:
            self._finish_active()

    def _finish_active(self) -> None:
        old = self._segments[-1]
        if len(old.offsets) == 0 or (len(old.offsets) == 1 and old.first_lsn > 0 and self._only_frontiers(old)):
            return
        self._write_group([self._boundary()])
        self._checkpoint_index(old)
        self._active.finish()
        with self._lock:
            new = self._create_segment(old.next_lsn)
        with self._mlock:  # recorded only once the new segment's file is durable
            mf.record_rollover(self.root, self._manifest, mf.FinishedSegment(old.first_lsn, old.next_lsn - 1, old.end))
        self._active = ActiveSegment(new)
        self._room = FileRoom(self._active.fd, new.end, self.segment_bytes)
        self._direct.open(new.path)
        self._idx_checkpoint = 0
        self._write_group([self._boundary()])
        notify([self._listener], new.first_lsn, "segment-finish listener")

    def _only_frontiers(self, seg: Segment) -> bool:
        return self.read(seg.first_lsn).kind == rec.RecordKind.FRONTIERS

    def finish_segment(self) -> None:
        self._group.run_background()

    def set_finish_listener(self, callback: Callable[[int], None] | None) -> None:
        self._listener = callback

    # --- reading -------------------------------------------------------------------------------

    @property
    def end_lsn(self) -> int:
        with self._lock:
            return self._segments[-1].next_lsn

    @property
    def finished_lsn(self) -> int:
        with self._lock:
            return self._segments[-1].first_lsn

    def set_preamble(self, preamble: SegmentPreamble | None) -> None:
        self._preamble = NO_PREAMBLE if preamble is None else preamble

    def _segment_for(self, lsn: int) -> Segment:
        with self._lock:
            firsts = [s.first_lsn for s in self._segments]
            i = bisect.bisect_right(firsts, lsn) - 1
            if i < 0 or lsn >= self._segments[i].next_lsn:
                raise WalError(f"LSN {lsn} is not in the log at {self.dir} (it holds "
                               f"[{firsts[0]}, {self._segments[-1].next_lsn}))")
            return self._segments[i]

    def _read_fd(self, path: str) -> int:
        with self._lock:
            fd = self._read_fds.get(path)
            if fd is None:
                fd = self._read_fds[path] = os.open(path, os.O_RDONLY)
            return fd

    def read(self, lsn: int) -> rec.Record:
        seg = self._segment_for(lsn)
        offset = seg.offsets[lsn - seg.first_lsn]
        fd = self._read_fd(seg.path)
        raw = os.pread(fd, rec.HEADER_SIZE, offset)
        head = rec.decode_header(raw)
        if head is None or head.lsn != lsn:
            raise WalCorruption(f"{seg.path}: record header at offset {offset} (LSN {lsn}) is damaged; run "
                                "`sediment verify`", path=seg.path, offset=offset, reason="bad header on read")
        body = os.pread(fd, head.body_len, offset + rec.HEADER_SIZE)
        if not rec.body_ok(head, body):
            raise WalCorruption(f"{seg.path}: record body at offset {offset} (LSN {lsn}) fails its checksum; run "
                                "`sediment verify`", path=seg.path, offset=offset, reason="bad body on read")
        return rec.record_of(head, body)

    def read_many(self, lsns: Sequence[int]) -> list[rec.Record]:
        # neighbouring frames of a segment come in one pread: a read per record let go of the
        # interpreter lock twice a record, each time waiting for it again beside busy threads
        got: dict[int, rec.Record] = {}
        wanted = sorted(set(lsns))
        i = 0
        while i < len(wanted):
            seg = self._segment_for(wanted[i])
            with self._lock:
                n, end = len(seg.offsets), seg.end
            j = bisect.bisect_left(wanted, seg.first_lsn + n, i)
            fd = self._read_fd(seg.path)
            for lo, hi, indices in sg.read_spans(seg.offsets, end, [lsn - seg.first_lsn for lsn in wanted[i:j]]):
                data = sg.pread_all(fd, hi - lo, lo)
                for k in indices:
                    lsn = seg.first_lsn + k
                    got[lsn] = sg.framed_record(data, seg.offsets[k] - lo, lsn, seg.path, seg.offsets[k]) \
                        or self.read(lsn)
            i = j
        return [got[lsn] for lsn in lsns]

    def scan(self, start: int | None = None) -> Iterator[rec.Record]:
        with self._lock:
            segments = list(self._segments)
        for seg in segments:
            with self._lock:
                n, end = len(seg.offsets), seg.end
            if n == 0 or (start is not None and seg.first_lsn + n <= start):
                continue
            first = 0 if start is None else max(0, start - seg.first_lsn)
            try:
                yield from sg.read_frames(seg.path, seg.first_lsn, seg.offsets[first], first, n, end)
            except FileNotFoundError:
                raise WalError(f"segment {seg.path} was trimmed while being scanned") from None

    # --- trimming and closing ------------------------------------------------------------------

    @property
    def start_lsn(self) -> int:
        with self._lock:
            return self._segments[0].first_lsn

    def trim(self, lsn: int) -> None:
        """Drop the finished segments wholly below ``lsn``. One trim at a time: the new start
        is recorded in the manifest first, then the files are deleted oldest first, each
        deletion made durable, so a crash anywhere leaves only garbage below the recorded
        start (deleted quietly at the next open), never a hole."""
        check_trim(self.dir, lsn, self.end_lsn)
        with self._trim_lock:
            with self._lock:
                n = finished_below(self._segments, lsn)
                if n == 0:
                    return
                dropped = self._segments[:n]
                start = self._segments[n].first_lsn
            with self._mlock:
                mf.record_start(self.root, self._manifest, start)
            with self._lock:
                del self._segments[:n]
                fds = [self._read_fds.pop(seg.path, None) for seg in dropped]
            for fd in fds:
                if fd is not None:
                    os.close(fd)
            for seg in dropped:
                if not self._pool.offer(seg.path, seg.idx_path, seg.first_lsn):
                    sg.remove_segment_files(self.dir, [seg])

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._group.close()
        with self._lock:
            fds = list(self._read_fds.values())
            self._read_fds.clear()
        for fd in fds:
            os.close(fd)
        if self._group.failed is None:
            seg = self._segments[-1]
            if len(seg.offsets) > self._idx_checkpoint:
                self._checkpoint_index(seg)
            with self._mlock:
                mf.write_end(self.root, self._manifest, seg.next_lsn)
        self._active.close()
        self._direct.close()
