"""CLI polish for operators: help texts, logging, cluster keys, read --from."""

from __future__ import annotations

import argparse
import json
import uuid

import pytest

from sediment.cli import build_parser
from sediment.cli import main as cli_main


def _subparsers(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield name, sub
                for inner, subsub in _subparsers(sub):
                    yield f"{name} {inner}", subsub


def test_every_positional_argument_has_help_and_global_options_are_listed_once():
    parser = build_parser()
    top = parser.format_help()
    assert "--data-dir" in top and "--connect" in top and "--log-format" in top
    subs = dict(_subparsers(parser))
    assert {"read", "stats", "cluster-key", "relation add", "serve"} <= set(subs)
    for name, sub in subs.items():
        for action in sub._actions:
            if not action.option_strings and not isinstance(action, argparse._SubParsersAction):
                assert action.help, f"`sediment {name}`: positional {action.dest} has no help"
        if name != "storage-node":
            options = [o for a in sub._actions if a.help != argparse.SUPPRESS for o in a.option_strings]
            assert "--data-dir" not in options and "--log-level" not in options, f"`sediment {name}` repeats them"
    args = parser.parse_args(["read", "r", "--as-of", "1", "--data-dir", "/x", "--log-level", "debug"])
    assert args.data_dir == "/x" and args.log_level == "debug"  # still accepted after the command


def test_cluster_key_prints_a_new_uuid(capsys):
    keys = set()
    for _ in range(2):
        assert cli_main(["cluster-key"]) == 0
        keys.add(uuid.UUID(capsys.readouterr().out.strip()))
    assert len(keys) == 2


def test_json_logs_are_one_object_per_line(tmp_path, capsys):
    data = str(tmp_path / "d")
    assert cli_main(["--data-dir", data, "relation", "add", "r", "--schema", "id:int64"]) == 0
    capsys.readouterr()
    assert cli_main(["--data-dir", data, "--log-level", "info", "--log-format", "json", "compact"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert any(r["logger"].startswith("sediment.engine.") and "compaction pass" in r["message"] and r["level"] == "info"
               for r in lines)
    assert all({"time", "level", "logger", "message"} <= set(r) for r in lines)
    assert cli_main(["--data-dir", data, "--log-level", "error", "--no-progress", "compact"]) == 0
    assert capsys.readouterr().err == ""


def test_read_from_gives_the_changes_between_two_times(tmp_path, capsys):
    data = str(tmp_path / "d")
    csv = tmp_path / "u.csv"
    csv.write_text("id,time,diff\n1,1,1\n2,1,1\n2,2,-1\n3,2,2\n1,3,1\n")
    for argv in (["relation", "add", "r", "--schema", "id:int64"], ["append", "r", str(csv)], ["seal", "r", "3"]):
        assert cli_main(["--data-dir", data, *argv]) == 0
    capsys.readouterr()
    assert cli_main(["--data-dir", data, "read", "r", "--as-of", "3", "--from", "1"]) == 0
    assert capsys.readouterr().out.splitlines() == ['"id","diff"', "1,1", "2,-1", "3,2"]
    assert cli_main(["--data-dir", data, "read", "r", "--as-of", "2", "--from", "3"]) == 2


def test_read_of_bytes_csv_cannot_carry_points_to_parquet_before_printing_anything(tmp_path, capsys):
    """A binary column holding bytes that are not UTF-8 printed the CSV header, then only
    "Invalid UTF8 payload"; UTF-8 bytes still go to CSV, and Parquet takes any bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import sediment

    data = str(tmp_path / "d")
    with sediment.open(data) as engine:
        engine.add_relation("r", pa.schema([("id", pa.int64()), ("b", pa.binary())]))
        engine.append("r", pa.table({"id": [1], "b": [b"tea"], "time": [1], "diff": [1]}))
        engine.append("r", pa.table({"id": [2], "b": [b"\x00\xff"], "time": [2], "diff": [1]}))
        engine.seal("r", 2)
    assert cli_main(["--data-dir", data, "read", "r", "--as-of", "1"]) == 0
    assert capsys.readouterr().out.splitlines() == ['"id","b","diff"', '1,"tea",1']
    for out in ([], ["--out", str(tmp_path / "r.csv")]):
        assert cli_main(["--data-dir", data, "read", "r", "--as-of", "2", *out]) == 2
        got = capsys.readouterr()
        assert got.out == "" and got.err.count("\n") == 1, got
        assert "column 'b' of 'r' holds bytes that are not UTF-8" in got.err and "--out FILE.parquet" in got.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    assert cli_main(["--data-dir", data, "read", "r", "--as-of", "2", "--out", str(tmp_path / "r.parquet")]) == 0
    assert pq.read_table(tmp_path / "r.parquet").column("b").to_pylist() == [b"tea", b"\x00\xff"]


def test_tail_prints_each_value_as_read_does(tmp_path, capsys):
    """tail wrote Python's str() of each value: b'tea' for bytes, 0:00:01.500000 for a duration,
    True for a boolean, 0.10000000149011612 for a float32, none of which `sediment append` reads
    back as the value; now its fields are read's, so a tailed row can be appended again."""
    import csv
    import datetime

    import pyarrow as pa

    import sediment

    data = str(tmp_path / "d")
    schema = pa.schema([("b", pa.binary()), ("ts", pa.timestamp("us", tz="UTC")), ("du", pa.duration("ms")),
                        ("ok", pa.bool_()), ("f", pa.float32()), ("fb", pa.binary(2))])
    with sediment.open(data) as engine:
        engine.add_relation("r", schema)
        row = pa.table({"b": [b"tea"], "ts": pa.array([datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)],
                                                       schema.field("ts").type),
                        "du": pa.array([1500], pa.duration("ms")), "ok": [True], "f": pa.array([0.1], pa.float32()),
                        "fb": pa.array([b"ab"], pa.binary(2))}, schema=schema)
        engine.append("r", row.append_column("time", pa.array([1], pa.int64())).append_column(
            "diff", pa.array([1], pa.int64())))
        engine.seal("r", 1)
    assert cli_main(["--data-dir", data, "read", "r", "--as-of", "1"]) == 0
    read_row = list(csv.reader(capsys.readouterr().out.splitlines()))[1]
    assert cli_main(["--data-dir", data, "tail", "r", "--count", "1"]) == 0
    tailed = list(csv.reader(capsys.readouterr().out.splitlines()))[1]
    assert tailed[:2] == ["snapshot", "1"] and tailed[2:] == read_row, (tailed, read_row)
    back = tmp_path / "back.csv"
    back.write_text(",".join(schema.names) + ",time,diff\n" + ",".join(tailed[2:-1]) + ",2,-1\n")
    assert cli_main(["--data-dir", data, "append", "r", str(back)]) == 0
    assert cli_main(["--data-dir", data, "seal", "r", "2"]) == 0
    capsys.readouterr()
    assert cli_main(["--data-dir", data, "read", "r", "--as-of", "2"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == []  # the tailed row, retracted, cancels it


@pytest.mark.parametrize("level", ["verbose", "INFO"])
def test_bad_log_level_is_a_usage_error(level, capsys):
    assert cli_main(["--log-level", level, "cluster-key"]) == 2


@pytest.mark.slow
@pytest.mark.zookeeper
def test_the_cli_creates_a_replicated_engine_and_a_second_coordinator_reads_it(tmp_path, capsys, zookeeper, zk_root):
    from support.replication import Node

    key = str(uuid.uuid4())
    nodes = [Node(tmp_path / f"node{i}", key=uuid.UUID(key)) for i in range(3)]
    for n in nodes:
        n.start()
    try:
        meta = f"zk://{zookeeper.hosts}{zk_root}/cli"
        create = ["--data-dir", str(tmp_path / "a"), "--metadata", meta, "--cluster-key", key,
                  "--replicas", ",".join(n.address for n in nodes), "--blob", f"file://{tmp_path}/shared-blobs"]
        assert cli_main([*create, "relation", "add", "r", "--schema", "id:int64"]) == 0
        csv = tmp_path / "u.csv"
        csv.write_text("id,time,diff\n1,1,1\n2,1,1\n")
        for argv in (["append", "r", str(csv)], ["seal", "r", "1"]):
            assert cli_main(["--data-dir", str(tmp_path / "a"), "--metadata", meta, *argv]) == 0
        capsys.readouterr()
        # another data directory, the metadata alone: the storage record says where everything is
        assert cli_main(["--data-dir", str(tmp_path / "b"), "--metadata", meta, "read", "r", "--as-of", "1"]) == 0
        assert capsys.readouterr().out.splitlines() == ['"id","diff"', "1,1", "2,1"]
        # the first directory without --metadata: its REPLICATED marker names the metadata store
        assert cli_main(["--data-dir", str(tmp_path / "a"), "read", "r", "--as-of", "1"]) == 0
        assert capsys.readouterr().out.splitlines() == ['"id","diff"', "1,1", "2,1"]
    finally:
        for n in nodes:
            if n.proc is not None:
                n.kill()
