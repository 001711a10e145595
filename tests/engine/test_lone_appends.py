"""A lone writer's short path (engine/writer.py ``_append_lone``): a table of 1-16 rows that
is already in the relation's update schema is checked, encoded and submitted in one step;
anything else goes the full way. These tests change what the path reads each time (the
relation's schema version, the relation itself) between appends, and hand it tables whose
schema is equal, equal-looking or different, and check which path took each append, what
was stored, and that every refusal is typed and changes nothing."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

import sediment
from sediment.clock import ManualClock
from sediment.engine import writer as writer_module
from sediment.wal.group_commit import GroupAppend

SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.binary())])


def _rows(ids: list[int], t: int = 1, *, schema: pa.Schema | None = None, **extra: list) -> pa.Table:
    columns = {"id": pa.array(ids, pa.int64()), "payload": pa.array([b"p%d" % k for k in ids], pa.binary()),
               **{name: pa.array(values) for name, values in extra.items()},
               "time": pa.array([t] * len(ids), pa.int64()), "diff": pa.array([1] * len(ids), pa.int64())}
    table = pa.table(columns)
    return table if schema is None else table.cast(schema)


@pytest.fixture
def short_path(monkeypatch):
    """The bounds the short path's check returned, in order (None: it sent the append on)."""
    seen: list = []
    real = writer_module.BodyBounds.bounds

    def spy(self, body, table: pa.Table):
        got = real(self, body, table)
        seen.append(got)
        return got

    monkeypatch.setattr(writer_module.BodyBounds, "bounds", spy)
    return seen


def _stored(engine, name: str, t: int) -> list[tuple]:
    got = engine.snapshot(name, as_of=t).sort_by("id")
    return list(zip(*(got.column(c).to_pylist() for c in got.column_names if c != "diff"), strict=True))


def test_equal_schemas_from_other_objects_take_the_short_path_and_read_back(tmp_path, short_path):
    """A table built with a schema object of its own (equal to the relation's, with or without
    schema metadata) takes the short path; what it stores reads back whole, visible on return."""
    with sediment.open(tmp_path / "d", clock=ManualClock()) as engine:
        engine.add_relation("r", SCHEMA)
        own = pa.schema([("id", pa.int64()), ("payload", pa.binary()), ("time", pa.int64()), ("diff", pa.int64())])
        engine.append("r", _rows([1, 2], schema=own))
        engine.append("r", _rows([3], schema=own.with_metadata({"from": "a client"})))
        engine.append("r", _rows(list(range(4, 20))))  # 16 rows: the most the short path takes
        assert short_path == [(1, 1)] * 3
        assert engine.stats()["relations"]["r"]["tail_records"] == 3
        engine.seal("r", 1)
        assert [k for k, _p in _stored(engine, "r", 1)] == list(range(1, 20))


def test_equal_looking_schemas_go_the_full_way_and_are_stored_in_the_relation_s_types(tmp_path, short_path):
    """Tables whose columns have the relation's names but not exactly its update schema
    (narrower integers, large binary, a non-nullable field, another column order, 17 rows)
    are converted by the full path without reaching the short path's check, a time column in
    two chunks is sent on before it, and what is stored is in the relation's types."""
    with sediment.open(tmp_path / "d", clock=ManualClock()) as engine:
        engine.add_relation("r", SCHEMA)
        schemas = [
            pa.schema([("id", pa.int32()), ("payload", pa.binary()), ("time", pa.int64()), ("diff", pa.int64())]),
            pa.schema([("id", pa.int64()), ("payload", pa.large_binary()), ("time", pa.int64()),
                       ("diff", pa.int64())]),
            pa.schema([("id", pa.int64()), ("payload", pa.binary()), ("time", pa.int32()), ("diff", pa.int64())]),
            pa.schema([pa.field("id", pa.int64(), nullable=False), ("payload", pa.binary()), ("time", pa.int64()),
                       ("diff", pa.int64())]),
        ]
        for k, schema in enumerate(schemas):
            engine.append("r", _rows([10 + k], schema=schema))
        engine.append("r", _rows([14]).select(["payload", "id", "diff", "time"]))
        seventeen = _rows(list(range(100, 117)))
        engine.append("r", seventeen)
        two_chunks = pa.Table.from_batches(_rows([200, 201]).to_batches(max_chunksize=1))
        engine.append("r", two_chunks)
        assert short_path == []  # the time column's two chunks: two batches, sent on before the check
        engine.seal("r", 1)
        got = engine.snapshot("r", as_of=1)
        assert got.schema.field("id").type == pa.int64() and got.schema.field("payload").type == pa.binary()
        assert sorted(got.column("id").to_pylist()) == [10, 11, 12, 13, 14, *range(100, 117), 200, 201]


def test_an_alter_between_lone_appends_is_seen_by_the_next_one(tmp_path, short_path):
    """After an alter adds a column, the next append in the new schema takes the short path
    under the new version; one in the old schema goes the full way (the new column gets its
    default); both read back, also after a reopen."""
    with sediment.open(tmp_path / "d", clock=ManualClock()) as engine:
        engine.add_relation("r", SCHEMA)
        engine.append("r", _rows([1]))
        version = engine.alter_relation("r", add=[pa.field("note", pa.string())], defaults={"note": "none"})
        engine.append("r", _rows([2], note=["two"]))
        engine.append("r", _rows([3]))  # the old columns: filled in by the full path
        assert short_path == [(1, 1), (1, 1)]
        assert engine.schema_version("r") == version
    with sediment.open(tmp_path / "d", clock=ManualClock()) as engine:
        engine.seal("r", 1)
        assert _stored(engine, "r", 1) == [(1, b"p1", "none"), (2, b"p2", "two"), (3, b"p3", "none")]


def test_a_relation_dropped_and_created_again_under_its_name_gets_its_own_appends(tmp_path, short_path):
    """The short path finds the relation by name on every append: after a drop and an add of
    the same name with another schema, a table in the new schema lands in the new relation,
    and one in the old schema is refused (SchemaMismatch) with nothing written."""
    with sediment.open(tmp_path / "d", clock=ManualClock()) as engine:
        engine.add_relation("r", SCHEMA)
        engine.append("r", _rows([1]))
        engine.drop_relation("r")
        engine.add_relation("r", pa.schema([("id", pa.int64()), ("score", pa.float64())]))
        table = pa.table({"id": pa.array([7], pa.int64()), "score": pa.array([0.5]),
                          "time": pa.array([2], pa.int64()), "diff": pa.array([1], pa.int64())})
        engine.append("r", table)
        with pytest.raises(sediment.errors.SchemaMismatch):
            engine.append("r", _rows([8], t=2))
        assert short_path == [(1, 1), (2, 2)]
        assert engine.stats()["relations"]["r"]["tail_records"] == 1
        engine.seal("r", 2)
        assert _stored(engine, "r", 2) == [(7, 0.5)]


@pytest.mark.parametrize("case", ["negative time", "null time", "null diff", "sealed time", "unknown relation",
                                  "not a table", "closed"])
def test_bad_lone_appends_are_typed_refusals_that_change_nothing(tmp_path, short_path, case):
    """Every refusal of a one-row append by a lone writer is the full path's typed error, and
    nothing reaches the log: its end LSN, the relation's tail and a subscriber's feed stay as
    they were, and the next good append goes through."""
    errors = sediment.errors
    good = _rows([1], t=5)
    tables = {"negative time": (_rows([2], t=-1), errors.InvalidUpdates),
              "null time": (good.set_column(2, "time", pa.array([None], pa.int64())), errors.InvalidUpdates),
              "null diff": (good.set_column(3, "diff", pa.array([None], pa.int64())), errors.InvalidUpdates),
              "sealed time": (_rows([2], t=3), errors.TimeAlreadySealed),
              "unknown relation": (good, errors.UnknownRelation),
              "not a table": ({"id": [1]}, errors.InvalidUpdates),
              "closed": (good, errors.EngineClosed)}
    table, error = tables[case]
    engine = sediment.open(tmp_path / "d", clock=ManualClock())
    try:
        engine.add_relation("r", SCHEMA)
        engine.seal("r", 3)
        end = engine.wal.end_lsn
        with engine.subscribe("r") as feed:
            assert feed.next(timeout=10).kind == "snapshot"
            if case == "closed":
                engine.close()
            with pytest.raises(error):
                engine.append("nope" if case == "unknown relation" else "r", table)
            if case == "closed":
                return
            assert engine.wal.end_lsn == end
            assert engine.stats()["relations"]["r"]["tail_records"] == 0
            assert feed.next(timeout=0.05) is None
            engine.append("r", good)
            assert feed.next(timeout=10).table.column("id").to_pylist() == [1]
        assert short_path[-1] == (5, 5)
    finally:
        engine.close()


def test_lone_appends_leave_the_state_a_reopen_rebuilds(tmp_path):
    """``on_durable``'s one-record path (inline tail entry, backlog, greatest time, counters,
    feed) leaves for lone appends to two relations, one with a subscriber and one altered
    halfway, exactly the tail
    entries, backlog and greatest time that an open's replay of the same log builds; the
    subscriber gets every append in order and the counters count every append and row."""
    rows = [(name, k, t) for k, (name, t) in enumerate((("r" if i % 3 else "s"), 1 + i // 2) for i in range(40))]
    with sediment.open(tmp_path / "d", clock=ManualClock(), compact_interval=None) as engine:
        engine.add_relation("r", SCHEMA)
        engine.add_relation("s", SCHEMA)
        with engine.subscribe("s") as feed:
            assert feed.next(timeout=10).kind == "snapshot"
            for name, k, t in rows:
                ids = list(range(k, k + 1 + k % 16))
                if k == 20:  # later entries of r carry its schema version 1
                    engine.alter_relation("r", add=[pa.field("note", pa.string())], defaults={"note": "none"})
                extra = {"note": ["n"] * len(ids)} if name == "r" and k >= 20 else {}
                engine.append(name, _rows(ids, t=t, **extra))
            want = [i for name, k, _t in rows if name == "s" for i in range(k, k + 1 + k % 16)]
            got: list[int] = []
            while len(got) < len(want):
                event = feed.next(timeout=10)
                assert event is not None and event.kind == "updates"
                got += event.table.column("id").to_pylist()
        assert got == want
        view = engine.view
        live = ({n: list(view.relations[n].tail) for n in ("r", "s")}, view.backlog.bytes, view.max_time)
        assert view.lone_groups == len(rows)
        counters = {n: (view.relations[n].counters.appends.value, view.relations[n].counters.rows.value)
                    for n in ("r", "s")}
        assert counters == {n: (sum(1 for m, _k, _t in rows if m == n), sum(1 + k % 16 for m, k, _t in rows if m == n))
                            for n in ("r", "s")}
    with sediment.open(tmp_path / "d", clock=ManualClock(), compact_interval=None) as engine:
        view = engine.view
        assert ({n: list(view.relations[n].tail) for n in ("r", "s")}, view.backlog.bytes, view.max_time) == live
    assert {e.schema_version for e in live[0]["r"]} == {0, 1}
    assert [len(entries) for entries in live[0].values()] == [sum(1 for m, _k, _t in rows if m == n) for n in "rs"]


def test_a_lone_writer_leads_the_idle_log_itself_with_no_queue_entry(tmp_path, monkeypatch):
    """A lone writer's append takes the idle log's lead under the engine lock and writes its
    record on its own thread: no ``GroupAppend`` (queue entry and ticket) is made for it,
    and every append is durable, in order, across a reopen."""
    made: list[int] = []
    real = GroupAppend.__init__

    def counting(self, *args, **kwargs) -> None:  # noqa: ANN001
        made.append(1)
        real(self, *args, **kwargs)

    with sediment.open(tmp_path / "d", clock=ManualClock(), compact_interval=None) as engine:
        engine.add_relation("r", SCHEMA)
        engine.append("r", _rows([0]))
        monkeypatch.setattr(GroupAppend, "__init__", counting)
        for k in range(1, 200):
            engine.append("r", _rows([k], t=1 + k // 50))
        monkeypatch.setattr(GroupAppend, "__init__", real)
        assert made == [], f"{len(made)} of 199 lone appends were queued"
        engine.seal("r", 10)
    with sediment.open(tmp_path / "d", clock=ManualClock(), compact_interval=None) as engine:
        assert [k for k, _p in _stored(engine, "r", 10)] == list(range(200))


def _within(seconds: float, call) -> bool:  # noqa: ANN001
    """Whether ``call()`` returned within ``seconds`` (run on a daemon thread, so a call that
    hangs fails the test instead of hanging it)."""
    done = threading.Event()
    threading.Thread(target=lambda: (call(), done.set()), daemon=True).start()
    return done.wait(seconds)


def test_ctrl_c_between_the_lead_and_the_write_gives_the_lead_back(tmp_path):
    """KeyboardInterrupt raised after a lone append took the idle log's lead and before its
    write began (where Ctrl-C may land on the main thread) writes nothing and keeps no lead:
    the next append and the close return, and a reopen holds exactly the appends that
    returned."""
    engine = sediment.open(tmp_path / "d", clock=ManualClock(), compact_interval=None)
    engine.add_relation("r", SCHEMA)
    engine.append("r", _rows([1]))
    writer = engine.writer  # the interrupt lands on this writer's call
    real = writer._write_lone  # noqa: SLF001

    def interrupted(*args, **kwargs) -> None:  # noqa: ANN002, ANN003
        raise KeyboardInterrupt

    writer._write_lone = interrupted  # noqa: SLF001
    with pytest.raises(KeyboardInterrupt):
        engine.append("r", _rows([2]))
    writer._write_lone = real  # noqa: SLF001
    assert _within(30, lambda: engine.append("r", _rows([3]))), "the next append waited on a lead never given back"
    engine.seal("r", 1)
    assert _within(30, engine.close), "close waited on a lead never given back"
    with sediment.open(tmp_path / "d", clock=ManualClock(), compact_interval=None) as engine:
        assert [k for k, _p in _stored(engine, "r", 1)] == [1, 3]
