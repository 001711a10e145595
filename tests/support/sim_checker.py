"""The history checker of the seeded simulation (pure: no trio, no I/O).

It sees what a client saw (each append: submitted when, to which coordinator, and its
outcome) and what the cluster holds after a final recovery, and reports violations by
kind. It only flags what the rules forbid:

* ``QuorumLost`` and ``SessionFenced`` are outcome-unknown, and so is an append whose
  coordinator crashed before answering: such an append may or may not be in the log.
* An acknowledged append must be in the final log, whole, at the LSNs it was
  acknowledged with, on a quorum of the final replicas (``lost_ack``); and in real-time
  order: acknowledged before another was submitted means a lower LSN (``order``).
* No LSN is acknowledged for two different records (``conflicting_ack``), no callback
  runs twice (``double_callback``), no record is in the log twice (``duplicate``) or
  without having been submitted (``phantom``), and the final replicas agree on every
  committed LSN (``divergence``).
* Marks: a storage node's low-water mark, local low-water mark and session never go
  down (``lwm_regression``); a session's resolved high-water mark (the low-water mark
  it sets) is at least every LSN acknowledged before that session began
  (``hwm_regression``); one coordinator acknowledges in increasing LSN order; the
  partition metadata's session id and generation never go down (``meta_regression``).
* The metadata matches the replicas after the final recovery (``meta_mismatch``).
* A coordinator fenced while the metadata still named its own session: nobody
  superseded it (``spurious_fence``). A coordinator dying of an unexpected exception
  (``crash``). No progress within bounded virtual time once every fault healed
  (``hang``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

OUTCOME_UNKNOWN = ("QuorumLost", "SessionFenced")


@dataclass
class Op:
    """One append as the client saw it."""

    op_id: int
    bodies: list[bytes]
    coordinator: str
    submit_seq: int
    submit_time: float
    outcome: str = "pending"  # pending | ack | <error class name>
    lsn: int = -1  # last LSN, once acknowledged
    ack_seq: int = -1
    ack_session: int = -1
    callbacks: int = 0


@dataclass
class Violation:
    kind: str
    detail: str


@dataclass
class History:
    """Everything observed during one run, appended to as it happens."""

    ops: list[Op] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    seq: int = 0
    max_acked: int = -1  # the highest LSN acknowledged so far, by anyone
    session_start_acked: dict[int, int] = field(default_factory=dict)  # session -> max_acked when it began
    meta_session: int = 0
    meta_generation: int = 0
    last_ack_by_coordinator: dict[str, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)  # violations by kind, all of them

    def tick(self) -> int:
        self.seq += 1
        return self.seq

    def flag(self, kind: str, detail: str) -> None:
        """Record a violation; details are kept for the first few of each kind only."""
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if self.counts[kind] <= 3:
            self.violations.append(Violation(kind, detail))

    def submitted(self, bodies: list[bytes], coordinator: str, now: float) -> Op:
        op = Op(len(self.ops), bodies, coordinator, self.tick(), now)
        self.ops.append(op)
        return op

    def answered(self, op: Op, lsn: int, err: BaseException | None, session: int) -> None:
        op.callbacks += 1
        if op.callbacks > 1:
            self.flag("double_callback", f"append {op.op_id} ({op.bodies[0]!r}) answered {op.callbacks} times, "
                      f"now with {'ack ' + str(lsn) if err is None else type(err).__name__}")
            return
        if err is not None:
            op.outcome = type(err).__name__
            return
        op.outcome, op.lsn, op.ack_seq, op.ack_session = "ack", lsn, self.tick(), session
        prev = self.last_ack_by_coordinator.get(op.coordinator, -1)
        if lsn <= prev:
            self.flag("hwm_regression", f"coordinator {op.coordinator} acknowledged LSN {lsn} after LSN {prev}")
        self.last_ack_by_coordinator[op.coordinator] = lsn
        self.max_acked = max(self.max_acked, lsn)

    def meta_written(self, session: int, generation: int, writer: str) -> None:
        if session < self.meta_session or generation < self.meta_generation:
            self.flag("meta_regression", f"{writer} wrote partition metadata session {session} generation "
                      f"{generation} over session {self.meta_session} generation {self.meta_generation}")
        if session > self.meta_session:
            self.session_start_acked[session] = self.max_acked
        self.meta_session = max(self.meta_session, session)
        self.meta_generation = max(self.meta_generation, generation)

    def node_state(self, node: str, old, new) -> None:
        """A storage node changed its partition state (session, low-water marks)."""
        if new.low_water_mark < old.low_water_mark or new.local_low_water_mark < old.local_low_water_mark:
            self.flag("lwm_regression", f"node {node}: low-water mark {old.low_water_mark} -> {new.low_water_mark}, "
                      f"local {old.local_low_water_mark} -> {new.local_low_water_mark} (session {new.session_id})")
        if new.session_id < old.session_id:
            self.flag("lwm_regression", f"node {node}: session went down {old.session_id} -> {new.session_id}")
        if new.session_id == old.session_id:  # not an OPEN: a session setting its resolved mark
            floor = self.session_start_acked.get(new.session_id)
            if floor is not None and new.low_water_mark < floor:
                self.flag("hwm_regression", f"session {new.session_id} resolved high-water mark "
                          f"{new.low_water_mark} (set on {node}) but LSN {floor} was acknowledged before the "
                          "session began")


@dataclass
class Final:
    """The cluster after the final recovery."""

    replicas: list[str]  # the final coordinator's replicas
    in_sync: list[str]  # of those, the ones in sync at the end
    committed: int  # the final coordinator's committed high-water mark
    session: int
    logs: dict[str, list[bytes]]  # replica -> record bodies by LSN (volatile == durable at the end)
    meta_session: int
    meta_replicas: dict[str, tuple[int, int]]  # replica -> (session id, closing hwm)
    node_sessions: dict[str, int]  # replica -> the session its storage remembers
    unresolved: int


def check_final(h: History, f: Final, sentinel: bytes | None) -> None:
    """Every check that needs the end state; flags into ``h``."""
    quorum = len(f.replicas) // 2 + 1
    submitted = {b for op in h.ops for b in op.bodies}
    if sentinel is not None:
        submitted.add(sentinel)
    # replicas agree on every committed LSN they hold
    for lsn in range(f.committed + 1):
        seen = {f.logs[a][lsn] for a in f.in_sync if lsn < len(f.logs[a])}
        if len(seen) > 1:
            h.flag("divergence", f"in-sync replicas hold different records at committed LSN {lsn}: "
                   f"{sorted(seen)[:3]}")
            break
    where: dict[bytes, list[int]] = {}
    ref = max((f.logs[a] for a in f.in_sync), key=len, default=[])
    for lsn, body in enumerate(ref[:f.committed + 1]):
        where.setdefault(body, []).append(lsn)
    for body, lsns in where.items():
        if len(lsns) > 1:
            h.flag("duplicate", f"record {body!r} is at LSNs {lsns}")
        if body not in submitted:
            h.flag("phantom", f"record {body!r} at LSN {lsns[0]} was never submitted")
    by_lsn: dict[int, tuple[bytes, int]] = {}
    for op in h.ops:
        if op.outcome != "ack":
            continue
        first = op.lsn - len(op.bodies) + 1
        for i, body in enumerate(op.bodies):
            lsn = first + i
            other = by_lsn.get(lsn)
            if other is not None and other[0] != body:
                h.flag("conflicting_ack", f"LSN {lsn} acknowledged for {other[0]!r} (append {other[1]}) and for "
                       f"{body!r} (append {op.op_id}, session {op.ack_session})")
            by_lsn[lsn] = (body, op.op_id)
            holders = sum(1 for a in f.replicas if lsn < len(f.logs[a]) and f.logs[a][lsn] == body)
            if holders < quorum or lsn > f.committed:
                found = where.get(body)
                h.flag("lost_ack", f"append {op.op_id} {body!r} acknowledged at LSN {lsn} (session "
                       f"{op.ack_session}) is on {holders} of {len(f.replicas)} final replicas (quorum {quorum}); "
                       f"final committed {f.committed}; found at {found}")
    # real-time order: acknowledged before B was submitted => a lower LSN than B's first
    acked = sorted((op for op in h.ops if op.outcome == "ack"), key=lambda o: o.ack_seq)
    by_submit = sorted((op for op in h.ops if op.outcome == "ack"), key=lambda o: o.submit_seq)
    i, best, best_op = 0, -1, None
    for op in by_submit:
        while i < len(acked) and acked[i].ack_seq < op.submit_seq:
            if acked[i].lsn > best:
                best, best_op = acked[i].lsn, acked[i]
            i += 1
        if best >= op.lsn - len(op.bodies) + 1:
            h.flag("order", f"append {op.op_id} was submitted after append {best_op.op_id} was acknowledged "
                   f"at LSN {best}, but got LSNs from {op.lsn - len(op.bodies) + 1}")
            break
    # the metadata matches the replicas
    if f.meta_session != f.session:
        h.flag("meta_mismatch", f"metadata session {f.meta_session}, final coordinator's {f.session}")
    for a in f.replicas:
        st = f.meta_replicas.get(a)
        if st is None:
            h.flag("meta_mismatch", f"replica {a} of the final coordinator is not in the partition metadata")
        elif a in f.in_sync and st != (f.session, f.unresolved):
            h.flag("meta_mismatch", f"replica {a} is in sync in session {f.session} but its metadata state is "
                   f"(session {st[0]}, closing hwm {st[1]})")
        elif a in f.in_sync and f.node_sessions.get(a) != f.session:
            h.flag("meta_mismatch", f"replica {a} is in sync in session {f.session} but its storage remembers "
                   f"session {f.node_sessions.get(a)}")
