"""The seeded simulation's cluster mode (issue 29): members, a manager, assignments, moves.

``run_cluster_seed(seed)`` runs several partitions, each a real replicated log (real
:class:`Coordinator` s and :class:`StorageNode` s over the simulated network and disks of
tests/sim_world.py), served by members of a cluster:

* A simulated ZooKeeper holds one session per member (ephemeral, expiring
  ``SESSION_TIMEOUT`` virtual seconds after the member's last heartbeat), the members
  that are leaving, and the assignment (one record written by compare-and-set).
* The manager is the live member that joined first; each tick it computes the plan with
  :func:`sediment.cluster.assignment.plan_assignment` and records it. When the manager
  dies the next member in join order takes over.
* A member follows the record: for a partition it is given at generation ``g`` it starts
  a coordinator of that partition's log with generation ``g``, which runs the log's
  recovery before it serves (clients are refused until it is writable); a partition it
  no longer owns it stops at once. The old owner is fenced where the data lands: the
  partition metadata refuses an older generation and the storage nodes an older session.
* Quick detection (cluster/probe.py): the manager looks at every member's port every
  ``PROBE`` seconds, the others at the manager's; a port that accepted once and then
  refuses twice, ``PROBE_CONFIRM`` apart, is a dead process, and its member's session is
  deleted at once. A paused process's port still accepts (the kernel answers), so a
  SIGSTOPped member, or one cut off, still waits for its session to expire.
* Hand-over (cluster/member.py): a leaving member keeps acknowledging appends to each
  partition it handed over until the new owner's recovery fences its coordinator (or
  ``HANDOVER_WAIT`` passes), and exits once nothing is assigned to it or held.
* Faults: a member killed (its session lapses, or its port is seen refusing), paused (its links and heartbeats freeze;
  past the session it resumes with stale beliefs, finds its session gone and rejoins as
  a new member), a member joining, one leaving (it hands its partitions over first), the
  manager killed, ZooKeeper unreachable (members stop acknowledging at once), and the
  storage-node faults of the single-log mode (crashes, resets, slow links).

Checks: per partition, the history checker of tests/sim_checker.py (every acknowledged
append present, once, in order); ``two_owners``: no two members acknowledge for the same
partition under the same generation; ``unowned``: within ``OWNED_WITHIN`` virtual seconds
of the last disturbance every partition is served by a live member at its recorded
generation; ``unbalanced``: every recorded plan is balanced over the members it names.
"""

from __future__ import annotations

import functools
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import trio

from sediment.cluster.assignment import PartitionOwner, moves, plan_assignment
from support.sim_checker import History
from support.sim_cluster import Cluster, CoordHandle, run_seed
from support.sim_world import SimDisk, SimNodeEndpoint, SimPartitionStore

SESSION_TIMEOUT = 2.0  # virtual seconds without a heartbeat before ZooKeeper ends a member's session
LEASE = SESSION_TIMEOUT * 2 / 3  # a member stops serving when ZooKeeper has not answered for this long
TICK = 0.1  # how often a member heartbeats and reads the assignment (a watch, polled)
PROBE = 0.2  # seconds between a member's looks at its peers' ports (cluster/probe.py)
PROBE_CONFIRM = 0.05  # a refusal is confirmed by a second look this much later
HANDOVER_WAIT = 5.0  # a handed-over partition takes appends until fenced, at most this long
OWNED_WITHIN = SESSION_TIMEOUT + 3.0  # after the last disturbance, every partition is served within this
MAX_MEMBERS = 5
CLUSTER_FAULT_KINDS = {  # kind -> weight in the schedule
    "member_crash": 4, "member_pause": 3, "member_join": 2, "member_leave": 2, "manager_crash": 2,
    "zk_outage": 1, "node_crash": 3, "conn_reset": 2, "slow_link": 1,
}
_STORAGE_KINDS = ("node_crash", "conn_reset", "slow_link")


class NotAcknowledged(Exception):
    """A member that lost its ZooKeeper connection withholds the acknowledgement: the
    append's outcome is unknown to the client."""


class NodeDisks:
    """One storage node's disks, one per partition, lost together when the node crashes
    (what :class:`SimNodeEndpoint` and the network need of a disk: ``horizon``, ``crash``)."""

    slow = 0.0
    capacity = None

    def __init__(self, name: str, seed: int, histories: dict[int, History]) -> None:
        self.name, self.seed, self.histories = name, seed, histories
        self.disks: dict[int, SimDisk] = {}

    def of(self, partition: int) -> SimDisk:
        if partition not in self.disks:
            self.disks[partition] = SimDisk(f"{self.name}#{partition}",
                                            random.Random(f"disk-{self.seed}-{self.name}-{partition}"),
                                            self.histories[partition].node_state)
        return self.disks[partition]

    @property
    def horizon(self) -> float:
        return max((d.horizon for d in self.disks.values()), default=0.0)

    def crash(self) -> None:
        for d in self.disks.values():
            d.crash()


@dataclass
class Member:
    """One coordinator process of the cluster, by its incarnation (``m2.3``: host 2, third start)."""

    name: str
    host: int
    alive: bool = True
    paused: bool = False
    leaving: bool = False
    connected: bool = True  # its own view of its ZooKeeper session
    heard: float = 0.0  # when ZooKeeper last answered its heartbeat (its own clock)
    owned: dict[int, tuple[int, CoordHandle]] = field(default_factory=dict)
    handing: dict[int, tuple[int, CoordHandle, float]] = field(default_factory=dict)  # (generation, coord, since)
    resumed: trio.Event = field(default_factory=trio.Event)


@dataclass
class SimZooKeeper:
    """What the cluster keeps in ZooKeeper: sessions (join order kept), leavers, the assignment."""

    sessions: dict[str, float] = field(default_factory=dict)  # member -> last heartbeat (insertion = join order)
    leaving: set[str] = field(default_factory=set)
    assignment: dict[int, PartitionOwner] = field(default_factory=dict)
    version: int = 0
    down: bool = False
    writes: int = 0


class ClusterSim(Cluster):
    """Several partitions' logs served by the members of a cluster (see the module docstring).

    ``lease``: a member serves and acknowledges only while ZooKeeper answered it within
    ``LEASE`` (two thirds of the session timeout, when a ZooKeeper client gives up on the
    connection). Off, only the fencing where the data lands stands between a stale owner
    and the log, and the checks must hold all the same."""

    lease = True

    def __init__(self, seed: int, steps: int, duration: float, kinds: dict[str, int] | None = None,
                 clients: int = 3, partitions: int = 4, members: int = 3) -> None:
        super().__init__(seed, steps, duration, kinds or CLUSTER_FAULT_KINDS, clients)
        self.partitions, self.first_members = partitions, members
        self.part_histories = {p: History() for p in range(partitions)}
        self.zk = SimZooKeeper()
        self.members: dict[str, Member] = {}
        self.incarnations: dict[int, int] = {}
        self.acked_by: dict[tuple[int, int], str] = {}  # (partition, generation) -> the member that acknowledged
        self.last_disturbance = 0.0
        self.stats = Counter()
        self.plan_seconds: list[float] = []  # wall-clock time of each plan_assignment call
        self.plan_cpu: list[float] = []  # its CPU time (the wall clock also counts preemption by other processes)
        self.finished = False  # the members are stopped for the final recovery
        self.gaps: list[float] = []  # virtual seconds some partition went unserved, per spell
        self.seen_up: set[str] = set()  # members whose port a probe found accepting
        self.livelock_limit = 20_000 + 2_000 * partitions  # every log's tasks may run at one instant

    # --- the per-partition world ---------------------------------------------------------------

    def history_of(self, partition: int) -> History:
        return self.part_histories[partition]

    def histories(self) -> list[History]:
        return [self.history, *self.part_histories.values()]

    def new_disk(self, address: str) -> NodeDisks:  # type: ignore[override]
        return NodeDisks(address, self.seed, self.part_histories)

    def disk_of(self, address: str, partition: int) -> SimDisk:
        return self.net.nodes[address].disk.of(partition)

    def store_opener(self, ep: SimNodeEndpoint):
        return lambda pid: SimPartitionStore(ep.disk.of(pid))

    def disturbed(self) -> None:
        self.last_disturbance = trio.current_time()

    # --- members --------------------------------------------------------------------------------

    def join(self, host: int) -> Member:
        """A member process starts on ``host`` and registers a new ZooKeeper session."""
        self.incarnations[host] = self.incarnations.get(host, 0) + 1
        m = Member(f"m{host}.{self.incarnations[host]}", host, heard=trio.current_time())
        self.members[m.name] = m
        self.zk.sessions[m.name] = trio.current_time()
        self.note(f"{m.name} joined")
        self.disturbed()
        self.nursery.start_soon(self.member_loop, m)
        return m

    def live_members(self) -> list[Member]:
        return [m for m in self.members.values() if m.alive]

    def manager(self) -> Member | None:
        """The live session that joined first (an election by sequential ephemeral nodes)."""
        for name in self.zk.sessions:
            return self.members[name]
        return None

    def drop(self, m: Member, p: int) -> None:
        _, ch = m.owned.pop(p)
        self.crash_coordinator(ch)

    def kill(self, m: Member) -> None:
        """SIGKILL: the process and its coordinators stop; its session lapses later."""
        m.alive = False
        m.resumed.set()
        for p in list(m.owned):
            self.drop(m, p)
        for _g, ch, _since in m.handing.values():
            self.crash_coordinator(ch)
        m.handing.clear()
        self.note(f"{m.name} killed")
        self.disturbed()

    async def member_loop(self, m: Member) -> None:
        while m.alive:
            await trio.sleep(TICK)
            if m.paused:
                await m.resumed.wait()
                continue
            if not m.alive:
                return
            if self.zk.down:
                m.connected = False
                continue
            if m.name not in self.zk.sessions:
                self.note(f"{m.name} found its session gone: it drops its partitions and rejoins")
                self.kill(m)
                self.join(m.host)
                return
            m.connected, m.heard = True, trio.current_time()
            self.zk.sessions[m.name] = m.heard
            self.follow(m)
            if self.manager() is m:
                self.manage(m)
            self.end_hand_overs(m)
            if m.leaving and not m.handing and all(o.member != m.name for o in self.zk.assignment.values()):
                del self.zk.sessions[m.name]
                self.zk.leaving.discard(m.name)
                self.note(f"{m.name} handed everything over and exits")
                self.kill(m)
                return

    def follow(self, m: Member) -> None:
        """Start a coordinator (recovery first) for each partition given to ``m``; stop the others."""
        for p, owner in self.zk.assignment.items():
            if owner.member != m.name:
                continue
            cur = m.owned.get(p)
            if cur is not None and cur[0] == owner.generation and cur[1].alive:
                continue
            if cur is not None:
                self.drop(m, p)
            ch = self.start_coordinator(self.replicas, name=f"{m.name}/p{p}/g{owner.generation}", partition=p,
                                        generation=owner.generation, host=m.name)
            m.owned[p] = (owner.generation, ch)
        for p in list(m.owned):
            owner = self.zk.assignment.get(p)
            if owner is not None and owner.member != m.name and m.leaving:
                g, ch = m.owned.pop(p)
                m.handing[p] = (g, ch, trio.current_time())
                self.note(f"{m.name} hands partition {p} over; it takes appends until fenced")
            elif owner is None or owner.member != m.name or owner.generation != m.owned[p][0]:
                self.drop(m, p)

    def end_hand_overs(self, m: Member) -> None:
        """Stop each handed-over partition's coordinator once fenced, or HANDOVER_WAIT after."""
        now = trio.current_time()
        for p, (_g, ch, since) in list(m.handing.items()):
            if not ch.alive or ch.coord.fenced is not None or now - since > HANDOVER_WAIT:
                del m.handing[p]
                self.stats["handed_over"] += 1
                self.crash_coordinator(ch)

    async def probe_ports(self) -> None:
        """cluster/probe.py's quick detection of dead members (see the module doc)."""
        while True:
            await trio.sleep(PROBE)
            dead = self.refusing()
            if not dead:
                continue
            await trio.sleep(PROBE_CONFIRM)
            for name in sorted(dead & self.refusing()):
                if name in self.zk.sessions:
                    del self.zk.sessions[name]
                    self.zk.leaving.discard(name)
                    self.note(f"{name}'s port refused twice: its member znode deleted")
                    self.stats["probed_dead"] += 1
                    self.disturbed()

    def refusing(self) -> set[str]:
        """Members in ZooKeeper whose port a live prober finds refusing after it accepted once:
        the manager looks at every member, the others at the manager only."""
        manager = self.manager()
        if self.zk.down or manager is None:
            return set()
        probers = [m for m in self.live_members() if not m.paused and self.may_serve(m) and m.name in self.zk.sessions]
        if manager in probers:
            targets = [self.members[n] for n in self.zk.sessions if n != manager.name]
        else:
            targets = [manager] if any(m is not manager for m in probers) else []
        self.seen_up.update(m.name for m in targets if m.alive)
        return {m.name for m in targets if not m.alive and m.name in self.seen_up}

    def manage(self, m: Member) -> None:
        """The manager's step: plan from the live sessions and record the plan if it changed."""
        live = list(self.zk.sessions)
        started, cpu = time.perf_counter(), time.thread_time()
        plan = plan_assignment(self.partitions, live, self.zk.assignment, self.zk.leaving)
        self.plan_seconds.append(time.perf_counter() - started)
        self.plan_cpu.append(time.thread_time() - cpu)
        if not plan or plan == self.zk.assignment:
            return
        eligible = set(live) - self.zk.leaving
        sizes = Counter(o.member for o in plan.values())
        if max(sizes.values()) - min(sizes.get(n, 0) for n in eligible) > 1:
            self.history.flag("unbalanced", f"{m.name} planned counts {dict(sizes)} over {sorted(eligible)}")
        for mv in moves(self.zk.assignment, plan):
            self.note(f"{m.name} moves partition {mv.partition} {mv.from_member} -> {mv.to_member} "
                      f"generation {mv.generation}")
            self.stats["moves"] += 1
        self.zk.assignment, self.zk.version = plan, self.zk.version + 1
        self.zk.writes += 1

    async def expire_sessions(self) -> None:
        """ZooKeeper's side: a session without a heartbeat for SESSION_TIMEOUT ends."""
        while True:
            await trio.sleep(TICK)
            now = trio.current_time()
            if self.zk.down:
                continue
            for name, last in list(self.zk.sessions.items()):
                if now - last > SESSION_TIMEOUT:
                    del self.zk.sessions[name]
                    self.zk.leaving.discard(name)
                    self.note(f"session of {name} expired")
                    self.stats["sessions_expired"] += 1
                    self.disturbed()

    # --- clients ---------------------------------------------------------------------------------

    async def client(self, cid: int) -> None:
        rng = self.work_rng
        view: dict[int, PartitionOwner] = {}
        last: dict[int, Member] = {}  # where each partition's appends went: kept until that member refuses
        k = 0
        while not self.stopping:
            await trio.sleep(rng.expovariate(1 / 0.05))
            if not self.zk.down:
                view = dict(self.zk.assignment)
            p = rng.randrange(self.partitions)
            owner = view.get(p)
            m = self.members.get(owner.member) if owner is not None else None
            if p in last and p in last[p].handing and last[p].alive:
                m = last[p]  # not redirected yet: the leaving owner still takes its appends
            if self.stopping or m is None or not m.alive:
                continue
            last[p] = m
            n = 1 if rng.random() < 0.8 else rng.randint(2, 4)
            bodies = [f"c{cid}.{k}.{j}".encode() for j in range(n)]
            k += 1
            wait = rng.uniform(0.5, 3.0)
            with trio.move_on_after(wait):
                await self.serve_append(m, p, bodies, wait)

    async def serve_append(self, m: Member, p: int, bodies: list[bytes], wait: float) -> None:
        """What member ``m`` does with an append to partition ``p``: a paused process handles it
        when it resumes, with whatever it believed; a member that does not own ``p`` at a
        writable (recovered) coordinator refuses it, writing nothing."""
        if m.paused:
            await m.resumed.wait()
        cur = m.owned.get(p)
        if cur is None and p in m.handing and m.handing[p][1].coord.fenced is None:
            cur = m.handing[p][:2]
            self.stats["handover_appends"] += 1
        if not self.may_serve(m) or cur is None or not cur[1].alive or not cur[1].coord.writable.is_set():
            self.stats["redirects"] += 1
            return
        if m.name not in self.zk.sessions:
            self.stats["stale_owner_appends"] += 1  # its session is gone: a newer owner's fence must hold
        await self.append(cur[1], bodies, wait, vet=functools.partial(self.vet, m, p, cur[0]))

    def may_serve(self, m: Member) -> bool:
        return m.alive and m.connected and not (self.lease and trio.current_time() - m.heard > LEASE)

    def vet(self, m: Member, p: int, generation: int, ch: CoordHandle, lsn: int,
            err: BaseException | None) -> BaseException | None:
        """The member's last word on an answer of its coordinator, and the ``two_owners`` check."""
        stale = m.name not in self.zk.sessions
        if err is not None:
            if stale:
                self.stats[f"stale_owner_{type(err).__name__}"] += 1
            return err
        if not self.may_serve(m):
            return NotAcknowledged(f"{m.name} lost ZooKeeper before acknowledging LSN {lsn} of partition {p}")
        if stale:
            self.stats["stale_owner_acks"] += 1  # legal only before a newer owner recovered; the checker judges
        other = self.acked_by.setdefault((p, generation), m.name)
        if other != m.name:
            self.history.flag("two_owners", f"partition {p} generation {generation}: {other} and {m.name} both "
                              f"acknowledged (LSN {lsn})")
        return None

    # --- ownership -------------------------------------------------------------------------------

    def unserved(self) -> list[int]:
        out = []
        for p in range(self.partitions):
            owner = self.zk.assignment.get(p)
            m = self.members.get(owner.member) if owner is not None else None
            cur = m.owned.get(p) if m is not None else None
            if (m is None or m.paused or not self.may_serve(m) or m.name not in self.zk.sessions
                    or cur is None or cur[0] != owner.generation or not cur[1].alive
                    or not cur[1].coord.writable.is_set()):
                out.append(p)
        return out

    async def watch_ownership(self) -> None:
        """Flag ``unowned`` when a partition stays unserved OWNED_WITHIN after the last disturbance."""
        bad_since: float | None = None
        flagged = False
        while not self.finished:
            await trio.sleep(TICK)
            now = trio.current_time()
            left = self.unserved()
            if not left:
                if bad_since is not None:
                    self.gaps.append(now - bad_since)
                bad_since, flagged = None, False
                continue
            bad_since = now if bad_since is None else bad_since
            if not flagged and now - max(bad_since, self.last_disturbance) > OWNED_WITHIN:
                flagged = True
                self.history.flag("unowned", f"partitions {left} not served at {now:.2f}, {OWNED_WITHIN}s after the "
                                  f"last disturbance at {self.last_disturbance:.2f}; assignment "
                                  f"{ {p: (o.member, o.generation) for p, o in self.zk.assignment.items()} }")

    # --- the schedule ------------------------------------------------------------------------------

    def pick_member(self) -> Member | None:
        live = [m for m in self.live_members() if not m.paused and not m.leaving]
        return self.rng.choice(live) if live else None

    async def fault(self, at: float, kind: str) -> None:
        if kind in _STORAGE_KINDS:
            await trio.sleep_until(at)
            self.disturbed()
            await super().fault(at, kind)
            self.disturbed()
            return
        await trio.sleep_until(at)
        if self.stopping:
            return
        rng = self.rng
        d = rng.uniform(0.05, 2.5)
        victim = self.manager() if kind == "manager_crash" else self.pick_member()
        if kind == "member_join":
            if len(self.live_members()) >= max(MAX_MEMBERS, self.first_members + 2):
                return
            self.count(kind)
            self.join(max(self.incarnations) + 1)
        elif kind == "zk_outage":
            self.count(kind)
            self.zk.down = True
            for m in self.live_members():
                m.connected = False
            self.note(f"ZooKeeper unreachable for {d:.3f}s")
            self.disturbed()
            await trio.sleep(d)
            self.zk_back()
        elif victim is None or victim.paused or not victim.alive:
            return
        elif kind == "member_pause":
            self.count(kind)
            await self.pause(victim, rng.choice([rng.uniform(0.05, SESSION_TIMEOUT / 2),
                                                 rng.uniform(SESSION_TIMEOUT + 0.5, SESSION_TIMEOUT + 4)]))
        else:  # member_crash, manager_crash, member_leave: the operator starts the host again
            self.count(kind)
            if kind == "member_leave":
                victim.leaving = True
                self.zk.leaving.add(victim.name)
                self.note(f"{victim.name} leaving (SIGTERM)")
                self.disturbed()
            else:
                self.kill(victim)
            await trio.sleep(d)
            if not self.final_phase:
                self.join(victim.host)

    def zk_back(self) -> None:
        """ZooKeeper answers again; sessions resume with fresh timeouts, as after a leader election."""
        if self.zk.down:
            now = trio.current_time()
            self.zk.sessions = {n: now for n in self.zk.sessions}
            self.zk.down = False
            self.note("ZooKeeper back")
            self.disturbed()

    async def pause(self, m: Member, seconds: float) -> None:
        """SIGSTOP for ``seconds``: no heartbeats, links frozen (TCP holds the bytes), requests queue."""
        m.paused, m.resumed = True, trio.Event()
        self.net.block(m.name, "*")
        self.net.block("*", m.name)
        self.note(f"{m.name} paused for {seconds:.3f}s")
        self.disturbed()
        with trio.move_on_after(seconds):
            while not self.final_phase:
                await trio.sleep(TICK)
        self.resume(m)

    def resume(self, m: Member) -> None:
        if m.paused:
            m.paused = False
            self.net.unblock(m.name, "*")
            self.net.unblock("*", m.name)
            m.resumed.set()
            self.note(f"{m.name} resumed")
            self.disturbed()

    # --- the run -------------------------------------------------------------------------------------

    async def main(self) -> None:
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            for _ in range(3):
                a = self.new_node_address()
                await self.add_node(a)
                self.replicas.append(a)
            nursery.start_soon(self.expire_sessions)
            nursery.start_soon(self.probe_ports)
            for host in range(1, self.first_members + 1):
                self.join(host)
            with trio.move_on_after(20.0):
                while self.unserved():
                    await trio.sleep(TICK)
            nursery.start_soon(self.watch_ownership)
            schedule = self.fault_schedule()
            await self.clients_under_faults(schedule)
            nursery.cancel_scope.cancel()

    async def heal(self) -> None:
        self.final_phase = True
        self.note("healing every fault")
        self.net.heal_all()
        self.zk_back()
        for m in self.live_members():
            self.resume(m)
        for a, ep in self.net.nodes.items():
            if not ep.up:
                await self.start_node(a)
        if not any(not m.leaving for m in self.live_members()):  # one that is leaving is about to be gone
            self.join(max(self.incarnations) + 1)
        self.disturbed()

    async def final_check(self) -> None:
        with trio.move_on_after(OWNED_WITHIN + 1.0):
            while self.unserved():
                await trio.sleep(TICK)
        if self.unserved():
            self.history.flag("unowned", f"partitions {self.unserved()} not served {OWNED_WITHIN + 1.0}s after every "
                              "fault healed")
        self.finished = True
        for m in self.live_members():
            self.kill(m)
        self.zk.sessions.clear()
        for c in self.coords:
            self.crash_coordinator(c)
        self.final_logs = {}
        async with trio.open_nursery() as n:
            for p in range(self.partitions):
                last = self.zk.assignment.get(p)
                n.start_soon(self.final_partition, p, (last.generation if last else 0) + 1, f"final{p}")


def run_cluster_seed(seed: int, steps: int = 12, duration: float = 8.0, logs: bool = False,
                     kinds: dict[str, int] | None = None, clients: int = 3, partitions: int = 4,
                     members: int = 3):
    """One run of the cluster mode; deterministic in its arguments (see :func:`run_seed`)."""
    made: list[ClusterSim] = []

    def make(*args) -> ClusterSim:
        made.append(ClusterSim(*args, partitions=partitions, members=members))
        return made[0]

    r = run_seed(seed, steps, duration, logs, kinds, clients, make=make)
    r.sim = made[0]  # type: ignore[attr-defined]
    return r
