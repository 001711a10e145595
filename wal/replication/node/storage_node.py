"""The storage node: keeps replicas of partitions on local disk and serves coordinators.

    sediment storage-node --dir DIR --listen 127.0.0.1:7001 --cluster-key UUID

Each partition is kept in the WAL's file layout with its state in the control file
(partition_store.py; docs/formats.md, "Storage node layout"). Records arrive already
framed with their LSNs, so a node checks them and writes the coordinator's bytes as they
are: every replica holds byte-identical records. Nothing is acknowledged before it is
durable (fdatasync).

Why a node refuses things:

* a request whose cluster key is not the one in its control file (it belongs to
  another cluster: a misconfigured coordinator must not write here);
* any request from a session lower than the highest it has seen for the partition
  (that coordinator was superseded: this is the fence that stops a zombie writing).
  The highest session is persisted at OPEN, so a restart does not forget it;
* an APPEND whose first LSN is not the next one (the coordinator must catch it up).

The node is CPU-bound under load, so an APPEND costs as few trio scheduler passes and
thread hops as it can: :meth:`StorageNode.submit` checks and orders each request
synchronously in arrival order; a partition's writer thread writes each run of queued
appends with one sync (:class:`_Partition`, group commit) and replies from there
(replies.py). An in-memory store (the simulations) runs each operation at once in the
trio thread through the same callbacks, so a MockClock run stays deterministic. READ
runs in a worker thread and is not ordered with the writes. :class:`StorageNode` is
independent of sockets: tests run it over in-memory streams.
"""

from __future__ import annotations

import argparse
import errno
import functools
import itertools
import logging
import queue
import socket
import struct
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, NamedTuple

import trio

from sediment.errors import ReplicationError, SedimentError, WalError
from sediment.wal import record as rec
from sediment.wal.control import PartitionState
from sediment.wal.replication import wire
from sediment.wal.replication.node.partition_store import (
    DEFAULT_CHECKPOINT,
    DEFAULT_SEGMENT_BYTES,
    PartitionStore,
    lock_directory,
    open_directory,
)
from sediment.wal.replication.node.replies import Replies
from sediment.wal.replication.wire import MsgType, Request, Response, Status, WireError

if TYPE_CHECKING:
    from sediment.metrics import NodeMetrics

log = logging.getLogger(__name__)

MAX_READ_BYTES = 4 << 20
OPEN_PAYLOAD = struct.Struct("<q")  # OPEN response payload: the session persisted before this OPEN


def check_payload(payload: bytes, first_lsn: int) -> list[int]:
    """The frame sizes of the records in an APPEND payload; WireError unless every frame is
    intact and the LSNs run first_lsn, first_lsn + 1, ... (a node stores nothing it cannot vouch for).

    record.check_frame's checks written out in the loop: this runs for every record a node
    receives, and a call per record costs about a fifth of the check (docs/benchmarks.md)."""
    sizes = []
    view = memoryview(payload)
    end = len(payload)
    crc = rec.crc32c_raw
    pos = 0
    lsn = first_lsn
    while pos < end:
        u = rec.check_header(view, pos)
        frame_end = end + 1 if u is None else pos + rec.HEADER_SIZE + u[4]
        if frame_end > end:
            raise WireError(f"APPEND record frame at payload offset {pos} is damaged or cut short")
        if u[6] != lsn:
            raise WireError(f"APPEND record at payload offset {pos} has LSN {u[6]}, expected {lsn}")
        if crc(view[pos + rec.HEADER_SIZE:frame_end]) != u[5]:
            raise WireError(f"APPEND record LSN {lsn} fails its body checksum")
        sizes.append(frame_end - pos)
        pos = frame_end
        lsn += 1
    return sizes


Done = Callable[[BaseException | None], None]  # an operation's completion: None once durable, else why not

_APPEND, _STATE, _CALL = "append", "state", "call"


def _nothing(_lsn: int) -> None:
    """A call that changes nothing: queued so that its reply waits for the operations before it."""


class _Op(NamedTuple):
    """One storage operation of a partition and whom to tell once it is durable (or failed).

    ``arg``: for an append (payload, first LSN, frame sizes); for a state write the new
    PartitionState; for a call (store method, LSN)."""

    kind: str
    arg: object
    done: Done


class _Partition:
    """One partition's request ordering (see the module doc). Who writes what: the trio thread
    ``highest_session`` and ``reserved_next``; whoever runs the operations (the writer thread)
    ``next_lsn``, ``state`` and ``failed``. Each is one attribute, read whole by the other side."""

    def __init__(self, pid: int, store: PartitionStore, metrics: NodeMetrics | None = None) -> None:
        self.pid = pid
        self.store = store
        self.metrics = metrics
        self.state = store.read_state()  # cached: replies carry it, and reading the file each time is slow
        self.highest_session = self.state.session_id
        self.queued_state = self.state  # the state once every queued operation ran (trio thread)
        self.reserved_next = store.next_lsn
        # The last TRIM's point (trio thread; memory only): records below it are in the engine's
        # batches, so READs below it answer TRIMMED, and a new owner's scan starts there rather
        # than at the first record of the oldest segment the store still keeps.
        self.trimmed = 0
        # The store's next LSN as of the last completed operation: replies read it here rather
        # than from the store, which the writer thread may be changing.
        self.next_lsn = store.next_lsn
        self.failed: str = ""
        self._queue: queue.SimpleQueue[_Op | None] | None = None
        if store.blocking:
            self._queue = queue.SimpleQueue()
            threading.Thread(target=self._writer, name=f"sediment-partition-{pid}-writer", daemon=True).start()

    def enqueue(self, kind: str, arg: object, done: Done) -> None:
        """Queue an operation behind every earlier one. ``done`` runs once it is durable (or
        failed): in the writer thread, or at once for a non-blocking store."""
        op = _Op(kind, arg, done)
        if self._queue is None:
            self._finish([op], *self._apply([op]))
        else:
            self._queue.put(op)

    def first_kept(self) -> int:
        """The first LSN this replica serves: its store's first record, or the last TRIM's
        point when that is higher (the store drops only whole segments)."""
        return max(self.store.start_lsn, self.trimmed)

    def stop(self) -> None:
        """Let the writer thread finish what is queued, then exit."""
        if self._queue is not None:
            self._queue.put(None)

    def _writer(self) -> None:
        """The writer thread: everything queued, in order, one sync per run of appends."""
        q = self._queue
        assert q is not None
        while True:
            ops = [q.get()]
            while not q.empty():
                ops.append(q.get_nowait())
            stop = None in ops
            if stop:
                ops = ops[:ops.index(None)]
            for appends, run in itertools.groupby(ops, key=lambda op: op.kind == _APPEND):
                for group in [list(run)] if appends else [[op] for op in run]:
                    self._finish(group, *self._apply(group))
            if stop:
                return

    def _apply(self, ops: list[_Op]) -> tuple[BaseException | None, int]:
        """Run one group (a run of appends, or one other operation) against the store: (error,
        the store's next LSN after it). After a failure every later operation fails too."""
        try:
            if self.failed:
                raise WalError(self.failed)
            op = ops[0]
            if op.kind == _APPEND:
                if len(ops) == 1:
                    payload, first, sizes = op.arg
                else:
                    first = op.arg[1]
                    payload = b"".join([o.arg[0] for o in ops])
                    sizes = [s for o in ops for s in o.arg[2]]
                started = time.perf_counter()
                self.store.write(payload, first, sizes)
                if self.metrics is not None:
                    self.metrics.count_sync(self.pid, len(sizes), len(payload), time.perf_counter() - started)
            elif op.kind == _STATE:
                self.store.write_state(op.arg)
            else:
                fn, lsn = op.arg
                fn(lsn)
            return None, self.store.next_lsn
        except Exception as exc:  # noqa: BLE001 - every waiter must hear of it; the partition stops
            self.failed = self.failed or f"partition {self.pid} storage failed: {exc}; restart the node"
            if self.metrics is not None:
                self.metrics.errors.labels(partition=str(self.pid)).inc()
            log.error("%s", self.failed)
            return exc, -1

    def _finish(self, ops: list[_Op], error: BaseException | None, next_lsn: int) -> None:
        """Publish the group's effect, then complete its operations: their replies show the
        state after it, and never an undurable one."""
        if error is None:
            self.next_lsn = next_lsn
            for op in ops:
                if op.kind == _STATE:
                    self.state = op.arg
        for op in ops:
            try:
                op.done(error)
            except Exception:  # noqa: BLE001 - a bug in one reply must not stop the writer thread
                log.exception("partition %d: completing an operation failed", self.pid)


Reply = Callable[[Response], None]


class StorageNode:
    """Request handling for every partition of one storage directory (no sockets here)."""

    def __init__(self, cluster_key: uuid.UUID, open_store: Callable[[int], PartitionStore],
                 metrics: NodeMetrics | None = None) -> None:
        self.cluster_key = cluster_key
        self._open_store = open_store
        self._parts: dict[int, _Partition] = {}
        self.metrics = metrics
        if metrics is not None:
            metrics.watch_partitions(lambda: self._parts)
        self._refused: dict[int, str] = {}
        self._running = False
        self._stopped = False

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Serve requests while this runs; when it ends (cancelled), the partitions' writer
        threads finish what is queued and exit, and later requests are refused. Runs once:
        a second run could open a store whose old writer thread is still finishing."""
        if self._stopped:
            raise WalError("this StorageNode has stopped; serve with a new StorageNode")
        self._running = True
        try:
            task_status.started()
            await trio.sleep_forever()
        finally:
            self._running = False
            self._stopped = True
            for part in self._parts.values():
                part.stop()

    def _refuse(self, pid: int, exc: BaseException) -> str:
        """A partition whose store cannot be opened (a lost manifest, a shortened segment...)
        is refused, never served empty: logged once with the typed error, then every request
        for it is answered FAILED with the same reason until the node is restarted."""
        why = self._refused.get(pid)
        if why is None:
            why = self._refused[pid] = (f"partition {pid} refused: its storage cannot be opened: "
                                        f"{type(exc).__name__}: {exc}")
            log.error("%s", why)
        return why

    def _partition(self, pid: int) -> _Partition:
        if pid in self._refused:
            raise WalError(self._refused[pid])
        part = self._parts.get(pid)
        if part is None:
            part = self._parts[pid] = _Partition(pid, self._open_store(pid), self.metrics)
        return part

    def _reply(self, req: Request, part: _Partition | None, status: Status = Status.OK, message: str = "",
               payload: bytes = b"") -> Response:
        if part is None:
            return Response(req.request_id, status, message, payload=payload)
        state = part.state
        return Response(req.request_id, status, message, part.highest_session, part.next_lsn - 1,
                        state.low_water_mark, state.local_low_water_mark, payload)

    def submit(self, req: Request, reply: Reply) -> Callable[[], Awaitable[None]] | None:
        """Check and order ``req`` now (arrival order matters for fencing and LSNs). ``reply``
        gets the response exactly once: at once, or once the effect is durable (then from the
        partition's writer thread, for a blocking store). A READ is returned as an async
        function for the caller to run: it reads in a worker thread and then replies."""
        if req.cluster_key != self.cluster_key:
            reply(self._reply(req, None, Status.WRONG_CLUSTER,
                              f"this storage node belongs to cluster {self.cluster_key}, the request to "
                              f"{req.cluster_key}; point the coordinator at its own cluster's nodes"))
            return None
        if not self._running:
            reply(self._reply(req, None, Status.FAILED, "this storage node is not running (it is stopping)"))
            return None
        try:
            part = self._partition(req.partition)
        except (SedimentError, OSError) as exc:
            reply(self._reply(req, None, Status.FAILED, self._refuse(req.partition, exc)))
            return None
        if part.failed:
            reply(self._reply(req, part, Status.FAILED, part.failed))
            return None
        if req.session_id < part.highest_session:
            reply(self._reply(req, part, Status.FENCED,
                              f"partition {req.partition}: session {req.session_id} was superseded by session "
                              f"{part.highest_session}; this coordinator must stop"))
            return None
        if req.type == MsgType.OPEN:
            before = part.queued_state
            part.highest_session = req.session_id
            if before.session_id == req.session_id:  # a resent OPEN: answered once its state write is durable
                part.enqueue(_CALL, (_nothing, 0), self._after(req, part, reply, OPEN_PAYLOAD.pack(before.session_id)))
                return None
            new = PartitionState(req.session_id, before.low_water_mark, before.local_low_water_mark)
            part.queued_state = new
            part.enqueue(_STATE, new, self._after(req, part, reply, OPEN_PAYLOAD.pack(before.session_id)))
            return None
        if req.session_id > part.highest_session:
            reply(self._reply(req, part, Status.BAD_REQUEST,
                              f"partition {req.partition}: session {req.session_id} has not sent OPEN"))
            return None
        if req.type == MsgType.APPEND:
            if req.arg1 != part.reserved_next:
                reply(self._reply(req, part, Status.LSN_MISMATCH,
                                  f"partition {req.partition}: append at LSN {req.arg1}, next is "
                                  f"{part.reserved_next}; catch this replica up first"))
                return None
            try:
                sizes = check_payload(req.payload, req.arg1)
            except WireError as exc:
                reply(self._reply(req, part, Status.BAD_REQUEST, str(exc)))
                return None
            part.reserved_next += len(sizes)
            part.enqueue(_APPEND, (req.payload, req.arg1, sizes), self._after(req, part, reply))
            return None
        if req.type == MsgType.READ:
            return functools.partial(self._read, req, part, reply)
        if req.type == MsgType.INFO:
            reply(self._reply(req, part))
            return None
        if req.type == MsgType.TRUNCATE:
            self._truncate(req, part, reply)
            return None
        if req.type == MsgType.TRIM:
            part.trimmed = max(part.trimmed, min(req.arg1, part.reserved_next))
            part.enqueue(_CALL, (part.store.trim_prefix, req.arg1), self._after(req, part, reply))
            return None
        if req.type == MsgType.RESET:
            part.reserved_next = req.arg1
            part.trimmed = min(part.trimmed, req.arg1)
            part.enqueue(_CALL, (part.store.reset, req.arg1), self._after(req, part, reply))
            return None
        if req.type == MsgType.SET_LWM:
            self._set_lwm(req, part, reply)
            return None
        reply(self._reply(req, part, Status.BAD_REQUEST, f"unknown request type {req.type}"))
        return None

    def _truncate(self, req: Request, part: _Partition, reply: Reply) -> None:
        """Keep LSNs below ``arg1``: refused unless that keeps between first - 1 and the last."""
        first = part.first_kept()
        if not first <= req.arg1 <= part.reserved_next:
            reply(self._reply(req, part, Status.BAD_REQUEST,
                              f"partition {req.partition}: truncate at LSN {req.arg1} refused: it must keep "
                              f"between first - 1 = {first - 1} and the last record "
                              f"{part.reserved_next - 1}"))
            return
        part.reserved_next = req.arg1
        part.enqueue(_CALL, (part.store.truncate, req.arg1), self._after(req, part, reply))

    def _set_lwm(self, req: Request, part: _Partition, reply: Reply) -> None:
        """Low-water mark ``arg1`` (local: what this replica holds of it): never backwards. A
        state equal to the one queued (a coordinator's open right after OPEN, when nothing was
        appended since the last session) is not written again: the reply waits behind the
        queued operations only, so it still never reports a state that is not durable."""
        new = PartitionState(req.session_id, req.arg1, min(req.arg1, part.reserved_next - 1))
        old = part.queued_state
        if new.low_water_mark < old.low_water_mark or new.local_low_water_mark < old.local_low_water_mark:
            reply(self._reply(req, part, Status.BAD_REQUEST,
                              f"partition {req.partition}: low-water mark {new.low_water_mark} (local "
                              f"{new.local_low_water_mark}) is below the stored {old.low_water_mark} (local "
                              f"{old.local_low_water_mark}); low-water marks only move forward"))
            return
        if (new.session_id, new.low_water_mark, new.local_low_water_mark) == (
                old.session_id, old.low_water_mark, old.local_low_water_mark):
            part.enqueue(_CALL, (_nothing, 0), self._after(req, part, reply))
            return
        part.queued_state = new
        part.enqueue(_STATE, new, self._after(req, part, reply))

    def _after(self, req: Request, part: _Partition, reply: Reply, payload: bytes = b"") -> Done:
        """The completion of ``req``'s operation: its reply, built when it runs."""

        def done(error: BaseException | None) -> None:
            if error is not None:
                reply(self._reply(req, part, Status.FAILED, f"partition {req.partition}: {error}"))
            else:
                reply(self._reply(req, part, payload=payload))

        return done

    async def _read(self, req: Request, part: _Partition, reply: Reply) -> None:
        first = part.first_kept()
        if req.arg1 < first:
            reply(self._reply(req, part, Status.TRIMMED,
                              f"partition {req.partition}: LSN {req.arg1} was trimmed; the first kept is "
                              f"{first}", payload=struct.pack("<Q", first)))
            return
        limit = min(max(req.arg2, 1), MAX_READ_BYTES)
        if part.store.blocking:
            data = await trio.to_thread.run_sync(part.store.read, req.arg1, limit)
        else:
            data = part.store.read(req.arg1, limit)
        reply(self._reply(req, part, payload=data))

    async def serve(self, stream: trio.abc.Stream) -> None:
        """Serve one connection: requests are ordered as they arrive, replies sent when ready.
        At the end of the peer's stream, the replies still owed are sent before closing."""
        replies = Replies(stream)
        reader = wire.FrameReader(stream)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(replies.sender)
                while True:
                    msg = await reader.next()
                    if msg is None:
                        break
                    if not isinstance(msg, Request):
                        raise WireError("a storage node received a response frame")
                    replies.received += 1
                    work = self.submit(msg, replies.put)
                    if work is not None:
                        nursery.start_soon(work)
                replies.end_of_requests()
        except* Exception as group:  # a broken or lying peer ends only its own connection
            log.info("connection dropped: %r", group.exceptions[0])
        finally:
            replies.close()
            await trio.aclose_forcefully(stream)


async def serve_tcp(directory: str, host: str, port: int, cluster_key: uuid.UUID,
                    segment_bytes: int = DEFAULT_SEGMENT_BYTES, task_status=trio.TASK_STATUS_IGNORED,
                    open_store: Callable[[int], PartitionStore] | None = None,
                    metrics: NodeMetrics | None = None) -> None:
    node = StorageNode(cluster_key, open_store or open_directory(directory, cluster_key, segment_bytes), metrics)
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        listeners = await nursery.start(functools.partial(trio.serve_tcp, node.serve, port, host=host))
        task_status.started(listeners)


def _address_arg(text: str) -> str:
    """``HOST:PORT`` with a port in 0..65535, checked before anything is created: a bad one was
    an internal error after the storage directory was made, and a port past 65535 was bound
    modulo 65536, a port nobody asked for."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"invalid address {text!r}: give HOST:PORT with a port in 0..65535, "
                                         "e.g. 127.0.0.1:7001 (0 picks a free port)")
    return text


def _positive_int_arg(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n <= 0:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: give a positive integer")
    return n


def add_storage_node_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``storage-node`` to the ``sediment`` command's subparsers."""
    text = "run a storage node serving replicated partitions"
    p = sub.add_parser("storage-node", help=text, description=text)
    p.add_argument("--dir", required=True, help="storage directory (control file and partition directories)")
    p.add_argument("--listen", required=True, type=_address_arg, metavar="HOST:PORT",
                   help="address to listen on (port 0 picks a free one; the `listening on` line names it)")
    p.add_argument("--cluster-key", required=True, help="the cluster's UUID; requests for another are refused")
    p.add_argument("--segment-bytes", type=_positive_int_arg, default=DEFAULT_SEGMENT_BYTES,
                   help=f"bytes after which a partition's log segment is finished (default {DEFAULT_SEGMENT_BYTES})")
    p.add_argument("--checkpoint-records", type=_positive_int_arg, default=DEFAULT_CHECKPOINT,
                   help="records between durable ends recorded in a partition's manifest")
    p.add_argument("--metrics-listen", type=_address_arg, default=None, metavar="HOST:PORT",
                   help="also serve Prometheus metrics at http://HOST:PORT/metrics (port 0 picks a free one)")
    p.set_defaults(func=cmd_storage_node)
    return p


def _listen_failure(exc: BaseException) -> OSError | None:
    """The OSError in what a failed listen raised (trio may wrap it in groups): a port in use,
    or a host that does not resolve or is not this machine's."""
    if isinstance(exc, BaseExceptionGroup):
        return next(filter(None, map(_listen_failure, exc.exceptions)), None)
    return exc if isinstance(exc, OSError) else None


def cmd_storage_node(args: argparse.Namespace) -> int:
    """Run until killed. Prints ``listening on HOST:PORT`` once it accepts connections (with
    port 0, the port it bound: how a supervisor or a test learns it without a race)."""
    host, _, port = args.listen.rpartition(":")
    try:
        key = uuid.UUID(args.cluster_key)
    except ValueError:
        raise WalError(f"--cluster-key {args.cluster_key!r} is not a UUID; use the key the cluster was "
                       "created with") from None

    _check_listen(args.listen, host or "127.0.0.1", int(port))
    if getattr(args, "metrics_listen", None):  # refused before the directory is made too, naming the option
        m_host, _, m_port = args.metrics_listen.rpartition(":")
        _check_listen(f"{args.metrics_listen} (--metrics-listen)", m_host or "127.0.0.1", int(m_port))
    lock_fd = lock_directory(args.dir)  # noqa: F841 - held until the process exits
    open_store = open_directory(args.dir, key, args.segment_bytes, args.checkpoint_records)  # refuses a lost control file before listening

    metrics = None
    if getattr(args, "metrics_listen", None):
        from sediment.metrics import MetricsServer, NodeMetrics

        metrics = NodeMetrics()
        m_host, _, m_port = args.metrics_listen.rpartition(":")
        print(f"metrics on {MetricsServer(metrics, m_host or '127.0.0.1', int(m_port)).url}", flush=True)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(functools.partial(serve_tcp, args.dir, host or "127.0.0.1", int(port),
                                                              key, args.segment_bytes, open_store=open_store,
                                                              metrics=metrics))
            addr = listeners[0].socket.getsockname()
            print(f"listening on {addr[0]}:{addr[1]}", flush=True)

    try:
        trio.run(main)
    except BaseException as exc:
        failed = _listen_failure(exc)
        if failed is None:
            raise
        raise _cannot_listen(args.listen, failed) from None
    return 0


def _cannot_listen(listen: str, failed: OSError) -> ReplicationError:
    if failed.errno != errno.EADDRINUSE:
        return ReplicationError(f"storage node cannot listen on {listen}: {failed.strerror or failed}; "
                                "give a host name or address of this machine")
    return ReplicationError(f"storage node cannot listen on {listen}: {failed.strerror}; another process "
                            "holds the port: stop it, or pick another port (0 picks a free one)")


def _check_listen(listen: str, host: str, port: int) -> None:
    """Bind the address once and let it go, before the directory is made: a host that does not
    resolve, is not this machine's, or a port another process holds is refused with nothing
    created (the listener itself binds it again right after)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the listener binds
            probe.bind(address)
    except OSError as exc:
        raise _cannot_listen(listen, exc) from None


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(prog="storage-node")
    add_storage_node_parser(parser.add_subparsers())
    sys.exit(cmd_storage_node(parser.parse_args(["storage-node", *sys.argv[1:]])))
