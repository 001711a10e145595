"""An Arrow Flight server that puts one :class:`~sediment.engine.engine.Engine` on the network.

Spark jobs (and any other process) need the coordinator without opening the data
directory themselves: only one process may hold it, and the WAL must stay on the
coordinator's disk. The server exposes the whole Engine API over Arrow Flight, so
updates and reads travel as Arrow record batches, never re-encoded, and a
:class:`sediment.client.Client` behaves like an Engine.

The wire protocol is in docs/formats.md ("Network protocol"); the pieces the client shares
are in :mod:`sediment.net`.

Transactions live on the server by id between calls. One left idle (no call naming it)
for longer than ``txn_idle_timeout`` is aborted, and so is every one still open when the
server stops: an open transaction holds back the compacter's WAL cut, so a client that
vanished must not keep one open for ever (and the WAL's replay discards one that a crash
left open). Tables staged for an ``append_many`` are dropped after as long without a call
(sediment/net/staged_tables.py).
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.flight as flight

from sediment import errors
from sediment.arrow_codec import schema_to_text
from sediment.clock import MONOTONIC, Clock
from sediment.engine import staged
from sediment.engine.args import check_bool, check_number
from sediment.engine.schema import check_name, update_schema
from sediment.errors import SedimentError, TransactionError
from sediment.net import grpc_setup, keyed
from sediment.net.alter_wire import decode_alter, wire_schema
from sediment.net.append_serving import (
    DEFAULT_MAX_APPEND_BYTES,
    PLAIN_ARGS,
    read_bounded,
    serve_append_stream,
)
from sediment.net.append_stream import EXCHANGE_VERSION
from sediment.net.feed_streams import FeedStreams
from sediment.net.held_tails import HeldTails, serve_hold, serve_tail_part
from sediment.net.messages import FIELDS, Action, Exchange, Get, Put
from sediment.net.protocol import (
    PLAN_METADATA_KEY,
    PROTOCOL_VERSION,
    decode_locks,
    field,
    json_arg,
    plan_metadata,
)
from sediment.net.server_access import BearerTokenMiddlewareFactory, listen_location, resolve_token
from sediment.net.shared_feeds import SharedFeeds
from sediment.net.staged_tables import StagedTables
from sediment.net.tls import check_tls_pem
from sediment.net.txn_registry import TxnRegistry, group_name, txn_id_of
from sediment.net.wire_errors import error_detail, to_flight_error

if TYPE_CHECKING:
    from sediment.client import Client
    from sediment.engine.engine import Engine

__all__ = ["DEFAULT_LOCATION", "PLAN_METADATA_KEY", "SedimentFlightServer", "error_detail", "serve_local",
           "to_flight_error"]

DEFAULT_LOCATION = "grpc://127.0.0.1:0"
LOCAL_STOP_GRACE = 10.0  # seconds serve_local's close() waits for calls still running
DEFAULT_STOP_GRACE = 30.0  # seconds stop() waits for calls still running when given no grace
DEFAULT_TXN_IDLE_TIMEOUT = 600.0  # seconds without a call before the server aborts a transaction
FEED_POLL = 1.0  # seconds a feed stream waits for an event before checking that its client is still there

log = logging.getLogger(__name__)


class SedimentFlightServer(flight.FlightServerBase):
    """Serves ``engine`` on ``location`` (it listens as soon as it is constructed; ``port`` and
    ``uri`` say where). :meth:`stop` stops listening, waits for calls under way and aborts the
    transactions clients left open; with ``close_engine=True`` it closes the engine too."""

    def __init__(self, engine: Engine, location: str = DEFAULT_LOCATION, token: str | None = None, *,
                 close_engine: bool = False, txn_idle_timeout: float | None = DEFAULT_TXN_IDLE_TIMEOUT,
                 clock: Clock = MONOTONIC, tls: tuple[bytes, bytes] | None = None,
                 stop_grace: float = DEFAULT_STOP_GRACE, max_append_bytes: int | None = None) -> None:
        """``txn_idle_timeout``: seconds a transaction may go without a call before it is
        aborted (None: never), and tables staged for an ``append_many`` before they are dropped
        (with None: DEFAULT_TXN_IDLE_TIMEOUT); ``clock`` measures it (tests pass their own). ``stop_grace``:
        seconds :meth:`stop` waits for calls still running when it is given no grace. ``tls``: the
        server's (certificate chain, private key) in PEM; then ``location`` is
        ``grpc+tls://HOST:PORT`` and clients must connect with TLS (the token is still required).
        ``max_append_bytes``: the most Arrow bytes of one append or staged table the server holds
        (it holds a whole append before applying it; None: 1 GiB); a larger one is refused, nothing applied."""
        self._token = resolve_token(token)
        check_number(txn_idle_timeout, "txn_idle_timeout (seconds)", allow_none=True)
        self.stop_grace = check_number(stop_grace, "stop_grace (seconds)", low_open=False)
        max_append_bytes = DEFAULT_MAX_APPEND_BYTES if max_append_bytes is None else max_append_bytes
        if isinstance(max_append_bytes, bool) or not isinstance(max_append_bytes, int) or max_append_bytes <= 0:
            raise errors.InvalidArgument(f"max_append_bytes must be a positive int of bytes, not {max_append_bytes!r}")
        self.max_append_bytes = max_append_bytes
        check_bool(close_engine, "close_engine")
        location, parsed = listen_location(location, tls)
        if tls is not None:
            check_tls_pem(*tls, "tls[0] (the certificate)", "tls[1] (the key)")
        self.scheme = "grpc+tls" if tls is not None else "grpc"
        self.engine = engine
        self.host = parsed.hostname
        self._close_engine = close_engine
        self._lock = threading.Lock()
        self._txns = TxnRegistry(engine.transaction, txn_idle_timeout, clock)
        self._reaper_stop = threading.Event()
        self._held_tails = HeldTails(clock=clock)  # plans' WAL-tail rows kept for readers' tail_part calls
        self._stopped = False
        self.stopping = threading.Event()  # set as stop() begins: no new calls from then on
        self._feeds = FeedStreams(lambda: self._stopped, FEED_POLL)
        # stages expire even when transactions never do: a client that died between its puts
        # and its append_many must not hold memory until the server stops
        stage_idle = txn_idle_timeout if txn_idle_timeout is not None else DEFAULT_TXN_IDLE_TIMEOUT
        self._stages = StagedTables(stage_idle, clock, lambda: self.uri)
        self._shared = SharedFeeds(self._feeds, self._engine_subscription, lambda: self._stopped, FEED_POLL)
        self._actions = self._action_table()
        self._keys = keyed.engine_keys()  # applied idempotency keys, for an engine that is not a cluster member
        grpc_setup.apply()  # before gRPC's first use in the process, or it has no effect
        try:  # listens from here on, so everything a handler uses is set above
            super().__init__(location, middleware={"auth": BearerTokenMiddlewareFactory(self._token)},
                             **({"tls_certificates": [flight.CertKeyPair(*tls)]} if tls is not None else {}))
        except pa.ArrowException as exc:  # gRPC only says "Server did not start properly"
            raise SedimentError(f"could not listen on {location} ({exc}); is the port in use by another process? "
                                "pick another port (0 picks a free one)") from None
        threading.Thread(target=self._reap_loop, args=(min(stage_idle / 4, 30.0),),
                         name="sediment-server-txn-reaper", daemon=True).start()

    def _action_table(self) -> dict[str, Callable[[dict[str, Any]], Any]]:
        """Every do_action type's handler of the JSON body. An op whose fields
        (messages.FIELDS) are all its call's arguments passes them in that order."""
        eng = self.engine

        def by_fields(op: Action, call: Callable[..., Any]) -> Callable[[dict[str, Any]], Any]:
            return lambda a: call(*(field(a, key, op) for key in FIELDS[op]))

        positional = {
            Action.DROP_RELATION: eng.drop_relation, Action.SCHEMA_VERSION: eng.schema_version,
            Action.DESCRIBE: eng.describe, Action.SEAL: eng.seal, Action.SET_SINCE: eng.set_since,
            Action.SINCE: eng.since, Action.SEALED: eng.sealed, Action.TRACE_INFO: eng.trace_info,
            # a cluster member's engine sends bulk loads to its partition's engine
            Action.BULK_STAGE: getattr(eng, "bulk_stage", None) or functools.partial(staged.stage, eng),
            Action.BULK_ABORT: getattr(eng, "bulk_abort", None) or functools.partial(staged.abort_staged, eng),
        }
        bulk_commit = getattr(eng, "bulk_commit", None) or functools.partial(staged.commit_staged, eng)
        return {op: by_fields(op, call) for op, call in positional.items()} | {
            Action.PING: lambda a: {"protocol": PROTOCOL_VERSION, "data_dir": eng.data_dir,
                                    "cluster": getattr(eng, "cluster_uri", None), "append_exchange": [EXCHANGE_VERSION]},
            Action.ADD_RELATION: self._add_relation,
            Action.ALTER_RELATION: self._alter_relation,
            Action.RELATIONS: lambda a: eng.relations(bool(a.get("include_internal"))),
            Action.SCHEMA: lambda a: schema_to_text(eng.schema(field(a, "name", "schema"))),
            Action.COMPACT: lambda a: eng.compact(a.get("name")),
            Action.STATS: lambda a: eng.stats(bool(a.get("include_internal"))),
            Action.COMPACTION_ERRORS: lambda a: eng.compaction_errors(),
            Action.BEGIN: lambda a: self._txns.begin(a.get("group")),
            Action.COMMIT_ALL: self._commit_all,
            Action.ABORT_GROUP: self._abort_group,
            Action.COMMIT: self._commit,
            Action.ABORT: self._abort,
            Action.TXN_STATE: lambda a: self._txns.state(field(a, "txn", "txn_state")),
            Action.APPEND_MANY: self._append_many,
            Action.DISCARD_STAGE: self._discard_stage,
            Action.RELEASE_READ: self._release_read,
            Action.FEED_JOIN: self._shared.join,
            Action.FEED_LEAVE: self._shared.leave,
            Action.BULK_COMMIT: lambda a: bulk_commit(field(a, "name", "bulk_commit"),  # time, diff optional
                                                      field(a, "job", "bulk_commit"), a.get("time"), a.get("diff")),
        }

    @property
    def uri(self) -> str:
        """Where clients connect: ``grpc://HOST:PORT`` (``grpc+tls://``) with the port actually bound."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    # --- actions -------------------------------------------------------------------------------

    def _add_relation(self, args: dict[str, Any]) -> None:
        schema = wire_schema(field(args, "schema", "add_relation"), "add_relation: schema")
        where = {"partition": args["partition"]} if "partition" in args else {}  # a cluster member's
        self.engine.add_relation(field(args, "name", "add_relation"), schema, **where)

    def _release_read(self, args: dict[str, Any]) -> None:
        lease = field(args, "lease", "release_read")
        self.engine.release_read(lease)
        self._held_tails.release(lease)

    def _alter_relation(self, args: dict[str, Any]) -> int:
        name = field(args, "name", "alter_relation")
        if "base" in args:  # a cluster client's alter, which a retry must not apply twice
            return keyed.alter_from(self.engine, name, args["base"], decode_alter(args))
        return self.engine.alter_relation(name, **decode_alter(args))

    def _open_txns(self, ids: object) -> list[Any]:
        """The open transactions ``ids`` of a commit_all; TransactionError (each aborted and
        settled) when one is not open here."""
        if not isinstance(ids, list):
            raise ValueError(f"commit_all: txns must be a list of transaction ids, not {ids!r}")
        txns, unknown = [], []
        for i in ids:
            try:
                txns.append(self._txns.get(i))
            except TransactionError as exc:
                unknown.append(exc)
        if unknown:
            try:
                for tx in txns:
                    tx.abort()
            finally:
                self._settle_all(txns)
            raise TransactionError(f"{unknown[0]}; every transaction of this commit_all was aborted")
        return txns

    def _settle_all(self, txns: list[Any]) -> None:
        for tx in txns:
            self._txns.settle(tx)

    def _commit_all(self, args: dict[str, Any]) -> list[str]:
        ids = field(args, "txns", "commit_all")
        group_name(args.get("group"))  # a bad one is refused before anything is committed
        if isinstance(ids, list):
            for i in ids:  # every one checked before any is committed or aborted
                txn_id_of(i)
        try:
            if "client" in args:
                return keyed.commit_all_once(self.engine, args, lambda: self._open_txns(ids), self._settle_all)
            txns = self._open_txns(ids)
            try:
                self.engine.commit_all(txns)
            finally:
                self._settle_all(txns)
            return [tx.state for tx in txns]
        finally:
            group = args.get("group")
            if group is not None:
                self._abort_group({"group": group})

    def _abort_group(self, args: dict[str, Any]) -> int:
        """Abort the group's transactions still open (a Spark job's losing task attempts); how many."""
        txns = self._txns.group_members(str(group_name(field(args, "group", "abort_group"))))
        for tx in txns:
            self._end(tx, tx.abort)
        return len(txns)

    def _end(self, tx: Any, how: Callable[[], None]) -> str:
        """Commit or abort ``tx`` (``how``), and forget it whatever happens; its final state."""
        try:
            how()
        finally:
            self._txns.settle(tx)
        return tx.state

    def reap_idle_transactions(self) -> list[int]:
        """Abort the transactions idle for longer than ``txn_idle_timeout``; their ids. A
        background thread calls this; tests call it with their own clock."""
        return self._txns.reap_idle()

    def _reap_loop(self, interval: float) -> None:
        while not self._reaper_stop.wait(interval):
            try:
                self.reap_idle_transactions()
                self.reap_idle_stages()
            except Exception as exc:  # noqa: BLE001 - the next round tries again
                log.warning("reaping idle transactions failed: %s", exc)

    def _commit(self, args: dict[str, Any]) -> str:
        if "client" in args:
            return keyed.commit_once(self.engine, args, lambda: self._txns.get(field(args, "txn", "commit")),
                                     self._end)
        tx = self._txns.get(field(args, "txn", "commit"))
        return self._end(tx, tx.commit)

    def _abort(self, args: dict[str, Any]) -> str:
        txn_id = field(args, "txn", "abort")
        finished = self._txns.finished_state(txn_id)
        if finished is not None:
            return finished
        tx = self._txns.get(txn_id)
        return self._end(tx, tx.abort)

    def _append_many(self, args: dict[str, Any]) -> None:
        tables = self._stages.take(str(field(args, "stage", "append_many")))
        locks = decode_locks(args.get("locks"))
        if "client" in args:
            keyed.append_many_once(self.engine, tables, args, self._keys)
        elif locks is None:
            self.engine.append_many(tables)
        else:
            self.engine.append_many(tables, locks=locks)

    def _discard_stage(self, args: dict[str, Any]) -> None:
        self._stages.discard(str(field(args, "stage", "discard_stage")))

    def reap_idle_stages(self) -> list[str]:
        """Drop the tables staged for append_many calls that no call named for longer than
        ``txn_idle_timeout`` (DEFAULT_TXN_IDLE_TIMEOUT when transactions never time out); their
        stage ids. A background thread calls this with
        :meth:`reap_idle_transactions`."""
        return self._stages.reap_idle()

    @property
    def staged_rows(self) -> int:
        """Rows staged for append_many calls still to come, held in memory."""
        return self._stages.rows

    # --- Flight RPCs ---------------------------------------------------------------------------

    def list_actions(self, context: flight.ServerCallContext) -> list[tuple[str, str]]:
        """Each action with the fields its body may carry (docs/formats.md, "Messages")."""
        return [(op.value, "{" + ", ".join(FIELDS[op]) + "}") for op in Action]

    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> Iterator[flight.Result]:
        """Runs to completion before answering, so a returned action is durable."""
        try:
            handler = self._actions.get(action.type)
            if handler is None:
                raise ValueError(f"unknown action {action.type!r}; known: {sorted(self._actions)}")
            body = action.body.to_pybytes() if action.body is not None else b""
            result = handler(json_arg(body, f"body of action {action.type!r}"))
        except Exception as exc:  # noqa: BLE001 - every failure goes back typed
            raise to_flight_error(exc) from exc
        return iter([flight.Result(json.dumps({"result": result}).encode())])

    def do_put(self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor,
               reader: flight.MetadataRecordBatchReader, writer: flight.FlightMetadataWriter) -> None:
        """``append`` and ``stage`` read the whole stream, then append it as one call: the engine's
        appends are all or nothing, so a stream that breaks off midway writes nothing.
        ``append_stream`` carries many appends, each acknowledged: the append stream of clients
        of the build before the exchange (sediment/net/append_serving.py)."""
        try:
            args = json_arg(descriptor.command, "do_put descriptor command")
            op = args.get("op", Put.APPEND)
            name = field(args, "relation", "do_put descriptor")
            if op == Put.APPEND_STREAM:
                self._serve_appends(name, args, reader, writer.write)
                return
            table = read_bounded(reader, self.max_append_bytes)
            if op == Put.APPEND:
                self._append(name, table, args.get("txn"), args.get("locks"))
            elif op == Put.APPEND_ONCE and hasattr(self.engine, "append_once"):  # a cluster member's
                self.engine.append_once(name, table, field(args, "client", op), field(args, "seq", op))
            elif op == Put.STAGE:
                check_name(name)  # a name that is not a string must not become a staging key
                stage = str(field(args, "stage", "do_put descriptor"))
                self._stages.put(stage, name, table)
            else:
                raise ValueError(f"unknown do_put op {op!r}: use one of {[o.value for o in Put]}")
        except Exception as exc:  # noqa: BLE001 - every failure goes back typed
            raise to_flight_error(exc) from exc

    def do_exchange(self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor,
                    reader: flight.MetadataRecordBatchReader, writer: flight.MetadataRecordBatchWriter) -> None:
        """The append stream (``append_exchange``, version 1): an exchange, so that a client's
        close can cancel an append waiting for its acknowledgement (sediment/net/append_stream.py)."""
        try:
            args = json_arg(descriptor.command, "do_exchange descriptor command")
            op = field(args, "op", "do_exchange descriptor")
            if op != Exchange.APPEND_STREAM:
                raise ValueError(f"unknown do_exchange op {op!r}: use one of {[o.value for o in Exchange]}")
            if args.get("version") != EXCHANGE_VERSION:
                raise errors.InvalidArgument(f"append_exchange version {args.get('version')!r} is not served by "
                                             f"{self.uri} (it serves {EXCHANGE_VERSION}); use matching versions")
            self._serve_appends(field(args, "relation", "do_exchange descriptor"), args, reader, writer.write_metadata)
        except Exception as exc:  # noqa: BLE001 - every failure goes back typed
            raise to_flight_error(exc) from exc

    def _serve_appends(self, name: str, args: dict[str, Any], reader: flight.MetadataRecordBatchReader,
                       send: Callable[[pa.Buffer], None]) -> None:
        """One append stream's appends to ``name``, each acknowledged with ``send``."""
        if self._stopped:
            raise errors.EngineClosed(f"the sediment server on {self.uri} is stopping")
        engine_append = self.engine.append  # looked up once per stream, not per append

        def append(table: pa.Table, meta: dict[str, Any]) -> None:
            if meta is PLAIN_ARGS:
                engine_append(name, table)
            elif "client" in meta:
                keyed.append_once(self.engine, name, table, meta, self._keys)
            else:
                self._append(name, table, meta.get("txn"), meta.get("locks"))

        # a pipelining client's stream (``queue``) has its plain appends queued; an
        # Engine has append_queued, a cluster member not
        queued = getattr(self.engine, "append_queued", None) if args.get("queue") is True else None
        serve_append_stream(reader, send, append, lambda: self._stopped,
                            None if queued is None else functools.partial(queued, name), self.max_append_bytes)

    def _append(self, name: str, table: pa.Table, txn: object, locks: object) -> None:
        """One append as the client asked for it: plain, with locks, or into a transaction."""
        if txn is None:
            if locks is None:
                self.engine.append(name, table)
            else:
                self.engine.append(name, table, locks=decode_locks(locks))
            return
        tx = self._txns.get(txn)
        try:
            tx.append(name, table)
        finally:
            self._txns.settle(tx)

    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket) -> flight.FlightDataStream:
        try:
            args = json_arg(ticket.ticket, "do_get ticket")
            op = field(args, "op", "do_get ticket")
            name = field(args, "relation", "do_get ticket")
            if op == Get.SNAPSHOT:
                return flight.RecordBatchStream(self.engine.snapshot(name, field(args, "as_of", "snapshot ticket")))
            if op == Get.REPLAY:
                schema = update_schema(self.engine.schema(name))
                batches = self.engine.replay(name, batch_rows=args.get("batch_rows", 65536))
                return flight.GeneratorStream(schema, _typed_errors(batches))
            if op == Get.PLAN:
                return self._plan_stream(name, args)
            if op == Get.SUBSCRIBE:
                return self._subscribe(name, args, context)
            if op == Get.FEED_SHARE:
                return self._shared.open(name, args, context, self.uri)
            if op == Get.TAIL_PART:
                return flight.RecordBatchStream(serve_tail_part(self._held_tails, name, args))
            raise ValueError(f"unknown do_get op {op!r}: use one of {[o.value for o in Get]}")
        except Exception as exc:  # noqa: BLE001 - every failure goes back typed
            raise to_flight_error(exc) from exc

    def _subscribe(self, name: str, args: dict[str, Any], context: flight.ServerCallContext,
                   ) -> flight.FlightDataStream:
        """A feed's stream; with ``continuation``, the next stream of a feed parked at an alter."""
        token = args.get("continuation")
        if token is not None:
            sub, schema = self._feeds.take(str(token))
        else:
            schema = update_schema(self.engine.schema(name))
            sub = self._engine_subscription(name, args)
        return self._feeds.stream(sub, schema, context, self.uri)

    def _engine_subscription(self, name: str, args: dict[str, Any]) -> Any:
        """The engine's subscription a subscribe request (its own stream or a shared one) asks for."""
        return self.engine.subscribe(name, args.get("as_of"), resume=args.get("resume", False),
                                     max_lag=args.get("max_lag"))

    def _plan_stream(self, name: str, args: dict[str, Any]) -> flight.FlightDataStream:
        plan = self.engine.plan_read(name, field(args, "as_of", "plan ticket"), from_t=args.get("from"),
                                     lease_seconds=args.get("lease_seconds", 600.0))
        try:
            body, extra = serve_hold(self._held_tails, plan, args)  # the tail rows, or held and quantiles
            tail = body.replace_schema_metadata({**(body.schema.metadata or {}), **extra,
                                                 PLAN_METADATA_KEY: plan_metadata(plan)})
            return flight.RecordBatchStream(tail)
        except BaseException:
            self.engine.release_read(plan.lease)
            raise

    # --- stopping ------------------------------------------------------------------------------

    def wait_feeds_released(self, timeout: float) -> bool:
        """Wait until no feed stream is open (a client that cancelled its stream is let go
        once the server notices); False after ``timeout`` seconds."""
        return self._feeds.wait_released(timeout)

    def stop(self, grace: float | None = None) -> bool:
        """Stop listening, abort the transactions clients left open, drop staged tables, and
        close the engine if this server owns it. Idempotent.

        Calls under way are waited for ``grace`` seconds (without it, the server's
        ``stop_grace``, DEFAULT_STOP_GRACE unless given: a client that holds a stream open
        without using it, or stops reading one, must not keep the stop waiting for ever),
        after which the transactions are aborted and the engine closed under the calls still
        running (they fail at their next step). Returns False in that case, True when all
        calls finished in time. gRPC finishes the shutdown once those clients go away."""
        with self._lock:
            if self._stopped:
                return True
            self._stopped = True
        self.stopping.set()
        self._txns.refuse_new(f"the sediment server on {self.uri} is stopping; reconnect to a new one")
        self._reaper_stop.set()
        self._feeds.close()  # ends their streams, which would otherwise hold up the shutdown for ever
        clean = self._shut_down(self.stop_grace if grace is None else grace)
        self._stages.clear()
        for tx in self._txns.close(f"the sediment server on {self.uri} is stopping; reconnect to a new one"):
            try:
                tx.abort()
            except Exception as exc:  # noqa: BLE001 - replay discards it at the next open anyway
                log.warning("could not abort transaction %#x at server stop: %s", tx.id, exc)
        if self._close_engine:
            self.engine.close()
        return clean

    def _shut_down(self, grace: float) -> bool:
        """gRPC's shutdown, waited for at most ``grace`` seconds; whether it finished."""
        finished = threading.Event()

        def shut_down() -> None:
            try:
                self.shutdown()
            except Exception as exc:  # noqa: BLE001 - a failed shutdown must not keep the engine open
                log.warning("sediment server on %s: shutdown failed: %s", self.uri, exc)
            finally:
                finished.set()

        threading.Thread(target=shut_down, name="sediment-server-shutdown", daemon=True).start()
        finished.wait(max(0.0, grace))
        if not finished.is_set():
            log.warning("sediment server on %s: calls still running after %.1f s are cut off", self.uri, grace)
        return finished.is_set()

    @property
    def open_transactions(self) -> list[int]:
        """Ids of the transactions clients have begun and not finished."""
        return self._txns.open_ids

    def __enter__(self) -> SedimentFlightServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _typed_errors(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A failure in the middle of a stream (a damaged batch) still reaches the client typed."""
    try:
        yield from batches
    except Exception as exc:  # noqa: BLE001
        raise to_flight_error(exc) from exc
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()  # unpins the engine's readers even when the client went away early


def serve_local(engine: Engine, *, token: str | None = None, close_engine: bool = True) -> Client:
    """Serve ``engine`` on a free loopback port and return a connected client whose ``close()``
    also stops the server (and, with ``close_engine``, the engine). For tests and for code
    that wants to exercise the network path inside one process."""
    from sediment.client import Client

    token = token or uuid.uuid4().hex
    try:
        server = SedimentFlightServer(engine, DEFAULT_LOCATION, token, close_engine=close_engine)
    except BaseException:
        if close_engine:
            engine.close()
        raise
    try:
        client = Client(server.uri, token=token)
    except BaseException:
        server.stop()
        raise
    client.add_close_callback(lambda: server.stop(grace=LOCAL_STOP_GRACE))
    return client
