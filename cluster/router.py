"""The engine a cluster member serves: the Engine's calls, each sent to the engine of the
relation's partition when this member owns it, answered with a redirect otherwise.

``sediment serve --cluster`` hands a :class:`ClusterEngine` to the same Flight server as a
single engine, so the wire protocol and the client's methods stay as they are; the one
new answer is the typed redirect :class:`~sediment.errors.NotPartitionOwner` (partition,
owner's advertised address, generation). A write is acknowledged only if the member still
owns the partition, in the same generation, with its ZooKeeper session, after the write
(:class:`~sediment.errors.MembershipLost` otherwise, an outcome-unknown error the client
retries at the owner). A read is refused the same way before it starts, and its answer
(or failure) leaves only once the membership store, read after the read arrived, still
assigns the partition to this member in that generation (``Member.confirm_owner``; the
reads waiting at one moment share one such read, cluster/read_confirm.py): a member deposed
by a move while live and in touch, which has not seen the move yet, answers MembershipLost,
so no read misses a write acknowledged anywhere before it arrived (docs/reliability.md,
session 32). Nor does it fail
from stale state: a call (or a replay's stream) that fails at a member that lost the
partition meanwhile answers MembershipLost, not, say, that a batch the new owner compacted
away is missing (BatchCorruption) or that the engine's store was closed (BlobError), which
the client would not retry. The check is of the engine the call ran on: one fenced, closed
or failed, or replaced by a reopen, answers nothing. A member that hands a partition over
(SIGTERM) takes its appends and seals until the new owner's recovery fences it
(cluster/member.py): only their success is answered there; its reads, and any failure,
answer MembershipLost.
"""

from __future__ import annotations

import itertools
import secrets
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from sediment.cluster import alter_once, layout
from sediment.cluster.applied import APPLIED, AppliedOnce
from sediment.cluster.member import Member
from sediment.cluster.partition_transaction import PartitionTransaction
from sediment.engine import staged
from sediment.errors import (
    CrossPartitionTransaction,
    InvalidArgument,
    NothingWritten,
    NotPartitionOwner,
    RelationExists,
    TransactionError,
    UnknownRelation,
    WalFenced,
)
from sediment.txn_state import OPEN


class ClusterEngine:
    """The Engine's API over the partitions ``member`` serves (see the module doc)."""

    def __init__(self, member: Member) -> None:
        self.member = member
        self.data_dir = member.data_dir
        self.cluster_uri = member.where.uri
        self.metrics = member.metrics
        self.superseded = None
        self.superseded_listeners: list = []
        # random-based ids: a client resending a commit to a later owner must never name another's
        self._txn_ids = itertools.count(secrets.randbits(40) << 20)
        self._applied = AppliedOnce(on_doubt=member.reopen)
        self._alter_lock = threading.Lock()
        self._relations_lock = threading.Lock()  # adds and drops: none removes a record another completes

    # --- routing -------------------------------------------------------------------------------

    def _partition(self, name: str) -> int:
        """The partition ``name`` is recorded in: the member's view (read every pass), or the
        record itself when a partition served here lacks the relation (the view is older than a
        drop, or a drop and an add elsewhere)."""
        p = self.member.partition_of(name)
        held = self.member.held(p) if p is not None else None
        if held is not None and held[0].view.relations.get(name) is None:
            p = self.member.partition_of(name, fresh=True)
        if p is None:
            raise UnknownRelation(f"no relation {name!r} in cluster {self.member.where.uri}; add it first")
        return p

    def _engine(self, name: str, *, append: bool = False) -> tuple[Any, int, int]:
        """(engine, partition, generation) for ``name``, or the redirect. ``append``: a partition
        this member hands over serves appends and seals until its new owner fences it."""
        p = self._partition(name)
        engine, generation = self.member.engine_for(p, append=append)
        return engine, p, generation

    def _write(self, name: str, call: str, *args: Any, append: bool = False, **kwargs: Any) -> Any:
        return self._served(name, call, *args, append=append, **kwargs)[0]

    def _served(self, name: str, call: str, *args: Any, append: bool = False, read: bool = False,
                **kwargs: Any) -> tuple[Any, int, int]:
        """(result, partition, generation) of the engine's ``call``, as :meth:`_answered`."""
        engine, p, generation = self._engine(name, append=append)
        result = self._answered(p, generation, engine, lambda: getattr(engine, call)(name, *args, **kwargs),
                                append=append, read=read)
        return result, p, generation

    def _read(self, name: str, call: str, *args: Any, **kwargs: Any) -> Any:
        """A read's result, answered only once ownership is confirmed after it arrived."""
        return self._served(name, call, *args, read=True, **kwargs)[0]

    def _answered(self, p: int, generation: int, engine: Any, run: Callable[[], Any], *, append: bool = False,
                  read: bool = False, refused: Callable[[Any], None] | None = None) -> Any:
        """``run()``'s result (on ``engine``), answered only while this member still serves
        partition ``p`` in ``generation`` with that engine (``append``: a successful append or
        seal also while the partition is handed over, not fenced yet); its failure only while
        it serves it, since a member that hands the partition over, or lost it, may have failed
        on state the new owner moved past or on the engine closing (a batch compacted away,
        the store closed): MembershipLost then, which the client retries at the owner.
        ``read``: its answer, or failure, leaves only once the membership store, read after
        the call arrived, still names this member and ``generation`` for ``p``
        (``Member.confirm_owner``); ``refused(result)`` lets go of what a result refused so
        holds (a read plan's lease, a subscription). A write refused because a new owner claimed the partition's S3 log (WalFenced: nothing
        written) is a redirect."""
        try:
            result = run()
        except WalFenced:
            self.metrics.redirects.inc()
            raise NotPartitionOwner(f"partition {p} was taken over by its new owner while {self.member.advertise} "
                                    "wrote to it; nothing was written: retry at the owner", partition=p, owner=None,
                                    generation=generation) from None
        except Exception:
            self.member.check_still_serving(p, generation, engine, read=read)  # lost meanwhile: that is the answer
            raise
        try:
            self.member.check_still_serving(p, generation, engine, append=append, read=read)
        except Exception:
            if refused is not None:
                try:
                    refused(result)
                except Exception:  # noqa: BLE001, S110 - a closing engine lets go of it anyway
                    pass
            raise
        return result

    def _stream(self, batches: Iterator[Any], p: int, generation: int, engine: Any) -> Iterator[Any]:
        """A stream read from an engine, whose failure mid-way is checked as a call's: an owner
        that lost the partition while it streamed (handed it over, or paused past its session,
        and the new owner deleted a batch it compacted away) answers that, which the client
        retries at the owner, not that a batch of its old state is missing."""
        try:
            yield from batches
        except Exception:
            self.member.check_still_serving(p, generation, engine)
            raise

    # --- relations -----------------------------------------------------------------------------

    def add_relation(self, name: str, schema: pa.Schema, partition: int | None = None) -> None:
        """Create ``name`` in ``partition`` (default: a hash of the name), recorded in ZooKeeper
        first so that every member and client routes it the same way. An add whose owner
        stopped after the record completes when added again to the same partition; any other
        partition is refused (RelationExists) until the name is dropped (see :meth:`drop_relation`)."""
        from sediment.engine.schema import check_name

        check_name(name)
        count = self.member.config.partitions
        if partition is None:
            partition = layout.default_partition(name, count)
        elif not isinstance(partition, int) or isinstance(partition, bool) or not 0 <= partition < count:
            raise InvalidArgument(f"partition must be an integer in [0, {count}), not {partition!r}")
        with self._relations_lock:
            engine, generation = self.member.engine_for(partition)
            recorded, created = self._record_relation(name, partition)
            if recorded != partition:
                raise RelationExists(f"relation {name!r} already exists in partition {recorded} of "
                                     f"{self.member.where.uri}; drop it first or pick another name")
            try:
                self._answered(partition, generation, engine, lambda: engine.add_relation(name, schema))
            except NothingWritten:
                if created:  # refused (a bad schema): the record goes too, nothing is left changed
                    self.member.zk_call(lambda: self.member.membership().remove_relation(name),
                                        f"remove the record of refused relation {name!r}", write=True)
                raise

    def _record_relation(self, name: str, partition: int) -> tuple[int, bool]:
        """Record ``name`` in ``partition`` unless it is recorded already: the partition it is
        recorded in, and whether this call recorded it. The record is the arbiter between adds
        of one name at two members."""
        return self.member.zk_call(lambda: self.member.membership().record_relation(name, partition),
                                   f"record relation {name!r}", write=True)

    def drop_relation(self, name: str) -> None:
        """Drop ``name`` from its partition's catalog, then its record in ZooKeeper. A drop
        finding the record but no catalog entry (a drop or add whose owner stopped between
        its two writes) removes the record: the drop is complete, and the name free."""
        membership = self.member.membership()
        with self._relations_lock:
            got = self.member.zk_call(lambda: membership.relation(name), f"find relation {name!r}'s partition")
            if got is None:
                raise UnknownRelation(f"no relation {name!r} in cluster {self.member.where.uri}; nothing was dropped")
            partition, record = got
            engine, generation = self.member.engine_for(partition)
            try:
                self._answered(partition, generation, engine, lambda: engine.drop_relation(name))
            except UnknownRelation:
                pass  # dropped already, or never added: only the record is left (checked as still ours)
            # only that record: one dropped and added again meanwhile (by a newer owner) stays
            self.member.zk_call(lambda: membership.remove_relation(name, record), f"remove relation {name!r}",
                                write=True)

    def relations(self, include_internal: bool = False) -> list[str]:
        names = self.member.zk_call(lambda: self.member.membership().relation_names(), "list the relations")
        return sorted(n for n in names if include_internal or not n.startswith("_"))

    def schema(self, name: str) -> pa.Schema:
        return self._read(name, "schema")

    def since(self, name: str) -> int:
        return self._read(name, "since")

    def sealed(self, name: str) -> int:
        return self._read(name, "sealed")

    def trace_info(self, name: str) -> dict[str, int]:
        return self._read(name, "trace_info")

    def alter_relation(self, name: str, *, base: int | None = None, **changes: Any) -> int:
        """With ``base``, the schema version the change starts from: applied only when the
        relation is at ``base``; when it is past it and version ``base + 1`` is this change,
        that version (a retry of an alter that landed); SchemaVersionMoved otherwise, with
        nothing changed (cluster/alter_once.py). Alters of this member go one at a time."""
        with self._alter_lock:
            engine, p, generation = self._engine(name)
            if base is not None:
                landed = self._answered(p, generation, engine, lambda: alter_once.check_base(
                    name, engine.view.get(name).entry.schema_history, base, changes))
                if landed is not None:
                    return landed
            return self._answered(p, generation, engine, lambda: engine.alter_relation(name, **changes))

    def schema_version(self, name: str) -> int:
        return self._read(name, "schema_version")

    def describe(self, name: str) -> dict[str, Any]:
        """The engine's description, with the relation's ``partition``."""
        return {**self._read(name, "describe"), "partition": self._partition(name)}

    # --- writes --------------------------------------------------------------------------------

    def append(self, name: str, updates: pa.Table, *, locks: Any = None) -> None:
        self._write(name, "append", updates, append=True, locks=locks)

    def append_once(self, name: str, updates: pa.Table, client: str, seq: int, *, locks: Any = None) -> None:
        """An append with an idempotency key: applied at most once however often it is retried,
        here or at a later owner (cluster/applied.py). ``locks`` are checked only when the key
        was not applied yet: a retry of a locked append that landed succeeds."""
        engine, p, generation = self._engine(name, append=True)
        if not self._answered(p, generation, engine, lambda: self._applied.append_many(engine, p, {name: updates}, client,
                                                                                        seq, locks), append=True):
            self.metrics.deduplicated.inc()

    def _one_partition(self, updates: Mapping[str, pa.Table]) -> int | None:
        parts = {self._partition(name) for name in updates}
        if len(parts) > 1:
            raise CrossPartitionTransaction(f"append_many names relations of partitions {sorted(parts)}: a write "
                                            "is atomic within one partition; nothing was written")
        return next(iter(parts), None)

    def append_many(self, updates: Mapping[str, pa.Table], *, locks: Any = None) -> None:
        p = self._one_partition(updates)
        if p is None:
            return
        engine, generation = self.member.engine_for(p, append=True)
        self._answered(p, generation, engine, lambda: engine.append_many(updates, locks=locks), append=True)

    def append_many_once(self, updates: Mapping[str, pa.Table], client: str, seq: int, *,
                         locks: Any = None) -> None:
        """``append_many`` with an idempotency key, applied at most once as :meth:`append_once`."""
        p = self._one_partition(updates)
        if p is None:
            return
        engine, generation = self.member.engine_for(p, append=True)
        if not self._answered(p, generation, engine, lambda: self._applied.append_many(engine, p, updates, client, seq,
                                                                                        locks), append=True):
            self.metrics.deduplicated.inc()

    def commit_once(self, name: str, client: str, seq: int, commit: Callable[[int, pa.Table], None]) -> None:
        """A transaction's commit with an idempotency key: ``commit(partition, marks)`` commits
        it with the key's marks (rows of ``_cluster.applied``) inside, so the key is durable
        exactly when the commit is; a repeat of an applied key commits nothing and succeeds.
        ``name``: a relation the transaction wrote (it names the partition)."""
        engine, p, generation = self._engine(name)
        if not self._answered(p, generation, engine, lambda: self._applied.apply(engine, p, client, seq,
                                                                                  lambda marks: commit(p, marks))):
            self.metrics.deduplicated.inc()

    def seal(self, name: str, t: int) -> None:
        self._write(name, "seal", t, append=True)

    def set_since(self, name: str, t: int) -> None:
        self._write(name, "set_since", t)

    def transaction(self) -> ClusterTransaction:
        return ClusterTransaction(self, next(self._txn_ids))

    def commit_all(self, transactions: Sequence[ClusterTransaction]) -> None:
        """One commit for transactions of one partition; CrossPartitionTransaction (and each
        is aborted) when they span two."""
        bound = {t.partition for t in transactions if t.partition is not None}
        if len(bound) > 1:
            for t in transactions:
                t.abort()
            raise CrossPartitionTransaction(f"commit_all over partitions {sorted(bound)}: transactions commit "
                                            "together only within one partition; every one was aborted")
        inner = [t.inner for t in transactions if t.inner is not None]
        if inner:
            (p,) = bound
            engine, generation = self.member.engine_for(p)
            self._answered(p, generation, engine, lambda: engine.commit_all(inner))
        for t in transactions:
            t.finish_empty()

    def commit_all_marked(self, transactions: Sequence[ClusterTransaction], partition: int, marks: pa.Table) -> None:
        """:meth:`commit_all` with an idempotency key's ``marks`` written inside the first
        transaction, in ``partition`` (the one the key is checked in)."""
        if transactions:
            try:
                transactions[0].mark(partition, marks)
            except BaseException:
                for t in transactions:
                    t.abort()
                raise
            self.commit_all(transactions)

    # --- reads ---------------------------------------------------------------------------------

    def bulk_stage(self, name: str, job: str) -> str:
        """Bulk loads (engine/staged.py) at the engine of the relation's partition: its files
        are staged where that engine's blob store is, and the load, recorded in that engine's
        memory, commits only there (a later owner refuses it: write it again)."""
        return self._bulk(name, staged.stage, job)

    def bulk_commit(self, name: str, job: str, time: int | None = None, diff: int | None = None) -> dict[str, Any]:
        return self._bulk(name, staged.commit_staged, job, time, diff)

    def bulk_abort(self, name: str, job: str) -> int:
        return self._bulk(name, staged.abort_staged, job)

    def _bulk(self, name: str, call: Callable[..., Any], *args: Any) -> Any:
        engine, p, generation = self._engine(name)
        return self._answered(p, generation, engine, lambda: call(engine, name, *args))

    def snapshot(self, name: str, as_of: int) -> pa.Table:
        return self._read(name, "snapshot", as_of)

    def replay(self, name: str, *, batch_rows: int = 65536) -> Any:
        engine, p, generation = self._engine(name)
        batches = self._answered(p, generation, engine, lambda: engine.replay(name, batch_rows=batch_rows),
                                 read=True, refused=lambda batches: batches.close())
        return self._stream(batches, p, generation, engine)

    def subscribe(self, name: str, as_of: int | None = None, *, resume: bool = False,
                  max_lag: int | None = None) -> Any:
        engine, p, generation = self._engine(name)
        return self._answered(p, generation, engine, lambda: engine.subscribe(name, as_of, resume=resume,
                                                                             max_lag=max_lag),
                              read=True, refused=lambda subscription: subscription.close())

    def plan_read(self, name: str, as_of: int, **options: Any) -> Any:
        """The partition's plan, its lease renumbered so that release_read finds the partition."""
        engine, p, generation = self._engine(name)
        plan = self._answered(p, generation, engine, lambda: engine.plan_read(name, as_of, **options), read=True,
                              refused=lambda plan: engine.release_read(plan.lease))
        plan.lease = plan.lease * self.member.config.partitions + self._partition(name)
        return plan

    def release_read(self, lease: int) -> None:
        """End a plan's lease. At a member that no longer holds the partition there is nothing
        to end: the engine that granted the lease was closed when the partition moved, and its
        leases with it (the server lets the plan's held tail go all the same)."""
        count = self.member.config.partitions
        held = self.member.held(lease % count)
        if held is not None:
            held[0].release_read(lease // count)

    # --- the member as a whole -----------------------------------------------------------------

    def compact(self, name: str | None = None) -> None:
        if name is not None:
            self._write(name, "compact")
            return
        for p, (engine, _g) in self.member.owned().items():
            try:
                engine.compact()
            except Exception:
                if (self.member.held(p) or (None,))[0] is engine:
                    raise
                # handed over or taken meanwhile: its new owner compacts it


    def compaction_errors(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for engine, _g in self.member.owned().values():
            out.update(engine.compaction_errors())
        return out

    def stats(self, include_internal: bool = False) -> dict[str, Any]:
        """This member's partitions, each with its engine's stats."""
        owned = self.member.owned()
        return {"member": self.member.member_id, "advertise": self.member.advertise,
                "partitions": {str(p): {"generation": g, **engine.stats(include_internal)}
                               for p, (engine, g) in sorted(owned.items())}}

    def close(self) -> None:
        self.member.stop()


class ClusterTransaction(PartitionTransaction):
    """A transaction bound to the partition of its first append; an append to a relation of
    another partition is refused (CrossPartitionTransaction) before anything of it is written."""

    def __init__(self, router: ClusterEngine, txn_id: int) -> None:
        super().__init__()
        self.id = txn_id
        self.partition: int | None = None
        self._router = router
        self._generation = -1
        self._mutex = threading.Lock()
        self._engine: Any = None

    def _bind(self, p: int, elsewhere: str) -> int:
        """With ``_mutex`` held: the generation of partition ``p``, the transaction bound to it
        on first use; ``elsewhere`` is the refusal when it is bound to another partition."""
        if self.state != OPEN:
            raise TransactionError(f"transaction {self.id:#x} is {self.state}")
        if self.partition is not None and p != self.partition:
            raise CrossPartitionTransaction(f"transaction {self.id:#x} writes partition {self.partition}; "
                                            + elsewhere)
        engine, generation = self._router.member.engine_for(p)
        if self.inner is None:
            self.partition, self.inner, self._generation, self._engine = p, engine.transaction(), generation, engine
        return generation

    def append(self, name: str, updates: pa.Table) -> None:
        with self._mutex:
            p = self._router._partition(name)
            generation = self._bind(p, f"relation {name!r} is in partition {p}: a transaction is atomic within "
                                       "one partition; nothing of this append was written")
            if generation != self._generation:
                raise TransactionError(f"partition {p} moved while transaction {self.id:#x} was open; it is lost: "
                                       "begin again at the new owner")
        self._router._answered(p, generation, self._engine, lambda: self.inner.append(name, updates))

    def commit(self) -> None:
        self._router.commit_all([self])

    def commit_marked(self, partition: int, marks: pa.Table) -> None:
        """Commit with an idempotency key's ``marks`` (cluster/applied.py) written inside, in
        ``partition``: the one the key is checked in."""
        self.mark(partition, marks)
        self.commit()

    def mark(self, partition: int, marks: pa.Table) -> None:
        """Write an idempotency key's ``marks`` into this transaction, in ``partition``."""
        with self._mutex:
            self._bind(partition, f"its commit names partition {partition}; nothing was committed")
        self.inner.append(APPLIED, marks)

