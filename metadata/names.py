"""Every metadata key sediment writes, in one place, as format/parse pairs.

Keys are ``/``-separated paths (the rules every store checks: :mod:`sediment.metadata.validation`). Ids are
fixed-width lower-case hex, so that listing a prefix, which returns keys sorted as text,
returns them in id order. This module is part of the metadata leaf package: ``wal/`` and
``trace/`` use it as freely as the engine (docs/formats.md describes each value).
"""

from __future__ import annotations

from sediment.errors import InvalidMetadataRequest

STORAGE = "engine/storage"  # where the engine's log and batches live, and its identity
EPOCH = "engine/epoch"  # bumped at each open: the high half of transaction ids
NEXT_RELATION_ID = "catalog/next-relation-id"
RELATIONS = "catalog/relations/"  # + relation name: its catalog entry
TRACES = "trace/"  # + relation id (16 hex digits): its trace state
PARTITIONS = "store/partition/"  # + partition number: a replicated partition's metadata


def _tail(key: str, prefix: str, what: str) -> str:
    if not isinstance(key, str) or not key.startswith(prefix) or len(key) == len(prefix):
        raise InvalidMetadataRequest(f"metadata key {key!r} is not a {what} key ({prefix}<...>)")
    return key[len(prefix):]


def relation_key(name: str) -> str:
    return RELATIONS + name


def relation_name(key: str) -> str:
    return _tail(key, RELATIONS, "catalog entry")


def trace_key(relation_id: int) -> str:
    return f"{TRACES}{relation_id:016x}"


def trace_relation_id(key: str) -> int:
    tail = _tail(key, TRACES, "trace state")
    if len(tail) != 16 or tail != tail.lower():
        raise InvalidMetadataRequest(f"metadata key {key!r}: a trace state key ends in 16 lower-case hex digits")
    try:
        return int(tail, 16)
    except ValueError:
        raise InvalidMetadataRequest(f"metadata key {key!r}: {tail!r} is not hexadecimal") from None


def partition_key(partition: int) -> str:
    return f"{PARTITIONS}{partition}"


def partition_of(key: str) -> int:
    tail = _tail(key, PARTITIONS, "partition")
    if not tail.isdigit() or str(int(tail)) != tail:
        raise InvalidMetadataRequest(f"metadata key {key!r}: a partition key ends in a decimal number")
    return int(tail)
