"""One coordinator as a member of a cluster: membership, the manager's assignment, and the
partitions it opens and closes.

The membership store is reached through ``cluster/membership.py``: ZooKeeper, as described
here (``cluster/zk_membership.py``), or leases on S3 (``cluster/s3_membership.py``), whose
member ids, manager and compare-and-set follow the same rules.

A member registers an ephemeral sequential znode (its id, e.g. ``m-0000000004``); the
member with the lowest sequence number is the manager and writes the assignment
(``cluster.assignment.plan_assignment``: balanced, sticky, generation + 1 on every move)
with the znode's version as compare-and-set. Every member runs one control loop,
level-triggered: a watch or a state change wakes it, and it also looks every ``POLL``
seconds, so a missed or re-registered watch only delays it. Each pass reads the members,
the leaving set and the assignment, plans (manager only), then opens the partitions
assigned to it and closes the others.

Opening a partition is opening its engine (its own log partition, metadata root and blob
prefix), which runs the replicated log's recovery: the new store session is recorded in the
partition's metadata and the storage nodes refuse the previous owner's writes, so an old
owner is fenced where data lands, never by a lock it believes it holds.

A member whose port refuses connections (cluster/probe.py: a SIGKILLed process) is removed
from the members at once, without waiting for its session to end: by the manager, which
looks at every member's port, or, for the manager itself, by the others, which look at
its port. A live member removed so rejoins under a new id. That is only quicker, never
needed for safety: the old owner is fenced by the generation either way.

A member that leaves (SIGTERM) keeps acknowledging appends and seals to each partition it
hands over until the new owner's recovery fences it (or ``HANDOVER_WAIT`` passes): what the
new owner does before it takes the log (its metadata, blob store and catalog) then costs the
writers nothing. Those writes are safe as any fenced owner's: one acknowledged before the new
store session took the storage nodes is in the log the new owner recovers, and after it the
nodes refuse them. Reads of such a partition are redirected from the moment the new
assignment is seen; one begun before, and any call failing meanwhile, answers MembershipLost
(:meth:`check_still_serving`), which the client retries at the new owner. Before that, a
read's answer waits for :meth:`confirm_owner` (the assignment read after it arrived), so no
read is answered from state another owner may have moved past.

A SUSPENDED or LOST ZooKeeper connection stops serving at once (:meth:`engine_for` refuses);
a LOST session also closes every partition, and once connected again the member registers
anew under a new id, so a member paused past its session rejoins as a new member. kazoo
queues a call made while the connection is suspended until it is back (for a SIGSTOPped
ZooKeeper, for ever), so the calls made on a client's thread and on the way out go through
:meth:`zk_call`, bounded by ``ZK_CALL_TIMEOUT``; only the control loop's own thread waits.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sediment.clock import Clock, MonotonicClock
from sediment.cluster import layout
from sediment.cluster.membership import LOST, CallUnanswered, Membership
from sediment.cluster.metrics import ClusterMetrics
from sediment.cluster.probe import PeerProbe
from sediment.cluster.read_confirm import ReadConfirmer
from sediment.cluster.zk_membership import ZK_CALL_TIMEOUT, ZooKeeperMembership  # noqa: F401 - where callers found it
from sediment.errors import MembershipLost, NotPartitionOwner
from sediment.wording import counted

POLL = 0.5  # seconds between the control loop's looks when no watch fires
OPEN_RETRY = 1.0  # seconds before a partition whose open failed is tried again
HANDOVER_WAIT = 5.0  # seconds a handed-over partition takes appends while its new owner has not fenced it
LEAVE_COMPACT_WAIT = 3.0  # seconds a leaving member spends compacting its partitions' WAL tails first
log = logging.getLogger(__name__)


def open_membership(where: Any, clock: Clock | None = None) -> Membership:
    """The membership of the cluster at ``where`` (a parsed zk:// or s3:// cluster URI)."""
    from sediment.cluster.s3_layout import S3ClusterPath

    if isinstance(where, S3ClusterPath):
        from sediment.cluster.s3_membership import S3Membership

        return S3Membership(where, clock)
    return ZooKeeperMembership(where)


@dataclass
class _Handing:
    """A partition this leaving member handed over, serving appends until the new owner fences it."""

    engine: Any
    generation: int
    fenced: threading.Event = field(default_factory=threading.Event)
    appends: int = 0  # appends and seals it took meanwhile


def _usable(engine: Any) -> bool:
    """Whether ``engine`` may still answer: not fenced by a newer owner, closed or failed (each
    of which it learns before its member does, and answers its own error meanwhile)."""
    view = getattr(engine, "view", None)
    return (getattr(engine, "superseded", None) is None and not getattr(view, "closed", False)
            and getattr(view, "failed", None) is None)


class Member:
    """A live member of the cluster at ``where``, advertised to clients as ``advertise``."""

    def __init__(self, where: Any, advertise: str, data_dir: str, *,
                 engine_options: dict[str, Any] | None = None, clock: Clock | None = None,
                 membership: Membership | None = None) -> None:
        self.where = where
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        self.advertise = advertise
        self.data_dir = os.path.abspath(data_dir)
        self.metrics = ClusterMetrics()
        self.member_id: str | None = None
        self.view: dict = {"members": {}, "manager": None, "assignment": {}, "relations": {}}
        self._engine_options = dict(engine_options or {})
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._session_lost = False
        self._heard = 0.0  # clock time of the last pass that read ZooKeeper
        self._leaving = False
        self._leaving_seen: set[str] = set()  # the members the last pass read as leaving
        self._engines: dict[int, tuple[Any, int]] = {}  # partition -> (engine, generation)
        self._handing: dict[int, _Handing] = {}  # partitions handed over while leaving, until fenced
        self._opening: set[int] = set()
        self._retry_at: dict[int, float] = {}
        self._open_failed: dict[int, str] = {}  # why an assigned partition's last open failed
        self._seen: dict[int, tuple[str, int]] = {}  # the assignment of the previous pass
        self._membership: Membership = membership if membership is not None else open_membership(where, self.clock)
        self._probe: PeerProbe | None = None
        self._confirmer = ReadConfirmer(self._membership.assignment_now, ZK_CALL_TIMEOUT,
                                        self.metrics.read_confirmations.inc)
        self.config: layout.ClusterConfig | None = None
        self._thread: threading.Thread | None = None

    # --- life cycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Connect, read the deployment, register and start the control loop."""
        self.config = self._membership.start(self._on_state)
        self._connected.set()
        self._register()
        self._thread = threading.Thread(target=self._loop, name="cluster-member", daemon=True)
        self._thread.start()
        self._wake.set()
        self._probe = PeerProbe(self._probe_targets, self._in_touch, self._wake.set)
        self._probe.start()
        if self.config.blob.startswith("s3://"):
            from sediment import _s3

            threading.Thread(target=_s3.warm, name="s3-warm", daemon=True).start()

    def leave(self, timeout: float) -> str | None:
        """SIGTERM: ask the manager to move this member's partitions, close each as it goes, and
        return None once none is left, else why some are still held: after ``timeout`` seconds,
        or at once when no member could take them (none other, or every other one leaving as
        well: a whole cluster stopped together used to wait out the timeout in every member)."""
        self._leaving = True
        self._compact_before_leaving(min(timeout / 4, LEAVE_COMPACT_WAIT))
        try:
            self.zk_call(lambda: self._membership.announce_leaving(self.member_id), "announce leaving", write=True)
        except Exception as exc:  # noqa: BLE001 - the partitions then move when the session ends
            log.warning("could not announce leaving: %s", exc)
        self._wake.set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._engines and not self._opening and not self._handing:
                    return None
                others = set(self.view["members"]) - {self.member_id}
                staying = others - self._leaving_seen
            if not others:
                return "no other member to hand them to"
            if not staying:
                return "every other member is leaving too"
            if not self._connected.is_set() or self._session_lost:
                return "the membership store is out of reach (they move when this member's session ends)"
            time.sleep(0.05)
        return f"still held after {timeout:g} s"

    def _compact_before_leaving(self, wait: float) -> None:
        """Take each partition's WAL tail into batches (and trim the storage nodes to it) before
        handing it over, so that its new owner reads and replays only what arrives after this;
        the member goes on serving meanwhile. At most ``wait`` seconds: a slow pass only
        leaves a longer tail to replay."""
        with self._lock:
            engines = [e for e, _g in self._engines.values()]

        def compact(engine: Any) -> None:
            try:
                engine.wal.finish_segment()
                engine.compaction.run_pass(None, merge=False)
            except Exception as exc:  # noqa: BLE001 - the new owner replays the longer tail instead
                log.warning("compacting before the hand-over failed: %s", exc)

        threads = [threading.Thread(target=compact, args=(e,), name="compact-before-leaving", daemon=True)
                   for e in engines]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(0.0, started + wait - time.monotonic()))
        log.info("member %s compacted the WAL tails of %s before handing them over (%.3f s)",
                 self.member_id, counted(sum(not t.is_alive() for t in threads), "partition"), time.monotonic() - started)

    def stop(self) -> None:
        """Close every partition and end the session (the ephemeral znode goes with it)."""
        self._stop.set()
        self._wake.set()
        if self._probe is not None:
            self._probe.stop()
        if self._thread is not None:
            self._thread.join(10.0)
        engines = self._release_all()
        for partition, engine in engines:
            self._close_engine(partition, engine)
        try:
            self._membership.stop()
        except Exception as exc:  # noqa: BLE001 - the session (or lease) then ends on the store's side
            log.warning("member %s: ending the membership: %s: %s", self.member_id, type(exc).__name__, exc)

    # --- serving -------------------------------------------------------------------------------

    def partition_of(self, name: str, *, fresh: bool = False) -> int | None:
        """The relation's recorded partition (None: no such relation); ``fresh``: read from
        the membership store, not from the view of the last pass."""
        p = None if fresh else self.view["relations"].get(name)
        if p is not None:
            return p
        got = self.zk_call(lambda: self._membership.relation(name), f"find relation {name!r}'s partition")
        return None if got is None else got[0]

    def zk_call(self, call: Callable[[], Any], what: str, *, write: bool = False) -> Any:
        """The result of one bounded membership call ``call()``, for a thread that must not
        wait on an unreachable store: refused at once while out of touch, and after
        ``ZK_CALL_TIMEOUT`` seconds without an answer (CallUnanswered). A read that cannot be
        made is a NotPartitionOwner (nothing done: ask another member); a write that was sent
        but not answered is a MembershipLost (it may yet be applied)."""
        if not self._connected.is_set() or self._session_lost:
            raise self._unreachable(what, "the connection is suspended or the session lost")
        try:
            return call()
        except CallUnanswered as exc:
            why = exc.why
            if write:
                raise MembershipLost(f"{self.advertise} sent {self._membership.store} the request to {what} but got "
                                     f"{why}: it may or may not be applied; read back (or retry at another member)"
                                     ) from None
            raise self._unreachable(what, why) from None

    def _unreachable(self, what: str, why: str) -> NotPartitionOwner:
        self.metrics.redirects.inc()
        return NotPartitionOwner(f"{self.advertise} cannot reach {self._membership.store} to {what} ({why}); nothing "
                                 "was done: ask another member or connect with the cluster's URI")

    def _in_touch(self) -> bool:
        """Connected, the session not lost, and the membership read recently enough
        (``Membership.fresh``: on ZooKeeper within half the session timeout it granted): a
        process resumed after a pause (SIGSTOP, a long GC) refuses before its client notices."""
        return (self._connected.is_set() and not self._session_lost
                and self._membership.fresh(self.clock.current_time() - self._heard))

    def engine_for(self, partition: int, *, append: bool = False) -> tuple[Any, int]:
        """(engine, generation) of a partition this member serves now (``append``: or hands over,
        not fenced yet); NotPartitionOwner (a redirect naming the owner) otherwise, also while
        out of touch with ZooKeeper."""
        with self._lock:
            held = self._engines.get(partition)
            if held is not None and getattr(held[0], "superseded", None) is not None:
                del self._engines[partition]  # fenced by a newer owner: it refuses everything now
                held = None
                self._wake.set()
            if held is None and append:
                held = self._handed(partition)
            if held is not None and self._in_touch():
                return held
        self.metrics.redirects.inc()
        owner, generation = self.view["assignment"].get(partition, (None, -1))
        address = self.view["members"].get(owner) if owner != self.member_id else None
        failed = self._open_failed.get(partition) if owner == self.member_id else None
        if failed is not None:
            raise NotPartitionOwner(
                f"partition {partition} is assigned to {self.advertise}, which cannot open it ({failed}); it retries "
                "every second: fix that and retry", partition=partition, owner=None, generation=generation)
        raise NotPartitionOwner(
            f"partition {partition} is not served by {self.advertise}; its owner is {address or 'being chosen'} "
            f"(generation {generation}): retry there", partition=partition, owner=address, generation=generation)

    def reopen(self, partition: int, engine: Any) -> None:
        """Close ``engine`` and open its partition again if it is still assigned here: after a
        write of unknown outcome it may show less than its log holds, which the open's recovery
        settles (cluster/applied.py). Requests are redirected meanwhile."""
        with self._lock:
            held = self._engines.get(partition)
            if held is None or held[0] is not engine:
                return  # moved, or reopened already
            del self._engines[partition]
            self._opening.add(partition)
        log.warning("member %s opens partition %d again after a write whose outcome is unknown", self.member_id,
                    partition)

        def run() -> None:
            self._close_engine(partition, engine)
            self._open_partition(partition, held[1], False)

        threading.Thread(target=run, name=f"reopen-partition-{partition}", daemon=True).start()

    def check_still_serving(self, partition: int, generation: int, engine: Any = None, *,
                            append: bool = False, read: bool = False) -> None:
        """After a call: answer (its result, or its failure) only while the session holds and
        this member serves the partition in ``generation``, with ``engine`` (the one the call
        ran on) open and not fenced; ``append``: a successful append or seal is also answered
        while the partition is handed over and its new owner has not fenced it (the nodes
        refuse one after that, so one that succeeded is in the log the new owner recovers).
        MembershipLost otherwise: the call may have run on state the new owner has moved past
        (a batch it compacted away), or met the engine closing; the client retries at the owner.
        ``read``: a read's answer (or failure) also waits for :meth:`confirm_owner`."""
        with self._lock:
            held = self._engines.get(partition)
            if held is None and append:
                h = self._handing.get(partition)
                held = (h.engine, h.generation) if h is not None and not h.fenced.is_set() else None
            ok = (held is not None and held[1] == generation and (engine is None or held[0] is engine)
                  and _usable(held[0]) and self._in_touch())
        if not ok:
            raise MembershipLost(f"{self.advertise} lost partition {partition} (it was handed over or taken, or the "
                                 f"{self._membership.tie} lost) while the call ran: it may or may not have been applied; "
                                 "retry at the owner")
        if read:
            self.confirm_owner(partition, generation)

    def confirm_owner(self, partition: int, generation: int) -> None:
        """Whether the membership store, read after this call began (one read shared by the
        reads waiting then: cluster/read_confirm.py), still assigns ``partition`` to this
        member in ``generation``: MembershipLost if not (the read is not answered; the client
        retries it at the owner), NotPartitionOwner if no read answers in time."""
        try:
            assignment = self._confirmer.confirm()
        except CallUnanswered as exc:
            raise self._unreachable(f"confirm that it still owns partition {partition}", exc.why) from None
        now = assignment.get(partition, (None, -1))
        if now != (self.member_id, generation):
            self._wake.set()  # the next pass sees the move
            raise MembershipLost(f"{self.advertise} no longer owns partition {partition} (generation {generation}; "
                                 f"{self._membership.store} now assigns it to {now[0] or 'nobody'}, generation "
                                 f"{now[1]}): the read was not answered; retry at the owner")

    def _handed(self, partition: int) -> tuple[Any, int] | None:
        """A partition being handed over whose new owner has not fenced it yet (under the lock)."""
        h = self._handing.get(partition)
        if h is None or h.fenced.is_set() or not _usable(h.engine):
            return None
        h.appends += 1
        return h.engine, h.generation

    def owned(self) -> dict[int, tuple[Any, int]]:
        with self._lock:
            return dict(self._engines)

    def held(self, partition: int) -> tuple[Any, int] | None:
        """(engine, generation) of ``partition`` if this member holds it (one lookup, no copy)."""
        with self._lock:
            return self._engines.get(partition)

    def membership(self) -> Membership:
        return self._membership

    # --- the membership store --------------------------------------------------------------------

    def _on_state(self, state: str) -> None:
        if state == "CONNECTED":
            self._connected.set()
        else:
            self._connected.clear()
            if state == LOST:
                self._session_lost = True
                if self._stop.is_set():  # stop() ended the session itself: no loss to warn about
                    log.info("member %s ended its %s", self.member_id, self._membership.tie)
                else:
                    log.warning("member %s lost its %s: it stops serving and will rejoin", self.member_id,
                                self._membership.tie)
        self._wake.set()

    def _register(self) -> None:
        self.member_id = self._membership.register(self.advertise)
        log.info("joined %s as %s (%s)", self.where.uri, self.member_id, self.advertise)

    def _watch(self, _event: object = None) -> None:
        self._wake.set()

    # --- the control loop --------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(POLL)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._pass()
            except Exception as exc:  # noqa: BLE001 - ZooKeeper unreachable and the like: the next pass retries
                log.warning("cluster member %s: control pass failed (%s: %s); retrying in %s s", self.member_id,
                            type(exc).__name__, exc or "no message", POLL)

    def _pass(self) -> None:
        if self._session_lost:
            self._drop_all()
            if not self._connected.is_set() or self._leaving:
                return  # leaving (SIGTERM): it never joins again, though its lease was deleted under it
            self._session_lost = False
            self._register()  # a new session: a new member
        if not self._connected.is_set():
            return
        members = self._remove_refusing(self._membership.members(self._watch))
        if self.member_id not in members and not self._leaving:
            log.warning("member %s was removed from the members (its port refused a connection): it rejoins",
                        self.member_id)
            self._drop_all()
            self._register()
            self._wake.set()
            return
        leaving = self._membership.leaving(self._watch)
        if self._leaving and self.member_id not in leaving:
            # a peer that counted it gone (its port refuses while its server drains) dropped its record
            self._membership.announce_leaving(self.member_id)
            leaving = [*leaving, self.member_id]
        data, stat = self._read_assignment()
        view = self._membership.read_view()
        with self._lock:
            self.view, self._leaving_seen = view, set(leaving)
        self._heard = self.clock.current_time()
        if view["manager"] == self.member_id:
            self._manage(sorted(members), set(leaving) & set(members), data, stat)
            data, stat = self._read_assignment()
            self.view = {**view, "assignment": layout.decode_assignment(data)}
        self._apply(layout.decode_assignment(data))

    def _read_assignment(self) -> tuple[bytes, Any]:
        return self._membership.read_assignment(self._watch)

    def _probe_targets(self) -> dict[str, str]:
        """Whose ports to look at: the manager looks at every other member's, the others at
        the manager's only (so that the next in line takes over from a dead manager)."""
        members, manager = self.view["members"], self.view["manager"]
        if manager == self.member_id:
            return {m: a for m, a in members.items() if m != self.member_id}
        return {manager: members[manager]} if manager in members else {}

    def _remove_refusing(self, members: list[str]) -> list[str]:
        """Remove the members whose port refuses connections (a dead process) from the
        membership store: the membership then changes for everyone at once, as when a session
        ends. Returns the members left."""
        dead = self._probe.refusing() & set(members) if self._probe is not None else set()
        for member in sorted(dead - {self.member_id}):
            log.info("member %s sees %s gone (connection refused): removed from the members", self.member_id, member)
            self._membership.remove(member)
        return [m for m in members if m not in dead or m == self.member_id]

    def _manage(self, members: list[str], leaving: set[str], data: bytes, stat: Any) -> None:
        """The manager's part: plan from the live members and write it if it changed."""
        from sediment.cluster.assignment import PartitionOwner, plan_assignment

        current = {p: PartitionOwner(m, g) for p, (m, g) in layout.decode_assignment(data).items()}
        gone = sorted({o.member for o in current.values()} - set(members))
        if gone:
            log.info("manager %s sees %s gone", self.member_id, ",".join(gone))
        planned = plan_assignment(self.config.partitions, members, current, leaving=leaving)
        if not planned:
            return  # nobody to serve: keep the record, so the next plan still bumps every generation
        new = {p: (o.member, o.generation) for p, o in planned.items()}
        if new == {p: (o.member, o.generation) for p, o in current.items()}:
            return
        if self._membership.write_assignment(layout.encode_assignment(new), stat):
            log.info("manager %s assigned %s", self.member_id, new)
        else:
            self._wake.set()  # another manager's write came first: plan again from it

    def _apply(self, assignment: dict[int, tuple[str, int]]) -> None:
        mine = {p: g for p, (m, g) in assignment.items() if m == self.member_id}
        with self._lock:
            held = {p: self._engines.pop(p) for p, (_e, g) in list(self._engines.items()) if mine.get(p) != g}
            handed = [(p, e) for p, (e, g) in held.items()  # appends go on until the new owner fences it
                      if self._leaving and assignment.get(p, (self.member_id, 0))[0] != self.member_id]
            for p, e in handed:
                self._handing[p] = _Handing(e, held[p][1])
                e.expect_takeover()
            closing = [(p, e) for p, (e, _g) in held.items() if p not in dict(handed)]
            now = self.clock.current_time()
            to_open = [(p, g) for p, g in mine.items()
                       if p not in self._engines and p not in self._opening and self._retry_at.get(p, 0) <= now]
            self._opening.update(p for p, _g in to_open)
            previous, self._seen = self._seen, assignment
        live = self.view["members"]
        for p, engine in closing:
            self.metrics.ownership_changes.labels("lost").inc()
            threading.Thread(target=self._close_engine, args=(p, engine), daemon=True).start()
        for p, engine in handed:
            self.metrics.ownership_changes.labels("lost").inc()
            threading.Thread(target=self._hand_over, args=(p, engine), daemon=True).start()
        for p, g in to_open:
            before = previous.get(p, (None, 0))[0]
            failover = before is not None and before != self.member_id and before not in live
            threading.Thread(target=self._open_partition, args=(p, g, failover), name=f"open-partition-{p}",
                             daemon=True).start()
        self.metrics.partitions_owned.set(len(self._engines))

    def _open_partition(self, partition: int, generation: int, failover: bool) -> None:
        from sediment.engine.engine import Engine

        log.info("member %s opens partition %d (generation %d)", self.member_id, partition, generation)
        try:
            engine = Engine.open(os.path.join(self.data_dir, "partitions", str(partition)),
                                 **self._membership.engine_options(partition), **self._engine_options)
        except Exception as exc:  # noqa: BLE001 - tried again on a later pass
            reason = f"{type(exc).__name__}: {exc}"
            with self._lock:
                repeated = self._open_failed.get(partition) == reason
                self._open_failed[partition] = reason
            # once per reason, not once per retry (every OPEN_RETRY seconds)
            (log.debug if repeated else log.warning)(
                "member %s could not open partition %d: %s (retried every %g s; logged again if the reason changes)",
                self.member_id, partition, exc, OPEN_RETRY)
            with self._lock:
                self._opening.discard(partition)
                self._retry_at[partition] = self.clock.current_time() + OPEN_RETRY
            self._wake.set()
            return
        engine.superseded_listeners.append(self._fenced_listener(partition, engine))
        engine.failed_listeners.append(lambda _err, engine=engine: self.reopen(partition, engine))
        with self._lock:
            self._opening.discard(partition)
            self._open_failed.pop(partition, None)
            owner, current = self.view["assignment"].get(partition, (None, -1))
            keep = owner == self.member_id and current == generation and not self._session_lost
            if keep:
                self._engines[partition] = (engine, generation)
        if not keep:
            self._close_engine(partition, engine)
        else:
            self.metrics.ownership_changes.labels("gained").inc()
            if failover:
                self.metrics.failovers.inc()
            log.info("member %s serves partition %d (generation %d)", self.member_id, partition, generation)
        self.metrics.partitions_owned.set(len(self._engines))
        self._wake.set()

    def _hand_over(self, partition: int, engine: Any) -> None:
        """Close a handed-over partition once its new owner fenced it, or after HANDOVER_WAIT."""
        with self._lock:
            h = self._handing.get(partition)
        if h is not None and h.engine is engine:
            fenced = h.fenced.wait(HANDOVER_WAIT)
            log.info("member %s handed partition %d over: %d appends taken after the new assignment, until %s",
                     self.member_id, partition, h.appends,
                     "the new owner fenced it" if fenced else f"{HANDOVER_WAIT:g} s passed without a new owner")
        with self._lock:
            if h is not None and self._handing.get(partition) is h:
                del self._handing[partition]
        self._close_engine(partition, engine)

    def _fenced_listener(self, partition: int, engine: Any) -> Callable[[BaseException], None]:
        def fenced(err: BaseException) -> None:
            with self._lock:
                h = self._handing.get(partition)
                handed = h is not None and h.engine is engine
                if handed:
                    h.fenced.set()
                if self._engines.get(partition, (None, 0))[0] is engine:
                    del self._engines[partition]
            (log.info if handed else log.warning)("partition %d was taken over: %s", partition, err)
            self._wake.set()

        return fenced

    def _drop_all(self) -> None:
        engines = self._release_all()
        for p, engine in engines:
            self.metrics.ownership_changes.labels("lost").inc()
            threading.Thread(target=self._close_engine, args=(p, engine), daemon=True).start()
        self.metrics.partitions_owned.set(0)

    def _release_all(self) -> list[tuple[int, Any]]:
        """(partition, engine) of every engine held or being handed over; none is held after."""
        with self._lock:
            engines = [*((p, e) for p, (e, _g) in self._engines.items()),
                       *((p, h.engine) for p, h in self._handing.items())]
            self._engines.clear()
            self._handing.clear()
        return engines

    @staticmethod
    def _close_engine(partition: int, engine: Any) -> None:
        try:
            engine.close()
        except Exception as exc:  # noqa: BLE001 - a fenced engine may fail its last flush; the new owner recovers
            log.warning("closing partition %d: %s", partition, exc)
