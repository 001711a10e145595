"""A client of a cluster of coordinators: today's client methods, each call sent to the
owner of the relation's partition.

``sediment.connect("zk://HOST:PORT/NAME")`` reads the cluster's members, assignment and
relations from ZooKeeper (``s3://BUCKET/PREFIX``: from an S3-only cluster's metadata store); ``sediment.connect("grpc://any-member")`` starts from that member
alone. Either way a member that does not own a partition answers with a redirect
(:class:`~sediment.errors.NotPartitionOwner`: owner's address and generation), which the
client follows and remembers per partition. A hint older than the newest generation seen
for that partition is ignored, so a stale member cannot send the client back. Calls refused
before anything was done (a redirect, an unreachable member, a partition being moved) are
retried until ``deadline`` seconds have passed; then CoordinatorUnavailable, naming the last
answer (a redirect met past the deadline is no answer of its own: a write tried in doubt before
it may have landed).
Writes whose outcome is unknown (the answer was lost, the owner died or was fenced) are
resent too: appends and ``append_many`` (with or without locks), transaction commits and
``commit_all`` with an idempotency key (the owner applies each at most once, and checks a
write's locks only if its key was not applied yet), alters from the schema version they
start from (cluster/alter_once.py), seals and ``set_since`` as they are (a frontier found at
or past the time after an unknown outcome counts as done); OutcomeUnknown after the deadline.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from sediment.client import Client, RemoteTransaction, _as_table
from sediment.cluster import layout
from sediment.cluster.directory import Directory, is_cluster_uri
from sediment.cluster.partition_transaction import PartitionTransaction
from sediment.engine.args import check_number
from sediment.errors import (
    CoordinatorSuperseded,
    CoordinatorUnavailable,
    CrossPartitionTransaction,
    EngineClosed,
    FrontierRegression,
    NotPartitionOwner,
    OutcomeUnknown,
    SchemaVersionMoved,
    UnknownRelation,
)
from sediment.txn_state import OPEN

DEFAULT_DEADLINE = 30.0  # seconds a call keeps following redirects and moves
RETRY_PAUSE = 0.05  # seconds between tries while a partition has no reachable owner
# The owner went away (died, lost its session, was fenced or closed) while or before the call
# ran: an idempotent call goes again to the new owner.
_MOVED = (CoordinatorUnavailable, EngineClosed, OutcomeUnknown, CoordinatorSuperseded, flight.FlightTimedOutError)
DEFAULT_CALL_TIMEOUT = 10.0  # seconds one call may take at one member (a paused member never answers)


class ClusterClient:
    """The client's methods over a cluster (see the module doc). Thread-safe."""

    def __init__(self, uri: str, token: str | None = None, *, deadline: float = DEFAULT_DEADLINE,
                 **options: Any) -> None:
        self.uri = uri
        self.deadline = check_number(deadline, "deadline (seconds a call may take, retries included)")
        self._token = token
        self._options = {"timeout": DEFAULT_CALL_TIMEOUT, **options}
        self._lock = threading.Lock()
        self._clients: dict[str, Client] = {}
        self._partition_of: dict[str, int] = {}
        self._owners: dict[int, tuple[str | None, int]] = {}  # partition -> (address, generation)
        self._seeds: list[str] = []
        self._leases: dict[int, str] = {}
        self._client_id = uuid.uuid4().hex
        self._threads = itertools.count(1)
        self._local = threading.local()
        self._directory: Directory | None = None  # where a zk:// or s3:// client reads the cluster's state
        self._zk: Any = None  # a zk:// client's kazoo client (the directory's)
        if is_cluster_uri(uri):
            self._directory = Directory(uri)  # ClusterMissing now rather than at the first call
            self._zk = self._directory.zk
            self._refresh()
        else:
            self._seeds.append(self._client(uri).uri)

    # --- routing -------------------------------------------------------------------------------

    def _client(self, address: str) -> Client:
        with self._lock:
            got = self._clients.get(address)
        if got is None:
            got = Client(address, self._token, **self._options)
            with self._lock:
                got = self._clients.setdefault(address, got)
        return got

    def _drop(self, address: str) -> None:
        """Forget the client of ``address``. Its idle append streams end now, in the background
        (each waits for the member's last word, which a retry elsewhere must not wait for,
        and a stopping member waits for them); the client itself is closed once the calls
        other threads may still be making on it have had their time (closing it under them
        would fail them)."""
        with self._lock:
            got = self._clients.pop(address, None)
        if got is not None:
            threading.Thread(target=got.end_streams, name="sediment-cluster-drop", daemon=True).start()
            closer = threading.Timer(self._options.get("timeout") or DEFAULT_CALL_TIMEOUT, got.close)
            closer.daemon = True
            closer.start()

    def _refresh(self, timeout: float | None = None) -> None:
        """Learn owners and relations again from ZooKeeper (or S3; a zk:// or s3:// client only),
        each read waiting at most ``timeout`` seconds (None: as long as it takes)."""
        if self._directory is None:
            return
        view = self._directory.read_view(timeout)
        with self._lock:
            self._seeds = list(view["members"].values())
            self._partition_of.update(view["relations"])
            for p, (member, generation) in view["assignment"].items():
                self._learn_locked(p, view["members"].get(member), generation)

    def _learn_locked(self, partition: int, address: str | None, generation: int) -> None:
        known = self._owners.get(partition)
        if known is None or generation > known[1] or (generation == known[1] and address is not None):
            self._owners[partition] = (address, generation)
        if address is not None and address not in self._seeds:
            self._seeds.append(address)

    def _target(self, name: str | None) -> str | None:
        with self._lock:
            p = self._partition_of.get(name) if name is not None else None
            owner = self._owners.get(p, (None, -1))[0] if p is not None else None
            if owner is not None:
                return owner
            if not self._seeds:
                return None
            return self._seeds[int(time.monotonic() * 1000) % len(self._seeds)]

    def _redirected(self, name: str | None, err: NotPartitionOwner) -> None:
        with self._lock:
            if name is not None and err.partition >= 0:
                self._partition_of[name] = err.partition
            if err.partition >= 0:
                known = self._owners.get(err.partition)
                if known is not None and known[0] not in (None, err.owner) and err.generation < known[1]:
                    return  # an older hint than one already followed: ignore it
                self._learn_locked(err.partition, err.owner, err.generation)
                if err.owner is None:
                    self._owners.pop(err.partition, None)

    def _forget_owner(self, address: str) -> None:
        with self._lock:
            for p, (owner, generation) in list(self._owners.items()):
                if owner == address:
                    self._owners[p] = (None, generation)
            if address in self._seeds and len(self._seeds) > 1:
                self._seeds.remove(address)
        self._drop(address)

    def _next_key(self) -> tuple[str, int]:
        local = self._local
        if not hasattr(local, "client"):
            local.client, local.seq = f"{self._client_id}-{next(self._threads)}", 0
        local.seq += 1
        return local.client, local.seq

    def route(self, name: str | None, call: Callable[[Client], Any], *, retry_unknown: bool = False,
              unknown_outcome: bool = False) -> Any:
        """``call`` at the owner of ``name``'s partition, following redirects and moves until the
        deadline. ``retry_unknown``: also resend after an outcome-unknown failure (calls that
        are idempotent: reads, seals, keyed appends); ``unknown_outcome``: past the deadline
        such a call raises OutcomeUnknown, since an attempt may have landed."""
        deadline = time.monotonic() + self.deadline
        uncertain: BaseException | None = None
        refused: BaseException | None = None  # the last redirect or refusal, for the error at the deadline
        while True:
            address = self._target(name)
            if address is None:  # no member known (yet): look again until the deadline
                if time.monotonic() > deadline:
                    raise CoordinatorUnavailable(f"no member of {self.uri} is known; is any member running?")
                self._pause_and_refresh(deadline + 1, CoordinatorUnavailable("no member"))
                continue
            try:
                return call(self._client(address))
            except NotPartitionOwner as err:
                refused = err
                self._redirected(name, err)
                if err.owner is None or err.owner == address:
                    try:
                        self._pause_and_refresh(deadline, err)
                    except NotPartitionOwner:
                        break  # past the deadline: a redirect is no answer (an earlier try may have landed)
            except UnknownRelation as err:
                if name is None or name in self._partition_of or self._directory is None:
                    raise
                self._pause_and_refresh(deadline, err)
            except _MOVED as err:
                if not retry_unknown:
                    raise  # the call may have been carried out: only an idempotent one goes again
                uncertain = err
                self._forget_owner(address)
                if time.monotonic() > deadline:
                    break
                self._pause_and_refresh(deadline, err)
            if time.monotonic() > deadline:
                break
        if unknown_outcome and uncertain is not None:
            raise OutcomeUnknown(f"write to {name!r} in {self.uri}: no owner acknowledged it within {self.deadline:g} "
                                 f"s (last: {uncertain}); it may or may not have been applied") from None
        last = f" (last answer: {refused})" if refused is not None else ""
        raise CoordinatorUnavailable(f"no owner of {name!r} in {self.uri} answered within {self.deadline:g} s{last}; "
                                     f"`sediment --connect {self.uri} cluster status` shows the owners")

    def _pause_and_refresh(self, deadline: float, err: BaseException) -> None:
        if time.monotonic() > deadline:
            raise err
        time.sleep(RETRY_PAUSE)
        try:
            self._refresh(max(0.1, deadline - time.monotonic()))  # a paused ZooKeeper must not outlast the deadline
        except Exception:  # noqa: BLE001 - ZooKeeper away (or slower than the deadline): go on with what is known
            pass

    # --- relations -----------------------------------------------------------------------------

    def add_relation(self, name: str, schema: pa.Schema, *, partition: int | None = None) -> None:
        """Create a relation in ``partition`` (default: a hash of the name)."""
        if partition is None and self._directory is not None:
            partition = layout.default_partition(name, self._directory.config.partitions)
        if partition is not None:
            with self._lock:
                self._partition_of.setdefault(name, partition)
        self.route(name, lambda c: c.add_relation(name, schema, partition=partition))

    def drop_relation(self, name: str) -> None:
        self.route(name, lambda c: c.drop_relation(name))
        with self._lock:
            self._partition_of.pop(name, None)

    def relations(self, include_internal: bool = False) -> list[str]:
        return self.route(None, lambda c: c.relations(include_internal), retry_unknown=True)

    def schema(self, name: str) -> pa.Schema:
        return self.route(name, lambda c: c.schema(name), retry_unknown=True)

    def since(self, name: str) -> int:
        return self.route(name, lambda c: c.since(name), retry_unknown=True)

    def sealed(self, name: str) -> int:
        return self.route(name, lambda c: c.sealed(name), retry_unknown=True)

    # --- writes --------------------------------------------------------------------------------

    def append(self, name: str, updates: pa.Table, *, locks: Any = None) -> None:
        """Append with an idempotency key (this thread's client id, its next sequence number):
        an outcome-unknown failure (the owner died, lost its session, was fenced) is sent again,
        to the new owner, until the deadline, and applied at most once. ``locks`` go with the
        key: the owner checks them only if the key was not applied yet, so a retry of a locked
        append that landed succeeds, and one that did not is checked (LockConflict: nothing
        written)."""
        table = _as_table(name, updates)
        key = self._next_key()
        self.route(name, lambda c: c.append_once(name, table, key[0], key[1], locks=locks), retry_unknown=True,
                   unknown_outcome=True)

    def append_many(self, updates: Mapping[str, pa.Table], *, locks: Any = None) -> None:
        """Atomic within one partition (CrossPartitionTransaction otherwise, nothing written).
        Keyed and retried after an unknown outcome as :meth:`append`, ``locks`` too."""
        names = sorted(updates)
        key = self._next_key()
        self.route(names[0] if names else None, lambda c: c.append_many(updates, locks=locks, key=key),
                   retry_unknown=True, unknown_outcome=True)

    def seal(self, name: str, t: int) -> None:
        """Write ``close t``; retried after an unknown outcome. A retry finding the relation
        sealed past ``t`` (an earlier attempt landed, and then a later seal) succeeds."""
        self._frontier(name, t, lambda c: c.seal(name, t), lambda c: c.sealed(name))

    def set_since(self, name: str, t: int) -> None:
        """Advance the compaction frontier; retried after an unknown outcome, as :meth:`seal`."""
        self._frontier(name, t, lambda c: c.set_since(name, t), lambda c: c.since(name))

    def _frontier(self, name: str, t: int, move: Callable[[Client], None], read: Callable[[Client], int]) -> None:
        """Move a frontier that only moves forward to ``t``, idempotently: moving it to where it
        is succeeds, and after an attempt whose outcome is unknown, so does finding it past ``t``
        (FrontierRegression then would claim that nothing happened, which may be false)."""
        unknown: list[BaseException] = []

        def call(c: Client) -> None:
            try:
                move(c)
            except FrontierRegression:
                if unknown and read(c) >= t:
                    return
                raise
            except _MOVED as err:
                unknown.append(err)
                raise

        self.route(name, call, retry_unknown=True, unknown_outcome=True)

    def transaction(self, group: str | None = None) -> ClusterRemoteTransaction:
        return ClusterRemoteTransaction(self, group)

    def commit_all(self, transactions: Sequence[ClusterRemoteTransaction], group: str | None = None) -> None:
        """Commit transactions of one partition as one; CrossPartitionTransaction otherwise.
        With an idempotency key, resent after an unknown outcome and applied at most once, as
        :meth:`ClusterRemoteTransaction.commit`."""
        bound = [t for t in transactions if t.inner is not None]
        owners = {t.client.uri for t in bound}
        if len(owners) > 1:
            for t in transactions:
                t.abort()
            raise CrossPartitionTransaction("commit_all over transactions at different partitions' owners: they "
                                            "commit together only within one partition; every one was aborted")
        if bound:
            name = bound[0].relation
            client, seq = self._next_key()
            inner = [t.inner for t in bound]
            self.route(name, lambda c: c.commit_all(inner, group=group, key=(name, client, seq)), retry_unknown=True,
                       unknown_outcome=True)
        for t in transactions:
            t.finish_empty()

    # --- reads ---------------------------------------------------------------------------------

    def snapshot(self, name: str, as_of: int) -> pa.Table:
        return self.route(name, lambda c: c.snapshot(name, as_of), retry_unknown=True)

    def replay(self, name: str, *, batch_rows: int = 65536) -> Any:
        return self.route(name, lambda c: list(c.replay(name, batch_rows=batch_rows)), retry_unknown=True)

    def subscribe(self, name: str, as_of: int | None = None, *, resume: bool = False,
                  max_lag: int | None = None) -> Any:
        return self.route(name, lambda c: c.subscribe(name, as_of, resume=resume, max_lag=max_lag),
                          retry_unknown=True)

    def plan_read(self, name: str, as_of: int, **options: Any) -> Any:
        def plan(c: Client) -> Any:
            got = c.plan_read(name, as_of, **options)
            with self._lock:
                self._leases[got.lease] = c.uri
            return got

        return self.route(name, plan, retry_unknown=True)

    def release_read(self, lease: int) -> None:
        with self._lock:
            address = self._leases.pop(lease, None)
        if address is not None:
            self._client(address).release_read(lease)

    def trace_info(self, name: str) -> dict[str, int]:
        return self.route(name, lambda c: c.trace_info(name), retry_unknown=True)

    def alter_relation(self, name: str, **changes: Any) -> int:
        """Alter from the schema version read just before (cluster/alter_once.py): retried
        after an unknown outcome and applied at most once (a retry finding this change as the
        next version answers it); sent again from the new version when another alter came first."""
        deadline = time.monotonic() + self.deadline
        while True:
            base = self.schema_version(name)
            try:
                return self.route(name, lambda c, base=base: c.alter_relation(name, base=base, **changes), retry_unknown=True,
                                  unknown_outcome=True)
            except SchemaVersionMoved:
                if time.monotonic() > deadline:
                    raise

    def schema_version(self, name: str) -> int:
        return self.route(name, lambda c: c.schema_version(name), retry_unknown=True)

    def describe(self, name: str) -> dict[str, Any]:
        return self.route(name, lambda c: c.describe(name), retry_unknown=True)

    def owner(self, name: str) -> tuple[str, int]:
        """(address, partition) of the member that serves ``name``'s partition now."""
        got = self.route(name, lambda c: (c.uri, c.describe(name)["partition"]), retry_unknown=True)
        return got[0], int(got[1])

    def compact(self, name: str | None = None) -> None:
        if name is not None:
            self.route(name, lambda c: c.compact(name), retry_unknown=True)
            return
        for address in self.members():
            self._client(address).compact()

    def members(self) -> list[str]:
        try:
            self._refresh(self.deadline)  # bounded: ZooKeeper may be paused
        except Exception as exc:  # noqa: BLE001 - kazoo's errors and timeouts, typed for the caller
            store = "the S3 metadata store" if self.uri.startswith("s3://") else "ZooKeeper"
            raise CoordinatorUnavailable(f"{store} of {self.uri} did not answer within {self.deadline:g} s "
                                         f"({type(exc).__name__}); retry once it is reachable") from None
        with self._lock:
            return sorted(set(self._seeds) | {a for a, _g in self._owners.values() if a is not None})

    def stats(self, include_internal: bool = False) -> dict:
        """Each reachable member's stats, by advertised address."""
        out = {}
        for address in self.members():
            try:
                out[address] = self._client(address).stats(include_internal)
            except (CoordinatorUnavailable, EngineClosed):
                continue
        return {"members": out}

    def compaction_errors(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for address in self.members():
            out.update(self._client(address).compaction_errors())
        return out

    # --- closing -------------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            c.close()
        if self._directory is not None:
            self._directory.close()
            self._directory = self._zk = None

    def __enter__(self) -> ClusterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ClusterRemoteTransaction(PartitionTransaction):
    """A transaction that begins at the owner of its first append's partition."""

    def __init__(self, cluster: ClusterClient, group: str | None) -> None:
        super().__init__()
        self._cluster = cluster
        self._group = group
        self.inner: RemoteTransaction | None = None
        self.client: Client | None = None
        self.relation = ""  # the first relation appended to: its partition holds the transaction

    def append(self, name: str, updates: pa.Table) -> None:
        if self.inner is None:
            def begin(c: Client) -> None:
                c.schema(name)  # at the owner: a redirect before the transaction exists
                self.client, self.inner = c, c.transaction(self._group)

            self._cluster.route(name, begin)
            self.relation = name
        self.inner.append(name, updates)

    def commit(self) -> None:
        """Commit with an idempotency key, resent after an unknown outcome (to the partition's
        owner, until the deadline) and applied at most once; TransactionError if the
        transaction was lost (its partition moved before it committed: nothing committed)."""
        if self.inner is not None:
            client, seq = self._cluster._next_key()
            name = self.relation

            def send(txn: int) -> str:
                return self._cluster.route(name, lambda c: c.commit_once(txn, name, client, seq),
                                           retry_unknown=True, unknown_outcome=True)

            self.inner.commit(send=send)
        self.finish_empty()

    def __enter__(self) -> ClusterRemoteTransaction:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc_type is None and self.state == OPEN:
            self.commit()
        elif self.state == OPEN:
            self.abort()


def cluster_status(uri: str, token: str | None = None) -> dict:
    """What ``sediment cluster status`` prints: members by advertised address, the manager, and
    per partition its owner, generation, sealed frontiers and WAL backlog (from its owner)."""
    directory = Directory(uri)
    try:
        view = directory.read_view()
    finally:
        directory.close()
    where = directory.where
    members = view["members"]
    per_member: dict[str, dict] = {}
    for address in set(members.values()):
        try:
            with Client(address, token) as c:
                per_member[address] = c.stats().get("partitions", {})
        except Exception:  # noqa: BLE001 - an unreachable member shows no figures
            per_member[address] = {}
    partitions = []
    for p, (member, generation) in sorted(view["assignment"].items()):
        address = members.get(member)
        figures = per_member.get(address or "", {}).get(str(p), {})
        partitions.append({"partition": p, "owner": address, "member": member, "generation": generation,
                           "sealed": {n: r.get("sealed") for n, r in figures.get("relations", {}).items()},
                           "wal_backlog_bytes": figures.get("wal", {}).get("backlog_bytes")})
    return {"cluster": where.uri, "manager": members.get(view["manager"]) if view["manager"] else None,
            "members": [{"id": m, "advertise": a} for m, a in sorted(members.items())],
            "partitions": partitions}
