"""The storage node: keeps replicas of partitions on local disk and serves coordinators.

    sediment storage-node --dir DIR --listen 127.0.0.1:7001 --cluster-key UUID

Each partition is a directory of segment files in the WAL's file layout
(``<dir>/<partition>/<first LSN>.seg``/``.idx``, record frames of wal/record.py) and a
partition-state entry in the control file ``<dir>/sediment-wal.ctl`` (session id,
low-water mark, local low-water mark). Records arrive already framed with their LSNs,
so a node checks them and writes the coordinator's bytes as they are: every replica
holds byte-identical records.

Why a node refuses things:

* a request whose cluster key is not the one in its control file (it belongs to
  another cluster: a misconfigured coordinator must not write here);
* any request from a session lower than the highest it has seen for the partition
  (that coordinator was superseded: this is the fence that stops a zombie writing).
  The highest session is persisted at OPEN, so a restart does not forget it;
* an APPEND whose first LSN is not the next one (the coordinator must catch it up).

Nothing is acknowledged before it is durable (fdatasync). Appends queued while a
write is in progress are written together with one sync (group commit), which is
what makes pipelined batches from a coordinator cheap.

The request handling (:class:`StorageNode`) is independent of sockets and of where
bytes are kept: tests run it over in-memory streams with :class:`MemoryPartitionStore`.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import struct
import sys
import threading
import uuid
from array import array
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import trio

from sediment._fs import pwrite_all as _pwrite_all
from sediment.errors import WalCorruption, WalError
from sediment.wal import record as rec
from sediment.wal import segment as sg
from sediment.wal import wire
from sediment.wal.control import ControlFile, PartitionState, fsync_dir
from sediment.wal.wire import MsgType, Request, Response, Status, WireError

log = logging.getLogger(__name__)

DEFAULT_SEGMENT_BYTES = 64 << 20
MAX_READ_BYTES = 4 << 20
OPEN_PAYLOAD = struct.Struct("<q")  # OPEN response payload: the session persisted before this OPEN


class PartitionStore(Protocol):
    """Where one partition's replica lives. ``blocking``: run calls in a worker thread."""

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
        os.makedirs(self.dir, exist_ok=True)
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
        if lsn >= self.next_lsn:
            return
        lsn = max(lsn, self.start_lsn)
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
        del self.frames[lsn:]

    def close(self) -> None:
        pass


def check_payload(payload: bytes, first_lsn: int) -> list[int]:
    """The frame sizes of the records in an APPEND payload; WireError unless every frame is
    intact and the LSNs run first_lsn, first_lsn + 1, ... (a node stores nothing it cannot vouch for)."""
    sizes = []
    view = memoryview(payload)
    pos = 0
    lsn = first_lsn
    while pos < len(payload):
        head = rec.decode_header(view, pos)
        if head is None or pos + head.frame_size > len(payload):
            raise WireError(f"APPEND record frame at payload offset {pos} is damaged or cut short")
        if head.lsn != lsn:
            raise WireError(f"APPEND record at payload offset {pos} has LSN {head.lsn}, expected {lsn}")
        if not rec.body_ok(head, view[pos + rec.HEADER_SIZE:pos + head.frame_size]):
            raise WireError(f"APPEND record LSN {lsn} fails its body checksum")
        sizes.append(head.frame_size)
        pos += head.frame_size
        lsn += 1
    return sizes


class _Partition:
    """One partition's request ordering: appends are checked and reserved in arrival order,
    then written by one writer task that groups everything queued into one sync."""

    def __init__(self, pid: int, store: PartitionStore) -> None:
        self.pid = pid
        self.store = store
        self.state = store.read_state()  # cached: replies carry it, and reading the file each time is slow
        self.highest_session = self.state.session_id
        self.reserved_next = store.next_lsn
        self.queue: list[tuple[str, object, trio.Event, list]] = []
        self.wake = trio.Event()
        self.failed: str = ""

    def set_state(self, state: PartitionState) -> None:
        """Persist (worker thread), then publish: replies never show an undurable state."""
        self.store.write_state(state)
        self.state = state

    async def io(self, fn: Callable, *args):
        if self.store.blocking:
            return await trio.to_thread.run_sync(fn, *args)
        return fn(*args)

    def enqueue(self, kind: str, arg: object) -> tuple[trio.Event, list]:
        done = trio.Event()
        out: list = []
        self.queue.append((kind, arg, done, out))
        self.wake.set()
        return done, out

    async def writer(self) -> None:
        while True:
            await self.wake.wait()
            self.wake = trio.Event()
            while self.queue:
                if self.queue[0][0] == "append":
                    n = 0
                    while n < len(self.queue) and self.queue[n][0] == "append":
                        n += 1
                    group, self.queue = self.queue[:n], self.queue[n:]
                    payload = b"".join(g[1][0] for g in group)
                    sizes = [s for g in group for s in g[1][2]]
                    first = group[0][1][1]
                    await self._run(group, self.store.write, payload, first, sizes)
                else:
                    op, self.queue = self.queue[0], self.queue[1:]
                    await self._run([op], *op[1])

    async def _run(self, ops: list, fn: Callable, *args) -> None:
        try:
            if self.failed:
                raise WalError(self.failed)
            await self.io(fn, *args)
        except Exception as exc:  # noqa: BLE001 - every waiter must hear of it; the partition stops
            self.failed = self.failed or f"partition {self.pid} storage failed: {exc}; restart the node"
            log.error("%s", self.failed)
            for _k, _a, done, out in ops:
                out.append(exc)
                done.set()
            return
        for _k, _a, done, _out in ops:
            done.set()


class StorageNode:
    """Request handling for every partition of one storage directory (no sockets here)."""

    def __init__(self, cluster_key: uuid.UUID, open_store: Callable[[int], PartitionStore]) -> None:
        self.cluster_key = cluster_key
        self._open_store = open_store
        self._parts: dict[int, _Partition] = {}
        self._nursery: trio.Nursery | None = None

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Own the partitions' writer tasks; serve connections while this runs."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def _partition(self, pid: int) -> _Partition:
        part = self._parts.get(pid)
        if part is None:
            part = self._parts[pid] = _Partition(pid, self._open_store(pid))
            assert self._nursery is not None, "StorageNode.run() must be running"
            self._nursery.start_soon(part.writer)
        return part

    def _reply(self, req: Request, part: _Partition | None, status: Status = Status.OK, message: str = "",
               payload: bytes = b"") -> Response:
        if part is None:
            return Response(req.request_id, status, message, payload=payload)
        state = part.state
        return Response(req.request_id, status, message, part.highest_session, part.store.next_lsn - 1,
                        state.low_water_mark, state.local_low_water_mark, payload)

    def submit(self, req: Request) -> Response | Awaitable[Response]:
        """Check and order ``req`` now (arrival order matters for fencing and LSNs); the
        result, or an awaitable that resolves once the effect is durable."""
        if req.cluster_key != self.cluster_key:
            return self._reply(req, None, Status.WRONG_CLUSTER,
                               f"this storage node belongs to cluster {self.cluster_key}, the request to "
                               f"{req.cluster_key}; point the coordinator at its own cluster's nodes")
        part = self._partition(req.partition)
        if part.failed:
            return self._reply(req, part, Status.FAILED, part.failed)
        if req.session_id < part.highest_session:
            return self._reply(req, part, Status.FENCED,
                               f"partition {req.partition}: session {req.session_id} was superseded by session "
                               f"{part.highest_session}; this coordinator must stop")
        if req.type == MsgType.OPEN:
            before = part.state
            part.highest_session = req.session_id
            if before.session_id == req.session_id:
                return self._reply(req, part, payload=OPEN_PAYLOAD.pack(before.session_id))
            new = PartitionState(req.session_id, before.low_water_mark, before.local_low_water_mark)
            return self._after(req, part, part.enqueue("call", (part.set_state, new)),
                               OPEN_PAYLOAD.pack(before.session_id))
        if req.session_id > part.highest_session:
            return self._reply(req, part, Status.BAD_REQUEST,
                               f"partition {req.partition}: session {req.session_id} has not sent OPEN")
        if req.type == MsgType.APPEND:
            if req.arg1 != part.reserved_next:
                return self._reply(req, part, Status.LSN_MISMATCH,
                                   f"partition {req.partition}: append at LSN {req.arg1}, next is "
                                   f"{part.reserved_next}; catch this replica up first")
            try:
                sizes = check_payload(req.payload, req.arg1)
            except WireError as exc:
                return self._reply(req, part, Status.BAD_REQUEST, str(exc))
            part.reserved_next += len(sizes)
            return self._after(req, part, part.enqueue("append", (req.payload, req.arg1, sizes)))
        if req.type == MsgType.READ:
            return self._read(req, part)
        if req.type == MsgType.INFO:
            return self._reply(req, part)
        if req.type == MsgType.TRUNCATE:
            part.reserved_next = min(part.reserved_next, max(req.arg1, part.store.start_lsn))
            return self._after(req, part, part.enqueue("call", (part.store.truncate, req.arg1)))
        if req.type == MsgType.TRIM:
            return self._after(req, part, part.enqueue("call", (part.store.trim_prefix, req.arg1)))
        if req.type == MsgType.RESET:
            part.reserved_next = req.arg1
            return self._after(req, part, part.enqueue("call", (part.store.reset, req.arg1)))
        if req.type == MsgType.SET_LWM:
            new = PartitionState(req.session_id, req.arg1, min(req.arg1, part.reserved_next - 1))
            return self._after(req, part, part.enqueue("call", (part.set_state, new)))
        return self._reply(req, part, Status.BAD_REQUEST, f"unknown request type {req.type}")

    async def _after(self, req: Request, part: _Partition, waiter: tuple[trio.Event, list],
                     payload: bytes = b"") -> Response:
        done, out = waiter
        await done.wait()
        if out:
            return self._reply(req, part, Status.FAILED, f"partition {req.partition}: {out[0]}")
        return self._reply(req, part, payload=payload)

    async def _read(self, req: Request, part: _Partition) -> Response:
        if req.arg1 < part.store.start_lsn:
            return self._reply(req, part, Status.TRIMMED,
                               f"partition {req.partition}: LSN {req.arg1} was trimmed; the first kept is "
                               f"{part.store.start_lsn}", payload=struct.pack("<Q", part.store.start_lsn))
        limit = min(max(req.arg2, 1), MAX_READ_BYTES)
        data = await part.io(part.store.read, req.arg1, limit)
        return self._reply(req, part, payload=data)

    async def serve(self, stream: trio.abc.Stream) -> None:
        """Serve one connection: requests are ordered as they arrive, replies sent when ready."""
        send_lock = trio.Lock()
        reader = wire.FrameReader(stream)

        async def finish(pending: Awaitable[Response]) -> None:
            resp = await pending
            async with send_lock:
                await stream.send_all(wire.encode_response(resp))

        try:
            async with trio.open_nursery() as nursery:
                while True:
                    msg = await reader.next()
                    if msg is None:
                        break
                    if not isinstance(msg, Request):
                        raise WireError("a storage node received a response frame")
                    result = self.submit(msg)
                    if isinstance(result, Response):
                        async with send_lock:
                            await stream.send_all(wire.encode_response(result))
                    else:
                        nursery.start_soon(finish, result)
        except Exception as exc:  # noqa: BLE001 - a broken or lying peer ends only its own connection
            log.info("connection dropped: %r", exc)
        finally:
            await trio.aclose_forcefully(stream)


def open_directory(directory: str, cluster_key: uuid.UUID,
                   segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> Callable[[int], PartitionStore]:
    """A factory of FilePartitionStores under ``directory``; refuses another cluster's directory."""
    os.makedirs(directory, exist_ok=True)
    control = ControlFile.open_or_create(directory, cluster_key)
    lock = threading.Lock()

    def open_store(pid: int) -> PartitionStore:
        with lock:
            if pid not in control.partitions:
                control.add_partition(pid)
        return FilePartitionStore(directory, pid, control, lock, segment_bytes)

    return open_store


async def serve_tcp(directory: str, host: str, port: int, cluster_key: uuid.UUID,
                    segment_bytes: int = DEFAULT_SEGMENT_BYTES, task_status=trio.TASK_STATUS_IGNORED) -> None:
    node = StorageNode(cluster_key, open_directory(directory, cluster_key, segment_bytes))
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        listeners = await nursery.start(functools.partial(trio.serve_tcp, node.serve, port, host=host))
        task_status.started(listeners)


def add_storage_node_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``storage-node`` to the ``sediment`` command's subparsers."""
    text = "run a storage node serving replicated partitions"
    p = sub.add_parser("storage-node", help=text, description=text)
    p.add_argument("--dir", required=True, help="storage directory (control file and partition directories)")
    p.add_argument("--listen", required=True, metavar="HOST:PORT", help="address to listen on")
    p.add_argument("--cluster-key", required=True, help="the cluster's UUID; requests for another are refused")
    p.add_argument("--segment-bytes", type=int, default=DEFAULT_SEGMENT_BYTES)
    p.set_defaults(func=cmd_storage_node)
    return p


def cmd_storage_node(args: argparse.Namespace) -> int:
    """Run until killed. Prints ``listening on HOST:PORT`` once it accepts connections."""
    host, _, port = args.listen.rpartition(":")
    try:
        key = uuid.UUID(args.cluster_key)
    except ValueError:
        raise WalError(f"--cluster-key {args.cluster_key!r} is not a UUID; use the key the cluster was "
                       "created with") from None

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(serve_tcp, args.dir, host or "127.0.0.1", int(port), key,
                                            args.segment_bytes)
            addr = listeners[0].socket.getsockname()
            print(f"listening on {addr[0]}:{addr[1]}", flush=True)

    trio.run(main)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(prog="storage-node")
    add_storage_node_parser(parser.add_subparsers())
    sys.exit(cmd_storage_node(parser.parse_args(["storage-node", *sys.argv[1:]])))
