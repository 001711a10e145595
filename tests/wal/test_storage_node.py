"""The storage node's request path: pipelined appends, group commit and its failure, replies
that do not fit the socket buffer, and writer threads that stop with the node.

One test runs a real node process (killed with SIGKILL); the others serve a real
:class:`StorageNode` over TCP inside the test's trio run, so a store can be made to fail.
"""

from __future__ import annotations

import errno
import functools
import os
import socket
import struct
import threading
from pathlib import Path

import pytest
import trio
from support.replication import KEY, Node

from sediment.errors import LowWaterMarkRegression, WalError
from sediment.wal import record as rec
from sediment.wal.control import ControlFile, PartitionState
from sediment.wal.replication import wire
from sediment.wal.replication.node.partition_store import FilePartitionStore, open_directory
from sediment.wal.replication.node.storage_node import StorageNode
from sediment.wal.replication.replica import Call, ReplicaConnection, tcp_connect
from sediment.wal.replication.wire import MsgType, Request, Response, Status

pytestmark = pytest.mark.timeout(120)
SESSION = 1


def frames(first: int, bodies: list[bytes]) -> bytes:
    return b"".join(rec.encode(rec.Record(rec.RecordKind.UPDATES, relation_id=1, body=b), first + i)
                    for i, b in enumerate(bodies))


def writer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("sediment-partition-")]


def join_writers() -> None:
    """Every partition writer thread exits once its node stops."""
    for t in writer_threads():
        t.join(30)
    assert not writer_threads()


async def serve_in_process(nursery: trio.Nursery, node: StorageNode) -> str:
    await nursery.start(node.run)
    listeners = await nursery.start(functools.partial(trio.serve_tcp, node.serve, 0, host="127.0.0.1"))
    return f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"


def test_pipelined_appends_are_acknowledged_in_order_and_survive_sigkill(tmp_path: Path) -> None:
    node = Node(tmp_path / "node")
    node.start()
    batches = [[f"b{i}-r{j}".encode() * 20 for j in range(1 + i % 4)] for i in range(400)]
    expected = [b for batch in batches for b in batch]

    async def append_all() -> None:
        async with trio.open_nursery() as nursery:
            conn = await ReplicaConnection.open(nursery, node.address, tcp_connect, KEY, 0, 30.0)
            assert (await conn.call(MsgType.OPEN, SESSION)).ok
            order: list[int] = []
            calls: list[tuple[int, Call]] = []
            lsn = 0
            for batch in batches:  # all sent before the first reply is awaited
                last = lsn + len(batch) - 1
                calls.append((last, conn.request(MsgType.APPEND, SESSION, lsn, 0, frames(lsn, batch),
                                                 on_reply=lambda call, last=last: order.append(last))))
                lsn = last + 1
            for last, call in calls:
                await call.done.wait()
                assert call.error is None and call.response is not None
                assert call.response.status == Status.OK, call.response.message
                assert call.response.max_lsn >= last  # the reply shows the state after the append
            assert order == [last for last, _ in calls]
            conn.kill("done")

    async def check_after_restart() -> None:
        async with trio.open_nursery() as nursery:
            conn = await ReplicaConnection.open(nursery, node.address, tcp_connect, KEY, 0, 30.0)
            assert (await conn.call(MsgType.OPEN, SESSION)).max_lsn == len(expected) - 1
            got: list[bytes] = []
            while len(got) < len(expected):
                resp = await conn.call(MsgType.READ, SESSION, len(got), 1 << 20)
                assert resp.ok and resp.payload
                got += [r.body for r in wire.iter_records(resp.payload)]
            assert got == expected
            conn.kill("done")

    try:
        trio.run(append_all)
        node.kill()  # no clean shutdown: only what was synced before each reply is there
        assert node.records() == expected
        node.start()
        trio.run(check_after_restart)
    finally:
        if node.proc is not None:
            node.kill()


async def opened_on(nursery: trio.Nursery, store: FilePartitionStore) -> ReplicaConnection:
    """A connection, in session SESSION, to a node served in process on ``store`` alone."""
    address = await serve_in_process(nursery, StorageNode(KEY, lambda pid: store))
    conn = await ReplicaConnection.open(nursery, address, tcp_connect, KEY, 0, 30.0)
    assert (await conn.call(MsgType.OPEN, SESSION)).ok
    return conn


class NewStore(FilePartitionStore):
    """A real replica store of a new control file, for a test to hook into."""

    def __init__(self, root: str, partition: int) -> None:
        control = ControlFile.create(root, KEY)
        control.add_partition(partition)
        super().__init__(root, partition, control, threading.Lock())


class FailingStore(NewStore):
    """A real replica store whose disk fails on cue. Its first write waits for ``release``, so
    the appends that arrive meanwhile queue up and reach the store as one group."""

    def __init__(self, root: str, partition: int) -> None:
        super().__init__(root, partition)
        self.entered = threading.Event()
        self.release = threading.Event()
        self.fail_from_write = 2
        self.writes: list[int] = []  # records per write call

    def write(self, payload: bytes, first_lsn: int, sizes: list[int]) -> None:
        self.writes.append(len(sizes))
        if len(self.writes) == 1:
            self.entered.set()
            self.release.wait(60)
        if len(self.writes) >= self.fail_from_write:
            raise OSError(errno.EIO, "injected I/O error")
        super().write(payload, first_lsn, sizes)


def test_a_failed_group_write_fails_every_waiter_and_the_partition(tmp_path: Path) -> None:
    store = FailingStore(str(tmp_path), 0)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            conn = await opened_on(nursery, store)
            first = conn.request(MsgType.APPEND, SESSION, 0, 0, frames(0, [b"a"]))
            await trio.to_thread.run_sync(store.entered.wait)  # the writer is inside write #1
            group = [conn.request(MsgType.APPEND, SESSION, lsn, 0, frames(lsn, [b"x%d" % lsn]))
                     for lsn in (1, 2, 3)]
            info = await conn.call(MsgType.INFO, SESSION)  # answered while the write is held
            assert info.ok and info.max_lsn == -1  # nothing is durable yet, and none of it shows
            store.release.set()
            for call in [first, *group]:
                await call.done.wait()
            assert first.response is not None and first.response.ok and first.response.max_lsn == 0
            for call in group:
                assert call.response is not None and call.response.status == Status.FAILED
                assert "injected I/O error" in call.response.message
                assert call.response.max_lsn == 0
            assert store.writes == [1, 3]  # the three queued appends were one group, one write
            later = await conn.call(MsgType.APPEND, SESSION, 4, 0, frames(4, [b"later"]))
            assert later.status == Status.FAILED and "restart the node" in later.message
            assert len(store.writes) == 2  # refused without touching the store
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        store.release.set()
    join_writers()
    reopened = FilePartitionStore(str(tmp_path), 0, ControlFile.open(str(tmp_path)), threading.Lock())
    assert [r.body for r in wire.iter_records(reopened.read(0, 1 << 20))] == [b"a"]
    reopened.close()


class HeldStateStore(NewStore):
    """A real replica store whose state writes wait for ``release`` once ``hold`` is set."""

    def __init__(self, root: str, partition: int) -> None:
        super().__init__(root, partition)
        self.hold, self.entered, self.release = threading.Event(), threading.Event(), threading.Event()

    def write_state(self, state: PartitionState) -> None:
        if self.hold.is_set():
            self.entered.set()
            self.release.wait(60)
        super().write_state(state)


def test_a_resent_open_is_answered_only_once_the_session_it_names_is_durable(tmp_path: Path) -> None:
    """A coordinator that resends OPEN (its first answer late) was answered at once when the
    first OPEN's state write was still queued: a power cut then could bring the node back
    with the older session, which it had been told was fenced. The resent OPEN now waits for
    that write, as the first one does."""
    store = HeldStateStore(str(tmp_path), 0)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            conn = await opened_on(nursery, store)
            store.hold.set()
            first = conn.request(MsgType.OPEN, SESSION + 1)
            await trio.to_thread.run_sync(store.entered.wait)  # the writer is inside its state write
            resent = conn.request(MsgType.OPEN, SESSION + 1)
            info = await conn.call(MsgType.INFO, SESSION + 1)  # answered at once, after the resend was handled
            assert info.ok
            assert not resent.done.is_set() and not first.done.is_set()  # neither before the write is durable
            store.release.set()
            for call in (first, resent):
                await call.done.wait()
                assert call.response is not None and call.response.ok
            assert ControlFile.open(str(tmp_path)).read_state(0).session_id == SESSION + 1
            conn.kill("done")
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        store.release.set()
    join_writers()


def test_replies_larger_than_the_socket_buffer_do_not_interleave_with_acks(tmp_path: Path) -> None:
    """READ replies (from the trio thread) far larger than the socket buffers, with append
    acknowledgements (from the writer thread) arriving while they are being sent: every
    reply must come out whole, whatever the path that wrote it."""
    big = [os.urandom(64 << 10) for _ in range(48)]  # 3 MiB of records
    base = frames(0, big)
    reads, appends = 8, 64

    def req(rid: int, kind: MsgType, arg1: int = 0, arg2: int = 0, payload: bytes = b"") -> bytes:
        return wire.encode_request(Request(kind, rid, KEY, 0, SESSION, arg1, arg2, payload))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            address = await serve_in_process(nursery, StorageNode(KEY, open_directory(str(tmp_path), KEY)))
            host, _, port = address.rpartition(":")
            sock = trio.socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the node's sends fill up quickly
            await sock.connect((host, int(port)))
            stream = trio.SocketStream(sock)
            reader = wire.FrameReader(stream)
            await stream.send_all(req(1, MsgType.OPEN) + req(2, MsgType.APPEND, 0, 0, base))
            for _ in range(2):
                resp = await reader.next()
                assert isinstance(resp, Response) and resp.ok, resp
            # 24 MiB of READ replies; once the first has begun to arrive, appends whose acks
            # are ready while the node is still stuck sending those replies.
            await stream.send_all(b"".join(req(1000 + i, MsgType.READ, 0, 4 << 20) for i in range(reads)))
            while len(reader.buf) < wire.FRAME_SIZE:
                reader.buf += await stream.receive_some(wire.FRAME_SIZE)
            await stream.send_all(b"".join(req(2000 + i, MsgType.APPEND, len(big) + i, 0,
                                               frames(len(big) + i, [b"small-%d" % i])) for i in range(appends)))
            got: dict[int, Response] = {}
            while len(got) < reads + appends:
                resp = await reader.next()  # a CRC or framing error here would mean interleaved bytes
                assert isinstance(resp, Response) and resp.request_id not in got
                got[resp.request_id] = resp
            for rid, resp in got.items():
                assert resp.ok, resp.message
                if rid < 2000:  # the prefix, and whichever small appends were durable by then
                    assert resp.payload.startswith(base)
                    lsns = [r.lsn for r in wire.iter_records(resp.payload)]
                    assert lsns == list(range(len(lsns)))
                else:
                    assert resp.max_lsn >= len(big) + rid - 2000
            await stream.aclose()
            nursery.cancel_scope.cancel()

    trio.run(main)
    join_writers()


def test_low_water_marks_only_move_forward_and_truncation_stays_in_range(tmp_path: Path) -> None:
    """A real node process: a lower low-water mark and a truncation outside [first - 1, last]
    are refused (nothing changes, the partition keeps serving); after SIGKILL the control
    file still holds the highest mark. The control file and the store refuse the same
    directly, with typed errors. A trimmed node serves from the TRIM's point on (not from the
    first record of the segment it keeps) and refuses to keep less than that point - 1."""
    node = Node(tmp_path / "node", extra_args=("--segment-bytes", "8192"))
    node.start()
    bodies = [f"r{i}".encode() * 200 for i in range(60)]

    async def talk() -> None:
        async with trio.open_nursery() as nursery:
            conn = await ReplicaConnection.open(nursery, node.address, tcp_connect, KEY, 0, 30.0)
            assert (await conn.call(MsgType.OPEN, SESSION)).ok
            for i, body in enumerate(bodies):
                assert (await conn.call(MsgType.APPEND, SESSION, i, 0, frames(i, [body]))).ok
            assert (await conn.call(MsgType.SET_LWM, SESSION, 20)).low_water_mark == 20
            low = await conn.call(MsgType.SET_LWM, SESSION, 19)
            assert low.status == Status.BAD_REQUEST and low.low_water_mark == 20, low.message
            for bad in (61, 62):  # keep more than the last record
                assert (await conn.call(MsgType.TRUNCATE, SESSION, bad)).status == Status.BAD_REQUEST
            assert (await conn.call(MsgType.TRIM, SESSION, 40)).ok
            assert first_record(node) < 40, "the store keeps the segment that holds LSN 40 whole"
            trimmed = await conn.call(MsgType.READ, SESSION, 0, 1)
            first = struct.unpack("<Q", trimmed.payload[:8])[0]
            assert trimmed.status == Status.TRIMMED and first == 40  # the TRIM's point, not the segment's start
            assert [r.lsn for r in wire.iter_records((await conn.call(MsgType.READ, SESSION, 40, 1)).payload)] == [40]
            below = await conn.call(MsgType.TRUNCATE, SESSION, first - 1)  # would keep less than first - 1
            assert below.status == Status.BAD_REQUEST and below.max_lsn == 59, below.message
            assert (await conn.call(MsgType.TRUNCATE, SESSION, 60)).max_lsn == 59  # keep all: allowed
            assert (await conn.call(MsgType.TRUNCATE, SESSION, 50)).max_lsn == 49
            conn.kill("done")

    try:
        trio.run(talk)
        node.kill()
        assert node.records()[-1] == bodies[49] and len(node.records()) == 50 - first_record(node)
    finally:
        if node.proc is not None:
            node.kill()
    control = ControlFile.open(str(node.dir))
    assert control.read_state(0).low_water_mark == 20
    with pytest.raises(LowWaterMarkRegression):
        control.write_state(0, PartitionState(SESSION, 19, 19))
    with pytest.raises(LowWaterMarkRegression):  # the local low-water mark too
        control.write_state(0, PartitionState(SESSION, 30, control.read_state(0).local_low_water_mark - 1))
    store = open_directory(str(node.dir), KEY)(0)
    try:
        with pytest.raises(WalError, match="outside"):
            store.truncate(store.next_lsn + 1)
        with pytest.raises(WalError, match="outside"):
            store.truncate(store.start_lsn - 1)
    finally:
        store.close()


def first_record(node: Node) -> int:
    from sediment.wal import segment as sg
    return min(p[0] for name in os.listdir(node.dir / "0") if (p := sg.parse_name(name)) and p[1] == "seg")


def test_a_low_water_mark_the_node_already_holds_is_not_written_again(tmp_path: Path) -> None:
    """A coordinator's open sends OPEN (a new session: written, it fences the older one) and
    then SET_LWM with the cluster's high-water mark; when nothing was appended since the last
    session that mark is the one stored, and the node answered it with a second write of the
    same state. Now a SET_LWM that changes nothing writes nothing (the control file's state
    sequence stays), and one that moves the mark is written as before."""

    def stored() -> PartitionState:
        return ControlFile.open(str(tmp_path)).read_state(0)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            address = await serve_in_process(nursery, StorageNode(KEY, open_directory(str(tmp_path), KEY)))
            conn = await ReplicaConnection.open(nursery, address, tcp_connect, KEY, 0, 30.0)
            assert (await conn.call(MsgType.OPEN, SESSION)).ok
            assert (await conn.call(MsgType.APPEND, SESSION, 0, 0, frames(0, [b"a", b"b", b"c"]))).ok
            assert (await conn.call(MsgType.SET_LWM, SESSION, 2)).low_water_mark == 2
            first = stored()
            assert (first.session_id, first.low_water_mark, first.local_low_water_mark) == (SESSION, 2, 2)
            again = await conn.call(MsgType.SET_LWM, SESSION, 2)
            assert again.ok and again.low_water_mark == 2 and stored() == first
            assert (await conn.call(MsgType.OPEN, SESSION + 1)).ok  # the next session: written
            opened = stored()
            assert (opened.session_id, opened.sequence) == (SESSION + 1, first.sequence + 1)
            same = await conn.call(MsgType.SET_LWM, SESSION + 1, 2)
            assert same.ok and same.low_water_mark == 2 and stored() == opened
            assert (await conn.call(MsgType.APPEND, SESSION + 1, 3, 0, frames(3, [b"d"]))).ok
            moved = await conn.call(MsgType.SET_LWM, SESSION + 1, 3)
            assert moved.ok and moved.low_water_mark == 3
            last = stored()
            assert (last.session_id, last.low_water_mark, last.sequence) == (SESSION + 1, 3, opened.sequence + 1)
            conn.kill("done")
            nursery.cancel_scope.cancel()

    trio.run(main)
    join_writers()
