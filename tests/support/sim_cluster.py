"""A seeded, deterministic simulation of the whole replicated log (FoundationDB-style).

``run_seed(seed)`` builds a cluster in memory under trio's MockClock: real
:class:`StorageNode` request handling over :class:`SimDisk` storage, real
:class:`Coordinator` s (store sessions, recovery, catch-up) over a simulated network
(tests/support/sim_world.py), partition metadata in a :class:`MemoryMetadataStore` behind a
wrapper that can fail or race. Clients append; a schedule drawn from the seed injects
faults; then every fault heals, a final coordinator recovers, and the history checker
(tests/support/sim_checker.py) judges the run. Same seed, same schedule, same result.

The code under test is used only through what the real log uses: ``Coordinator(...)``,
``submit``, ``run``, ``writable``, ``in_sync()``, ``session``, ``committed``, ``fenced``,
``StorageNode(key, open_store)``, ``run``/``serve`` and the PartitionStore protocol,
``PartitionMetaStore`` over a MetadataStore. Trio's scheduler randomness is seeded per
run and kept to the run's thread (tests/support/sim_schedule.py), so task order is
reproducible whatever else runs in the process.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import random
import uuid
from dataclasses import dataclass, field

import trio
import trio.testing

from sediment.errors import MetadataError
from sediment.metadata.memory import MemoryMetadataStore
from sediment.wal import record as rec
from sediment.wal.replication.node.storage_node import StorageNode
from sediment.wal.replication.partition_meta import UNRESOLVED, PartitionMeta, PartitionMetaStore
from sediment.wal.replication.partition_meta import key as meta_key
from sediment.wal.replication.store_session import Coordinator
from support.sim_checker import Final, History, Violation, check_final
from support.sim_instruments import Livelock, TraceLogs
from support.sim_schedule import seeded_scheduler
from support.sim_world import SimDisk, SimNet, SimNodeEndpoint, SimPartitionStore

KEY = uuid.UUID(int=13)

FAULT_KINDS = {  # kind -> weight in the schedule
    "node_crash": 5, "partition": 3, "partition_oneway": 2, "partition_coordinator": 2, "slow_link": 2,
    "conn_reset": 2, "coord_crash": 3, "coord_takeover": 2, "meta_conflict": 3, "meta_outage": 1,
    "replica_add": 1, "replica_remove": 1, "replica_replace": 1, "disk_full": 2, "slow_disk": 1,
}
SETTLE = 30.0  # virtual seconds after healing for every live coordinator to answer every append
FINAL_RECOVERY = 60.0  # virtual seconds for the final recovery (every node up, network healed)


class SimMeta:
    """One coordinator's view of the metadata store: outages, raced writes, and a record of
    every session it wrote (to tell a spurious fence from a real one)."""

    def __init__(self, cluster: Cluster, name: str, partition: int = 0) -> None:
        self.cluster, self.name = cluster, name
        self.key, self.history = meta_key(partition), cluster.history_of(partition)
        self.sessions: list[int] = []

    def get(self, key: str):
        if self.cluster.meta_down:
            raise MetadataError(f"simulated: the metadata store is unreachable (reading {key})")
        return self.cluster.store.get(key)

    def compare_and_set(self, key: str, value: bytes, expected_version: int | None) -> int:
        c = self.cluster
        if c.meta_down:
            raise MetadataError(f"simulated: the metadata store is unreachable (writing {key})")
        if key == self.key and c.meta_conflicts > 0:
            cur = c.store.get(key)
            if cur is not None:  # another writer rewrote it first: same content, new version
                c.meta_conflicts -= 1
                c.store.compare_and_set(key, cur.value, cur.version)
                c.note(f"metadata rewritten under {self.name} (CAS conflict injected)")
        version = c.store.compare_and_set(key, value, expected_version)
        if key == self.key:
            meta = PartitionMeta.decode(value, key)
            self.sessions.append(meta.session_id)
            self.history.meta_written(meta.session_id, meta.generation, self.name)
        return version


@dataclass
class CoordHandle:
    name: str
    coord: Coordinator
    meta: SimMeta
    replicas: list[str]
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    alive: bool = True
    crashed: bool = False
    partition: int = 0


@dataclass
class Result:
    seed: int
    faults: dict[str, int]
    violations: list[Violation]  # the first few of each kind, with details
    counts: dict[str, int]  # violations by kind
    appends: int
    acked: int
    virtual_seconds: float
    digest: str
    trace: list[str]
    most_steps: int = 0  # the most task steps at one virtual instant


def _only_cancelled(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_cancelled(e) for e in exc.exceptions)
    return isinstance(exc, trio.Cancelled)


class Cluster:
    def __init__(self, seed: int, steps: int, duration: float, kinds: dict[str, int] | None = None,
                 clients: int = 3) -> None:
        self.seed, self.steps, self.duration = seed, steps, duration
        self.kinds = kinds or FAULT_KINDS
        self.clients = clients
        self.rng = random.Random(f"schedule-{seed}")
        self.work_rng = random.Random(f"work-{seed}")
        self.disk_rng = random.Random(f"disk-{seed}")
        self.history = History()
        self.store = MemoryMetadataStore()
        self.net = SimNet(random.Random(f"net-{seed}"))
        self.meta_down = False
        self.meta_conflicts = 0
        self.coords: list[CoordHandle] = []
        self.current: CoordHandle | None = None
        self.replicas: list[str] = []
        self.faults: dict[str, int] = {}
        self.trace: list[str] = []
        self.stopping = False
        self.final_phase = False
        self._nodes = 0
        self._coord_n = 0
        self.nursery: trio.Nursery

    def history_of(self, partition: int) -> History:
        """The history of one partition's log (one log here; the cluster mode has several)."""
        return self.history

    def histories(self) -> list[History]:
        return [self.history]

    def disk_of(self, address: str, partition: int) -> SimDisk:
        return self.net.nodes[address].disk

    def new_disk(self, address: str) -> SimDisk:
        return SimDisk(address, random.Random(f"disk-{self.seed}-{address}"), self.history.node_state)

    def store_opener(self, ep: SimNodeEndpoint):
        return lambda pid: SimPartitionStore(ep.disk)

    def note(self, what: str) -> None:
        if len(self.trace) < 3000:
            self.trace.append(f"{trio.current_time():9.4f} {what}")
        elif len(self.trace) == 3000:
            self.trace.append("... (the trace stops here: 3000 lines)")

    def count(self, kind: str) -> None:
        self.faults[kind] = self.faults.get(kind, 0) + 1

    # --- storage nodes ----------------------------------------------------------------------

    def new_node_address(self) -> str:
        self._nodes += 1
        return f"node{self._nodes}:7000"

    async def add_node(self, address: str) -> None:
        self.net.nodes[address] = SimNodeEndpoint(address, self.new_disk(address))
        await self.start_node(address)

    async def start_node(self, address: str) -> None:
        ep = self.net.nodes[address]
        node = StorageNode(KEY, self.store_opener(ep))

        async def serve_node(task_status=trio.TASK_STATUS_IGNORED) -> None:
            with trio.CancelScope() as scope:
                ep.scope = scope
                async with trio.open_nursery() as n:
                    await n.start(node.run)
                    ep.nursery, ep.serve, ep.up = n, node.serve, True
                    task_status.started()

        await self.nursery.start(serve_node)
        self.note(f"node {address} up")

    def crash_node(self, address: str) -> None:
        ep = self.net.nodes[address]
        ep.up = False
        ep.break_all()
        if ep.scope is not None:
            ep.scope.cancel()
        ep.disk.crash()
        self.note(f"node {address} crashed")

    # --- coordinators -----------------------------------------------------------------------

    def start_coordinator(self, replicas: list[str], name: str | None = None, partition: int = 0,
                          generation: int = 0, host: str | None = None) -> CoordHandle:
        """A coordinator of one partition's log; ``host``: its name on the network (default
        its own name; the cluster mode's members run one per partition they own)."""
        self._coord_n += 1
        name = name or f"coord{self._coord_n}"
        meta = SimMeta(self, name, partition)

        async def direct(fn, *args):
            return fn(*args)

        coord = Coordinator(replicas, PartitionMetaStore(meta, partition), KEY, partition,
                            connect=functools.partial(self.net.connect, host or name), timeout=1.0,
                            retry_interval=0.05, blocking=direct, generation=generation)
        ch = CoordHandle(name, coord, meta, list(replicas), partition=partition)
        self.coords.append(ch)
        self.nursery.start_soon(self._run_coordinator, ch)
        self.note(f"{name} started over {replicas}")
        return ch

    async def _run_coordinator(self, ch: CoordHandle) -> None:
        with ch.scope:
            try:
                await ch.coord.run()
            except BaseException as exc:
                if _only_cancelled(exc):
                    raise
                self.history_of(ch.partition).flag("crash", f"{ch.name} died of {type(exc).__name__}: {exc!r}"[:400])
            else:
                self._fenced(ch)
        ch.alive = False
        if ch is self.current and not ch.crashed:  # the operator starts a replacement
            await trio.sleep(0.2)
            if ch is self.current and not self.final_phase:
                self.current = self.start_coordinator(self.replicas)

    def _fenced(self, ch: CoordHandle) -> None:
        got = self.store.get(meta_key(ch.partition))
        now = PartitionMeta.decode(got.value).session_id if got is not None else 0
        mine = max(ch.meta.sessions, default=-1)
        self.note(f"{ch.name} stopped: {ch.coord.fenced}")
        if now == mine:
            self.history_of(ch.partition).flag("spurious_fence", f"{ch.name} stopped ({str(ch.coord.fenced)[:200]}) while the "
                              f"partition metadata still names its session {mine}")

    def crash_coordinator(self, ch: CoordHandle) -> None:
        if ch.alive:
            ch.crashed = True
            ch.alive = False
            ch.scope.cancel()
            self.note(f"{ch.name} crashed")

    def reconfigure(self, replicas: list[str]) -> None:
        old = self.current
        self.replicas = replicas
        self.current = self.start_coordinator(replicas)
        if old is not None:
            self.crash_coordinator(old)

    # --- clients ----------------------------------------------------------------------------

    async def client(self, cid: int) -> None:
        rng = self.work_rng
        k = 0
        while not self.stopping:
            await trio.sleep(rng.expovariate(1 / 0.05))
            live = [c for c in self.coords if c.alive]
            if self.stopping or not live:
                continue
            ch = self.current if self.current in live and rng.random() < 0.8 else rng.choice(live)
            n = 1 if rng.random() < 0.8 else rng.randint(2, 4)
            bodies = [f"c{cid}.{k}.{j}".encode() for j in range(n)]
            k += 1
            await self.append(ch, bodies, wait=rng.uniform(0.5, 3.0))

    async def append(self, ch: CoordHandle, bodies: list[bytes], wait: float, vet=None) -> bool:
        """Submit one append to a coordinator and wait up to ``wait`` for its answer. ``vet``
        (the cluster mode's member): sees every answer as it arrives and may turn an
        acknowledgement into an error, as a member that lost ZooKeeper stops acknowledging."""
        records = [rec.Record(rec.RecordKind.UPDATES, relation_id=1, t_lo=i, t_hi=i, body=b)
                   for i, b in enumerate(bodies)]
        history = self.history_of(ch.partition)
        op = history.submitted(bodies, ch.name, trio.current_time())
        done = trio.Event()

        def cb(lsn: int, err: BaseException | None) -> None:
            if vet is not None:
                err = vet(ch, lsn, err)
            history.answered(op, lsn, err, ch.coord.session)
            done.set()

        ch.coord.submit(records, cb)
        with trio.move_on_after(wait):
            await done.wait()
        return op.outcome == "ack"

    # --- the schedule -----------------------------------------------------------------------

    def pick_node(self, among: list[str] | None = None) -> str:
        return self.rng.choice(among if among is not None else self.replicas)

    async def fault(self, at: float, kind: str) -> None:
        await trio.sleep_until(at)
        if self.stopping:
            return
        rng = self.rng
        d = rng.uniform(0.05, 2.5)
        if kind == "node_crash":
            a = self.pick_node()
            ep = self.net.nodes[a]
            if not ep.up:
                return
            self.count(kind)
            self.crash_node(a)
            await trio.sleep(d)
            if not ep.up and not self.final_phase:
                await self.start_node(a)
        elif kind in ("partition", "partition_oneway", "partition_coordinator"):
            c = self.current.name if self.current else "*"
            if kind == "partition":
                a = self.pick_node()
                links = [("*", a), (a, "*")]
            elif kind == "partition_oneway":
                a = self.pick_node()
                links = [rng.choice([(c, a), (a, c)])]
            else:
                cut = rng.sample(self.replicas, rng.randint(1, len(self.replicas)))
                links = [pair for a in cut for pair in ((c, a), (a, c))]
            self.count(kind)
            self.note(f"{kind}: blocked {links} for {d:.3f}s")
            for s, t in links:
                self.net.block(s, t)
            await trio.sleep(d)
            for s, t in links:
                self.net.unblock(s, t)
        elif kind == "slow_link":
            a = self.pick_node()
            self.count(kind)
            self.net.slow[a] = rng.uniform(0.05, 0.8)
            self.note(f"slow links to {a} for {d:.3f}s")
            await trio.sleep(d)
            self.net.slow.pop(a, None)
        elif kind == "conn_reset":
            a = self.pick_node()
            self.count(kind)
            self.note(f"connections of {a} reset")
            self.net.nodes[a].break_all()
        elif kind == "coord_crash":
            if self.current is None or not self.current.alive:
                return
            self.count(kind)
            self.crash_coordinator(self.current)
            await trio.sleep(rng.uniform(0, 0.5))
            if not self.final_phase:
                self.current = self.start_coordinator(self.replicas)
        elif kind == "coord_takeover":
            old = self.current
            self.count(kind)
            self.current = self.start_coordinator(self.replicas)
            await trio.sleep(d)
            if old is not None:
                self.crash_coordinator(old)
        elif kind == "meta_conflict":
            self.count(kind)
            self.meta_conflicts += rng.randint(1, 3)
        elif kind == "meta_outage":
            self.count(kind)
            self.meta_down = True
            self.note(f"metadata store down for {d:.3f}s")
            await trio.sleep(d)
            self.meta_down = False
        elif kind in ("replica_add", "replica_remove", "replica_replace"):
            reps = list(self.replicas)
            if kind == "replica_remove" and len(reps) <= 3 or kind == "replica_add" and len(reps) >= 5:
                return
            cur = self.current
            if cur is None or not cur.alive or sorted(cur.coord.in_sync()) != sorted(reps):
                return  # the operator changes replicas only once the last change finished
            if kind != "replica_add":
                reps.remove(rng.choice(reps))
            if kind != "replica_remove":
                a = self.new_node_address()
                await self.add_node(a)
                reps.append(a)
            self.count(kind)
            self.note(f"{kind}: replicas {self.replicas} -> {reps}")
            self.reconfigure(reps)
        elif kind == "disk_full":
            a = self.pick_node()
            disk = self.net.nodes[a].disk
            self.count(kind)
            disk.capacity = disk.used + rng.randint(0, 3000)
            self.note(f"disk of {a} full for {d:.3f}s")
            await trio.sleep(d)
            disk.capacity = None
            if not self.final_phase:  # the operator frees space and restarts the node
                if self.net.nodes[a].up:
                    self.crash_node(a)
                await self.start_node(a)
        elif kind == "slow_disk":
            a = self.pick_node()
            disk = self.net.nodes[a].disk
            self.count(kind)
            disk.slow = rng.uniform(0.01, 0.3)
            await trio.sleep(d)
            disk.slow = 0.0

    # --- the run ----------------------------------------------------------------------------

    async def main(self) -> None:
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            for _ in range(3):
                a = self.new_node_address()
                await self.add_node(a)
                self.replicas.append(a)
            self.current = self.start_coordinator(self.replicas)
            schedule = self.fault_schedule()
            with trio.move_on_after(10.0):  # clients start once the first session accepts writes
                while not self.current.coord.writable.is_set():
                    await trio.sleep(0.01)
            await self.clients_under_faults(schedule)
            nursery.cancel_scope.cancel()

    def fault_schedule(self) -> list[tuple[float, str]]:
        """``steps`` faults at random times in the run, kinds drawn by their weights."""
        kinds, weights = list(self.kinds), list(self.kinds.values())
        return sorted((self.rng.uniform(0.2, self.duration), self.rng.choices(kinds, weights)[0])
                      for _ in range(self.steps))

    async def clients_under_faults(self, schedule: list[tuple[float, str]]) -> None:
        """The clients' run with the faults of ``schedule``, then every fault healed, the
        cluster settled and the final check."""
        async with trio.open_nursery() as work:
            for i in range(self.clients):
                work.start_soon(self.client, i)
            async with trio.open_nursery() as faults:
                for at, kind in schedule:
                    faults.start_soon(self.fault, at, kind)
                await trio.sleep(self.duration)
                faults.cancel_scope.cancel()
            self.stopping = True
            await self.heal()
            await self.settle()
            work.cancel_scope.cancel()
        await self.final_check()

    async def heal(self) -> None:
        self.final_phase = True
        self.note("healing every fault")
        self.net.heal_all()
        self.meta_down, self.meta_conflicts = False, 0
        for a, ep in self.net.nodes.items():
            ep.disk.slow = 0.0
            full = ep.disk.capacity is not None
            ep.disk.capacity = None
            if full and ep.up:
                self.crash_node(a)
            if not ep.up:
                await self.start_node(a)
        if self.current is None or not self.current.alive:
            self.current = self.start_coordinator(self.replicas)

    async def settle(self) -> None:
        """Every append to a coordinator that did not crash is answered in bounded time."""
        def waiting() -> list:
            live = {c.name for c in self.coords if not c.crashed}
            return [op for h in self.histories() for op in h.ops
                    if op.outcome == "pending" and op.coordinator in live]

        with trio.move_on_after(SETTLE):
            while waiting():
                await trio.sleep(0.1)
        left = waiting()
        if left:
            self.history.flag("hang", f"{len(left)} appends (first: {left[0].bodies[0]!r} to {left[0].coordinator}) "
                              f"got no answer within {SETTLE}s of every fault healing")

    async def final_check(self) -> None:
        for c in self.coords:
            self.crash_coordinator(c)
        self.final_logs: dict[str, list[bytes]] = {}
        await self.final_partition(0, 0, "final")

    async def final_partition(self, partition: int, generation: int, name: str) -> None:
        """Recover one partition's log with every fault healed, append a sentinel, and judge
        its history against what the replicas hold."""
        history = self.history_of(partition)
        final = self.start_coordinator(self.replicas, name=name, partition=partition, generation=generation)
        coord = final.coord
        with trio.move_on_after(FINAL_RECOVERY):
            while not coord.writable.is_set():  # run() replaces the event: poll, do not wait on one
                await trio.sleep(0.05)
        if not coord.writable.is_set():
            history.flag("hang", f"the final recovery of partition {partition} over {self.replicas} did not "
                         f"finish within {FINAL_RECOVERY}s with every node up and the network healed")
            return
        sentinel = f"final-sentinel-{partition}".encode() if partition else b"final-sentinel"
        if not await self.append(final, [sentinel], wait=30.0):
            history.flag("hang", f"the final coordinator of partition {partition} did not acknowledge an append "
                         "within 30s")
            return
        with trio.move_on_after(30.0):
            while len(coord.in_sync()) < len(self.replicas):
                await trio.sleep(0.1)
        await trio.sleep(1.0)  # every disk's syncs complete
        got, _ = PartitionMetaStore(self.store, partition).load()
        disks = {a: self.disk_of(a, partition) for a in self.replicas}
        logs = {a: [f[rec.HEADER_SIZE:] for f in d.frames] for a, d in disks.items()}
        f = Final(list(self.replicas), sorted(coord.in_sync()), coord.committed, coord.session, logs,
                  got.session_id, {a: (s.session_id, s.closing_hwm) for a, s in got.replicas.items()},
                  {a: d.state.session_id for a, d in disks.items()}, UNRESOLVED)
        self.note(f"final {partition}: session {f.session} committed {f.committed} in sync {f.in_sync}")
        check_final(history, f, sentinel)
        for a, log in logs.items():
            self.final_logs[a if partition == 0 else f"{a}#{partition}"] = log


def run_seed(seed: int, steps: int = 12, duration: float = 8.0, logs: bool = False,
             kinds: dict[str, int] | None = None, clients: int = 3, make=None) -> Result:
    """One simulated run; deterministic in its arguments. ``logs``: put the code under
    test's log lines (INFO and up) in the trace. ``kinds``: fault kinds and weights
    (default FAULT_KINDS). ``clients``: concurrent appenders. ``make``: builds the world
    from those arguments (default :class:`Cluster`; the cluster mode passes its own)."""
    logger = logging.getLogger("sediment")
    saved_level = logger.level
    cluster = (make or Cluster)(seed, steps, duration, kinds, clients)
    handler = TraceLogs(cluster)
    if logs:
        logger.addHandler(handler)
    logger.setLevel(logging.INFO if logs else logging.CRITICAL)
    clock = trio.testing.MockClock(autojump_threshold=0)
    livelock = Livelock(cluster, clock)
    end = 0.0
    try:
        async def main() -> None:
            nonlocal end
            with trio.move_on_after(duration + SETTLE + FINAL_RECOVERY + 120) as livelock.scope:
                await cluster.main()
                end = trio.current_time()
                return
            if not livelock.scope.cancel_called or "livelock" not in cluster.history.counts:
                cluster.history.flag("hang", "the simulation did not finish within its virtual time bound")
            end = trio.current_time()

        with seeded_scheduler(seed):
            trio.run(main, clock=clock, instruments=[livelock])
    finally:
        logger.setLevel(saved_level)
        logger.removeHandler(handler)
    hs = cluster.histories()
    ops = [op for h in hs for op in h.ops]
    violations = [v for h in hs for v in h.violations]
    counts: dict[str, int] = {}
    for h in hs:
        for k, n in h.counts.items():
            counts[k] = counts.get(k, 0) + n
    digest = hashlib.sha256()
    for line in cluster.trace:
        digest.update(line.encode())
    for op in ops:
        digest.update(f"{op.op_id} {op.outcome} {op.lsn}".encode())
    for v in violations:
        digest.update(f"{v.kind} {v.detail}".encode())
    for a, log in sorted(getattr(cluster, "final_logs", {}).items()):
        digest.update(a.encode() + b"".join(log))
    return Result(seed, dict(sorted(cluster.faults.items())), violations, dict(sorted(counts.items())), len(ops),
                  sum(1 for op in ops if op.outcome == "ack"), end, digest.hexdigest(), cluster.trace, livelock.most)
