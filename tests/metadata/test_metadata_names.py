"""Metadata keys come from one module (metadata/names.py): format/parse pairs round-trip,
ids sort as text in id order, bad keys are refused, and every key a working engine writes
is one that module names."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

import sediment
from sediment.errors import InvalidMetadataRequest
from sediment.metadata import names


def test_pairs_round_trip_and_sort_in_id_order() -> None:
    ids = [0, 1, 9, 10, 15, 16, 255, 4096, 2**32, 2**63 - 1]
    keys = [names.trace_key(i) for i in ids]
    assert [names.trace_relation_id(k) for k in keys] == ids
    assert sorted(keys) == keys
    for p in (0, 1, 7, 12, 4_000_000):
        assert names.partition_of(names.partition_key(p)) == p
    for name in ("orders", "a.b-c_d", "x" * 200):
        assert names.relation_name(names.relation_key(name)) == name


@pytest.mark.parametrize("parse, key", [
    (names.trace_relation_id, "trace/12"),
    (names.trace_relation_id, "trace/000000000000000G"),
    (names.trace_relation_id, "trace/000000000000000A"),
    (names.trace_relation_id, "catalog/relations/0000000000000001"),
    (names.partition_of, "store/partition/"),
    (names.partition_of, "store/partition/07"),
    (names.partition_of, "store/partition/-1"),
    (names.relation_name, "catalog/relations/"),
])
def test_bad_keys_are_refused(parse, key: str) -> None:
    with pytest.raises(InvalidMetadataRequest, match="metadata key"):
        parse(key)


def test_every_key_an_engine_writes_is_named(tmp_path: Path) -> None:
    with sediment.open(tmp_path / "d") as eng:
        eng.add_relation("orders", pa.schema([("id", pa.int64())]))
        eng.add_relation("gone", pa.schema([("id", pa.int64())]))
        eng.append("orders", pa.table({"id": [1], "time": [1], "diff": [1]}))
        eng.seal("orders", 1)
        eng.compact()
        eng.drop_relation("gone")
        keys = eng.storage.meta.list("")
    fixed = {names.STORAGE, names.EPOCH, names.NEXT_RELATION_ID}
    assert fixed <= set(keys)
    rid = None
    for key in set(keys) - fixed:
        if key.startswith(names.TRACES):
            rid = names.trace_relation_id(key)
        else:
            assert names.relation_name(key) == "orders", key
    assert rid is not None, "the compacted relation's trace state"

