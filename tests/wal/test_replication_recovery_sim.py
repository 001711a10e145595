"""Recovery by Waltz's rules and the one metadata writer, under trio's MockClock.

Storage states are laid out directly in the in-memory stores and the partition metadata
(what earlier sessions would have left), then a real Coordinator recovers over real
StorageNode request handlers on the simulated network of tests/wal/test_replication_sim.py.
"""

from __future__ import annotations

import itertools

import pytest
import trio
from support.memory_store import MemoryPartitionStore
from test_replication_sim import (
    KEY,
    SimNetwork,
    append,
    bodies,
    make_coordinator,
    rec_of,
    run_sim,
    start_cluster,
    start_nodes,
    wait_for,
)

from sediment.errors import LowWaterMarkRegression, ReplicaUnavailable, SessionFenced
from sediment.metadata.memory import MemoryMetadataStore
from sediment.wal import record as rec
from sediment.wal.control import PartitionState
from sediment.wal.replication.node.storage_node import StorageNode
from sediment.wal.replication.partition_meta import (
    UNRESOLVED,
    PartitionMeta,
    PartitionMetaStore,
    ReplicaState,
)
from sediment.wal.replication.recovery import read_back_ours
from sediment.wal.replication.replica import ReplicaConnection
from sediment.wal.replication.store_session import Batch
from sediment.wal.replication.wire import MsgType, Request, Status

FIVE = ["a:1", "b:1", "c:1", "d:1", "e:1"]


def lay_out(net: SimNetwork, address: str, last: int, session: int, lwm: int) -> None:
    """A replica holding r0..r<last> whose storage last opened ``session`` with low-water mark ``lwm``."""
    store = net.stores.setdefault(address, {}).setdefault(0, MemoryPartitionStore())
    store.frames = [rec.encode(rec_of(i), i) for i in range(last + 1)]
    store.state = PartitionState(session, lwm, min(lwm, last), 1)


async def laid_out(nursery: trio.Nursery, layouts: dict[str, tuple[int, int, int]]) -> tuple[SimNetwork, MemoryMetadataStore]:
    """A network whose nodes hold what :func:`lay_out` lays out for each (last, session,
    low-water mark), started in that order, and an empty metadata store."""
    net = SimNetwork(nursery)
    for address, (last, session, lwm) in layouts.items():
        lay_out(net, address, last, session, lwm)
    for address in layouts:
        await net.add_node(address)
    return net, MemoryMetadataStore()


def write_meta(meta: MemoryMetadataStore, session: int, states: dict[str, ReplicaState], generation: int = 0) -> None:
    store = PartitionMetaStore(meta, 0)
    _, version = store.load()
    store.save(PartitionMeta(generation, session, states), version)


async def issue_example(nursery: trio.Nursery, connect_order: tuple[str, ...]) -> tuple[SimNetwork, MemoryMetadataStore]:
    """{120, 120, 110, 105, 105}: a and b were in session 2 and vote; c, d, e had their
    closing high-water marks set by session 2's recovery and do not vote."""
    net = SimNetwork(nursery)
    meta = MemoryMetadataStore()
    for a, last in zip(FIVE, [120, 120, 110, 105, 105], strict=True):
        lay_out(net, a, last, 2 if a in ("a:1", "b:1") else 1, 100 if a in ("a:1", "b:1") else last)
        await net.add_node(a)
    write_meta(meta, 2, {"a:1": ReplicaState(2, UNRESOLVED), "b:1": ReplicaState(2, UNRESOLVED),
                         "c:1": ReplicaState(1, 110), "d:1": ReplicaState(1, 105), "e:1": ReplicaState(1, 105)})
    plain = net.connect

    async def staggered(address: str):  # replicas report in the given order
        await trio.sleep(0.01 * connect_order.index(address))
        return await plain(address)

    net.connect = staggered
    return net, meta


def test_issue_example_resolves_120_whatever_the_report_order() -> None:
    expected = [f"r{i}".encode() for i in range(121)]
    for order in list(itertools.permutations(FIVE))[::17]:
        async def main(order=order) -> None:
            async with trio.open_nursery() as nursery:
                net, meta = await issue_example(nursery, order)
                coord = make_coordinator(net, meta, FIVE)
                await nursery.start(coord.run)
                assert coord.committed == 120, order
                await wait_for(lambda: len(coord.in_sync()) == 5)
                for a in FIVE:
                    assert bodies(net.log(a)) == expected
                    assert net.stores[a][0].state.low_water_mark == 120  # every recovered replica
                state = PartitionMetaStore(meta, 0).load()[0]
                assert state.replicas == {a: ReplicaState(coord.session, UNRESOLVED) for a in FIVE}
                assert await append(coord, [rec_of(121)]) == 121
                nursery.cancel_scope.cancel()

        run_sim(main)


def test_restored_old_copy_is_truncated_to_its_low_water_mark_and_does_not_vote() -> None:
    """c's storage was restored from a copy of session 1 (low-water mark 4) and holds stale
    records 5..30 that session 2 never wrote; a and b hold the truth up to 12. The old copy
    must neither vote for 30 nor keep its stale tail."""
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            net = SimNetwork(nursery)
            meta = MemoryMetadataStore()
            lay_out(net, "a:1", 12, 2, 9)
            lay_out(net, "b:1", 12, 2, 9)
            store = net.stores.setdefault("c:1", {}).setdefault(0, MemoryPartitionStore())
            store.frames = [rec.encode(rec_of(i if i <= 4 else 1000 + i), i) for i in range(31)]
            store.state = PartitionState(1, 4, 4, 1)
            for a in ("a:1", "b:1", "c:1"):
                await net.add_node(a)
            write_meta(meta, 2, {a: ReplicaState(2, UNRESOLVED) for a in ("a:1", "b:1", "c:1")})
            net.partition("b:1")  # b away: a (12) and c (4 after truncation) only
            coord = make_coordinator(net, meta)
            with trio.fail_after(30):
                await nursery.start(coord.run)
            assert coord.committed == 12
            expected = [f"r{i}".encode() for i in range(13)]
            assert bodies(net.log("c:1")) == expected and bodies(net.log("a:1")) == expected
            assert net.stores["c:1"][0].state.low_water_mark == 12
            nursery.cancel_scope.cancel()

    run_sim(main)


def test_new_replica_with_stale_records_neither_votes_nor_counts_absent() -> None:
    """d is new to the metadata but its storage holds 50 records of another history (stored
    low-water mark 2). It must not vote (it would carry 50 into the vote), must lose its
    stale tail above its low-water mark, and must not make the vote wait as if absent: a and
    b (c is away) decide 12 on their own."""
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            net = SimNetwork(nursery)
            meta = MemoryMetadataStore()
            for a in ("a:1", "b:1", "c:1"):
                lay_out(net, a, 12, 2, 9)
            store = net.stores.setdefault("d:1", {}).setdefault(0, MemoryPartitionStore())
            store.frames = [rec.encode(rec_of(i if i <= 2 else 5000 + i), i) for i in range(51)]
            store.state = PartitionState(1, 2, 2, 1)
            for a in ("a:1", "b:1", "c:1", "d:1"):
                await net.add_node(a)
            write_meta(meta, 2, {a: ReplicaState(2, UNRESOLVED) for a in ("a:1", "b:1", "c:1")})
            net.partition("c:1")
            coord = make_coordinator(net, meta, ["a:1", "b:1", "c:1", "d:1"])
            with trio.fail_after(30):
                await nursery.start(coord.run)
            assert coord.committed == 12
            expected = [f"r{i}".encode() for i in range(13)]
            assert bodies(net.log("d:1")) == expected
            state = PartitionMetaStore(meta, 0).load()[0]
            assert state.replicas["d:1"] == ReplicaState(coord.session, UNRESOLVED)
            assert state.replicas["c:1"] == ReplicaState(2, 12)  # away: keeps its session, gets the mark
            nursery.cancel_scope.cancel()

    run_sim(main)


def test_replica_replaced_added_and_removed() -> None:
    """c is replaced by d (new: does not vote, is not absent; c still counts as absent while
    in the metadata), then e is added, then d removed. Nothing acknowledged is lost and the
    metadata follows the assignment."""
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            net = await start_nodes(nursery)
            for a in ("d:1", "e:1"):
                await net.add_node(a)
            meta = MemoryMetadataStore()
            n = 0
            for replicas in (["a:1", "b:1", "c:1"], ["a:1", "b:1", "d:1"], ["a:1", "b:1", "d:1", "e:1"],
                             ["a:1", "b:1", "e:1"]):
                coord = make_coordinator(net, meta, replicas)
                scope = trio.CancelScope()

                async def run(task_status=trio.TASK_STATUS_IGNORED, coord=coord, scope=scope) -> None:
                    with scope:
                        await coord.run(task_status=task_status)

                with trio.fail_after(30):
                    await nursery.start(run)
                assert coord.committed == n - 1
                for _ in range(5):
                    assert await append(coord, [rec_of(n)]) == n
                    n += 1
                await wait_for(lambda coord=coord, replicas=replicas: len(coord.in_sync()) == len(replicas))
                state = PartitionMetaStore(meta, 0).load()[0]
                assert set(state.replicas) == set(replicas)
                assert all(s == ReplicaState(coord.session, UNRESOLVED) for s in state.replicas.values())
                scope.cancel()
            expected = [f"r{i}".encode() for i in range(n)]
            for a in ("a:1", "b:1", "e:1"):
                assert bodies(net.log(a)) == expected
            nursery.cancel_scope.cancel()

    run_sim(main)


async def crash_nodes(net: SimNetwork, coord, down: set[str]) -> None:
    """The nodes in ``down`` (a live set: remove to restart) crash: connections drop and new
    ones are refused at once, so retries of all of them run in step."""
    plain = net.connect

    async def connect(address: str):
        if address in down:
            raise OSError(f"connection to {address} refused")
        return await plain(address)

    net.connect = coord.connect = connect
    for a in down:
        for stream in net.streams.get(a, []):
            await stream.aclose()


def test_two_catch_ups_finishing_together_neither_fence_nor_lose_an_update() -> None:
    """Finding 2: d and e come back together and finish catching up in the same instant,
    with metadata calls that take 0.5 s (so their updates overlap: before the one writer,
    the loser's compare-and-set conflict fenced the coordinator for good). Both end up
    engaged in the session in the metadata and the coordinator keeps writing."""
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            net = await start_nodes(nursery)
            for a in ("d:1", "e:1"):
                await net.add_node(a)
            meta = MemoryMetadataStore()
            coord = make_coordinator(net, meta, FIVE, meta_latency=0.5, timeout=5.0)
            await nursery.start(coord.run)
            for i in range(10):
                assert await append(coord, [rec_of(i)]) == i
            down = {"d:1", "e:1"}
            await crash_nodes(net, coord, down)
            for i in range(10, 30):  # the appends find d and e gone; the session restarts without them
                assert await append(coord, [rec_of(i)]) == i
            await wait_for(lambda: set(coord.in_sync()) == {"a:1", "b:1", "c:1"})
            writes = coord.meta_writer.writes
            down.clear()
            await wait_for(lambda: len(coord.in_sync()) == 5 or coord.fenced is not None)
            assert coord.fenced is None
            assert coord.meta_writer.writes == writes + 2  # one update each, neither lost
            state = PartitionMetaStore(meta, 0).load()[0]
            assert state.replicas["d:1"] == state.replicas["e:1"] == ReplicaState(coord.session, UNRESOLVED)
            assert coord.replica_states == state.replicas
            assert await append(coord, [rec_of(30)]) == 30
            for a in ("d:1", "e:1"):
                assert net.stores[a][0].state.low_water_mark == coord.closing_hwm  # set when caught up
                await wait_for(lambda a=a: len(net.stores[a][0].frames) == 31)
                assert bodies(net.log(a)) == [f"r{i}".encode() for i in range(31)]
            nursery.cancel_scope.cancel()

    run_sim(main)


class ConflictingStore(MemoryMetadataStore):
    """Someone else writes the partition key just before our next compare-and-set: once with
    the same content (a conflict, but still our session), or with ``replace`` (not ours)."""

    def __init__(self) -> None:
        super().__init__()
        self.interfere: PartitionMeta | bool | None = None

    def compare_and_set(self, key: str, value: bytes, expected_version: int | None) -> int:
        if self.interfere is not None and expected_version is not None:
            got = self.get(key)
            body = got.value if self.interfere is True else self.interfere.encode()
            self.interfere = None
            super().compare_and_set(key, body, got.version)
        return super().compare_and_set(key, value, expected_version)


def test_metadata_conflict_retries_and_only_another_session_fences() -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            net = await start_nodes(nursery)
            meta = ConflictingStore()
            coord = make_coordinator(net, meta)
            await nursery.start(coord.run)
            await append(coord, [rec_of(0)])
            net.partition("c:1")
            await append(coord, [rec_of(1)])
            await wait_for(lambda: "c:1" not in coord.in_sync())
            meta.interfere = True  # a conflict that leaves the session ours: retried
            conflicts = coord.meta_writer.conflicts
            net.heal("c:1")
            await wait_for(lambda: len(coord.in_sync()) == 3)
            assert coord.fenced is None and coord.meta_writer.conflicts == conflicts + 1
            assert await append(coord, [rec_of(2)]) == 2
            net.partition("c:1")
            await append(coord, [rec_of(3)])
            await wait_for(lambda: "c:1" not in coord.in_sync())
            theirs = PartitionMetaStore(meta, 0).load()[0]
            theirs.session_id += 1
            meta.interfere = theirs  # another coordinator took a session: fenced
            net.heal("c:1")
            await wait_for(lambda: coord.fenced is not None)
            with pytest.raises(SessionFenced):
                await append(coord, [rec_of(4)])
            nursery.cancel_scope.cancel()

    run_sim(main)


def test_older_generation_is_refused() -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            net = await start_nodes(nursery)
            meta = MemoryMetadataStore()
            new = make_coordinator(net, meta, generation=3)
            await nursery.start(new.run)
            assert PartitionMetaStore(meta, 0).load()[0].generation == 3
            old = make_coordinator(net, meta, generation=2)
            await nursery.start(old.run)
            assert old.fenced is not None and "generation" in str(old.fenced)
            assert await append(new, [rec_of(0)]) == 0  # the newer one was not disturbed
            nursery.cancel_scope.cancel()

    run_sim(main)


def test_storage_node_refuses_lower_low_water_marks_and_truncation_out_of_range() -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            store = MemoryPartitionStore()
            store.frames = [rec.encode(rec_of(i), i) for i in range(10)]
            store.state = PartitionState(1, 5, 5, 1)
            node = StorageNode(KEY, lambda pid: store)
            await nursery.start(node.run)
            replies = []

            def ask(t: MsgType, arg1: int = 0, session: int = 1) -> Status:
                node.submit(Request(t, len(replies), KEY, 0, session, arg1), replies.append)
                return replies[-1].status

            assert ask(MsgType.OPEN) == Status.OK
            assert ask(MsgType.SET_LWM, 4) == Status.BAD_REQUEST and store.state.low_water_mark == 5
            assert ask(MsgType.TRUNCATE, 11) == Status.BAD_REQUEST  # above the last record
            assert ask(MsgType.TRUNCATE, -1) == Status.BAD_REQUEST  # below first - 1
            assert len(store.frames) == 10
            assert ask(MsgType.SET_LWM, 7) == Status.OK and store.state.low_water_mark == 7
            assert ask(MsgType.TRUNCATE, 10) == Status.OK and len(store.frames) == 10  # keep all: allowed
            assert ask(MsgType.TRUNCATE, 8) == Status.OK and len(store.frames) == 8
            with pytest.raises(LowWaterMarkRegression):
                store.write_state(PartitionState(1, 6, 6))
            nursery.cancel_scope.cancel()

    run_sim(main)


def test_a_node_claiming_a_newer_session_does_not_stop_the_coordinator() -> None:
    """c's storage says session 7 (it came from elsewhere), the metadata says nothing newer
    than ours: c answers FENCED, the coordinator re-reads the metadata, finds itself still
    current and goes on with a and b instead of stopping for good."""
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            net = SimNetwork(nursery)
            lay_out(net, "c:1", -1, 7, -1)
            for a in ("a:1", "b:1", "c:1"):
                await net.add_node(a)
            coord = make_coordinator(net, MemoryMetadataStore())
            with trio.fail_after(30):
                await nursery.start(coord.run)
            for i in range(5):
                assert await append(coord, [rec_of(i)]) == i
            await trio.sleep(1.0)  # c's catch-up keeps being refused meanwhile
            assert coord.fenced is None and set(coord.in_sync()) == {"a:1", "b:1"}
            assert await append(coord, [rec_of(5)]) == 5
            nursery.cancel_scope.cancel()

    run_sim(main)


def test_read_back_keeps_only_the_frames_this_coordinator_sent() -> None:
    """A coordinator whose session closed with LSNs 5..9 in flight, while another session
    kept 5..6 of them and wrote its own records at 7..9: only 5..6 may be acknowledged
    (the rest are sent again), whatever the new closing high-water mark says."""
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            net = SimNetwork(nursery)
            ours = [rec.encode(rec_of(i), i) for i in range(10)]
            theirs = [rec.encode(rec.Record(rec.RecordKind.UPDATES, relation_id=1, t_lo=i, t_hi=i,
                                            body=f"other{i}".encode()), i) for i in range(10)]
            store = net.stores.setdefault("a:1", {}).setdefault(0, MemoryPartitionStore())
            store.frames = ours[:7] + theirs[7:]
            store.state = PartitionState(3, 9, 9, 1)
            await net.add_node("a:1")
            await net.add_node("b:1")
            coord = make_coordinator(net, MemoryMetadataStore(), ["a:1", "b:1"])
            conn = await ReplicaConnection.open(nursery, "a:1", net.connect, KEY, 0, 1.0)
            dead = await ReplicaConnection.open(nursery, "b:1", net.connect, KEY, 0, 1.0)
            dead.kill("gone")
            sent = [Batch(5, 7, b"".join(ours[5:8]), [len(f) for f in ours[5:8]], []),
                    Batch(8, 9, b"".join(ours[8:10]), [len(f) for f in ours[8:10]], [])]
            assert await read_back_ours(coord, {"a:1": conn}, 3, sent, 9) == 6
            assert await read_back_ours(coord, {"b:1": dead, "a:1": conn}, 3, sent, 9) == 6
            assert await read_back_ours(coord, {"a:1": conn}, 3, sent, 5) == 5  # never above the closing mark
            assert await read_back_ours(coord, {"a:1": conn}, 3, sent[:1], 6) == 6
            store.frames = ours[:5] + theirs[5:]  # another session's record right at our first LSN
            assert await read_back_ours(coord, {"a:1": conn}, 3, sent, 9) == 4
            with pytest.raises(ReplicaUnavailable, match="no clean replica could be read"):
                await read_back_ours(coord, {"b:1": dead}, 3, sent, 9)
            nursery.cancel_scope.cancel()

    run_sim(main)


def test_storage_engaged_by_a_session_whose_metadata_update_failed_keeps_its_low_water_mark() -> None:
    """Session 7 resolved 12 on a and c (their low-water marks are 12) but could not write
    the metadata, which still says c closed at 10 in session 5. b lost LSN 12 in a crash.
    c's storage is newer than its metadata state: it keeps up to its low-water mark (12,
    committed), so 12 is on a quorum. Truncating c to the stale 10 resolved 11, below the
    low-water marks the nodes refuse to lower: recovery never finished."""
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            net, meta = await laid_out(nursery, {"a:1": (12, 7, 12), "b:1": (11, 6, 10), "c:1": (12, 7, 12)})
            write_meta(meta, 7, {"a:1": ReplicaState(6, UNRESOLVED), "b:1": ReplicaState(6, UNRESOLVED),
                                 "c:1": ReplicaState(5, 10)})
            coord = make_coordinator(net, meta)
            with trio.fail_after(30):
                await nursery.start(coord.run)
                await wait_for(lambda: len(coord.in_sync()) == 3)
            assert coord.committed == 12
            expected = [f"r{i}".encode() for i in range(13)]
            for a in ("a:1", "b:1", "c:1"):
                assert bodies(net.log(a)) == expected
                assert net.stores[a][0].state.low_water_mark == 12
            nursery.cancel_scope.cancel()

    run_sim(main)


def test_the_vote_never_resolves_below_a_low_water_mark_a_voter_stored() -> None:
    """Seed 4541: session 5 resolved 13 and set it as b's and d's low-water mark, caught c up
    to 13, then failed before setting c's mark and writing the metadata (b, d: session 4
    UNRESOLVED; c: closed at 10 in session 3). a lost LSN 13 in a crash, c the copies above
    10. Only b and d hold 13 and a quorum of 3 of 4 supports 12 before a is caught up: the
    nodes refuse to lower their low-water marks to 12, and recovery never finished. A
    mark below a stored low-water mark its replica holds decides nothing: a is caught up."""
    four = ["a:1", "b:1", "c:1", "d:1"]

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            net, meta = await laid_out(nursery, {"a:1": (12, 4, 10), "b:1": (13, 5, 13), "c:1": (10, 5, 8),
                                                 "d:1": (13, 5, 13)})
            write_meta(meta, 5, {"a:1": ReplicaState(4, UNRESOLVED), "b:1": ReplicaState(4, UNRESOLVED),
                                 "c:1": ReplicaState(3, 10), "d:1": ReplicaState(4, UNRESOLVED)})
            coord = make_coordinator(net, meta, four)
            with trio.fail_after(30):
                await nursery.start(coord.run)
                await wait_for(lambda: len(coord.in_sync()) == 4)
            assert coord.committed == 13
            expected = [f"r{i}".encode() for i in range(14)]
            for a in four:
                assert bodies(net.log(a)) == expected
                assert net.stores[a][0].state.low_water_mark == 13
            nursery.cancel_scope.cancel()

    run_sim(main)


def test_the_vote_joins_again_a_replica_whose_connection_dropped() -> None:
    """a (120) and b (110) vote in session 2; c is down throughout. Nothing is decided until
    b is caught up from a (c with a might hold a quorum above 110). a's connection drops
    after a reported and before b did; a comes back. The vote must join a again, copy a's
    records to b and decide 120. It kept a's report with its dead connection and waited for
    a change nobody would make: no catch-up had a live source, and no join was left to run."""
    three = ["a:1", "b:1", "c:1"]

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            net, meta = await laid_out(nursery, {"a:1": (120, 2, 100), "b:1": (110, 2, 100)})
            write_meta(meta, 2, {a: ReplicaState(2, UNRESOLVED) for a in three})
            plain, down = net.connect, {"c:1"}

            async def connect(address: str):
                if address in down:
                    raise OSError(f"connection to {address} refused")
                if address == "b:1":
                    await trio.sleep(0.05)  # b reports after a's connection dropped
                return await plain(address)

            async def drop_a() -> None:
                await trio.sleep(0.02)
                down.add("a:1")
                for stream in net.streams.get("a:1", []):
                    await stream.aclose()
                await trio.sleep(0.5)
                down.discard("a:1")

            net.connect = connect
            coord = make_coordinator(net, meta, three)
            nursery.start_soon(drop_a)
            with trio.fail_after(30):
                await nursery.start(coord.run)
            assert coord.committed == 120
            assert bodies(net.log("b:1")) == [f"r{i}".encode() for i in range(121)]
            nursery.cancel_scope.cancel()

    run_sim(main)


def test_a_replica_dropped_while_joining_is_caught_up_again_without_a_new_append() -> None:
    """c comes back after a crash; as its catch-up sends the live batches (the joining step)
    its replies start to be lost, so the watchdog drops it. With no append after that, the
    catch-up must still notice the drop and try again, and c is back in sync once its replies
    flow. It waited for an acknowledgement's progress that only a new append would make."""
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            net, coord = await start_cluster(nursery)
            for i in range(10):
                assert await append(coord, [rec_of(i)]) == i
            down = {"c:1"}
            await crash_nodes(net, coord, down)
            for i in range(10, 20):
                assert await append(coord, [rec_of(i)]) == i
            await wait_for(lambda: set(coord.in_sync()) == {"a:1", "b:1"})
            send_to, lost = coord._send_to, []  # noqa: SLF001 - the joining step's first send

            def send_then_lose_replies(link, batch) -> None:
                send_to(link, batch)
                if link.address == "c:1" and link.state == "catching" and not lost:
                    lost.append(trio.current_time())
                    net.partition("c:1")  # what was sent arrives; every reply is lost

            coord._send_to = send_then_lose_replies
            down.clear()
            await wait_for(lambda: lost, 30)
            await wait_for(lambda: coord.links["c:1"].state == "down", 30)  # the watchdog dropped c
            net.heal("c:1")
            await wait_for(lambda: "c:1" in coord.in_sync(), 30)  # no append meanwhile
            assert bodies(net.log("c:1")) == [f"r{i}".encode() for i in range(20)]
            nursery.cancel_scope.cancel()

    run_sim(main)
