"""sediment's network protocol: Arrow Flight between ``sediment serve`` (:mod:`sediment.server`)
and :class:`sediment.client.Client`. The pieces both sides use live here (op names and the
fields of each message in :mod:`sediment.net.messages`, constants and codecs in
:mod:`sediment.net.protocol`, typed errors in :mod:`sediment.net.wire_errors`), so
the client imports neither the server nor the engine; the server's transaction
bookkeeping is :mod:`sediment.net.txn_registry`.

Wire protocol (version 1; every JSON is UTF-8, every time an integer):

* Auth: every call carries the header ``authorization: Bearer <token>``; a missing or
  wrong token is refused with ``FlightUnauthenticatedError`` before any handler runs (the
  client raises it as ``sediment.errors.AuthenticationFailed``).
* ``do_put``: the descriptor is a command, JSON:
  ``{"op": "append_stream", "relation": NAME}`` opens a stream of appends to NAME, each
  acknowledged on the stream's metadata channel (see :mod:`sediment.net.append_stream`);
  the client's appends use it; a cluster client's keyed appends carry their idempotency
  key ``{"client": ID, "seq": N}`` in each append's metadata there (with ``"locks"`` too for
  a locked one: the locks are checked only when the key was not applied yet).
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
  relation_id, key_columns, since, sealed, as_of, blob_uri, s3_endpoint, batches, and
  schema_history: an altered relation's SchemaHistory.to_json(), else null). With
  ``"hold_tail": {"part_rows": N, "max_parts": M}`` a tail of more than one part (N rows a
  part, at most M parts) that fits the server's bound stays on the server for the lease
  instead: the stream's one column ``cut`` holds the quantile cuts of the first key column
  into that many parts and the metadata key ``sediment.held_tail`` holds ``{"rows", "parts",
  "key", "update_schema"}`` (see :mod:`sediment.net.held_tails`);
  ``{"op": "tail_part", "relation": NAME, "lease": L, "key": COLUMN|null, "cuts": B64|null,
  "index": I|null, "start": S|null, "stop": S|null}`` streams part of the tail held for lease
  L: the rows whose ``key`` falls in range I of ``cuts`` (base64 Arrow IPC of one column
  ``cut``; nulls in range 0), or rows [start, stop), or all; the lease's end (release_read
  or expiry) drops the rows, and a later call is refused with InvalidArgument;
  ``{"op": "subscribe", "relation": NAME, "as_of": T|null, "resume": BOOL, "max_lag": N|null,
  "continuation": TOKEN|absent}`` streams
  ``Engine.subscribe``'s events as batches of the update schema, each with app metadata
  ``{"kind": "snapshot"|"updates"|"progress"|"schema", "time": T, "last": BOOL}`` (an event may span
  batches, ``last`` ends it; a snapshot's rows carry time = T; progress is an empty batch;
  a relation never sealed, subscribed with as_of null, starts with an empty snapshot at T = -1;
  a subscriber dropped for falling more than max_lag events behind ends with FeedOverrun;
  ``schema``, an empty batch with T = the new schema version and a ``"continuation"`` token in
  its metadata, is the last event of a stream: the relation was altered, and the ticket
  ``{"op": "subscribe", "relation": NAME, "continuation": TOKEN}`` (within 60 s) streams the
  same subscription's next events in the new columns, nothing lost or repeated; see
  :mod:`sediment.net.feed_streams`).
* ``do_action``: the type is the operation, the body a JSON object of its arguments, the
  one result ``{"result": ...}``: add_relation {name, schema: base64 Arrow IPC schema},
  drop_relation {name}, relations {}, schema {name} -> base64 IPC schema, seal {name, t},
  alter_relation {name, add: base64 IPC schema, widen: base64 IPC schema, rename {old: new},
  drop [names], defaults: base64 IPC stream of one row|absent, base|absent} -> schema version
  (see :mod:`sediment.net.alter_wire`; ``base``, a cluster member's: the schema version the
  alter starts from, so a retry is not applied twice, see sediment/cluster/alter_once.py), schema_version {name}, describe {name},
  set_since {name, t}, since {name}, sealed {name}, compact {name|null}, trace_info {name}, stats {},
  compaction_errors {},
  begin {group|absent} -> transaction id, commit {txn, relation|absent, client|absent,
  seq|absent} (with a key, a cluster member's: at most once across retries, recorded with
  the commit in the log of RELATION's partition), abort {txn}, txn_state {txn},
  commit_all {txns, group|absent, relation|absent, client|absent, seq|absent} (one COMMIT
  record for them all; then every other open transaction of the group is aborted; a key as
  commit's), abort_group {group} (either ends the group: a later
  begin in it is refused with TransactionError),
  append_many {stage, locks|absent, client|absent, seq|absent} (a key as commit's),
  discard_stage {stage}, release_read {lease}, ping {}.
* Errors: a refused call fails with ``FlightServerError`` whose ``extra_info`` is JSON
  ``{"error": CLASS, "module": "sediment.errors"|"builtins", "message": TEXT, "attrs": {...}}``;
  the client raises the same class with the same message (see :func:`error_detail`).

Transactions live on the server by id between calls. One left idle (no call naming it)
for longer than ``txn_idle_timeout`` is aborted, and so is every one still open when the
server stops: an open transaction holds back the compacter's WAL cut, so a client that
vanished must not keep one open for ever (and the WAL's replay discards one that a crash
left open).
"""
