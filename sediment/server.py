"""An Arrow Flight server that puts one :class:`~sediment.engine.engine.Engine` on the network.

Spark jobs (and any other process) need the coordinator without opening the data
directory themselves: only one process may hold it, and the WAL must stay on the
coordinator's disk. The server exposes the whole Engine API over Arrow Flight, so
updates and reads travel as Arrow record batches, never re-encoded, and a
:class:`sediment.client.Client` behaves like an Engine.

Wire protocol (version 1; every JSON is UTF-8, every time an integer):

* Auth: every call carries the header ``authorization: Bearer <token>``; a missing or
  wrong token is refused with ``FlightUnauthenticatedError`` before any handler runs (the
  client raises it as ``sediment.errors.AuthenticationFailed``).
* ``do_put``: the descriptor is a command, JSON:
  ``{"op": "append", "relation": NAME, "txn": ID|null, "locks": LOCKS|absent}`` appends the
  streamed batches as one ``Engine.append`` (or into open transaction ID); the put
  completes only after the append is durable. LOCKS is ``{"high_water": T, "write":
  [[NAME, ID], ...], "read": [...], "append": [...]}`` (ids JSON scalars or lists, which
  become tuples), passed as ``sediment.Locks``. ``{"op": "stage", "relation": NAME, "stage": SID}`` only buffers
  the batches in memory for a later ``append_many`` action (nothing is written).
* ``do_get``: the ticket is JSON:
  ``{"op": "snapshot", "relation": NAME, "as_of": T}`` streams the snapshot;
  ``{"op": "replay", "relation": NAME, "batch_rows": N}`` streams ``Engine.replay``;
  ``{"op": "plan", "relation": NAME, "as_of": T, "from": T|null, "lease_seconds": S}``
  streams the read plan's WAL-tail rows; the stream's schema is the update schema and
  its metadata key ``sediment.plan`` holds the rest of the plan as JSON (lease, relation,
  relation_id, key_columns, since, sealed, as_of, blob_uri, s3_endpoint, batches);
  ``{"op": "subscribe", "relation": NAME, "as_of": T|null, "resume": BOOL}`` streams
  ``Engine.subscribe``'s events as batches of the update schema, each with app metadata
  ``{"kind": "snapshot"|"updates"|"progress", "time": T, "last": BOOL}`` (an event may span
  batches, ``last`` ends it; a snapshot's rows carry time = T; progress is an empty batch).
* ``do_action``: the type is the operation, the body a JSON object of its arguments, the
  one result ``{"result": ...}``: add_relation {name, schema: base64 Arrow IPC schema},
  drop_relation {name}, relations {}, schema {name} -> base64 IPC schema, seal {name, t},
  set_since {name, t}, since {name}, sealed {name}, compact {name|null}, trace_info {name}, stats {},
  compaction_errors {},
  begin {group|absent} -> transaction id, commit {txn}, abort {txn}, txn_state {txn},
  commit_all {txns, group|absent} (one COMMIT record for them all; then every other open
  transaction of the group is aborted), abort_group {group},
  append_many {stage, locks|absent}, discard_stage {stage}, release_read {lease}, ping {}.
* Errors: a refused call fails with ``FlightServerError`` whose ``extra_info`` is JSON
  ``{"error": CLASS, "module": "sediment.errors"|"builtins", "message": TEXT, "attrs": {...}}``;
  the client raises the same class with the same message (see :func:`error_detail`).

Transactions live on the server by id between calls. One left idle (no call naming it)
for longer than ``txn_idle_timeout`` is aborted, and so is every one still open when the
server stops: an open transaction holds back the compacter's WAL cut, so a client that
vanished must not keep one open for ever (and the WAL's replay discards one that a crash
left open).
"""

from __future__ import annotations

import base64
import hmac
import json
import logging
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.flight as flight

from sediment import errors
from sediment.engine.engine import Engine
from sediment.engine.schema import check_name, update_schema
from sediment.engine.transaction import Transaction
from sediment.errors import SedimentError, TransactionError

if TYPE_CHECKING:
    from sediment.client import Client

PROTOCOL_VERSION = 1
TOKEN_ENV = "SEDIMENT_TOKEN"
AUTH_HEADER = "authorization"
PLAN_METADATA_KEY = b"sediment.plan"
DEFAULT_LOCATION = "grpc://127.0.0.1:0"
# builtin exceptions the engine raises on purpose (bad argument types and values); anything
# else that is not a sediment error comes back as sediment.client.ServerError
BUILTIN_ERRORS = ("ValueError", "TypeError", "KeyError", "LookupError", "IndexError")
LOCAL_STOP_GRACE = 10.0  # seconds serve_local's close() waits for calls still running
_FINISHED_TXN_STATES = 4096
DEFAULT_TXN_IDLE_TIMEOUT = 600.0  # seconds without a call before the server aborts a transaction
FEED_POLL = 1.0  # seconds a feed stream waits for an event before checking that its client is still there
FEED_BATCH_ROWS = 65536  # how many finished transactions' states the server remembers

log = logging.getLogger(__name__)


# --- errors on the wire ---------------------------------------------------------------------


def error_detail(exc: BaseException) -> bytes:
    """The JSON that lets the client re-raise ``exc`` as its own class with its own message
    (and attributes such as WalCorruption's path and offset), not as a generic Flight error."""
    cls = type(exc)
    if isinstance(exc, SedimentError) and getattr(errors, cls.__name__, None) is cls:
        module = "sediment.errors"
    elif cls.__module__ == "builtins" and cls.__name__ in BUILTIN_ERRORS:
        module = "builtins"
    else:
        module = ""
    attrs = {}
    for key, value in vars(exc).items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue  # not representable: the message still says it
        attrs[key] = value
    return json.dumps({"error": cls.__name__, "module": module, "message": str(exc), "attrs": attrs}).encode()


def to_flight_error(exc: BaseException) -> flight.FlightError:
    """``exc`` as the Flight error the client maps back (authentication errors pass as they are)."""
    if isinstance(exc, flight.FlightError):
        return exc
    return flight.FlightServerError(f"{type(exc).__name__}: {exc}", extra_info=error_detail(exc))


def resolve_token(token: str | None) -> str:
    """The shared secret: the argument, else ``$SEDIMENT_TOKEN``. There is no anonymous mode:
    a coordinator that accepts writes from anyone who can reach the port is a foot-gun."""
    token = token if token is not None else os.environ.get(TOKEN_ENV)
    if not token:
        raise ValueError(f"no token for the sediment server: pass token=... (or --token), or set ${TOKEN_ENV}")
    return token


# --- auth -----------------------------------------------------------------------------------


class BearerTokenMiddlewareFactory(flight.ServerMiddlewareFactory):
    """Checks ``authorization: Bearer <token>`` on every call before its handler runs, so no
    RPC kind (including ones sediment does not implement) is reachable without the token."""

    def __init__(self, token: str) -> None:
        super().__init__()
        self._expected = f"Bearer {token}".encode()

    def start_call(self, info: flight.CallInfo, headers: dict[str, list[Any]]) -> None:
        for value in headers.get(AUTH_HEADER, []):
            given = value if isinstance(value, bytes) else str(value).encode()
            if hmac.compare_digest(given, self._expected):
                return None
        what = "a wrong" if headers.get(AUTH_HEADER) else "no"
        raise flight.FlightUnauthenticatedError(
            f"sediment server: {info.method} call with {what} token; send the server's token "
            f"(sediment.connect(uri, token=...) or ${TOKEN_ENV})")


# --- the server -----------------------------------------------------------------------------


def _schema_to_b64(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def _schema_from_b64(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def _json_arg(raw: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(raw.decode("utf-8")) if raw else {}
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"the {what} is not valid JSON ({exc}); see sediment/server.py for the protocol") from None
    if not isinstance(value, dict):
        raise ValueError(f"the {what} must be a JSON object, not {type(value).__name__}")
    return value


def _tuples(value: Any) -> Any:
    """JSON lists back to the tuples they were (lock ids are (name, id) tuples, hashed by repr)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def decode_locks(spec: object) -> Any:
    """A ``locks`` JSON object ({high_water, write, read, append}) as a sediment.Locks, or None."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise ValueError(f"locks must be a JSON object {{high_water, write, read, append}}, not {spec!r}")
    from sediment.engine.locks import Locks

    return Locks(_field(spec, "high_water", "locks"), **{kind: [_tuples(lock) for lock in spec.get(kind) or ()]
                                                         for kind in ("write", "read", "append")})


def _field(args: dict[str, Any], key: str, what: str) -> Any:
    try:
        return args[key]
    except KeyError:
        raise ValueError(f"the {what} lacks {key!r}; see sediment/server.py for the protocol") from None


class SedimentFlightServer(flight.FlightServerBase):
    """Serves ``engine`` on ``location`` (it listens as soon as it is constructed; ``port`` and
    ``uri`` say where). :meth:`stop` stops listening, waits for calls under way and aborts the
    transactions clients left open; with ``close_engine=True`` it closes the engine too."""

    def __init__(self, engine: Engine, location: str = DEFAULT_LOCATION, token: str | None = None, *,
                 close_engine: bool = False, txn_idle_timeout: float | None = DEFAULT_TXN_IDLE_TIMEOUT,
                 clock: Callable[[], float] = time.monotonic, tls: tuple[bytes, bytes] | None = None) -> None:
        """``txn_idle_timeout``: seconds a transaction may go without a call before it is
        aborted (None: never); ``clock`` measures it (tests pass their own). ``tls``: the
        server's (certificate chain, private key) in PEM; then ``location`` is
        ``grpc+tls://HOST:PORT`` and clients must connect with TLS (the token is still required)."""
        self._token = resolve_token(token)
        if txn_idle_timeout is not None and txn_idle_timeout <= 0:
            raise ValueError(f"txn_idle_timeout must be positive seconds or None, not {txn_idle_timeout!r}")
        parsed = urlparse(location)
        if tls is not None and parsed.scheme == "grpc":  # the same address, served with TLS
            location = "grpc+tls" + location[len("grpc"):]
            parsed = urlparse(location)
        if parsed.scheme not in ("grpc", "grpc+tcp", "grpc+tls") or not parsed.hostname or parsed.port is None:
            raise ValueError(f"cannot serve on {location!r}: give grpc://HOST:PORT (PORT 0 picks a free port)")
        if (parsed.scheme == "grpc+tls") != (tls is not None):
            raise ValueError(f"cannot serve on {location!r}: grpc+tls:// needs tls=(cert, key), and TLS needs grpc+tls://")
        self.scheme = "grpc+tls" if tls is not None else "grpc"
        self.engine = engine
        self.host = parsed.hostname
        self._close_engine = close_engine
        self._lock = threading.Lock()
        self._txns: dict[int, Transaction] = {}
        self._txn_used: dict[int, float] = {}  # transaction id -> clock() of the last call naming it
        self._groups: dict[str, set[int]] = {}  # group -> its open transactions
        self._txn_group: dict[int, str] = {}
        self._txn_idle_timeout = txn_idle_timeout
        self._clock = clock
        self._idle_aborted: OrderedDict[int, None] = OrderedDict()
        self._reaper_stop = threading.Event()
        self._finished: OrderedDict[int, str] = OrderedDict()
        self._stages: dict[str, dict[str, list[pa.Table]]] = {}
        self._stopped = False
        self._subs: set[Any] = set()
        self._actions: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
            "ping": (lambda a: {"protocol": PROTOCOL_VERSION, "data_dir": self.engine.data_dir}, "protocol check"),
            "add_relation": (self._add_relation, "create a relation {name, schema: base64 IPC}"),
            "drop_relation": (lambda a: self.engine.drop_relation(_field(a, "name", "drop_relation")),
                              "drop a relation {name}"),
            "relations": (lambda a: self.engine.relations(), "list relation names"),
            "schema": (lambda a: _schema_to_b64(self.engine.schema(_field(a, "name", "schema"))),
                       "a relation's columns {name} -> base64 IPC schema"),
            "seal": (lambda a: self.engine.seal(_field(a, "name", "seal"), _field(a, "t", "seal")),
                     "close time t {name, t}"),
            "set_since": (lambda a: self.engine.set_since(_field(a, "name", "set_since"), _field(a, "t", "set_since")),
                          "advance the compaction frontier {name, t}"),
            "since": (lambda a: self.engine.since(_field(a, "name", "since")), "compaction frontier {name}"),
            "sealed": (lambda a: self.engine.sealed(_field(a, "name", "sealed")), "sealed frontier {name}"),
            "compact": (lambda a: self.engine.compact(a.get("name")), "run a compaction pass {name|null}"),
            "trace_info": (lambda a: self.engine.trace_info(_field(a, "name", "trace_info")),
                           "a relation's stored shape {name}"),
            "stats": (lambda a: self.engine.stats(), "what the engine holds: relations, WAL, storage {}"),
            "compaction_errors": (lambda a: self.engine.compaction_errors(),
                                  "relations whose last compaction failed -> {name: error}"),
            "begin": (self._begin, "open a transaction {group|absent} -> id"),
            "commit_all": (self._commit_all, "commit transactions as one {txns, group|absent}; then abort the "
                                             "group's other open transactions"),
            "abort_group": (self._abort_group, "abort every open transaction of a group {group}"),
            "commit": (self._commit, "commit a transaction {txn}"),
            "abort": (self._abort, "abort a transaction {txn}"),
            "txn_state": (self._txn_state, "a transaction's state {txn}"),
            "append_many": (self._append_many, "append the staged tables atomically {stage}"),
            "discard_stage": (self._discard_stage, "forget staged tables {stage}"),
            "release_read": (lambda a: self.engine.release_read(_field(a, "lease", "release_read")),
                             "end a read plan's lease {lease}"),
        }
        try:  # listens from here on, so everything a handler uses is set above
            super().__init__(location, middleware={"auth": BearerTokenMiddlewareFactory(self._token)},
                             **({"tls_certificates": [flight.CertKeyPair(*tls)]} if tls is not None else {}))
        except pa.ArrowException as exc:  # gRPC only says "Server did not start properly"
            raise SedimentError(f"could not listen on {location} ({exc}); is the port in use by another process? "
                                "pick another port (0 picks a free one)") from None
        if txn_idle_timeout is not None:
            threading.Thread(target=self._reap_loop, args=(min(txn_idle_timeout / 4, 30.0),),
                             name="sediment-server-txn-reaper", daemon=True).start()

    @property
    def uri(self) -> str:
        """Where clients connect: ``grpc://HOST:PORT`` (``grpc+tls://``) with the port actually bound."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    # --- actions -------------------------------------------------------------------------------

    def _add_relation(self, args: dict[str, Any]) -> None:
        schema = _schema_from_b64(_field(args, "schema", "add_relation"))
        self.engine.add_relation(_field(args, "name", "add_relation"), schema)

    def _begin(self, args: dict[str, Any]) -> int:
        with self._lock:
            if self._stopped:
                raise errors.EngineClosed(f"the sediment server on {self.uri} is stopping; reconnect to a new one")
            tx = self.engine.transaction()
            self._txns[tx.id] = tx
            self._txn_used[tx.id] = self._clock()
            group = args.get("group")
            if group is not None:
                self._groups.setdefault(str(group), set()).add(tx.id)
                self._txn_group[tx.id] = str(group)
        return tx.id

    def _commit_all(self, args: dict[str, Any]) -> list[str]:
        ids = _field(args, "txns", "commit_all")
        if not isinstance(ids, list):
            raise ValueError(f"commit_all: txns must be a list of transaction ids, not {ids!r}")
        txns, unknown = [], []
        for i in ids:
            try:
                txns.append(self._txn(i))
            except TransactionError as exc:
                unknown.append(exc)
        try:
            if unknown:
                for tx in txns:
                    tx.abort()
                raise TransactionError(f"{unknown[0]}; every transaction of this commit_all was aborted")
            self.engine.commit_all(txns)
        finally:
            for tx in txns:
                self._settle(tx)
            group = args.get("group")
            if group is not None:
                self._abort_group({"group": group})
        return [tx.state for tx in txns]

    def _abort_group(self, args: dict[str, Any]) -> int:
        """Abort the group's transactions still open (a Spark job's losing task attempts); how many."""
        group = str(_field(args, "group", "abort_group"))
        with self._lock:
            ids = self._groups.pop(group, set())
            txns = [self._txns[i] for i in ids if i in self._txns]
        for tx in txns:
            try:
                tx.abort()
            finally:
                self._settle(tx)
        return len(txns)

    def _txn(self, txn_id: object) -> Transaction:
        with self._lock:
            tx = self._txns.get(txn_id) if isinstance(txn_id, int) else None
            state = self._finished.get(txn_id) if isinstance(txn_id, int) else None
            if tx is not None:
                self._txn_used[tx.id] = self._clock()
            idle = txn_id in self._idle_aborted
        if tx is None:
            shown = f"{txn_id:#x}" if isinstance(txn_id, int) else repr(txn_id)
            if idle:
                state = (f"{state}: the server aborted it after {self._txn_idle_timeout:g} s without a call "
                         "(txn_idle_timeout)")
            raise TransactionError(f"transaction {shown} is " + (
                f"already {state}" if state else "not open on this server (it was never begun here, or the "
                "server restarted and aborted it); begin a new transaction"))
        return tx

    def reap_idle_transactions(self) -> list[int]:
        """Abort the transactions idle for longer than ``txn_idle_timeout``; their ids. A
        background thread calls this; tests call it with their own clock."""
        if self._txn_idle_timeout is None:
            return []
        now = self._clock()
        with self._lock:
            idle = [self._txns[i] for i, used in self._txn_used.items()
                    if now - used > self._txn_idle_timeout and i in self._txns]
            for tx in idle:  # no call can pick them up any more
                self._forget(tx.id)
        reaped = []
        for tx in idle:
            try:
                tx.abort()
            except Exception as exc:  # noqa: BLE001 - replay discards it at the next open anyway
                log.warning("could not abort idle transaction %#x: %s", tx.id, exc)
                continue
            log.warning("aborted transaction %#x: no call for more than %g s", tx.id, self._txn_idle_timeout)
            with self._lock:
                self._idle_aborted[tx.id] = None
                self._finished[tx.id] = tx.state
                for remembered in (self._idle_aborted, self._finished):
                    while len(remembered) > _FINISHED_TXN_STATES:
                        remembered.popitem(last=False)
            reaped.append(tx.id)
        return reaped

    def _reap_loop(self, interval: float) -> None:
        while not self._reaper_stop.wait(interval):
            try:
                self.reap_idle_transactions()
            except Exception as exc:  # noqa: BLE001 - the next round tries again
                log.warning("reaping idle transactions failed: %s", exc)

    def _forget(self, txn_id: int) -> None:
        """Drop an open transaction's bookkeeping (with ``_lock`` held)."""
        self._txns.pop(txn_id, None)
        self._txn_used.pop(txn_id, None)
        group = self._txn_group.pop(txn_id, None)
        if group is not None:
            members = self._groups.get(group)
            if members is not None:
                members.discard(txn_id)
                if not members:
                    del self._groups[group]

    def _settle(self, tx: Transaction) -> str:
        """Forget a finished transaction, remembering its final state for txn_state."""
        state = tx.state
        if state != "open":
            with self._lock:
                self._forget(tx.id)
                self._finished[tx.id] = state
                while len(self._finished) > _FINISHED_TXN_STATES:
                    self._finished.popitem(last=False)
        return state

    def _commit(self, args: dict[str, Any]) -> str:
        tx = self._txn(_field(args, "txn", "commit"))
        try:
            tx.commit()
        finally:
            self._settle(tx)
        return tx.state

    def _abort(self, args: dict[str, Any]) -> str:
        txn_id = _field(args, "txn", "abort")
        with self._lock:
            if txn_id in self._finished:
                return self._finished[txn_id]
        tx = self._txn(txn_id)
        try:
            tx.abort()
        finally:
            self._settle(tx)
        return tx.state

    def _txn_state(self, args: dict[str, Any]) -> str:
        txn_id = _field(args, "txn", "txn_state")
        with self._lock:
            tx = self._txns.get(txn_id)
            return tx.state if tx is not None else self._finished.get(txn_id, "unknown")

    def _append_many(self, args: dict[str, Any]) -> None:
        with self._lock:
            staged = self._stages.pop(str(_field(args, "stage", "append_many")), {})
        tables = {name: pa.concat_tables(parts) if len(parts) > 1 else parts[0] for name, parts in staged.items()}
        locks = decode_locks(args.get("locks"))
        if locks is None:
            self.engine.append_many(tables)
        else:
            self.engine.append_many(tables, locks=locks)

    def _discard_stage(self, args: dict[str, Any]) -> None:
        with self._lock:
            self._stages.pop(str(_field(args, "stage", "discard_stage")), None)

    # --- Flight RPCs ---------------------------------------------------------------------------

    def list_actions(self, context: flight.ServerCallContext) -> list[tuple[str, str]]:
        return [(name, doc) for name, (_f, doc) in self._actions.items()]

    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> Iterator[flight.Result]:
        """Runs to completion before answering, so a returned action is durable."""
        try:
            entry = self._actions.get(action.type)
            if entry is None:
                raise ValueError(f"unknown action {action.type!r}; known: {sorted(self._actions)}")
            body = action.body.to_pybytes() if action.body is not None else b""
            result = entry[0](_json_arg(body, f"body of action {action.type!r}"))
        except Exception as exc:  # noqa: BLE001 - every failure goes back typed
            raise to_flight_error(exc) from exc
        return iter([flight.Result(json.dumps({"result": result}).encode())])

    def do_put(self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor,
               reader: flight.MetadataRecordBatchReader, writer: flight.FlightMetadataWriter) -> None:
        """Reads the whole stream, then appends it as one call: the engine's appends are all or
        nothing, so a stream that breaks off midway writes nothing."""
        try:
            args = _json_arg(descriptor.command or b"", "do_put descriptor command")
            op = args.get("op", "append")
            name = _field(args, "relation", "do_put descriptor")
            table = reader.read_all()
            if op == "append":
                txn = args.get("txn")
                locks = decode_locks(args.get("locks"))
                if txn is None and locks is None:
                    self.engine.append(name, table)
                elif txn is None:
                    self.engine.append(name, table, locks=locks)
                else:
                    tx = self._txn(txn)
                    try:
                        tx.append(name, table)
                    finally:
                        self._settle(tx)
            elif op == "stage":
                check_name(name)  # a name that is not a string must not become a staging key
                stage = str(_field(args, "stage", "do_put descriptor"))
                with self._lock:
                    self._stages.setdefault(stage, {}).setdefault(name, []).append(table)
            else:
                raise ValueError(f"unknown do_put op {op!r}: use 'append' or 'stage'")
        except Exception as exc:  # noqa: BLE001 - every failure goes back typed
            raise to_flight_error(exc) from exc

    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket) -> flight.FlightDataStream:
        try:
            args = _json_arg(ticket.ticket, "do_get ticket")
            op = _field(args, "op", "do_get ticket")
            name = _field(args, "relation", "do_get ticket")
            if op == "snapshot":
                return flight.RecordBatchStream(self.engine.snapshot(name, _field(args, "as_of", "snapshot ticket")))
            if op == "replay":
                schema = update_schema(self.engine.schema(name))
                batches = self.engine.replay(name, batch_rows=int(args.get("batch_rows", 65536)))
                return flight.GeneratorStream(schema, _typed_errors(batches))
            if op == "plan":
                return self._plan_stream(name, args)
            if op == "subscribe":
                schema = update_schema(self.engine.schema(name))
                sub = self.engine.subscribe(name, args.get("as_of"), resume=bool(args.get("resume", False)))
                with self._lock:
                    if self._stopped:
                        sub.close()
                        raise errors.EngineClosed(f"the sediment server on {self.uri} is stopping")
                    self._subs.add(sub)
                return flight.GeneratorStream(schema, self._feed(sub, schema, context))
            raise ValueError(f"unknown do_get op {op!r}: use 'snapshot', 'replay', 'plan' or 'subscribe'")
        except Exception as exc:  # noqa: BLE001 - every failure goes back typed
            raise to_flight_error(exc) from exc

    def _feed(self, sub: Any, schema: pa.Schema, context: flight.ServerCallContext,
              ) -> Iterator[tuple[pa.RecordBatch, bytes]]:
        """A subscription's events as batches of the update schema, each with app metadata
        ``{"kind", "time", "last"}``; an event's table may span several batches (``last`` marks
        its end), a progress event is one empty batch. Wakes every FEED_POLL seconds to notice
        a client that went away, so its subscription does not pin the feed log forever."""
        try:
            while not self._stopped and not context.is_cancelled():
                event = sub.next(timeout=FEED_POLL)
                if event is not None:
                    yield from _event_batches(event, schema)
        except Exception as exc:  # noqa: BLE001 - every failure goes back typed
            raise to_flight_error(exc) from exc
        finally:
            sub.close()
            with self._lock:
                self._subs.discard(sub)

    def _plan_stream(self, name: str, args: dict[str, Any]) -> flight.FlightDataStream:
        plan = self.engine.plan_read(name, _field(args, "as_of", "plan ticket"), from_t=args.get("from"),
                                     lease_seconds=float(args.get("lease_seconds", 600.0)))
        try:
            meta = {"lease": plan.lease, "relation": plan.relation, "relation_id": plan.relation_id,
                    "key_columns": plan.key_columns, "since": plan.since, "sealed": plan.sealed,
                    "as_of": plan.as_of, "blob_uri": plan.blob_uri, "s3_endpoint": plan.s3_endpoint,
                    "batches": plan.batches}
            tail = plan.tail.replace_schema_metadata({**(plan.tail.schema.metadata or {}),
                                                      PLAN_METADATA_KEY: json.dumps(meta).encode()})
            return flight.RecordBatchStream(tail)
        except BaseException:
            self.engine.release_read(plan.lease)
            raise

    # --- stopping ------------------------------------------------------------------------------

    def stop(self, grace: float | None = None) -> bool:
        """Stop listening, abort the transactions clients left open, drop staged tables, and
        close the engine if this server owns it. Idempotent.

        Calls under way are waited for: without ``grace``, for as long as they take (a client
        that stops reading a large stream holds them up); with ``grace``, for that many
        seconds, after which the transactions are aborted and the engine closed under the
        calls still running (they fail). Returns False in that case, True when all calls
        finished in time. gRPC finishes the shutdown once those clients go away."""
        with self._lock:
            if self._stopped:
                return True
            self._stopped = True
            subs, self._subs = list(self._subs), set()
        self._reaper_stop.set()
        for sub in subs:  # ends their streams, which would otherwise hold up the shutdown for ever
            sub.close()
        finished = threading.Event()

        def shut_down() -> None:
            try:
                self.shutdown()
            except Exception as exc:  # noqa: BLE001 - a failed shutdown must not keep the engine open
                log.warning("sediment server on %s: shutdown failed: %s", self.uri, exc)
            finally:
                finished.set()

        if grace is None:
            shut_down()
        else:
            threading.Thread(target=shut_down, name="sediment-server-shutdown", daemon=True).start()
            finished.wait(max(0.0, grace))
        clean = finished.is_set()
        if not clean:
            log.warning("sediment server on %s: calls still running after %.1f s are cut off", self.uri, grace)
        with self._lock:
            open_txns, self._txns = list(self._txns.values()), {}
            self._stages.clear()
        for tx in open_txns:
            try:
                tx.abort()
            except Exception as exc:  # noqa: BLE001 - replay discards it at the next open anyway
                log.warning("could not abort transaction %#x at server stop: %s", tx.id, exc)
        if self._close_engine:
            self.engine.close()
        return clean

    @property
    def open_transactions(self) -> list[int]:
        """Ids of the transactions clients have begun and not finished."""
        with self._lock:
            return sorted(self._txns)

    def __enter__(self) -> SedimentFlightServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _event_batches(event: Any, schema: pa.Schema) -> Iterator[tuple[pa.RecordBatch, bytes]]:
    """One feed event on the wire (see SedimentFlightServer._feed). A snapshot's rows get
    ``time`` = the snapshot's time so that every batch has the one update schema."""
    table = event.table
    if table is None:
        table = schema.empty_table()
    elif "time" not in table.column_names:
        table = table.append_column("time", pa.array([event.time] * table.num_rows, pa.int64()))
    batches = table.select(schema.names).cast(schema).to_batches(max_chunksize=FEED_BATCH_ROWS) or \
        [pa.RecordBatch.from_pylist([], schema=schema)]
    for i, batch in enumerate(batches):
        meta = {"kind": event.kind, "time": event.time, "last": i == len(batches) - 1}
        yield batch, json.dumps(meta).encode()


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

