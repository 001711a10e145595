"""Schema evolution through the server (a network client) and the CLI: the same alter, the
same refusals, the schema version in `relation list`."""

from __future__ import annotations

import pyarrow as pa
import pytest

import sediment
from sediment.cli import main
from sediment.errors import SchemaChangeRefused
from sediment.server import SedimentFlightServer

TOKEN = "schema-remote-token"


@pytest.fixture
def client(tmp_path):
    engine = sediment.open(str(tmp_path / "data"), compact_interval=None)
    server = SedimentFlightServer(engine, "grpc://127.0.0.1:0", TOKEN)
    c = sediment.connect(server.uri, token=TOKEN)
    yield c
    c.close()
    server.stop()
    engine.close()


def test_alter_through_the_client(client):
    client.add_relation("r", pa.schema([("id", pa.int32()), ("item", pa.string()), ("note", pa.string())]))
    client.append("r", pa.table({"id": pa.array([1], pa.int32()), "item": ["a"], "note": ["x"], "time": [1],
                                 "diff": [1]}))
    version = client.alter_relation("r", add=[pa.field("qty", pa.int32()), pa.field("at", pa.timestamp("us"))],
                                    defaults={"qty": 3}, widen={"id": pa.int64()}, rename={"item": "product"},
                                    drop=["note"])
    assert version == 1 == client.schema_version("r")
    assert client.schema("r") == pa.schema([("id", pa.int64()), ("product", pa.string()), ("qty", pa.int32()),
                                            ("at", pa.timestamp("us"))])
    client.append("r", pa.table({"id": [2], "product": ["b"], "time": [2], "diff": [1]}))
    client.seal("r", 2)
    assert client.snapshot("r", 2).to_pylist() == [
        {"id": 1, "product": "a", "qty": 3, "at": None, "diff": 1},
        {"id": 2, "product": "b", "qty": 3, "at": None, "diff": 1}]


def test_refusals_come_back_typed_and_change_nothing(client):
    client.add_relation("r", pa.schema([("id", pa.int64())]))
    with pytest.raises(SchemaChangeRefused, match="'id'.*widen only"):
        client.alter_relation("r", widen={"id": pa.int32()})
    with pytest.raises(SchemaChangeRefused, match="'q'.*default of the column's type"):
        client.alter_relation("r", add=[pa.field("q", pa.int32())], defaults={"q": "seven"})
    for wrong in (5, {"k": 1}, [1, 2]):  # as the engine refuses them: not stored as the text "5"
        with pytest.raises(SchemaChangeRefused, match="'note'.*default of the column's type"):
            client.alter_relation("r", add=[pa.field("note", pa.string())], defaults={"note": wrong})
    assert client.schema_version("r") == 0 and client.schema("r") == pa.schema([("id", pa.int64())])
    with pytest.raises(SchemaChangeRefused, match="'q'.*non-null default"):  # a null default travels as one
        client.alter_relation("r", add=[pa.field("q", pa.int32(), nullable=False)], defaults={"q": None})
    assert client.alter_relation("r", rename={"id": "id"}, widen={"id": pa.int64()}) == 0  # no change
    assert client.schema_version("r") == 0


def test_a_defaults_stream_of_other_than_one_row_is_invalid_argument(client):
    from sediment.arrow_codec import table_to_text
    from sediment.errors import InvalidArgument
    from sediment.net.alter_wire import encode_alter
    from sediment.net.messages import Action

    client.add_relation("r", pa.schema([("id", pa.int64())]))
    doc = encode_alter(add=[pa.field("q", pa.int32())])
    doc["defaults"] = table_to_text(pa.table({"q": pa.array([], pa.int32())}))
    with pytest.raises(InvalidArgument, match="one row, not 0"):
        client._action(Action.ALTER_RELATION, name="r", **doc)
    assert client.schema_version("r") == 0


def _run(capsys, data_dir, *argv):
    rc = main(["--data-dir", str(data_dir), *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_relation_alter_and_list(tmp_path, capsys):
    d = tmp_path / "data"
    assert _run(capsys, d, "relation", "add", "orders", "--schema", "id:int32,item:string,note:string")[0] == 0
    rc, out, err = _run(capsys, d, "relation", "alter", "orders", "--add", "qty:int32", "--default", "qty=5",
                        "--widen", "id:int64", "--rename", "item=product", "--drop", "note")
    assert rc == 0, err
    assert out.strip() == "altered relation orders: schema version 1 (id:int64,product:string,qty:int32)"
    rc, out, _ = _run(capsys, d, "relation", "list")
    assert out.splitlines() == ["orders\tid:int64,product:string,qty:int32\tsince=0\tsealed=-1\tschema_version=1"]
    with sediment.open(str(d)) as e:  # the --default text became the column's value for rows without it
        e.append("orders", pa.table({"id": [1], "product": ["a"], "time": [1], "diff": [1]}))
        e.seal("orders", 1)
        assert e.snapshot("orders", 1).column("qty").to_pylist() == [5]


def test_cli_alter_that_changes_nothing_says_so(tmp_path, capsys):
    d = tmp_path / "data"
    assert _run(capsys, d, "relation", "add", "orders", "--schema", "id:int32,item:string")[0] == 0
    rc, out, err = _run(capsys, d, "relation", "alter", "orders", "--rename", "item=item", "--widen", "id:int32")
    assert rc == 0, err
    assert out.strip() == "nothing to change in relation orders: schema version 0 (id:int32,item:string)"
    rc, out, _ = _run(capsys, d, "relation", "list")
    assert out.splitlines() == ["orders\tid:int32,item:string\tsince=0\tsealed=-1\tschema_version=0"]


@pytest.mark.parametrize(("argv", "code", "words"), [
    (["--widen", "id:int8"], 1, ["'id'", "widen only", "nothing was changed"]),
    (["--drop", "id", "--drop", "item"], 1, ["keep one column"]),
    (["--rename", "item"], 2, ["--rename takes NAME=VALUE"]),
    ([], 2, ["at least one of"]),
    (["--add", "qty:notatype"], 2, ["--add/--widen"]),
    # a column named twice was resolved silently, the last one winning
    (["--rename", "item=a", "--rename", "item=b"], 2, ["--rename names column 'item' twice"]),
    (["--add", "qty:int32", "--default", "qty=1", "--default", "qty=2"], 2, ["--default names column 'qty' twice"]),
    (["--widen", "id:int64", "--widen", "id:int32"], 2, ["--widen names column 'id' twice"]),
])
def test_cli_refused_alter_is_one_line_and_changes_nothing(tmp_path, capsys, argv, code, words):
    d = tmp_path / "data"
    assert _run(capsys, d, "relation", "add", "orders", "--schema", "id:int32,item:string")[0] == 0
    rc, _out, err = _run(capsys, d, "relation", "alter", "orders", *argv)
    assert rc == code, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    for w in words:
        assert w in err
    rc, out, _ = _run(capsys, d, "relation", "list")
    assert out.splitlines() == ["orders\tid:int32,item:string\tsince=0\tsealed=-1\tschema_version=0"]


def test_remote_feed_delivers_the_schema_change_and_goes_on(client):
    client.add_relation("r", pa.schema([("k", pa.int64())]))
    sub = client.subscribe("r")
    assert sub.next(10).kind == "snapshot"
    client.append("r", pa.table({"k": [1], "time": [1], "diff": [1]}))
    client.seal("r", 1)
    client.alter_relation("r", add=[pa.field("n", pa.int64())])
    client.append("r", pa.table({"k": [2], "n": [5], "time": [2], "diff": [1]}))
    kinds = [sub.next(10) for _ in range(4)]
    assert [e.kind for e in kinds] == ["updates", "progress", "schema", "updates"] and kinds[2].time == 1
    assert kinds[3].table.to_pylist() == [{"k": 2, "n": 5, "time": 2, "diff": 1}]
    sub.close()
    again = client.subscribe("r", 1, resume=True)  # the resume protocol still gives the same after progress 1
    got = again.next(10)
    assert got.kind == "updates" and got.table.to_pylist() == [{"k": 2, "n": 5, "time": 2, "diff": 1}]
    again.close()


def test_cli_tail_prints_the_schema_change_in_order(tmp_path):
    from sediment.cli import commands

    with sediment.open(str(tmp_path / "data"), compact_interval=None) as e:
        e.add_relation("r", pa.schema([("k", pa.int64()), ("v", pa.string())]))
        sub = e.subscribe("r")
        assert sub.next(5).kind == "snapshot"
        e.append("r", pa.table({"k": [1], "v": ["a"], "time": [1], "diff": [1]}))
        e.alter_relation("r", rename={"v": "w"}, add=[pa.field("n", pa.int64())])
        e.append("r", pa.table({"k": [2], "w": ["b"], "n": [3], "time": [2], "diff": [1]}))
        rows, names = [], ["k", "v"]
        for _ in range(3):  # what cmd_tail does with each event
            event = sub.next(5)
            if event.kind == "schema":
                names = [n for n in event.table.column_names if n not in ("time", "diff")]
            rows += list(commands._tail_rows(event, names, "r"))
        sub.close()  # values as the CSV text `sediment read` prints
    assert rows == [["update", "1", "1", "a", "1"], ["schema", 1, "k", "w", "n", "diff"],
                    ["update", "2", "2", "b", "3", "1"]]


def test_describe_on_the_engine_the_client_and_the_cli(tmp_path, capsys):
    import decimal
    import json

    engine = sediment.open(str(tmp_path / "data"), compact_interval=None)
    server = SedimentFlightServer(engine, "grpc://127.0.0.1:0", TOKEN)
    client = sediment.connect(server.uri, token=TOKEN)
    try:
        engine.add_relation("r", pa.schema([("id", pa.int32()), ("note", pa.string())]))
        engine.alter_relation("r", add=[pa.field("d", pa.decimal128(5, 2))], defaults={"d": decimal.Decimal("1.50")},
                              widen={"id": pa.int64()}, drop=["note"])
        want = {"name": "r", "id": 1, "schema": "id:int64,d:decimal128(5,2)", "schema_version": 1,
                "columns": [{"name": "id", "type": "int64", "field_id": 1, "default": None, "required": True},
                            {"name": "d", "type": "decimal128(5,2)", "field_id": 3, "default": "1.50",
                             "required": False}],
                "since": 0, "sealed": -1}
        assert engine.describe("r") == want
        assert client.describe("r") == want
    finally:
        client.close()
        server.stop()
        engine.close()
    assert main(["--data-dir", str(tmp_path / "data"), "relation", "describe", "r"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "r\tid:int64,d:decimal128(5,2)\tschema_version=1\tsince=0\tsealed=-1",
        "  id\tint64\tfield_id=1\trequired", "  d\tdecimal128(5,2)\tfield_id=3\tdefault=1.50"]
    assert main(["--data-dir", str(tmp_path / "data"), "relation", "describe", "r", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == want


def _altered(run_cli) -> None:
    assert run_cli("relation", "add", "r", "--schema", "id:int64,name:string")[0] == 0
    assert run_cli("relation", "alter", "r", "--add", "qty:int32", "--default", "qty=7", "--add", "note:string")[0] == 0


@pytest.mark.parametrize("where", ["data-dir", "connect"])
def test_cli_append_may_leave_out_columns_an_alter_added(tmp_path, capsys, where):
    """As Engine.append does, a file without the columns an alter added gets their default
    (null without one); `sediment append` refused it (SchemaMismatch: missing ['qty', 'note'])."""
    import pyarrow.parquet as pq

    engine = server = None
    if where == "connect":
        engine = sediment.open(str(tmp_path / "served"), compact_interval=None)
        server = SedimentFlightServer(engine, "grpc://127.0.0.1:0", TOKEN)
        target = ["--connect", server.uri, "--token", TOKEN]
    else:
        target = ["--data-dir", str(tmp_path / "data")]

    def run_cli(*argv):
        rc = main([*target, *argv])
        out, err = capsys.readouterr()
        return rc, out, err

    try:
        _altered(run_cli)
        lacking_both = tmp_path / "a.csv"
        lacking_both.write_text("id,name,time,diff\n" + "".join(f"{i},n{i:03d},1,1\n" for i in range(200)))
        rc, out, err = run_cli("append", "r", str(lacking_both), "--chunk-bytes", "512")  # several chunks
        assert rc == 0, err
        assert out.strip() == f"appended 200 rows to r from {lacking_both} (times 1..1)"
        lacking_note = tmp_path / "b.parquet"
        pq.write_table(pa.table({"id": [500], "name": ["x"], "qty": pa.array([None], pa.int32()), "time": [2],
                                 "diff": [1]}), lacking_note)
        rc, _out, err = run_cli("append", "r", str(lacking_note))
        assert rc == 0, err
        assert run_cli("seal", "r", "2")[0] == 0
        rc, out, err = run_cli("read", "r", "--as-of", "2")
        assert rc == 0, err
        lines = out.splitlines()
        assert lines[0] == '"id","name","qty","note","diff"' and len(lines) == 202
        assert lines[1] == '0,"n000",7,,1' and lines[-1] == '500,"x",,,1'
        assert all(line.split(",")[2:] == ["7", "", "1"] for line in lines[1:-1])
    finally:
        if server is not None:
            server.stop()
            engine.close()


def test_cli_append_without_a_first_column_names_what_may_be_left_out(tmp_path, capsys):
    d = tmp_path / "data"

    def run_cli(*argv):
        return _run(capsys, d, *argv)

    _altered(run_cli)
    src = tmp_path / "c.csv"
    src.write_text("id,time,diff\n1,1,1\n")
    rc, out, err = run_cli("append", "r", str(src))
    assert rc == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "missing ['name']" in err and "['note', 'qty'] may be left out" in err and str(src) in err
    with sediment.open(str(d)) as e:
        assert sum(b.num_rows for b in e.replay("r")) == 0
