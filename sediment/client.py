"""A network client for a sediment server, with the Engine's methods and semantics.

Spark executors and other processes reach the coordinator through this instead of
opening the data directory (only one process may). Code written against
:class:`~sediment.engine.engine.Engine` runs unchanged against a :class:`Client`:
the same methods, the same return types, the same durability (a call returns once
the server has made it durable) and the same typed errors from
:mod:`sediment.errors`, carried in the Flight error's detail. The wire protocol is
in docs/formats.md ("Network protocol").

    import sediment
    with sediment.connect("grpc://127.0.0.1:8815", token="...") as db:
        db.append("orders", updates)
        with db.transaction() as tx:
            tx.append("orders", more)
"""

from __future__ import annotations

import functools
import json
import os
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from sediment import errors
from sediment.arrow_codec import schema_from_text, schema_to_text
from sediment.engine.args import (  # the engine's own argument checks: no engine state
    check_bool,
    check_locks,
    check_number,
    check_str,
    check_updates_map,
)
from sediment.engine.read_plan import ReadPlan  # a plain value type: none of the engine comes with it
from sediment.errors import EngineClosed, SchemaMismatch, ServerError, TransactionError
from sediment.net import grpc_setup
from sediment.net.alter_wire import encode_alter
from sediment.net.append_stream import (
    CLOSE_WAIT_SECONDS,
    EXCHANGE_VERSION,
    PROBE_AFTER_SECONDS,
    AppendStream,
    StreamPool,
    append_batches,
    append_metadata,
    cancelled_append,
)
from sediment.net.call_gate import CallGate
from sediment.net.connect_options import check_ca_pem, read_ca_file, server_location
from sediment.net.held_tails import HELD_METADATA_KEY, encode_cuts
from sediment.net.messages import Action, Get, Put, encode
from sediment.net.pipelined import WINDOW as PIPELINE_WINDOW
from sediment.net.pipelined import PipelinedAppends
from sediment.net.protocol import (
    AUTH_HEADER,
    PLAN_FIELDS,
    PLAN_METADATA_KEY,
    PROTOCOL_VERSION,
    TOKEN_ENV,
    encode_locks,
)
from sediment.net.remote_subscription import RemoteSubscription
from sediment.net.remote_transaction import RemoteTransaction
from sediment.net.remote_transaction import as_table as _as_table
from sediment.net.shared_subscription import FeedShares, SharedSubscription
from sediment.net.wire_errors import error_line, server_error, typed_error
from sediment.txn_state import ABORTED

__all__ = ["Client", "RemoteSubscription", "RemoteTransaction", "ServerError", "connect", "typed_error"]

PUT_CHUNK_BYTES = 4 << 20  # record batches on the wire stay well below gRPC's message limits
INLINE_APPEND_BYTES = 1 << 20  # a larger append waits on a worker: a write gRPC holds cannot be cancelled


class Client:
    """A connection to a sediment server with the methods of :class:`sediment.Engine`.
    Thread-safe: calls from many threads share one gRPC channel. Use as a context manager."""

    def __init__(self, uri: str, token: str | None = None, *, timeout: float | None = None,
                 tls_root_certs: bytes | str | None = None) -> None:
        """``uri``: ``grpc://HOST:PORT`` (or just ``HOST:PORT``), or ``grpc+tls://HOST:PORT`` with
        ``tls_root_certs`` (PEM bytes, or a file name) naming the CA that signed the server's
        certificate (the system's roots when None)."""
        uri = server_location(uri)
        token = token if token is not None else os.environ.get(TOKEN_ENV)
        if not token:
            raise errors.InvalidArgument(f"no token to connect to {uri}: pass token=..., or set ${TOKEN_ENV}")
        check_str(token, "token (the server's shared secret)")
        check_number(timeout, "timeout (seconds per call)", allow_none=True)
        if tls_root_certs is not None and not isinstance(tls_root_certs, (bytes, str)):
            raise errors.InvalidArgument(f"tls_root_certs must be PEM bytes or a file name, not "
                                         f"{type(tls_root_certs).__name__}")
        self.uri = uri
        self._timeout = timeout
        self._options = flight.FlightCallOptions(timeout=timeout,
                                                 headers=[(AUTH_HEADER.encode(), f"Bearer {token}".encode())])
        if isinstance(tls_root_certs, str):
            tls_root_certs = read_ca_file(tls_root_certs)
        elif tls_root_certs is not None:
            tls_root_certs = check_ca_pem(tls_root_certs)
        if tls_root_certs is not None and not uri.startswith("grpc+tls://"):
            raise errors.InvalidArgument(f"tls_root_certs given for {uri!r}: use grpc+tls://HOST:PORT for a TLS "
                                         "coordinator")
        grpc_setup.apply()  # before gRPC's first use in the process, or it has no effect
        self._flight = flight.FlightClient(uri, **({"tls_root_certs": tls_root_certs} if tls_root_certs else {}))
        self._closed = False
        self._close_lock = threading.Lock()
        self._calls = CallGate(uri)  # blocking calls, which close() ends
        self._close_wait = CLOSE_WAIT_SECONDS if timeout is None else min(timeout, CLOSE_WAIT_SECONDS)
        self._on_close: list[Callable[[], None]] = []
        self._streams = StreamPool(self._open_stream, max_age=timeout / 2 if timeout else None)
        self._feed_shares = FeedShares(uri, self._get, self._action)
        self._unshared: weakref.WeakSet[RemoteSubscription] = weakref.WeakSet()  # ended by close()
        try:
            info = self._action(Action.PING)
        except BaseException:
            self._calls.close()
            self._flight.close()
            raise
        if info.get("protocol") != PROTOCOL_VERSION:
            self._calls.close()
            self._flight.close()
            raise ServerError(f"the server at {uri} speaks sediment protocol {info.get('protocol')}, this client "
                              f"{PROTOCOL_VERSION}; use matching sediment versions")
        # a server of the build before has no append exchange: its appends go on do_put streams
        self._exchange = EXCHANGE_VERSION in (info.get("append_exchange") or ())
        self.data_dir: str = info.get("data_dir", "")
        self.cluster: str | None = info.get("cluster")  # a cluster member's cluster URI

    # --- plumbing ------------------------------------------------------------------------------

    @contextmanager
    def _remote(self) -> Iterator[None]:
        """Turn the server's errors back into the typed errors they were."""
        if self._closed:
            raise EngineClosed(f"the client of {self.uri} is closed; connect again")
        try:
            yield
        except flight.FlightError as exc:
            typed = typed_error(exc)
            if typed is exc:
                raise
            raise typed from None
        except pa.ArrowException as exc:
            if "gRPC" not in str(exc):  # not the transport's (pyarrow reports some of gRPC's codes so)
                raise
            raise errors.TransportFailed(f"the transport failed during the call ({error_line(exc)}): it may or "
                                         "may not have been carried out; read back before writing again") from None

    def _action(self, op: Action, *, within: float | None = None, **args: Any) -> Any:
        """Run action ``op``; ``within``: its own deadline in seconds (the client's if sooner)."""
        action, options = flight.Action(op, encode(op, **args)), self._options
        if within is not None:
            options = flight.FlightCallOptions(timeout=min(within, self._timeout or within), headers=options.headers)
        with self._remote():
            results = self._calls.run(lambda: list(self._flight.do_action(action, options=options)))
        return json.loads(results[0].body.to_pybytes())["result"] if results else None

    def _get(self, op: Get, **args: Any) -> flight.FlightStreamReader:
        """The stream that answers a do_get ticket (called inside :meth:`_remote`); the
        client's close cancels it."""
        ticket = flight.Ticket(encode(op, **args))
        return self._calls.track(self._calls.run(lambda: self._flight.do_get(ticket, options=self._options)))

    def _put(self, command: bytes, table: pa.Table) -> None:
        """Stream ``table``; returns once the server has finished with it (made it durable),
        or raises the server's error."""
        with self._remote():
            self._calls.run(lambda: self._put_now(command, table))

    def _put_now(self, command: bytes, table: pa.Table) -> None:
        descriptor = flight.FlightDescriptor.for_command(command)
        writer, _reader = self._flight.do_put(descriptor, table.schema, options=self._options)
        failure: BaseException | None = None
        try:
            for batch in append_batches(table, PUT_CHUNK_BYTES):
                writer.write_batch(batch)
            writer.done_writing()
        except (flight.FlightError, pa.ArrowException, OSError) as exc:
            failure = exc  # the server may have refused early: close() reports why
        writer.close()
        if failure is not None:
            raise failure

    def _append(self, name: str, table: pa.Table, txn: int | None = None, locks: Any = None,
                key: tuple[str, int] | None = None) -> None:
        """One append (into transaction ``txn`` when given; with idempotency ``key``) on a pooled
        append stream; returns once the server has made it durable, or raises the server's error."""
        check_locks(locks)
        meta = append_metadata(txn, encode_locks(locks), key)
        batches = append_batches(table, PUT_CHUNK_BYTES)
        with self._remote():
            if table.get_total_buffer_size() > INLINE_APPEND_BYTES:  # nbytes walks the columns: 7 us
                self._calls.run(lambda: self._append_now(name, table.schema, batches, meta))
            else:  # on the caller's thread: a hop to a worker costs appends two context switches
                self._append_now(name, table.schema, batches, meta)

    def _append_now(self, name: str, schema: pa.Schema, batches: list[pa.RecordBatch], meta: bytes) -> None:
        while True:
            # a stream unused for a while is probed first: one that broke meanwhile (its server
            # died, say) is replaced before anything of the append goes out on it
            stream, fresh = self._streams.take(name, schema, probe_after=PROBE_AFTER_SECONDS)
            try:
                done = stream.append(batches, meta)
            except flight.FlightError as exc:
                stream.close()
                if stream.cancelled:
                    raise cancelled_append(self.uri, name) from exc
                if server_error(exc) is not None:
                    raise
                raise errors.OutcomeUnknown(
                    f"the append stream to {self.uri} broke after the append to {name!r} was sent "
                    f"({error_line(exc)}): it may or may not be applied; read the relation to find out, "
                    "or use keyed appends (append_once) to retry safely") from exc
            except BaseException as exc:
                # broken or interrupted before the acknowledgement: never reuse; redirected: the
                # member does not serve the relation (or stops), and a stopping one waits for the stream
                if stream.in_doubt or isinstance(exc, (errors.NotPartitionOwner, errors.EngineClosed)):
                    stream.close()
                else:
                    self._streams.give(stream)  # a refused append: the stream carries on
                raise
            if done:
                self._streams.give(stream)
                return
            if stream.cancelled:  # cut off while it was being sent
                stream.close()
                raise cancelled_append(self.uri, name)
            if fresh:  # a new stream that took nothing: the server's status says why, if it is typed
                why = "it ended the stream"
                try:
                    stream.finish()
                except flight.FlightError as exc:
                    typed = typed_error(exc)
                    if typed is not exc:
                        raise typed from None
                    why = error_line(exc)
                raise errors.CoordinatorUnavailable(f"the coordinator at {self.uri} did not take the append "
                                                    f"({why}; nothing was appended); is it stopping?")
            stream.close()  # an idle stream the server had ended: send on another

    def _open_stream(self, name: str, schema: pa.Schema, queued: bool = False) -> AppendStream:
        return AppendStream(self._flight, name, schema, self._options, queued, exchange=self._exchange)

    def end_streams(self) -> None:
        """End this client's idle append streams now, and each lent one when it is given back;
        later appends still work, each on a stream of its own."""
        self._streams.close(self._close_wait)

    def add_close_callback(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` after :meth:`close` (used to stop an in-process server with its client)."""
        self._on_close.append(callback)

    # --- relations -----------------------------------------------------------------------------

    def add_relation(self, name: str, schema: pa.Schema, *, partition: int | None = None) -> None:
        """Create an empty relation (see :meth:`sediment.Engine.add_relation`); ``partition``:
        the cluster partition to place it in (a cluster member only)."""
        if not isinstance(schema, pa.Schema):
            from sediment.engine.schema import check_name  # the name's error first, as the engine does

            check_name(name)
            raise SchemaMismatch(f"a relation schema must be a pyarrow.Schema, not {type(schema).__name__}")
        where = {} if partition is None else {"partition": partition}
        self._action(Action.ADD_RELATION, name=name, schema=schema_to_text(schema), **where)

    def drop_relation(self, name: str) -> None:
        """Forget a relation and its data."""
        self._action(Action.DROP_RELATION, name=name)

    def alter_relation(self, name: str, *, base: int | None = None, **changes: Any) -> int:
        """Change the relation's columns; the new schema version (see :meth:`sediment.Engine.alter_relation`).
        ``base`` (a cluster member only): the schema version the change starts from, so that a
        retry is not applied twice (cluster/alter_once.py; SchemaVersionMoved when another alter
        came first)."""
        where = {} if base is None else {"base": base}
        return int(self._action(Action.ALTER_RELATION, name=name, **encode_alter(**changes, relation=name), **where))

    def describe(self, name: str) -> dict[str, Any]:
        """The relation's schema, schema version, columns and frontiers (see :meth:`sediment.Engine.describe`)."""
        return self._action(Action.DESCRIBE, name=name)

    def schema_version(self, name: str) -> int:
        return int(self._action(Action.SCHEMA_VERSION, name=name))

    def relations(self, include_internal: bool = False) -> list[str]:
        """Names of the relations, sorted; internal ones (``_spark_sink.<id>`` and any name
        starting with an underscore) only with ``include_internal``."""
        return list(self._action(Action.RELATIONS, include_internal=check_bool(include_internal, "include_internal")))

    def schema(self, name: str) -> pa.Schema:
        """The relation's own columns (without ``time`` and ``diff``)."""
        return schema_from_text(self._action(Action.SCHEMA, name=name))

    def since(self, name: str) -> int:
        """The compaction frontier."""
        return int(self._action(Action.SINCE, name=name))

    def sealed(self, name: str) -> int:
        """The greatest sealed time (-1 when never sealed)."""
        return int(self._action(Action.SEALED, name=name))

    # --- writing -------------------------------------------------------------------------------

    def append(self, name: str, updates: pa.Table, *, locks: Any = None) -> None:
        """Append updates (columns plus ``time`` and ``diff``); durable on return, all or nothing.
        ``locks``: a ``sediment.Locks``, checked by the server as by the engine."""
        self._append(name, _as_table(name, updates), locks=locks)

    def pipelined(self, name: str, *, window: int = PIPELINE_WINDOW) -> PipelinedAppends:
        """Plain appends to ``name`` with up to ``window`` in flight on one stream, applied in
        order; each is durable once a later call collects its acknowledgement (``flush``,
        ``close``; see sediment/net/pipelined.py for how errors come back)."""
        with self._remote():  # a closed client refuses here
            return PipelinedAppends(name, window, PUT_CHUNK_BYTES, take=functools.partial(self._streams.take, queued=True), give=self._streams.give,
                                    resend=lambda table: self._append(name, table), remote=self._remote)

    def append_once(self, name: str, updates: pa.Table, client: str, seq: int, *, locks: Any = None) -> None:
        """Append with an idempotency key (``client``, ``seq``) to a cluster member or to a
        server of one engine: a retry of an append it has applied returns success and applies
        nothing again (nor checks its ``locks`` again), also at a coordinator that took the
        deployment over. It goes on the append stream, so concurrent keyed appends join the
        owner's group commit."""
        self._append(name, _as_table(name, updates), locks=locks, key=(client, seq))

    def commit_once(self, txn: int, relation: str, client: str, seq: int) -> str:
        """Commit transaction ``txn`` (which wrote ``relation``) at a cluster member with an
        idempotency key: a repeat of a commit that landed answers ``committed`` and commits
        nothing again, at this member or at a later owner of the partition."""
        return self._action(Action.COMMIT, txn=txn, relation=relation, client=client, seq=seq)

    def append_many(self, updates: Mapping[str, pa.Table], *, locks: Any = None,
                    key: tuple[str, int] | None = None) -> None:
        """Append to several relations atomically. The tables are staged on the server (in
        memory, nothing written) and then appended by one ``Engine.append_many``, so a refused
        call writes nothing, exactly as with the engine. ``key`` (client id, sequence number):
        an idempotency key for a cluster member, as in :meth:`append_once`."""
        check_updates_map(updates)
        check_locks(locks)
        tables = {name: _as_table(name, table) for name, table in updates.items()}
        if not tables:
            return
        lock_spec = encode_locks(locks)
        stage = uuid.uuid4().hex
        try:
            for name, table in tables.items():
                self._put(encode(Put.STAGE, relation=name, stage=stage), table)
            extra = ({} if lock_spec is None else {"locks": lock_spec}) | \
                ({} if key is None else {"client": key[0], "seq": key[1]})
            self._action(Action.APPEND_MANY, stage=stage, **extra)
        except BaseException:
            try:
                self._action(Action.DISCARD_STAGE, stage=stage)
            except Exception:  # noqa: BLE001 - report the first failure; the server drops stages at stop
                pass
            raise

    def transaction(self, group: str | None = None) -> RemoteTransaction:
        """A write transaction: appends to any relations, visible only after ``commit()``.
        ``group`` names a set of transactions that :meth:`commit_all` or :meth:`abort_group`
        settles together (one per Spark task attempt of a job, say)."""
        args = {} if group is None else {"group": group}
        return RemoteTransaction(self, int(self._action(Action.BEGIN, **args)))

    def commit_all(self, transactions: Sequence[RemoteTransaction | int], group: str | None = None, *,
                   key: tuple[str, str, int] | None = None) -> None:
        """Commit several transactions as one (one COMMIT record: all visible, or none);
        then, with ``group``, abort that group's other open transactions. Raises
        TransactionError, and all of them are aborted, if one cannot commit. ``key``
        (a relation the transactions wrote, client id, sequence number): an idempotency key
        for a cluster member, as in :meth:`commit_once`."""
        if isinstance(transactions, (str, bytes, Mapping)) or not isinstance(transactions, Sequence) or not all(
                isinstance(t, RemoteTransaction) or (isinstance(t, int) and not isinstance(t, bool))
                for t in transactions):
            raise errors.InvalidArgument(f"commit_all takes a list of transactions from Client.transaction() (or "
                                         f"their ids), not {transactions!r}")
        ids = [t.id if isinstance(t, RemoteTransaction) else int(t) for t in transactions]
        args: dict[str, Any] = {"txns": ids}
        if group is not None:
            args["group"] = group
        if key is not None:
            args["relation"], args["client"], args["seq"] = key
        try:
            states = self._action(Action.COMMIT_ALL, **args)
        except TransactionError:
            for t in transactions:
                if isinstance(t, RemoteTransaction):
                    t.settle(t.remote_state() or ABORTED)
            raise
        except errors.NothingWritten:
            raise
        except BaseException:
            for t in transactions:
                if isinstance(t, RemoteTransaction):
                    t.mark_in_doubt()
            raise
        for t, state in zip(transactions, states, strict=True):
            if isinstance(t, RemoteTransaction):
                t.settle(state)

    def txn_state(self, txn: int) -> str:
        """The server's word on transaction ``txn``: open, committed, aborted, or unknown (a
        server that restarted since, or forgot it among many), after a commit whose answer was lost."""
        if isinstance(txn, bool) or not isinstance(txn, int):
            raise errors.InvalidArgument(f"txn_state takes a transaction id (an int), not {txn!r}")
        return str(self._action(Action.TXN_STATE, txn=txn))

    def abort_group(self, group: str) -> int:
        """Abort every open transaction of ``group``; how many there were."""
        return int(self._action(Action.ABORT_GROUP, group=group))

    def seal(self, name: str, t: int) -> None:
        """Write ``close t``: no further updates at times <= t. Durable on return."""
        self._action(Action.SEAL, name=name, t=t)

    def bulk_stage(self, name: str, job: str) -> str:
        """The directory where bulk load ``job`` of ``name`` writes Parquet files (engine/staged.py)."""
        return str(self._action(Action.BULK_STAGE, name=name, job=job))

    def bulk_commit(self, name: str, job: str, *, time: int | None = None, diff: int | None = None) -> dict[str, Any]:
        """Commit bulk load ``job``'s staged files as pending runs, atomically and at most once;
        ``time``/``diff``: every row's, for files without such a column (engine/staged.py)."""
        given = {k: v for k, v in (("time", time), ("diff", diff)) if v is not None}
        return dict(self._action(Action.BULK_COMMIT, name=name, job=job, **given))

    def bulk_abort(self, name: str, job: str) -> int:
        """Delete bulk load ``job``'s staged files; nothing of it becomes visible."""
        return int(self._action(Action.BULK_ABORT, name=name, job=job))

    def set_since(self, name: str, t: int) -> None:
        """Advance the compaction frontier."""
        self._action(Action.SET_SINCE, name=name, t=t)

    # --- reading -------------------------------------------------------------------------------

    def snapshot(self, name: str, as_of: int) -> pa.Table:
        """The relation as of ``as_of`` (its columns plus ``diff``), consolidated and sorted."""
        with self._remote():
            return self._get(Get.SNAPSHOT, relation=name, as_of=as_of).read_all()

    def replay(self, name: str, *, batch_rows: int = 65536) -> Iterator[pa.RecordBatch]:
        """Every stored update of the relation in time order, streamed as record batches."""
        with self._remote():  # an unknown relation fails here, as with the engine
            reader = self._get(Get.REPLAY, relation=name, batch_rows=batch_rows)

        def generate() -> Iterator[pa.RecordBatch]:
            with self._remote():
                for chunk in reader:
                    yield chunk.data

        return generate()

    def plan_read(self, name: str, as_of: int, *, from_t: int | None = None,
                  lease_seconds: float = 600.0) -> ReadPlan:
        """A leased read plan (see :meth:`sediment.Engine.plan_read`); end it with
        :meth:`release_read`. The WAL-tail rows come in the stream, the rest in its metadata."""
        return self.plan_read_held(name, as_of, from_t=from_t, lease_seconds=lease_seconds)[0]

    def plan_read_held(self, name: str, as_of: int, *, from_t: int | None = None, lease_seconds: float = 600.0,
                       part_rows: int | None = None, max_parts: int = 16,
                       ) -> tuple[ReadPlan, dict[str, Any] | None, pa.Array | None]:
        """:meth:`plan_read`; with ``part_rows``, the coordinator keeps a WAL tail of more than
        ``part_rows`` rows for the lease instead of sending it, to be read part by part with
        :meth:`tail_part`, and sends the quantile cuts of its first key column into up to
        ``max_parts`` parts. Returns (the plan, with an empty tail when held; ``{"rows",
        "parts", "key"}`` or None when the tail came inline; the cuts or None)."""
        hold = None if part_rows is None else {"part_rows": part_rows, "max_parts": max_parts}
        with self._remote():
            body = self._get(Get.PLAN, relation=name, as_of=as_of, **{"from": from_t}, lease_seconds=lease_seconds,
                             **({"hold_tail": hold} if hold else {})).read_all()
        metadata = dict(body.schema.metadata or {})
        meta = json.loads(metadata.pop(PLAN_METADATA_KEY))
        held_raw = metadata.pop(HELD_METADATA_KEY, None)
        held = json.loads(held_raw) if held_raw is not None else None
        schema = schema_from_text(held.pop("update_schema")) if held is not None else body.schema
        tail = schema.empty_table() if held is not None else body.replace_schema_metadata(metadata or None)
        plan = ReadPlan(update_schema=tail.schema, tail=tail, **{key: meta.get(key) for key in PLAN_FIELDS})
        return plan, held, (body.column("cut").combine_chunks() if held is not None else None)

    def tail_part(self, name: str, lease: int, *, key: str | None = None, cuts: pa.Array | None = None,
                  index: int | None = None, start: int | None = None, stop: int | None = None) -> pa.Table:
        """Rows of the WAL tail the coordinator holds for read lease ``lease``
        (:meth:`plan_read_held`): key range ``index`` of ``cuts`` on column ``key``, or rows
        [start, stop), or all of them."""
        with self._remote():
            return self._get(Get.TAIL_PART, relation=name, lease=lease, key=key, index=index, start=start, stop=stop,
                             cuts=encode_cuts(cuts) if cuts is not None and len(cuts) else None).read_all()

    def subscribe(self, name: str, as_of: int | None = None, *, resume: bool = False,
                  max_lag: int | None = None, shared: bool = True) -> RemoteSubscription | SharedSubscription:
        """A feed of the relation's changes (see :meth:`sediment.Engine.subscribe`).

        ``shared``: this client's subscriptions to the relation share one stream from the
        server, which sends each event once for all of them (sediment/net/shared_feeds.py);
        False, or a server without shared streams: a stream of its own."""
        with self._remote():
            if shared and self._feed_shares.supported:
                sub = self._feed_shares.subscribe(name, as_of, resume, max_lag)
                if sub is not None:
                    return sub
            reader = self._get(Get.SUBSCRIBE, relation=name, as_of=as_of, resume=resume, max_lag=max_lag)

        def reopen(token: str) -> flight.FlightStreamReader:  # the same feed after an alter
            return self._get(Get.SUBSCRIBE, relation=name, continuation=token)

        sub = RemoteSubscription(self.uri, reader, reopen, relation=name, max_lag=max_lag, as_of=as_of)
        with self._close_lock:
            closed = self._closed
            if not closed:
                self._unshared.add(sub)
        if closed:  # closed while it subscribed
            sub.end(self._closed_error())
        return sub

    def _closed_error(self) -> EngineClosed:
        return EngineClosed(f"the client of {self.uri} was closed; connect again and subscribe with resume=True")

    def release_read(self, lease: int) -> None:
        """End a read plan's lease."""
        self._action(Action.RELEASE_READ, lease=lease)

    def trace_info(self, name: str) -> dict[str, int]:
        """The relation's stored shape (batches, pending, rows, bytes, upper, since, tail_records)."""
        return dict(self._action(Action.TRACE_INFO, name=name))

    def stats(self, include_internal: bool = False) -> dict:
        """The served engine's :meth:`Engine.stats`."""
        return dict(self._action(Action.STATS, include_internal=check_bool(include_internal, "include_internal")))

    def compact(self, name: str | None = None) -> None:
        """Run a compaction pass on the server and wait for it."""
        self._action(Action.COMPACT, name=name)

    def compaction_errors(self) -> dict[str, str]:
        """Relations whose last compaction failed on the server, with the error."""
        return dict(self._action(Action.COMPACTION_ERRORS))

    # --- closing -------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection; its subscriptions, shared or not, end with EngineClosed.
        Transactions it left open stay open on the server (another client may still commit them
        by id, as a Spark job's driver does its tasks') until a call names them, the server
        aborts them after ``--txn-idle-timeout`` seconds without one (600 by default), or it
        stops. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            callbacks, self._on_close = self._on_close, []
            unshared = list(self._unshared)
        try:
            for sub in unshared:  # first: ended as closed, before their readers are cancelled below
                sub.end(self._closed_error())
            self._feed_shares.close()
            self._calls.close()  # calls waiting on other threads end now, with CallCancelled
            self._streams.cancel()  # and so do appends waiting for their acknowledgements
            self._streams.close(self._close_wait)
            self._flight.close()
        finally:
            failures = []
            for callback in callbacks:
                try:
                    callback()
                except Exception as exc:  # noqa: BLE001 - run them all, then report
                    failures.append(exc)
            if failures:
                raise failures[0]

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(uri: str, token: str | None = None, *, timeout: float | None = None,
            tls_root_certs: bytes | str | None = None) -> Client:
    """Connect to a sediment server (``sediment serve``) at ``grpc://HOST:PORT`` (or
    ``grpc+tls://HOST:PORT``, trusting ``tls_root_certs``). ``token`` is the server's shared
    secret (default ``$SEDIMENT_TOKEN``); a wrong one fails here with AuthenticationFailed,
    no server with CoordinatorUnavailable."""
    return Client(uri, token, timeout=timeout, tls_root_certs=tls_root_certs)
