"""Cluster membership on S3 alone: leases renewed by their holders, polled by the others.

S3 has no sessions and no watches, so a member's liveness is a lease (``metadata/lease.py``)
on its own key ``members/m-<seq>``, which a thread renews every fifth of the lease time.
Another member counts it dead once it has seen the same write there for the lease time on
*its own* clock (no clocks are compared across machines) and then deletes the key with the
version it saw as compare-and-set: a member is dead for everyone exactly when its key is
gone, and a renewal racing the delete keeps it alive. A member that finds its key gone or
rewritten is out (``LOST``): it closes its partitions and registers anew under a new id, as
a ZooKeeper member whose session ended. It stops serving once two thirds of the lease time
have passed since the last renewal that succeeded began (``fresh``), which is before any
other member can count it dead.

A member that cannot reach S3 at all is ``SUSPENDED``, however long that lasts, and learns
its fate from its key once S3 answers, as a ZooKeeper client learns its session's on
reconnecting: a renewal that succeeds (nobody deleted the key) makes it a member again, with
its id and its open partitions. And after such a gap a member judges the others' leases
afresh (``LeaseWatch.restart``), as ZooKeeper restarts its sessions' timeouts after an
election: when S3 was out for everyone, nobody could renew, and counting them dead the
moment it answers again would end every lease at once.

The lease decides who *should* serve a partition, never who can: a paused member may write
once more, and the S3 log's epoch claim, taken by the new owner's open, refuses that write
(``WalFenced``). Member ids come from compare-and-set on ``member-seq``, so they order
members by age as ZooKeeper's sequential znodes do, and the oldest live member manages.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable
from typing import Any

from sediment.clock import Clock, MonotonicClock
from sediment.cluster import layout, s3_layout
from sediment.cluster.membership import CONNECTED, LOST, SUSPENDED, CallUnanswered
from sediment.errors import MetadataConflict, MetadataUnavailable
from sediment.metadata.lease import Lease, LeaseWatch

RENEWALS = 5  # renewals per lease time
IN_TOUCH = 2 / 3  # a member serves while its last renewal began less than this much of the lease time ago
log = logging.getLogger(__name__)


class S3Membership:
    """The membership of the S3-only cluster at ``where``."""

    def __init__(self, where: s3_layout.S3ClusterPath, clock: Clock | None = None) -> None:
        self.where = where
        self.uri = where.uri
        self.store, self.tie = "the S3 metadata store", "S3 lease"
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        self.config: layout.ClusterConfig | None = None
        self.lease_time = 0.0
        self._store: Any = None
        self._lease: Lease | None = None
        self._renewed = float("-inf")  # clock time at which the last renewal that succeeded began
        self._state = CONNECTED
        self._on_state: Callable[[str], None] = lambda _state: None
        self._live: dict[str, str] = {}  # id -> address, from the last members()
        self._assignment: tuple[bytes, Any] = (b"", None)  # the last read_assignment()
        self._watch: LeaseWatch | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self, on_state: Callable[[str], None]) -> layout.ClusterConfig:
        self._store = s3_layout.open_store(self.where)
        self.config = s3_layout.read_config(self._store, self.where)
        self.lease_time = self.config.session_timeout
        self._watch = LeaseWatch(self.lease_time, self.clock)
        self._on_state = on_state
        return self.config

    def stop(self) -> None:
        """Stop renewing and give the lease up: the others move its partitions at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.lease_time)
        try:
            with self._lock:
                lease, self._lease = self._lease, None
            if lease is not None:
                lease.release()
        finally:
            self._store.close()

    # --- the lease ---------------------------------------------------------------------------------

    def register(self, advertise: str) -> str:
        member = s3_layout.member_id(self._next_seq())
        lease = Lease(self._store, f"members/{member}", member, self.lease_time, self.clock,
                      info={"format": "sediment-member", "version": s3_layout.VERSION, "advertise": advertise})
        started = self.clock.current_time()
        if not lease.try_acquire():
            raise MetadataConflict(f"members/{member} of {self.uri} was written by another member; join again")
        with self._lock:
            self._lease, self._renewed = lease, started
        self._set_state(CONNECTED)
        if self._thread is None:
            self._thread = threading.Thread(target=self._renew_loop, name="cluster-lease", daemon=True)
            self._thread.start()
        return member

    def _next_seq(self) -> int:
        while True:
            got = self._store.get("member-seq")
            seq = 1 if got is None else int(s3_layout.decode("member-seq", got.value, "member-seq")["last"]) + 1
            try:
                self._store.compare_and_set("member-seq", s3_layout.encode("member-seq", {"last": seq}),
                                            None if got is None else got.version)
                return seq
            except MetadataConflict:
                continue  # another member joined at the same moment: take the next number

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.lease_time / RENEWALS):
            self.renew_now()

    def renew_now(self) -> str:
        """One renewal (the thread's, every fifth of the lease time); the state after it."""
        with self._lock:
            lease = self._lease
        started = self.clock.current_time()
        try:
            if lease is None:  # out of the cluster: connected again once S3 answers
                self._store.get("config")
                self._set_state(CONNECTED)
                return self._state
            held = lease.renew()
        except Exception as exc:  # noqa: BLE001 - S3 unreachable: out of touch, then out
            age = self.clock.current_time() - self._renewed
            log.warning("cannot renew the lease %s (%s: %s), last renewed %.1f s ago", lease and lease.key,
                        type(exc).__name__, exc, age)
            if age >= self.lease_time / 2:
                self._set_state(SUSPENDED)  # until S3 answers: then its key tells whether it is still a member
            return self._state
        if held:
            with self._lock:
                gap = started - self._renewed if self._lease is lease else 0.0
                if self._lease is lease:
                    self._renewed = started
            if gap >= self.lease_time / 2 and self._watch is not None:
                self._watch.restart()  # nobody else may have been able to renew meanwhile either
            self._set_state(CONNECTED)
        else:
            self._lose(lease, "its key was deleted or rewritten by another member")
        return self._state

    def _lose(self, lease: Lease | None, why: str) -> None:
        with self._lock:
            if lease is None or self._lease is not lease:
                return  # registered anew meanwhile
            self._lease = None
        log.warning("member %s lost its lease (%s): it stops serving and will rejoin", lease.holder, why)
        self._set_state(LOST)

    def _set_state(self, state: str) -> None:
        with self._lock:
            changed, self._state = self._state != state, state
        if changed:
            self._on_state(state)

    def fresh(self, heard_age: float) -> bool:
        """Renewed within ``IN_TOUCH`` of the lease time (counted from when the renewal began):
        the others count this member dead only after a whole lease time in which they saw no
        renewal. The renewal, not the control loop's last pass (``heard_age``), is what tells a
        process resumed after a pause: a pass reads many keys on S3 and may take a while."""
        return self.clock.current_time() - self._renewed < self.lease_time * IN_TOUCH

    # --- membership ----------------------------------------------------------------------------------

    def members(self, wake: Callable[[], None]) -> list[str]:
        """The live members; a member whose lease this one has seen unchanged for the lease time
        is deleted (compare-and-set on the version seen) and so dead for everyone."""
        own = self._lease.holder if self._lease is not None else None
        judge = self.fresh(0.0)  # a member out of touch itself cannot tell whether the others renewed
        present = s3_layout.read_members(self._store)
        live = {}
        for member, (address, version, value) in present.items():
            expired = self._watch.expired(f"members/{member}", version, value)
            if member != own and expired and judge:
                try:
                    self._store.delete(f"members/{member}", version)
                    log.info("member %s sees %s's lease not renewed for %g s: removed from the members", own,
                             member, self.lease_time)
                    continue
                except MetadataConflict:
                    pass  # renewed meanwhile: alive
            live[member] = address
        self._watch.keep_only({f"members/{m}" for m in present})
        self._live = live
        return sorted(live)

    def remove(self, member: str) -> None:
        self._live.pop(member, None)  # this pass's view goes without it too, as ZooKeeper's would
        got = self._store.get(f"members/{member}")
        if got is not None:
            try:
                self._store.delete(f"members/{member}", got.version)
            except MetadataConflict:
                pass  # renewed meanwhile: it answers again

    def leaving(self, wake: Callable[[], None]) -> list[str]:
        out = []
        for key in self._store.list("leaving/"):
            member = key[len("leaving/"):]
            if member in self._live:
                out.append(member)
            elif self._live and member < min(self._live):
                self._store.delete(key)  # its member is gone, and no later member can have that id
        return out

    def announce_leaving(self, member: str) -> None:
        try:
            self._store.compare_and_set(f"leaving/{member}", s3_layout.encode("leaving", {}), None)
        except MetadataConflict:
            pass  # announced already
        except MetadataUnavailable as exc:
            raise CallUnanswered(str(exc)) from None

    def read_assignment(self, wake: Callable[[], None]) -> tuple[bytes, Any]:
        self._assignment = s3_layout.read_assignment(self._store)
        return self._assignment

    def write_assignment(self, data: bytes, version: Any) -> bool:
        raw = {str(p): [m, g] for p, (m, g) in sorted(layout.decode_assignment(data).items())}
        try:
            self._store.compare_and_set("assignment", s3_layout.encode("assignment", {"assignment": raw}), version)
        except MetadataConflict:
            return False
        return True

    def assignment_now(self) -> dict[int, tuple[str, int]]:
        """A read of the key now (S3's listings and GETs are strongly consistent), not the one
        of the last pass, which it leaves as it is."""
        data, _version = self._bounded(lambda: s3_layout.read_assignment(self._store))
        return layout.decode_assignment(data)

    def read_view(self) -> dict:
        """The view of this pass: the members and the assignment it just read (each key read
        on S3 costs three requests), and the relations."""
        return s3_layout.read_view(self._store, self._live, self._assignment[0])

    def engine_options(self, partition: int) -> dict[str, Any]:
        cfg = self.config
        return {"metadata": self.where.partition_metadata(partition),
                "wal": layout.partition_blob(cfg.wal, partition),
                "blob": layout.partition_blob(cfg.blob, partition), "s3_endpoint": cfg.s3_endpoint}

    # --- relations -------------------------------------------------------------------------------------

    def _bounded(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except MetadataUnavailable as exc:
            raise CallUnanswered(str(exc)) from None

    def record_relation(self, name: str, partition: int) -> tuple[int, bool]:
        key = f"relations/{name}"
        while True:
            value = s3_layout.encode("relation", {"partition": partition, "record": secrets.token_hex(8)})
            try:
                self._bounded(lambda value=value: self._store.compare_and_set(key, value, None))
                return partition, True
            except MetadataConflict:
                pass
            got = self._bounded(lambda: self._store.get(key))
            if got is not None:
                return int(s3_layout.decode("relation", got.value, key)["partition"]), False

    def relation(self, name: str) -> tuple[int, Any] | None:
        key = f"relations/{name}"
        got = self._bounded(lambda: self._store.get(key))
        if got is None:
            return None
        body = s3_layout.decode("relation", got.value, key)
        return int(body["partition"]), body["record"]

    def remove_relation(self, name: str, record: Any = None) -> None:
        key = f"relations/{name}"
        got = self._bounded(lambda: self._store.get(key))
        if got is None:
            return
        if record is not None and s3_layout.decode("relation", got.value, key)["record"] != record:
            return  # dropped and added again meanwhile: that relation stays
        try:
            self._bounded(lambda: self._store.delete(key, got.version))
        except MetadataConflict:
            pass

    def relation_names(self) -> list[str]:
        return [k[len("relations/"):] for k in self._bounded(lambda: self._store.list("relations/"))]
