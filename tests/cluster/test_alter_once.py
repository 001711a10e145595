"""cluster/alter_once.py: an alter sent from a schema version lands once; a retry of one that
landed answers its version, and one whose version another alter took is refused (nothing
changed). The histories are the engine's own (engine/schema_rules.py evolve)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sediment.cluster.alter_once import at_version, check_base
from sediment.engine.schema_history import SchemaHistory
from sediment.engine.schema_rules import evolve
from sediment.errors import SchemaVersionMoved

V0 = SchemaHistory.initial(pa.schema([("k", pa.int64()), ("v", pa.string())]))
ADD_X = {"add": [pa.field("x", pa.int64())], "defaults": {"x": 7}}


def test_an_alter_at_its_base_is_applied():
    assert check_base("r", V0, 0, ADD_X) is None


def test_a_retry_of_an_alter_that_landed_answers_its_version_even_after_later_alters():
    v1 = evolve("r", V0, **ADD_X)
    v2 = evolve("r", v1, drop=["v"])
    assert check_base("r", v1, 0, ADD_X) == 1
    assert check_base("r", v2, 0, ADD_X) == 1


@pytest.mark.parametrize("other", [{"add": [pa.field("y", pa.int64())]},
                                   {"add": [pa.field("x", pa.int64())], "defaults": {"x": 8}},
                                   {"drop": ["v"]}])
def test_an_alter_whose_version_another_took_is_refused(other):
    v1 = evolve("r", V0, **other)
    with pytest.raises(SchemaVersionMoved, match="schema version 1, not 0"):
        check_base("r", v1, 0, ADD_X)
    with pytest.raises(SchemaVersionMoved):
        check_base("r", v1, 3, ADD_X)  # a base past the relation's version
    with pytest.raises(SchemaVersionMoved):  # valid only after the other alter: sent again from it
        check_base("r", evolve("r", V0, add=[pa.field("z", pa.int64())]), 0, {"rename": {"z": "w"}})


def test_the_history_at_a_version_keeps_field_ids_growing():
    v1 = evolve("r", V0, **ADD_X)
    v2 = evolve("r", v1, drop=["x"])
    assert at_version(v2, 1).next_field_id == v1.next_field_id and at_version(v2, 0).next_field_id == 3
    assert evolve("r", at_version(v2, 1), drop=["x"]).current.equals(v2.current, check_metadata=True)
