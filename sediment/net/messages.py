"""The Flight messages of sediment's protocol: every op name and the fields each one carries.

Server and client both name ops through these enums and build or check bodies against
``FIELDS``, so a renamed op or field breaks both sides at once instead of one silently.
docs/formats.md ("Messages") has a worked example of every message; tests decode them
against this table, and says what each field means ("Network protocol").
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any


class Put(StrEnum):
    """``do_put``: the descriptor command's ``op``."""

    APPEND_STREAM = "append_stream"
    APPEND = "append"
    APPEND_ONCE = "append_once"
    STAGE = "stage"


class Exchange(StrEnum):
    """``do_exchange``: the descriptor command's ``op`` (its magic; ``version`` its version)."""

    APPEND_STREAM = "append_exchange"


class Get(StrEnum):
    """``do_get``: the ticket's ``op``."""

    SNAPSHOT = "snapshot"
    REPLAY = "replay"
    PLAN = "plan"
    TAIL_PART = "tail_part"
    SUBSCRIBE = "subscribe"
    FEED_SHARE = "feed_share"


class Action(StrEnum):
    """``do_action``: the action type; its body is a JSON object of the fields below."""

    PING = "ping"
    ADD_RELATION = "add_relation"
    DROP_RELATION = "drop_relation"
    ALTER_RELATION = "alter_relation"
    SCHEMA_VERSION = "schema_version"
    DESCRIBE = "describe"
    RELATIONS = "relations"
    SCHEMA = "schema"
    SEAL = "seal"
    SET_SINCE = "set_since"
    SINCE = "since"
    SEALED = "sealed"
    COMPACT = "compact"
    TRACE_INFO = "trace_info"
    STATS = "stats"
    COMPACTION_ERRORS = "compaction_errors"
    BEGIN = "begin"
    COMMIT_ALL = "commit_all"
    ABORT_GROUP = "abort_group"
    COMMIT = "commit"
    ABORT = "abort"
    TXN_STATE = "txn_state"
    APPEND_MANY = "append_many"
    DISCARD_STAGE = "discard_stage"
    RELEASE_READ = "release_read"
    BULK_STAGE = "bulk_stage"
    BULK_COMMIT = "bulk_commit"
    BULK_ABORT = "bulk_abort"
    FEED_JOIN = "feed_join"
    FEED_LEAVE = "feed_leave"


Op = Put | Exchange | Get | Action

# the fields each message may carry (besides a descriptor's or ticket's "op")
FIELDS: dict[Op, tuple[str, ...]] = {
    Put.APPEND_STREAM: ("relation", "queue"),
    Put.APPEND: ("relation", "txn", "locks"),
    Put.APPEND_ONCE: ("relation", "client", "seq"),
    Put.STAGE: ("relation", "stage"),
    Exchange.APPEND_STREAM: ("version", "relation", "queue"),
    Get.SNAPSHOT: ("relation", "as_of"),
    Get.REPLAY: ("relation", "batch_rows"),
    Get.PLAN: ("relation", "as_of", "from", "lease_seconds", "hold_tail"),
    Get.TAIL_PART: ("relation", "lease", "key", "cuts", "index", "start", "stop"),
    Get.SUBSCRIBE: ("relation", "as_of", "resume", "max_lag", "continuation"),
    Get.FEED_SHARE: ("relation", "version", "stream", "sub", "as_of", "resume", "max_lag"),
    Action.PING: (),
    Action.ADD_RELATION: ("name", "schema", "partition"),
    Action.DROP_RELATION: ("name",),
    Action.ALTER_RELATION: ("name", "add", "widen", "rename", "drop", "defaults", "base"),
    Action.SCHEMA_VERSION: ("name",),
    Action.DESCRIBE: ("name",),
    Action.RELATIONS: ("include_internal",),
    Action.SCHEMA: ("name",),
    Action.SEAL: ("name", "t"),
    Action.SET_SINCE: ("name", "t"),
    Action.SINCE: ("name",),
    Action.SEALED: ("name",),
    Action.COMPACT: ("name",),
    Action.TRACE_INFO: ("name",),
    Action.STATS: ("include_internal",),
    Action.COMPACTION_ERRORS: (),
    Action.BEGIN: ("group",),
    Action.COMMIT_ALL: ("txns", "group", "relation", "client", "seq"),
    Action.ABORT_GROUP: ("group",),
    Action.COMMIT: ("txn", "relation", "client", "seq"),
    Action.ABORT: ("txn",),
    Action.TXN_STATE: ("txn",),
    Action.APPEND_MANY: ("stage", "locks", "client", "seq"),
    Action.DISCARD_STAGE: ("stage",),
    Action.RELEASE_READ: ("lease",),
    Action.BULK_STAGE: ("name", "job"),
    Action.BULK_COMMIT: ("name", "job", "time", "diff"),
    Action.BULK_ABORT: ("name", "job"),
    Action.FEED_JOIN: ("stream", "sub", "as_of", "resume", "max_lag"),
    Action.FEED_LEAVE: ("stream", "sub"),
}

# the fields of an append's metadata on the append stream (its last batch's app metadata)
STREAM_FIELDS: tuple[str, ...] = ("txn", "locks", "client", "seq")


def encode(op: Op, **fields: Any) -> bytes:
    """A message's JSON bytes: a descriptor command (do_put, do_exchange) or ticket (``op`` first) or, for an
    Action, its body. ValueError for a field the op does not carry (a caller's typo)."""
    extra = sorted(set(fields) - set(FIELDS[op]))
    if extra:
        raise ValueError(f"{op.value} carries no field {extra[0]!r}; its fields: {list(FIELDS[op])}")
    body = fields if isinstance(op, Action) else {"op": op.value, **fields}
    return json.dumps(body, default=repr).encode()
