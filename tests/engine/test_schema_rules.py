"""The schema-change rules (engine/schema_rules.py), without an engine: every allowed and every
refused change, and the field ids and history each allowed one leaves."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sediment.engine.schema_history import SchemaHistory
from sediment.engine.schema_rules import evolve, is_widening
from sediment.errors import InvalidArgument, SchemaChangeRefused
from sediment.trace.evolve import field_id

BASE = pa.schema([("id", pa.int32()), ("item", pa.string()), ("note", pa.string()), ("price", pa.float32()),
                  ("amount", pa.decimal128(10, 2)), ("blob", pa.binary()), ("small", pa.int8())])


def _history() -> SchemaHistory:
    return SchemaHistory.initial(BASE)


ALLOWED_WIDENINGS = [
    (pa.int8(), pa.int16()), (pa.int16(), pa.int32()), (pa.int32(), pa.int64()), (pa.int8(), pa.int64()),
    (pa.float32(), pa.float64()), (pa.decimal128(10, 2), pa.decimal128(12, 2)),
    (pa.decimal128(30, 2), pa.decimal256(40, 2)), (pa.string(), pa.large_string()), (pa.binary(), pa.large_binary()),
]
REFUSED_WIDENINGS = [
    (pa.int64(), pa.int32()), (pa.int32(), pa.int32()), (pa.float64(), pa.float32()), (pa.int32(), pa.float64()),
    (pa.int32(), pa.string()), (pa.string(), pa.int64()), (pa.decimal128(10, 2), pa.decimal128(12, 3)),
    (pa.decimal128(10, 2), pa.decimal128(9, 2)), (pa.large_string(), pa.string()), (pa.binary(), pa.string()),
    (pa.uint8(), pa.int16()), (pa.timestamp("s"), pa.timestamp("ms")), (pa.bool_(), pa.int8()),
]


@pytest.mark.parametrize(("src", "dst"), ALLOWED_WIDENINGS)
def test_allowed_widenings(src, dst):
    assert is_widening(src, dst)


@pytest.mark.parametrize(("src", "dst"), REFUSED_WIDENINGS)
def test_refused_widenings(src, dst):
    assert not is_widening(src, dst)


def test_initial_history_numbers_columns_from_one():
    h = _history()
    assert h.version == 0
    assert [field_id(f) for f in h.current] == list(range(1, len(BASE) + 1))
    assert h.next_field_id == len(BASE) + 1


def test_every_allowed_change_in_one_alter():
    h = evolve("r", _history(), add=[pa.field("qty", pa.int32())], defaults={}, widen={"id": pa.int64()},
               rename={"item": "product"}, drop=["note"])
    assert h.version == 1
    assert h.plain() == pa.schema([("id", pa.int64()), ("product", pa.string()), ("price", pa.float32()),
                                   ("amount", pa.decimal128(10, 2)), ("blob", pa.binary()), ("small", pa.int8()),
                                   ("qty", pa.int32())])
    ids = h.ids()
    assert ids["id"] == 1 and ids["product"] == 2 and ids["qty"] == len(BASE) + 1
    assert h.versions[0][1].names == BASE.names  # the old version is kept as it was


def test_added_column_with_a_default_may_be_non_nullable():
    h = evolve("r", _history(), add=[pa.field("qty", pa.int32(), nullable=False)], defaults={"qty": 5})
    assert h.defaults[h.ids()["qty"]].as_py() == 5


def test_field_ids_are_never_reused():
    h = evolve("r", _history(), drop=["note"])
    h = evolve("r", h, add=[pa.field("note", pa.string())])
    assert h.ids()["note"] not in {field_id(f) for f in BASE_IDS(h)}


def BASE_IDS(h):  # noqa: N802 - the fields of version 0
    return h.versions[0][1]


def test_rename_swap_is_allowed():
    h = evolve("r", _history(), rename={"item": "note", "note": "item"})
    assert h.ids()["note"] == 2 and h.ids()["item"] == 3


def test_drop_and_add_back_the_same_name_in_one_alter():
    h = evolve("r", _history(), drop=["note"], add=[pa.field("note", pa.int64())])
    assert h.ids()["note"] == len(BASE) + 1


def test_nothing_to_change_is_no_new_version():
    assert evolve("r", _history()) is None


@pytest.mark.parametrize("changes", [
    {"rename": {"item": "item"}}, {"widen": {"id": pa.int32()}}, {"widen": {"amount": pa.decimal128(10, 2)}},
    {"rename": {"item": "item", "note": "note"}, "widen": {"item": pa.string()}, "defaults": {}},
])
def test_changes_that_change_nothing_make_no_version(changes):
    """A rename to its own name made version 1 (same columns, same ids) and a widening to
    the same type was refused as not a widening; both are no change now, as an empty alter."""
    assert evolve("r", _history(), **changes) is None


def test_a_change_that_changes_nothing_beside_a_real_one_leaves_only_the_real_one():
    h = evolve("r", _history(), rename={"item": "item"}, widen={"id": pa.int32()}, add=[pa.field("q", pa.int8())])
    assert h.version == 1
    assert h.current.equals(pa.schema([*_history().current, h.current.field("q")]), check_metadata=True)


@pytest.mark.parametrize(("changes", "column", "rule"), [
    ({"add": [pa.field("qty", pa.int32(), nullable=False)]}, "qty", "nullable or default"),
    ({"add": [pa.field("qty", pa.int32(), nullable=False)], "defaults": {"qty": None}}, "qty",
     "nullable or default"),  # older rows would read null in it
    ({"rename": {"note": "note"}, "drop": ["note"]}, "note", "drop or rename"),
    ({"add": [pa.field("item", pa.string())]}, "item", "name clash"),
    ({"add": [pa.field("time", pa.int64())]}, "time", "reserved name"),
    ({"add": [pa.field("l", pa.list_(pa.int32()))]}, "l", "supported type"),
    ({"add": [pa.field("q", pa.int32())], "defaults": {"q": "seven"}}, "q", "default of the column's type"),
    ({"defaults": {"id": 1}}, "id", "default for an added column"),
    ({"add": [pa.field("q", pa.int32())], "defaults": {"other": 1}}, "other", "default for an added column"),
    ({"widen": {"id": pa.int16()}}, "id", "widen only"),
    ({"widen": {"id": pa.string()}}, "id", "widen only"),
    ({"widen": {"price": pa.int64()}}, "price", "widen only"),
    ({"widen": {"ghost": pa.int64()}}, "ghost", "unknown column"),
    ({"rename": {"item": "note"}}, "note", "name clash"),
    ({"rename": {"item": "diff"}}, "diff", "reserved name"),
    ({"rename": {"item": ""}}, "item", "valid name"),
    ({"rename": {"ghost": "x"}}, "ghost", "unknown column"),
    ({"drop": ["ghost"]}, "ghost", "unknown column"),
    ({"drop": ["note"], "rename": {"note": "n2"}}, "note", "drop or rename"),
    ({"drop": list(BASE.names)}, BASE.names[-1], "keep one column"),
    ({"rename": {"item": "product"}, "add": [pa.field("product", pa.string())]}, "product", "name clash"),
])
def test_refused_changes_name_the_column_and_the_rule(changes, column, rule):
    before = _history()
    with pytest.raises(SchemaChangeRefused) as info:
        evolve("r", before, **changes)
    assert info.value.column == column
    assert info.value.rule == rule
    assert repr(column) in str(info.value) and rule in str(info.value)
    assert before.version == 0 and before.current.names == BASE.names  # the history is a value: unchanged


@pytest.mark.parametrize("changes", [
    {"add": ["qty:int32"]}, {"add": pa.field("q", pa.int32())}, {"widen": {"id": "int64"}},
    {"rename": {"item": 3}}, {"drop": "note"}, {"defaults": [1]},
])
def test_arguments_of_the_wrong_shape(changes):
    with pytest.raises(InvalidArgument):
        evolve("r", _history(), **changes)


def test_history_round_trips_through_json():
    h = evolve("r", _history(), add=[pa.field("qty", pa.int32())], defaults={"qty": 7}, widen={"id": pa.int64()})
    h = evolve("r", h, add=[pa.field("when", pa.timestamp("us"))], defaults={"when": 1_000_000},
               rename={"qty": "quantity"})
    back = SchemaHistory.from_json(h.to_json())
    assert back.version == h.version == 2 and back.next_field_id == h.next_field_id
    assert [(v, s) for v, s in back.versions] == [(v, s) for v, s in h.versions]
    assert all(field_id(a) == field_id(b) for (_v, s1), (_w, s2) in zip(back.versions, h.versions, strict=True)
               for a, b in zip(s1, s2, strict=True))
    assert {k: v.as_py() for k, v in back.defaults.items()} == {k: v.as_py() for k, v in h.defaults.items()}
