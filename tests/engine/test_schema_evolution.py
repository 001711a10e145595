"""alter_relation end to end on a real engine: reads by field id across versions, in the WAL
tail and in batches, after reopening; consolidation across versions; appends that leave out
added columns; what the WAL records and batches say; feeds; refusals that change nothing."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import sediment
from sediment.engine.feed import PROGRESS, SCHEMA, SNAPSHOT, UPDATES
from sediment.errors import SchemaChangeRefused, SchemaMismatch
from sediment.metadata import names
from sediment.trace.evolve import VERSION_KEY, field_id
from sediment.wal.record import RecordKind

SCHEMA0 = pa.schema([("id", pa.int32()), ("item", pa.string()), ("note", pa.string())])


def _rows(**cols):
    return pa.table(cols)


def _old(ids, items, notes, t, diff=1):
    n = len(ids)
    return pa.table({"id": pa.array(ids, pa.int32()), "item": items, "note": notes, "time": [t] * n,
                     "diff": [diff] * n})


@pytest.fixture
def engine(tmp_path):
    opened = []

    def _open():
        e = sediment.open(str(tmp_path / "data"), compact_interval=None)
        opened.append(e)
        return e

    yield _open
    for e in opened:
        e.close()


def _snap(e, name, t):
    return e.snapshot(name, t).to_pylist()


def test_alter_reads_old_rows_by_field_id_in_batches_and_wal_tail(engine):
    e = engine()
    e.add_relation("r", SCHEMA0)
    e.append("r", _old([1, 2], ["a", "b"], ["x", "y"], 1))
    e.seal("r", 1)
    e.compact("r")  # these rows are now in a batch written under version 0
    e.append("r", _old([3], ["c"], ["z"], 2))  # this one stays in the WAL, version 0
    version = e.alter_relation("r", add=[pa.field("qty", pa.int32())], defaults={"qty": 7},
                               widen={"id": pa.int64()}, rename={"item": "product"}, drop=["note"])
    assert version == 1 == e.schema_version("r")
    assert e.schema("r") == pa.schema([("id", pa.int64()), ("product", pa.string()), ("qty", pa.int32())])
    e.append("r", _rows(id=[4], product=["d"], qty=pa.array([1], pa.int32()), time=[3], diff=[1]))
    e.seal("r", 3)
    want = [{"id": 1, "product": "a", "qty": 7, "diff": 1}, {"id": 2, "product": "b", "qty": 7, "diff": 1},
            {"id": 3, "product": "c", "qty": 7, "diff": 1}, {"id": 4, "product": "d", "qty": 1, "diff": 1}]
    got = e.snapshot("r", 3)
    assert got.to_pylist() == want
    assert got.schema.field("id").type == pa.int64()
    assert _snap(e, "r", 1) == want[:2]
    e.close()
    e = engine()  # replay of records written under two versions
    assert e.schema_version("r") == 1
    assert _snap(e, "r", 3) == want
    e.compact("r")
    assert _snap(e, "r", 3) == want
    replayed = pa.Table.from_batches(list(e.replay("r")))
    assert replayed.column_names == ["id", "product", "qty", "time", "diff"]
    assert replayed.column("qty").to_pylist() == [7, 7, 7, 1]


def test_dropped_column_is_not_resurrected_by_a_column_added_under_its_name(engine):
    e = engine()
    e.add_relation("r", SCHEMA0)
    e.append("r", _old([1], ["a"], ["secret"], 1))
    e.seal("r", 1)
    e.compact("r")
    e.append("r", _old([2], ["b"], ["secret2"], 2))
    e.alter_relation("r", drop=["note"])
    e.alter_relation("r", add=[pa.field("note", pa.string())])
    e.append("r", _rows(id=[3], item=["c"], note=["new"], time=[3], diff=[1]))
    e.seal("r", 3)
    assert [r["note"] for r in _snap(e, "r", 3)] == [None, None, "new"]
    e.compact("r")
    assert [r["note"] for r in _snap(e, "r", 3)] == [None, None, "new"]
    e.close()
    e = engine()
    assert [r["note"] for r in _snap(e, "r", 3)] == [None, None, "new"]


def test_retraction_after_an_add_cancels_the_insert_before_it(engine):
    e = engine()
    e.add_relation("r", pa.schema([("k", pa.int64())]))
    e.append("r", _rows(k=[1, 2], time=[1, 1], diff=[1, 1]))
    e.seal("r", 1)
    e.compact("r")
    e.append("r", _rows(k=[3], time=[2], diff=[1]))
    e.alter_relation("r", add=[pa.field("c", pa.string())], defaults={"c": "dflt"})
    e.append("r", _rows(k=[1, 3], c=["dflt", "dflt"], time=[3, 3], diff=[-1, -1]))
    e.seal("r", 3)
    assert _snap(e, "r", 3) == [{"k": 2, "c": "dflt", "diff": 1}]
    e.compact("r")
    assert _snap(e, "r", 3) == [{"k": 2, "c": "dflt", "diff": 1}]
    e.close()
    e = engine()
    assert _snap(e, "r", 3) == [{"k": 2, "c": "dflt", "diff": 1}]


def test_rows_differing_only_in_a_dropped_column_consolidate(engine):
    e = engine()
    e.add_relation("r", pa.schema([("a", pa.int64()), ("note", pa.string()), ("b", pa.int64())]))
    e.append("r", _rows(a=[1, 1, 1, 2], note=["x", "y", "z", "x"], b=[9, 9, 8, 9], time=[1] * 4, diff=[1] * 4))
    e.seal("r", 1)
    e.compact("r")
    e.append("r", _rows(a=[1], note=["w"], b=[9], time=[2], diff=[1]))
    e.alter_relation("r", drop=["note"])
    e.append("r", _rows(a=[1], b=[9], time=[3], diff=[-1]))
    e.seal("r", 3)
    want = [{"a": 1, "b": 8, "diff": 1}, {"a": 1, "b": 9, "diff": 2}, {"a": 2, "b": 9, "diff": 1}]
    assert _snap(e, "r", 3) == want
    assert _snap(e, "r", 1) == [{"a": 1, "b": 8, "diff": 1}, {"a": 1, "b": 9, "diff": 2}, {"a": 2, "b": 9, "diff": 1}]
    e.set_since("r", 3)
    e.compact("r")
    assert _snap(e, "r", 3) == want
    e.close()
    e = engine()
    assert _snap(e, "r", 3) == want


def test_appends_may_leave_out_added_columns_but_not_original_ones(engine):
    e = engine()
    e.add_relation("r", pa.schema([("k", pa.int64())]))
    e.alter_relation("r", add=[pa.field("n", pa.int32()), pa.field("d", pa.int64(), nullable=False)],
                     defaults={"d": -1})
    e.append("r", _rows(k=[1], time=[1], diff=[1]))
    e.append("r", _rows(k=[2], d=[5], time=[1], diff=[1]))
    e.seal("r", 1)
    assert _snap(e, "r", 1) == [{"k": 1, "n": None, "d": -1, "diff": 1}, {"k": 2, "n": None, "d": 5, "diff": 1}]
    with pytest.raises(SchemaMismatch, match="missing"):
        e.append("r", _rows(n=pa.array([1], pa.int32()), time=[2], diff=[1]))


def test_wal_records_and_batches_carry_the_schema_version_and_field_ids(engine):
    e = engine()
    e.add_relation("r", SCHEMA0)
    e.append("r", _old([1], ["a"], ["x"], 1))
    e.alter_relation("r", rename={"item": "product"}, add=[pa.field("qty", pa.int64())])
    e.append("r", _rows(id=pa.array([2], pa.int32()), product=["b"], note=["y"], time=[2], diff=[1]))
    versions = [r.schema_version for r in e.wal.scan() if r.kind == RecordKind.UPDATES]
    assert versions == [0, 1]
    e.seal("r", 2)
    e.compact("r")
    (ref,) = e.view.relations.get("r").trace.batches
    footer = pq.ParquetFile(e.storage.blobs.local_path(ref.key)).schema_arrow
    assert [field_id(f) for f in footer][:4] == [1, 2, 3, 4]
    assert footer.names[:4] == ["id", "product", "note", "qty"]
    assert footer.metadata[VERSION_KEY] == b"1"


def test_alter_is_durable_and_recorded_in_the_catalog_history(engine):
    e = engine()
    e.add_relation("r", SCHEMA0)
    e.alter_relation("r", widen={"id": pa.int64()})
    doc = json.loads(e.storage.meta.get(names.RELATIONS + "r").value)
    assert doc["version"] == 3 and doc["trace_state"] is True  # the alter kept the trace-state mark
    assert [v["version"] for v in doc["history"]["versions"]] == [0, 1]
    e.close()
    e = engine()
    assert e.schema("r").field("id").type == pa.int64()
    assert e.schema_version("r") == 1


def test_a_refused_alter_changes_nothing(engine):
    e = engine()
    e.add_relation("r", SCHEMA0)
    before = e.storage.meta.get(names.RELATIONS + "r")
    with pytest.raises(SchemaChangeRefused) as info:  # the add is fine, the widen is not: neither happens
        e.alter_relation("r", add=[pa.field("qty", pa.int32())], widen={"id": pa.int16()})
    assert info.value.column == "id" and info.value.rule == "widen only"
    after = e.storage.meta.get(names.RELATIONS + "r")
    assert (after.version, after.value) == (before.version, before.value)
    assert e.schema("r") == SCHEMA0 and e.schema_version("r") == 0
    e.append("r", _old([1], ["a"], ["x"], 1))  # still takes the old columns


@pytest.mark.parametrize("changes", [{}, {"rename": {"id": "id"}}, {"widen": {"id": pa.int32()}},
                                     {"rename": {"item": "item"}, "widen": {"note": pa.string()}}])
def test_an_alter_that_changes_nothing_makes_no_version(engine, changes):
    """A rename to the column's own name made schema version 1 (a catalog write and a
    feed's schema event for nothing); now it is no change, as an empty alter always was."""
    e = engine()
    e.add_relation("r", SCHEMA0)
    before = e.storage.meta.get(names.RELATIONS + "r")
    with e.subscribe("r") as feed:
        assert feed.next(timeout=10).kind == SNAPSHOT
        assert e.alter_relation("r", **changes) == 0
        e.append("r", _old([1], ["a"], ["x"], 1))
        assert feed.next(timeout=10).kind == UPDATES  # no schema event before it
    after = e.storage.meta.get(names.RELATIONS + "r")
    assert (after.version, after.value) == (before.version, before.value)
    assert e.schema_version("r") == 0 and e.describe("r")["schema_version"] == 0


def test_a_non_nullable_column_added_with_a_null_default_is_refused(engine):
    """It was accepted, and the rows written before it read null in a column declared not
    nullable."""
    e = engine()
    e.add_relation("r", SCHEMA0)
    e.append("r", _old([1], ["a"], ["x"], 1))
    before = e.storage.meta.get(names.RELATIONS + "r")
    with pytest.raises(SchemaChangeRefused) as info:
        e.alter_relation("r", add=[pa.field("qty", pa.int32(), nullable=False)], defaults={"qty": None})
    assert info.value.column == "qty" and info.value.rule == "nullable or default"
    assert "non-null default" in str(info.value) and "nothing was changed" in str(info.value)
    after = e.storage.meta.get(names.RELATIONS + "r")
    assert (after.version, after.value) == (before.version, before.value)
    assert e.alter_relation("r", add=[pa.field("qty", pa.int32(), nullable=False)], defaults={"qty": 0}) == 1
    e.seal("r", 1)
    assert _snap(e, "r", 1) == [{"id": 1, "item": "a", "note": "x", "qty": 0, "diff": 1}]


def test_feed_delivers_the_schema_change_in_order(engine):
    e = engine()
    e.add_relation("r", pa.schema([("k", pa.int64()), ("v", pa.string())]))
    sub = e.subscribe("r")
    assert sub.next(5).kind == SNAPSHOT
    e.append("r", _rows(k=[1], v=["a"], time=[1], diff=[1]))
    e.alter_relation("r", add=[pa.field("n", pa.int64())], rename={"v": "w"})
    e.append("r", _rows(k=[2], w=["b"], n=[5], time=[2], diff=[1]))
    e.seal("r", 2)
    events = [sub.next(5) for _ in range(4)]
    assert [ev.kind for ev in events] == [UPDATES, SCHEMA, UPDATES, PROGRESS]
    assert events[0].table.column_names == ["k", "v", "time", "diff"]
    assert events[1].time == 1 and events[1].table.column_names == ["k", "w", "n", "time", "diff"]
    assert events[2].table.to_pylist() == [{"k": 2, "w": "b", "n": 5, "time": 2, "diff": 1}]
    sub.close()


def test_readme_evolution_example_runs(tmp_path, monkeypatch):
    import pathlib

    text = (pathlib.Path(__file__).resolve().parent.parent.parent / "README.md").read_text()
    section = text[text.index("## Changing a relation's columns"):]
    code = section[section.index("```python") + len("```python"):]
    code = code[: code.index("```")]
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})  # noqa: S102 - the README's own example, asserts included
    assert (tmp_path / "evolve-data").is_dir()


def test_verify_accepts_batches_of_every_schema_version(engine, tmp_path):
    from sediment.engine.verify import verify_data_dir

    e = engine()
    e.add_relation("r", SCHEMA0)
    e.append("r", _old([1], ["a"], ["x"], 1))
    e.seal("r", 1)
    e.compact("r")  # a batch of version 0
    e.alter_relation("r", rename={"item": "product"}, widen={"id": pa.int64()})
    e.append("r", _rows(id=[2], product=["b"], note=["y"], time=[2], diff=[1]))
    e.close()  # the batch stays in version 0 while the relation is at version 1
    report = verify_data_dir(str(tmp_path / "data"))
    assert report.ok, report.problems


def test_recovered_tail_entries_keep_the_schema_version_of_their_records(tmp_path):
    """Every log's records come back with their schema version, through the file log's own
    recovery and through ``scan()`` (the device ring's and replicated log's path)."""
    from sediment.engine import log_replay

    for wal in (None, "device"):
        d = tmp_path / (wal or "file")
        options = {"compact_interval": None}
        if wal:
            options.update(wal=f"device:{d}-ring", wal_capacity=4 << 20)
        with sediment.open(str(d), **options) as e:
            e.add_relation("r", pa.schema([("k", pa.int64())]))
            e.append("r", _rows(k=[1], time=[1], diff=[1]))
            e.alter_relation("r", add=[pa.field("n", pa.int64())])
            e.append("r", _rows(k=[2], n=[3], time=[2], diff=[1]))
            heads = [log_replay.head_of(r) for r in e.wal.scan() if r.kind == RecordKind.UPDATES]
            assert [h.schema_version for h in heads] == [0, 1]
        with sediment.open(str(d), **options) as e:
            assert [t.schema_version for t in e.view.relations.get("r").tail] == [0, 1]


def test_reads_hand_out_plain_schemas_without_field_ids(engine):
    e = engine()
    e.add_relation("r", pa.schema([("k", pa.int64())]))
    e.append("r", _rows(k=[1], time=[1], diff=[1]))
    e.seal("r", 1)
    e.compact("r")
    for table in (e.snapshot("r", 1), pa.Table.from_batches(list(e.replay("r")))):
        assert table.schema.metadata is None
        assert all(f.metadata is None for f in table.schema)
