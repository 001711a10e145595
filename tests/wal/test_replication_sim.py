"""Deterministic simulations: a whole replicated partition in memory under trio's MockClock.

Storage nodes are real :class:`StorageNode` request handlers over in-memory partition
stores; the network is simulated (delay, black-holing a node, refusing connections);
metadata is the in-memory store. Time is virtual, so timeouts and retries cost nothing.
"""

from __future__ import annotations

import math
import uuid

import pytest
import trio
import trio.testing
from support.memory_store import MemoryPartitionStore

from sediment.errors import QuorumLost, QuorumUnavailable, SessionFenced
from sediment.metadata.memory import MemoryMetadataStore
from sediment.wal import record as rec
from sediment.wal.replication.node.storage_node import StorageNode
from sediment.wal.replication.partition_meta import UNRESOLVED, PartitionMetaStore
from sediment.wal.replication.store_session import Batch, Coordinator, Pending

KEY = uuid.UUID(int=7)
ADDRS = ["a:1", "b:1", "c:1"]


class SimStream(trio.abc.Stream):
    """One direction pair of a simulated connection: FIFO, with the network's delay."""

    def __init__(self, net: SimNetwork, address: str, out: trio.MemorySendChannel,
                 inp: trio.MemoryReceiveChannel) -> None:
        self.net, self.address, self.out, self.inp = net, address, out, inp
        self.pending = b""
        self.closed = False
        net.streams.setdefault(address, []).append(self)

    async def send_all(self, data) -> None:
        await trio.lowlevel.checkpoint()
        if self.closed:
            raise trio.ClosedResourceError("closed")
        if self.address in self.net.black_holed:
            return  # dropped on the floor, as a partitioned network does
        try:
            self.out.send_nowait((trio.current_time() + self.net.delay, bytes(data)))
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise trio.BrokenResourceError("peer gone") from exc

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes=None) -> bytes:
        if not self.pending:
            try:
                when, data = await self.inp.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                return b""
            await trio.sleep_until(when)
            self.pending = data
        n = len(self.pending) if max_bytes is None else max_bytes
        out, self.pending = self.pending[:n], self.pending[n:]
        return out

    async def aclose(self) -> None:
        self.closed = True
        await self.out.aclose()
        await self.inp.aclose()


class SimNetwork:
    def __init__(self, nursery: trio.Nursery, delay: float = 0.001) -> None:
        self.nursery = nursery
        self.delay = delay
        self.nodes: dict[str, StorageNode] = {}
        self.stores: dict[str, dict[int, MemoryPartitionStore]] = {}
        self.black_holed: set[str] = set()
        self.streams: dict[str, list[SimStream]] = {}

    async def add_node(self, address: str) -> None:
        stores = self.stores.setdefault(address, {})
        node = StorageNode(KEY, lambda pid: stores.setdefault(pid, MemoryPartitionStore()))
        await self.nursery.start(node.run)
        self.nodes[address] = node

    async def connect(self, address: str) -> trio.abc.Stream:
        if address in self.black_holed:
            await trio.sleep_forever()
        node = self.nodes[address]
        a_send, b_recv = trio.open_memory_channel(math.inf)
        b_send, a_recv = trio.open_memory_channel(math.inf)
        client = SimStream(self, address, a_send, a_recv)
        server = SimStream(self, address, b_send, b_recv)
        self.nursery.start_soon(node.serve, server)
        return client

    def partition(self, address: str) -> None:
        """Black-hole the node: existing and new connections silently lose every byte."""
        self.black_holed.add(address)

    def heal(self, address: str) -> None:
        self.black_holed.discard(address)

    def log(self, address: str, pid: int = 0) -> list[rec.Record]:
        frames = self.stores[address][pid].frames
        return [rec.record_of(rec.decode_header(f), f[rec.HEADER_SIZE:]) for f in frames]


def make_coordinator(net: SimNetwork, meta: MemoryMetadataStore, replicas: list[str] | None = None, *,
                     meta_latency: float = 0.0, generation: int = 0, timeout: float = 1.0) -> Coordinator:
    """A coordinator over ``replicas`` (default ADDRS). ``meta_latency``: virtual seconds each
    metadata call takes (a ZooKeeper round trip), so metadata updates can interleave."""
    async def direct(fn, *args):
        if meta_latency:
            await trio.sleep(meta_latency)
        return fn(*args)

    return Coordinator(replicas or ADDRS, PartitionMetaStore(meta, 0), KEY, 0, connect=net.connect, timeout=timeout,
                       retry_interval=0.05, blocking=direct, generation=generation)


async def start_nodes(nursery: trio.Nursery) -> SimNetwork:
    """A simulated network with the three storage nodes of ADDRS on it."""
    net = SimNetwork(nursery)
    for a in ADDRS:
        await net.add_node(a)
    return net


async def start_cluster(nursery: trio.Nursery) -> tuple[SimNetwork, Coordinator]:
    """Three storage nodes and a running coordinator over them."""
    net = await start_nodes(nursery)
    coord = make_coordinator(net, MemoryMetadataStore())
    await nursery.start(coord.run)
    return net, coord


def rec_of(i: int) -> rec.Record:
    return rec.Record(rec.RecordKind.UPDATES, relation_id=1, t_lo=i, t_hi=i, body=f"r{i}".encode())


async def append(coord: Coordinator, records: list[rec.Record]) -> int:
    """Submit and await the acknowledgement; raises the coordinator's error."""
    done = trio.Event()
    result: list = []

    def cb(lsn: int, err: BaseException | None) -> None:
        result.append((lsn, err))
        done.set()

    coord.submit(records, cb)
    await done.wait()
    lsn, err = result[0]
    if err is not None:
        raise err
    return lsn


async def wait_for(predicate, timeout: float = 60.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


def bodies(records: list[rec.Record]) -> list[bytes]:
    return [r.body for r in records]


def run_sim(fn) -> None:
    trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


def test_quorum_writes_reach_every_replica() -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            net = await start_nodes(nursery)
            meta = MemoryMetadataStore()
            coord = make_coordinator(net, meta)
            await nursery.start(coord.run)
            for i in range(20):
                assert await append(coord, [rec_of(i)]) == i
            await wait_for(lambda: all(len(net.stores[a][0].frames) == 20 for a in ADDRS))
            for a in ADDRS:
                assert bodies(net.log(a)) == [f"r{i}".encode() for i in range(20)]
            nursery.cancel_scope.cancel()

    run_sim(main)


def test_partitioned_replica_is_caught_up_after_heal() -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            net, coord = await start_cluster(nursery)
            for i in range(5):
                await append(coord, [rec_of(i)])
            net.partition("c:1")
            for i in range(5, 40):  # writes continue on the quorum a+b
                assert await append(coord, [rec_of(i)]) == i
            await wait_for(lambda: coord.links["c:1"].state != "in_sync")  # the watchdog dropped it
            assert await append(coord, [rec_of(40)]) == 40  # and writes went on without it
            assert len(net.stores["c:1"][0].frames) == 5
            net.heal("c:1")
            await wait_for(lambda: coord.links["c:1"].state == "in_sync")
            assert await append(coord, [rec_of(41)]) == 41
            await wait_for(lambda: len(net.stores["c:1"][0].frames) == 42)
            expected = [f"r{i}".encode() for i in range(42)]
            for a in ADDRS:
                assert bodies(net.log(a)) == expected
            assert coord.replica_states["c:1"].session_id == coord.session
            nursery.cancel_scope.cancel()

    run_sim(main)


def test_two_partitioned_fails_with_quorum_lost_then_recovers() -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            net, coord = await start_cluster(nursery)
            await append(coord, [rec_of(0)])
            first_session = coord.session
            net.partition("b:1")
            net.partition("c:1")
            with pytest.raises(QuorumLost):
                await append(coord, [rec_of(1)])
            with pytest.raises(QuorumUnavailable):  # no session: refused at once, nothing written
                await append(coord, [rec_of(2)])
            net.heal("b:1")
            net.heal("c:1")
            await wait_for(lambda: coord.writable.is_set() and coord.session > first_session)
            lsn = await append(coord, [rec_of(3)])
            logs = [bodies(net.log(a)) for a in ADDRS]
            # r1 reached only a (never a quorum): recovery may keep or drop it, but all agree.
            assert logs[0] == logs[1] == logs[2] or len({tuple(x[:lsn + 1]) for x in logs if len(x) > lsn}) == 1
            assert bodies(net.log("a:1"))[0] == b"r0" and bodies(net.log("a:1"))[lsn] == b"r3"
            nursery.cancel_scope.cancel()

    run_sim(main)


async def crash_with_a_batch_only_on_a(nursery: trio.Nursery, net: SimNetwork, meta: MemoryMetadataStore) -> list:
    """A coordinator writes r0..r9 to all three replicas, then a batch (r100, r101) that
    reaches only a (b and c are partitioned, and stay so), and dies. The batch's callbacks."""
    old = make_coordinator(net, meta)
    scope = trio.CancelScope()

    async def run_old(task_status=trio.TASK_STATUS_IGNORED) -> None:
        with scope:
            await old.run(task_status=task_status)

    await nursery.start(run_old)
    for i in range(10):
        await append(old, [rec_of(i)])
    net.partition("b:1")
    net.partition("c:1")
    acked: list = []
    old.submit([rec_of(100), rec_of(101)], lambda lsn, err: acked.append((lsn, err)))
    await wait_for(lambda: len(net.stores["a:1"][0].frames) == 12)  # the batch reached a only
    scope.cancel()  # the coordinator dies before any quorum
    await trio.lowlevel.checkpoint()
    return acked


def test_coordinator_crash_mid_batch_recovery_truncates_unacknowledged() -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            net = await start_nodes(nursery)
            meta = MemoryMetadataStore()
            acked = await crash_with_a_batch_only_on_a(nursery, net, meta)
            assert not any(err is None for _, err in acked)
            net.heal("b:1")
            net.heal("c:1")
            new = make_coordinator(net, meta)
            await nursery.start(new.run)
            assert new.committed == 9  # the vote: b and c hold 9, a holds 11
            for a in ADDRS:
                assert bodies(net.log(a)) == [f"r{i}".encode() for i in range(10)]
            assert await append(new, [rec_of(10)]) == 10
            state = PartitionMetaStore(meta, 0).load()[0]
            assert all(s == state.replicas[a] for a in ADDRS for s in [state.replicas[a]])
            assert {s.closing_hwm for s in state.replicas.values()} == {UNRESOLVED}
            nursery.cancel_scope.cancel()

    run_sim(main)


def test_superseded_coordinator_is_fenced() -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            net = await start_nodes(nursery)
            meta = MemoryMetadataStore()
            old = make_coordinator(net, meta)
            await nursery.start(old.run)
            assert await append(old, [rec_of(0)]) == 0
            new = make_coordinator(net, meta)
            await nursery.start(new.run)
            with pytest.raises(SessionFenced):
                await append(old, [rec_of(1)])
            with pytest.raises(SessionFenced):
                await append(old, [rec_of(2)])
            assert await append(new, [rec_of(1)]) == 1
            for a in ADDRS:
                await wait_for(lambda a=a: len(net.stores[a][0].frames) == 2)
                assert bodies(net.log(a)) == [b"r0", b"r1"]
            nursery.cancel_scope.cancel()

    run_sim(main)


def test_superseded_coordinator_with_a_replica_down_is_fenced_not_quorum_lost() -> None:
    """With one replica already out of sync, the first FENCED reply leaves fewer than a
    quorum in sync: that must still end in SessionFenced (the metadata decides), not in
    QuorumLost, which would tell the writer to retry against a coordinator that lost."""
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            net = await start_nodes(nursery)
            meta = MemoryMetadataStore()
            old = make_coordinator(net, meta)
            await nursery.start(old.run)
            assert await append(old, [rec_of(0)]) == 0
            net.partition("c:1")
            assert await append(old, [rec_of(1)]) == 1
            await wait_for(lambda: old.links["c:1"].state != "in_sync")
            new = make_coordinator(net, meta)
            await nursery.start(new.run)
            with pytest.raises(SessionFenced):
                await append(old, [rec_of(2)])
            assert await append(new, [rec_of(2)]) == 2
            for a in ("a:1", "b:1"):
                assert bodies(net.log(a)) == [b"r0", b"r1", b"r2"]
            nursery.cancel_scope.cancel()

    run_sim(main)


def test_replica_failure_closes_the_session_and_no_append_in_flight_fails() -> None:
    """Waltz: a failed replica closes the store session and a new one recovers. Appends
    in flight are settled by the closing high-water mark, never failed or duplicated."""
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            net, coord = await start_cluster(nursery)
            first_session = coord.session
            results: dict[int, tuple[int, BaseException | None]] = {}

            def submit(i: int) -> None:
                coord.submit([rec_of(i), rec_of(i + 10_000)],
                             lambda lsn, err, i=i: results.__setitem__(i, (lsn, err)))

            for i in range(100):
                submit(i)
            await wait_for(lambda: len(results) >= 30)
            net.partition("c:1")  # mid-stream: appends in flight to c will never be answered
            reads: list[tuple[bool, bytes]] = []

            async def read_now() -> None:
                restarting = coord.restarting
                reads.append((restarting, await coord.read(0)))

            close = coord.close_session  # start a read the moment the session closes
            coord.close_session = lambda why: (close(why), nursery.start_soon(read_now))
            n = 100
            while coord.session == first_session or n < 300:  # keep appending through the restart
                submit(n)
                n += 1
                await trio.sleep(0.005)
            await wait_for(lambda: len(reads) == 1)
            assert reads[0][0] and reads[0][1].startswith(rec.encode(rec_of(0), 0))  # served across the restart
            await wait_for(lambda: len(results) == n)
            assert all(err is None for _, err in results.values()), results
            assert coord.sessions_started == 2 and coord.links["c:1"].state == "down"
            log_a = bodies(net.log("a:1"))
            assert log_a == bodies(net.log("b:1"))[:len(log_a)]
            # every append exactly once, in submit order, at the LSN it was acknowledged with
            expected = [body for i in range(n) for body in (f"r{i}".encode(), f"r{i + 10_000}".encode())]
            assert log_a == expected
            assert [results[i][0] for i in range(n)] == [2 * i + 1 for i in range(n)]
            net.heal("c:1")
            await wait_for(lambda: coord.links["c:1"].state == "in_sync")
            assert await append(coord, [rec_of(999)]) == 2 * n
            await wait_for(lambda: len(net.stores["c:1"][0].frames) == 2 * n + 1)
            assert bodies(net.log("c:1")) == expected + [b"r999"]
            nursery.cancel_scope.cancel()

    run_sim(main)


def test_recovery_catches_a_lagging_replica_up_when_the_vote_is_undecidable() -> None:
    """a holds 12 records, b 10, c is unreachable: 12 is undecidable (c might hold it too)
    until b catches up from a. The new coordinator does that instead of waiting for c."""
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            net = await start_nodes(nursery)
            meta = MemoryMetadataStore()
            await crash_with_a_batch_only_on_a(nursery, net, meta)
            net.heal("b:1")  # c stays away
            new = make_coordinator(net, meta)
            with trio.fail_after(30):
                await nursery.start(new.run)
            assert new.committed == 11
            expected = [f"r{i}".encode() for i in range(10)] + [b"r100", b"r101"]
            assert bodies(net.log("a:1")) == bodies(net.log("b:1")) == expected
            assert await append(new, [rec_of(12)]) == 12
            state = PartitionMetaStore(meta, 0).load()[0]
            assert state.replicas["c:1"].closing_hwm == 11  # c, when it returns, keeps at most 11
            net.heal("c:1")
            await wait_for(lambda: new.links["c:1"].state == "in_sync")
            await wait_for(lambda: len(net.stores["c:1"][0].frames) == 13)
            assert bodies(net.log("c:1")) == expected + [b"r12"]
            nursery.cancel_scope.cancel()

    run_sim(main)


def test_carry_over_acknowledges_what_recovery_kept_and_resends_the_rest_in_order() -> None:
    """The settlement of a closed session's appends, on its own: records at or below the
    closing high-water mark are acknowledged; the rest are sent again with new LSNs, and
    a submission cut by the mark is acknowledged once, whole, after its tail is durable."""
    coord = Coordinator(ADDRS, PartitionMetaStore(MemoryMetadataStore(), 0), KEY, 0, connect=None)
    seen: list[list[bytes]] = []
    coord.listeners.append(lambda records: seen.append([r.body for r in records]))
    acks: list[tuple[str, int]] = []

    def waiter(name: str, lsns: list[int]) -> Pending:
        records = []
        for lsn in lsns:
            r = rec_of(lsn)
            r.lsn = lsn
            records.append(r)
        return Pending(records, lambda lsn, err: acks.append((name, lsn if err is None else -1)))

    w1, w2, w3 = waiter("w1", [5, 6]), waiter("w2", [7, 8, 9]), waiter("w3", [10])
    queued = waiter("q", [])
    queued.records = [rec_of(11)]
    coord.inflight.extend([Batch(5, 9, b"", [], [w1, w2]), Batch(10, 10, b"", [], [w3])])
    coord.queue.append(queued)
    coord.end_lsn, coord.committed = 8, 7  # recovery kept LSNs up to 7
    coord._carry_over(7)
    assert acks == [("w1", 6)] and seen == [[b"r5", b"r6"]]
    assert [(p.records[0].body, p.skip) for p in coord.queue] == [(b"r7", 1), (b"r10", 0), (b"r11", 0)]
    coord._send_batch()
    [batch] = coord.inflight
    assert (batch.first, batch.last) == (8, 11)
    frames = [rec.record_of(rec.decode_header(f), f[rec.HEADER_SIZE:]) for f in _frames(batch.payload)]
    assert [(f.lsn, f.body) for f in frames] == [(8, b"r8"), (9, b"r9"), (10, b"r10"), (11, b"r11")]
    batch.acks.update(ADDRS[:2])
    coord._advance()
    assert acks == [("w1", 6), ("w2", 9), ("w3", 10), ("q", 11)]
    assert seen[1] == [b"r7", b"r8", b"r9"]  # the whole submission, once


def _frames(payload: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(payload):
        size = rec.decode_header(payload, pos).frame_size
        out.append(payload[pos:pos + size])
        pos += size
    return out
