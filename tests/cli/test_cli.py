"""The ``sediment`` command line: every subcommand's output, and bad input rejected cleanly.

Most cases call ``main(argv)`` in-process (fast); a few run ``python -m sediment`` in a
real process to prove the entry point and that users never see a traceback. Every
rejected command must leave the data directory's content as it was: the same
relations, frontiers and stored updates, and the same WAL bytes.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
import types

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

import sediment
from sediment.cli import commands as cli_commands
from sediment.cli import files as cli_files
from sediment.cli import main
from sediment.cli import parser as cli_parser
from sediment.clock import ManualClock
from sediment.errors import UnknownRelation
from sediment.progress import Progress
from sediment.wal.record import RecordKind

PROGRESS_LINE = re.compile(r"^[^:]+: (started|done|stopped)\b")
SCHEMA = "id:int64,name:string"
HEADER = "id,name,time,diff\n"


# --- helpers --------------------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], data_dir: os.PathLike[str] | str, *argv: str) -> tuple[int, str, str]:
    """Run the CLI in-process on ``data_dir``; (exit code, stdout, stderr)."""
    rc = main(["--data-dir", str(data_dir), *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def ok(capsys: pytest.CaptureFixture[str], data_dir: os.PathLike[str] | str, *argv: str) -> str:
    rc, out, err = run(capsys, data_dir, *argv)
    assert rc == 0, f"{argv} failed: {err}"
    return out


def assert_one_line_error(rc: int, err: str, *words: str, code: int = 1) -> None:
    assert rc == code, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if not PROGRESS_LINE.match(line)]  # progress lines go first
    assert len(lines) == 1, err
    assert lines[0].startswith("sediment: error: "), err
    for word in words:
        assert word in lines[0], f"{word!r} not in {lines[0]!r}"


def wal_bytes(data_dir: os.PathLike[str] | str) -> dict[str, str]:
    """Digest of every WAL segment and index file (opening an engine rewrites only the
    control file and the metadata journal's epoch, never these)."""
    wal = os.path.join(data_dir, "wal")
    out = {}
    for root, _dirs, files in os.walk(wal):
        for name in files:
            if name.endswith((".seg", ".idx")):
                path = os.path.join(root, name)
                with open(path, "rb") as f:
                    out[os.path.relpath(path, wal)] = hashlib.sha256(f.read()).hexdigest()
    return out


def state(data_dir: os.PathLike[str] | str) -> dict[str, object]:
    """Everything a user can observe: relations, schemas, frontiers, every stored update."""
    with sediment.open(data_dir) as engine:
        rels = {}
        for name in engine.relations():
            rows = sorted(tuple(r.values()) for batch in engine.replay(name) for r in batch.to_pylist())
            rels[name] = (str(engine.schema(name)), engine.since(name), engine.sealed(name), rows)
    return {"relations": rels, "wal": wal_bytes(data_dir)}


def write_csv(path: os.PathLike[str], body: str, header: str = HEADER) -> str:
    with open(path, "w") as f:
        f.write(header + body)
    return str(path)


@pytest.fixture(autouse=True)
def small_segments(monkeypatch):
    """1 MiB WAL segments instead of 64 MiB: opening a log reads its whole preallocated
    segment, and these tests open engines a few hundred times."""
    real = sediment.open
    monkeypatch.setattr(sediment, "open", lambda data_dir, **kw: real(data_dir, **{"segment_bytes": 1 << 20, **kw}))


@pytest.fixture
def ddir(tmp_path, capsys):
    """A data directory with relation ``orders`` (id:int64,name:string), updates at times
    1 and 2, sealed through 2."""
    d = tmp_path / "data"
    ok(capsys, d, "relation", "add", "orders", "--schema", SCHEMA)
    src = write_csv(tmp_path / "seed.csv", "1,alice,1,1\n2,bob,1,1\n1,alice,2,-1\n3,carol,2,2\n")
    ok(capsys, d, "append", "orders", src)
    ok(capsys, d, "seal", "orders", "2")
    return d


# --- happy paths ----------------------------------------------------------------------------


def test_relation_add_list_drop(tmp_path, capsys):
    d = tmp_path / "data"
    assert ok(capsys, d, "relation", "add", "orders", "--schema", SCHEMA).strip() == \
        "added relation orders (id:int64,name:string)"
    ok(capsys, d, "relation", "add", "events", "--schema", "at:timestamp[ms],score:float64,ok:bool")
    out = ok(capsys, d, "relation", "list")
    assert out.splitlines() == [
        "events\tat:timestamp[ms],score:float64,ok:bool\tsince=0\tsealed=-1\tschema_version=0",
        "orders\tid:int64,name:string\tsince=0\tsealed=-1\tschema_version=0",
    ]
    assert ok(capsys, d, "relation", "drop", "events").strip() == "dropped relation events"
    assert ok(capsys, d, "relation", "list").splitlines() == ["orders\tid:int64,name:string\tsince=0\tsealed=-1\tschema_version=0"]
    with sediment.open(d) as engine:
        assert engine.relations() == ["orders"]
    ok(capsys, d, "relation", "drop", "orders")
    rc, out, err = run(capsys, d, "relation", "list")
    assert (rc, out) == (0, "") and "no relations" in err


def test_list_shows_since_and_sealed(ddir, capsys):
    ok(capsys, ddir, "seal", "orders", "5")
    ok(capsys, ddir, "since", "orders", "3")
    assert ok(capsys, ddir, "relation", "list").splitlines() == ["orders\tid:int64,name:string\tsince=3\tsealed=5\tschema_version=0"]


def test_append_seal_read_consolidates(ddir, capsys):
    # alice was added at 1 and retracted at 2; carol has multiplicity 2
    assert ok(capsys, ddir, "read", "orders", "--as-of", "1") == '"id","name","diff"\n1,"alice",1\n2,"bob",1\n'
    assert ok(capsys, ddir, "read", "orders", "--as-of", "2") == '"id","name","diff"\n2,"bob",1\n3,"carol",2\n'


@pytest.mark.parametrize("keep", [True, False], ids=["checked-chunks-kept", "file-read-twice"])
def test_append_prints_summary_and_is_one_transaction(tmp_path, capsys, monkeypatch, keep):
    if not keep:  # a file too big to hold: the second pass reads it again
        monkeypatch.setattr(cli_commands, "KEEP_VALIDATED_BYTES", 0)
    d = tmp_path / "data"
    ok(capsys, d, "relation", "add", "orders", "--schema", SCHEMA)
    body = "".join(f"{i},name-{i:05d},{i % 7},1\n" for i in range(3000))
    src = write_csv(tmp_path / "big.csv", body)
    out = ok(capsys, d, "append", "orders", src, "--chunk-bytes", "4096")
    assert out.strip() == f"appended 3000 rows to orders from {src} (times 0..6)"
    with sediment.open(d) as engine:
        records = list(engine.wal.scan())
        engine.seal("orders", 6)
        assert engine.snapshot("orders", 6).num_rows == 3000
    kinds = [r.kind for r in records]
    updates = [r for r in records if r.kind == RecordKind.UPDATES]
    assert len(updates) > 5, "the file should have been appended in several chunks"
    assert {r.txn_id for r in updates} != {0} and len({r.txn_id for r in updates}) == 1
    assert kinds[kinds.index(RecordKind.BEGIN)] == RecordKind.BEGIN and RecordKind.COMMIT in kinds
    assert sum(r.count for r in updates) == 3000


def test_append_failure_midway_aborts_the_transaction(ddir, tmp_path, capsys, monkeypatch):
    from sediment.engine.transaction import Transaction

    real_append, calls = Transaction.append, []

    def failing_append(self, name, table):
        calls.append(table.num_rows)
        if len(calls) == 3:
            raise OSError(5, "Input/output error")
        real_append(self, name, table)

    monkeypatch.setattr(Transaction, "append", failing_append)
    src = write_csv(tmp_path / "many.csv", "".join(f"{i},n{i:04d},5,1\n" for i in range(1000)))
    before = state(ddir)["relations"]
    rc, _, err = run(capsys, ddir, "append", "orders", src, "--chunk-bytes", "2048")
    assert_one_line_error(rc, err, "Input/output error")
    assert len(calls) == 3
    assert state(ddir)["relations"] == before  # two chunks were logged, but never committed
    with sediment.open(ddir) as engine:
        assert RecordKind.ABORT in [r.kind for r in engine.wal.scan()]


def test_header_only_file_appends_nothing(ddir, tmp_path, capsys):
    before = state(ddir)
    out = ok(capsys, ddir, "append", "orders", write_csv(tmp_path / "empty.csv", ""))
    assert out.startswith("appended 0 rows to orders")
    assert state(ddir) == before


def test_parquet_in_and_out_round_trip(tmp_path, capsys):
    d = tmp_path / "data"
    ok(capsys, d, "relation", "add", "orders", "--schema", SCHEMA)
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"name": ["x", "y", "x"], "id": pa.array([10, 20, 10], pa.int32()),  # safe cast
                             "time": [3, 3, 4], "diff": [1, 1, 1]}), src)
    assert "appended 3 rows" in ok(capsys, d, "append", "orders", str(src))
    ok(capsys, d, "seal", "orders", "4")
    out = tmp_path / "out.parquet"
    assert ok(capsys, d, "read", "orders", "--as-of", "4", "--out", str(out)).strip() == \
        f"wrote 2 rows of orders as of 4 to {out}"
    got = pq.read_table(out)
    assert got.to_pylist() == [{"id": 10, "name": "x", "diff": 2}, {"id": 20, "name": "y", "diff": 1}]
    assert got.schema.field("id").type == pa.int64()
    # and the same data through CSV out, then CSV back in to a second relation
    out_csv = tmp_path / "out.csv"
    ok(capsys, d, "read", "orders", "--as-of", "4", "--out", str(out_csv))
    assert pacsv.read_csv(out_csv).to_pylist() == got.to_pylist()
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]


def test_csv_round_trip_through_read_and_append(ddir, tmp_path, capsys):
    out = tmp_path / "snap.csv"
    ok(capsys, ddir, "read", "orders", "--as-of", "2", "--out", str(out))
    # the snapshot (columns + diff) plus a time column is a valid append file for a copy
    table = pacsv.read_csv(out)
    table = table.append_column("time", pa.array([0] * table.num_rows, pa.int64()))
    again = tmp_path / "again.csv"
    pacsv.write_csv(table, again)
    ok(capsys, ddir, "relation", "add", "copy", "--schema", SCHEMA)
    ok(capsys, ddir, "append", "copy", str(again))
    ok(capsys, ddir, "seal", "copy", "0")
    assert ok(capsys, ddir, "read", "copy", "--as-of", "0") == ok(capsys, ddir, "read", "orders", "--as-of", "2")


def test_format_override(ddir, tmp_path, capsys):
    src = write_csv(tmp_path / "updates.txt", "7,gus,3,1\n")
    rc, _, err = run(capsys, ddir, "append", "orders", src)
    assert_one_line_error(rc, err, "updates.txt", "--format", code=2)
    assert "appended 1 row to" in ok(capsys, ddir, "append", "orders", src, "--format", "csv")
    ok(capsys, ddir, "seal", "orders", "3")
    out = tmp_path / "snap.bin"
    ok(capsys, ddir, "read", "orders", "--as-of", "3", "--out", str(out), "--format", "parquet")
    assert pq.read_table(out).column("id").to_pylist() == [2, 3, 7]


def test_seal_and_since(ddir, capsys):
    assert ok(capsys, ddir, "seal", "orders", "9").strip() == "sealed orders through time 9"
    assert ok(capsys, ddir, "seal", "orders", "9").strip() == "sealed orders through time 9"  # idempotent
    assert ok(capsys, ddir, "since", "orders", "4").strip() == "since of orders is now 4"
    with sediment.open(ddir) as engine:
        assert (engine.sealed("orders"), engine.since("orders")) == (9, 4)
    assert ok(capsys, ddir, "read", "orders", "--as-of", "4") == '"id","name","diff"\n2,"bob",1\n3,"carol",2\n'


def test_data_dir_before_or_after_subcommand(ddir, capsys):
    expected = "orders\tid:int64,name:string\tsince=0\tsealed=2\tschema_version=0\n"
    assert main(["relation", "list", "--data-dir", str(ddir)]) == 0
    assert capsys.readouterr().out == expected
    assert main(["relation", "--data-dir", str(ddir), "list"]) == 0
    assert capsys.readouterr().out == expected
    assert main(["--data-dir", str(ddir), "relation", "list"]) == 0
    assert capsys.readouterr().out == expected


def test_version_and_usage_errors(tmp_path, capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"sediment {sediment.__version__}"
    assert_one_line_error(main([]), capsys.readouterr().err, "COMMAND", code=2)
    assert_one_line_error(main(["seal", "orders", "-3"]), capsys.readouterr().err, "invalid time", "[0, 2**63)", code=2)
    assert_one_line_error(main(["seal", "orders", "soon"]), capsys.readouterr().err, "'soon'", code=2)
    assert_one_line_error(main(["frobnicate"]), capsys.readouterr().err, "frobnicate", code=2)
    assert_one_line_error(main(["read", "orders"]), capsys.readouterr().err, "--as-of", code=2)
    assert_one_line_error(main(["--data-dir", str(tmp_path), "read", "orders", "--as-of", "1", "--out", "x.json"]),
                          capsys.readouterr().err, "x.json", code=2)


def test_missing_data_dir_is_not_created(tmp_path, capsys):
    d = tmp_path / "nowhere"
    for argv in (["relation", "list"], ["seal", "orders", "1"], ["read", "orders", "--as-of", "1"]):
        rc, _, err = run(capsys, d, *argv)
        assert_one_line_error(rc, err, "no data directory", str(d))
    assert not d.exists()


def test_debug_env_reraises(ddir, capsys, monkeypatch):
    monkeypatch.setenv("SEDIMENT_DEBUG", "1")
    with pytest.raises(UnknownRelation):
        main(["--data-dir", str(ddir), "seal", "nope", "1"])


def test_demo_dispatches_to_module(tmp_path, capsys, monkeypatch):
    seen = []
    fake = types.ModuleType("sediment.demo")
    fake.run = lambda args: seen.append((args.rows, args.data_dir)) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sediment.demo", fake)
    assert main(["demo", "--rows", "12", "--data-dir", str(tmp_path)]) == 0
    assert seen == [(12, str(tmp_path))]
    assert_one_line_error(main(["demo", "--rows", "0"]), capsys.readouterr().err, "--rows", code=2)


# --- progress -------------------------------------------------------------------------------


def test_progress_is_off_when_piped_lines_when_asked_and_nothing_when_off(tmp_path, capsys):
    d = tmp_path / "data"
    ok(capsys, d, "relation", "add", "orders", "--schema", SCHEMA)
    src = write_csv(tmp_path / "u.csv", "".join(f"{i},n,1,1\n" for i in range(500)))
    rc, _, err = run(capsys, d, "append", "orders", src)  # stderr is not a terminal: no progress by default
    assert (rc, err) == (0, "")
    rc, _, err = run(capsys, d, "append", "orders", src, "--progress")  # asked for: a line per phase
    assert rc == 0 and "\r" not in err
    assert [line.split(":")[0] for line in err.splitlines()] == ["check u.csv", "check u.csv", "append u.csv",
                                                                  "append u.csv"]
    assert "append u.csv: done, 500 rows in" in err
    rc, _, err = run(capsys, d, "compact", "--progress")  # a phase that counts nothing gives its time only
    assert rc == 0 and re.search(r"^compact 1 relation: done in \d+\.\d s$", err, re.M), err
    rc, _, err = run(capsys, d, "append", "orders", src, "--no-progress")
    assert rc == 0 and err == ""


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_modes_and_summary(monkeypatch):
    monkeypatch.delenv("SEDIMENT_PROGRESS", raising=False)
    clock = ManualClock()
    lines = io.StringIO()  # a StringIO is no terminal: start and end lines when forced
    with Progress(1000, "copy", "rows", stream=lines, clock=clock, force=True) as bar:
        clock.advance(8.0)
        bar.update(1000)
        assert bar.summary() == "copy: done, 1.0k rows in 8.0 s (125 rows/s)"
    assert lines.getvalue().splitlines() == ["copy: started, 1.0k rows", "copy: done, 1.0k rows in 8.0 s (125 rows/s)"]
    uncounted = io.StringIO()
    with Progress(0, "start", stream=uncounted, clock=clock, force=True):
        clock.advance(1.5)
    assert uncounted.getvalue().splitlines() == ["start: started", "start: done in 1.5 s"]
    piped = io.StringIO()
    with Progress(10, "default", stream=piped) as off:
        off.update(10)
    assert piped.getvalue() == "" and off.mode == "off"
    terminal = _Terminal()
    with Progress(10, "tty", stream=terminal) as on:
        on.update(10)
    assert "tty: 100%" in terminal.getvalue() and "10/10" in terminal.getvalue()
    timed = _Terminal()  # a phase that counts nothing shows its time, no count or rate
    with Progress(0, "compact", stream=timed):
        pass
    assert "compact: 00:00" in timed.getvalue() and "it/s" not in timed.getvalue() and "0it" not in timed.getvalue()
    monkeypatch.setenv("SEDIMENT_PROGRESS", "1")
    forced = io.StringIO()
    with Progress(10, "env", stream=forced) as on:
        on.update(10)
    assert forced.getvalue().splitlines()[-1].startswith("env: done, 10 in ")
    monkeypatch.setenv("SEDIMENT_PROGRESS", "0")
    quiet = _Terminal()
    with Progress(10, stream=quiet) as off:
        off.update(10)
    assert quiet.getvalue() == "" and off.done == 10


# --- verify ---------------------------------------------------------------------------------


def test_verify_clean(ddir, capsys):
    rc, out, _ = run(capsys, ddir, "verify")
    assert rc == 0
    assert out.splitlines()[0].startswith("checked ") and int(out.split()[1]) >= 3
    assert out.splitlines()[-1] == "ok: no problems"
    rc, out, _ = run(capsys, ddir, "verify", "--repair")
    assert rc == 0 and "repaired: nothing to cut" in out


def test_verify_finds_damage_and_repair_cuts_it(tmp_path, capsys):
    d = tmp_path / "data"
    ok(capsys, d, "relation", "add", "orders", "--schema", SCHEMA)
    for i, name in enumerate(["FIRST-MARKER-xyz", "second", "third"]):
        ok(capsys, d, "append", "orders", write_csv(tmp_path / f"u{i}.csv", f"{i},{name},{i + 1},1\n"))
    (seg,) = [p for p in (d / "wal" / "0").iterdir() if p.suffix == ".seg"]
    data = bytearray(seg.read_bytes())
    at = data.index(b"FIRST-MARKER-xyz") + 3
    assert 128 + 64 < at < data.index(b"third")  # inside an early record's body, valid records after it
    data[at] ^= 0xFF
    seg.write_bytes(bytes(data))

    rc, out, _ = run(capsys, d, "verify")
    assert rc == 1
    problems = [line for line in out.splitlines() if line.startswith("problem: ")]
    assert len(problems) == 1 and str(seg) in problems[0]
    offset = int(problems[0].split("offset ")[1].split(":")[0])
    assert 128 <= offset < at
    # the engine refuses to open such a log, with one line saying what to do
    rc, _, err = run(capsys, d, "seal", "orders", "5")
    assert_one_line_error(rc, err, str(seg), "verify --repair")

    before = seg.read_bytes()
    rc, _, err = run(capsys, d, "verify", "--repair")  # acknowledged records would be lost: refused
    assert_one_line_error(rc, err, str(seg), "--force")
    assert seg.read_bytes() == before
    rc, out, _ = run(capsys, d, "verify", "--repair", "--force")
    assert rc == 0
    repaired = [line for line in out.splitlines() if line.startswith("repaired: ") and "kept before" not in line]
    assert len(repaired) == 1 and str(seg) in repaired[0] and f"offset {offset}" in repaired[0]
    assert (seg.parent / f"{seg.name}.pre-repair-{offset}").read_bytes() == before  # nothing destroyed
    (report,) = [line.split(": ", 1)[1] for line in out.splitlines() if line.endswith(".json")]
    lost = json.loads(open(report).read())["lost"]
    assert [(f["path"], f["offset"], f["first_lsn"]) for f in lost] == [(str(seg), offset, 1)]
    assert out.splitlines()[-1] == "ok: no problems"
    rc, out, _ = run(capsys, d, "verify")
    assert rc == 0 and "problem:" not in out and out.splitlines()[-1] == "ok: no problems"
    with sediment.open(d) as engine:  # only the damaged (first) record is gone; the two after it verify
        assert sum(b.num_rows for b in engine.replay("orders")) == 2


def test_verify_missing_dir(tmp_path, capsys):
    rc, out, _ = run(capsys, tmp_path / "nope", "verify")
    assert rc == 1 and "no such data directory" in out


# --- bad input: one line, non-zero exit, nothing changed ------------------------------------


def _files(tmp_path, name: str, body: str, header: str = HEADER) -> str:
    return write_csv(tmp_path / name, body, header)


def _bad_parquet(tmp_path) -> str:
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"id": ["one"], "name": ["x"], "time": [3], "diff": [1]}), path)
    return str(path)


def _garbage_parquet(tmp_path) -> str:
    path = tmp_path / "garbage.parquet"
    path.write_bytes(b"this is not parquet at all" * 10)
    return str(path)


def _directory(tmp_path, name: str) -> str:
    (tmp_path / name).mkdir()
    return str(tmp_path / name)


def _halfway(tmp_path, bad_row: str) -> str:
    good = "".join(f"{i},n{i:04d},5,1\n" for i in range(400))
    return _files(tmp_path, "halfway.csv", good + bad_row + good)


BAD = [
    # (id, argv builder, exit code, words the message must contain)
    ("unknown relation append", lambda p: ["append", "nope", _files(p, "u.csv", "1,a,3,1\n")], 1, ["'nope'"]),
    ("unknown relation seal", lambda p: ["seal", "nope", "3"], 1, ["no relation named 'nope'"]),
    ("unknown relation read", lambda p: ["read", "nope", "--as-of", "1"], 1, ["no relation named 'nope'"]),
    ("unknown relation drop", lambda p: ["relation", "drop", "nope"], 1, ["no relation named 'nope'"]),
    ("existing relation", lambda p: ["relation", "add", "orders", "--schema", "a:int64"], 1, ["already exists"]),
    ("invalid name", lambda p: ["relation", "add", "../etc", "--schema", "a:int64"], 1, ["'../etc'"]),
    ("invalid name append", lambda p: ["append", "../etc", _files(p, "u.csv", "1,a,3,1\n")], 1, ["'../etc'"]),
    ("time column", lambda p: ["relation", "add", "t", "--schema", "time:int64,a:int64"], 2, ["'time'", "reserved"]),
    ("unknown type", lambda p: ["relation", "add", "t", "--schema", "a:int65"], 2, ["unknown type 'int65'"]),
    ("bad schema spec", lambda p: ["relation", "add", "t", "--schema", "a"], 2, ["NAME:TYPE"]),
    ("missing column", lambda p: ["append", "orders", _files(p, "u.csv", "1,3,1\n", "id,time,diff\n")], 1,
     ["u.csv", "missing ['name']"]),
    ("extra column", lambda p: ["append", "orders", _files(p, "u.csv", "1,a,x,3,1\n", "id,name,zz,time,diff\n")],
     1, ["u.csv", "unexpected ['zz']"]),
    ("string for int64 csv", lambda p: ["append", "orders", _files(p, "u.csv", "one,a,3,1\n")], 1,
     ["u.csv", "'id'", "int64", "'one'"]),
    ("string for int64 parquet", lambda p: ["append", "orders", _bad_parquet(p)], 1, ["bad.parquet", "'id'", "int64"]),
    ("negative time", lambda p: ["append", "orders", _files(p, "u.csv", "1,a,-4,1\n")], 1, ["u.csv", "negative time"]),
    ("null diff", lambda p: ["append", "orders", _files(p, "u.csv", "1,a,3,\n")], 1, ["u.csv", "'diff'", "null"]),
    ("missing time", lambda p: ["append", "orders", _files(p, "u.csv", "1,a,1\n", "id,name,diff\n")], 1, ["time"]),
    ("sealed time", lambda p: ["append", "orders", _files(p, "u.csv", "1,a,3,1\n9,z,2,1\n")], 1,
     ["sealed through time 2", "time 2"]),
    ("seal backwards", lambda p: ["seal", "orders", "1"], 1, ["sealed through 2", "cannot seal at 1"]),
    ("since beyond sealed", lambda p: ["since", "orders", "3"], 1, ["since 3", "sealed frontier 2"]),
    ("as_of above sealed", lambda p: ["read", "orders", "--as-of", "3"], 1,
     ["--as-of 3 for 'orders'", "[since 0, sealed 2]", "seal 'orders' through 3 first"]),
    ("tail as_of above sealed", lambda p: ["tail", "orders", "--as-of", "3", "--idle-timeout", "0.1"], 1,
     ["--as-of 3 for 'orders'", "[since 0, sealed 2]", "seal 'orders' through 3 first"]),
    ("malformed row halfway", lambda p: ["append", "orders", _halfway(p, "9,broken\n"), "--chunk-bytes", "2048"], 1,
     ["halfway.csv", "Expected 4 columns, got 2"]),
    ("bad value halfway", lambda p: ["append", "orders", _halfway(p, "9,x,5,many\n"), "--chunk-bytes", "2048"], 1,
     ["halfway.csv", "'diff'", "'many'"]),
    ("negative time halfway", lambda p: ["append", "orders", _halfway(p, "9,x,-1,1\n"), "--chunk-bytes", "2048"], 1,
     ["halfway.csv", "negative time"]),
    ("missing file", lambda p: ["append", "orders", str(p / "absent.csv")], 1, ["absent.csv", "no such file"]),
    ("directory as file", lambda p: ["append", "orders", str(p) + "/"], 2, ["cannot tell the format"]),
    ("directory as csv", lambda p: ["append", "orders", _directory(p, "d.csv")], 1, ["d.csv", "not a regular file"]),
    ("not parquet", lambda p: ["append", "orders", _garbage_parquet(p)], 1, ["garbage.parquet", "Parquet"]),
    ("empty csv", lambda p: ["append", "orders", _files(p, "e.csv", "", "")], 1, ["e.csv", "Empty CSV"]),
    ("read out to missing dir", lambda p: ["read", "orders", "--as-of", "2", "--out", str(p / "no" / "o.csv")], 2,
     ["o.csv", "no directory"]),
]


@pytest.mark.parametrize("argv_of,code,words", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_changes_nothing(ddir, tmp_path, capsys, argv_of, code, words):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    argv = argv_of(inputs)
    before = state(ddir)
    rc, out, err = run(capsys, ddir, *argv)
    assert_one_line_error(rc, err, *words, code=code)
    assert out == ""
    assert state(ddir) == before


def test_since_backwards(ddir, capsys):
    ok(capsys, ddir, "since", "orders", "2")
    before = state(ddir)
    rc, _, err = run(capsys, ddir, "since", "orders", "1")
    assert_one_line_error(rc, err, "since of 'orders' is 2", "cannot move back to 1")
    rc, _, err = run(capsys, ddir, "read", "orders", "--as-of", "1")
    assert_one_line_error(rc, err, "--as-of 1 for 'orders'", "[since 2, sealed 2]", "history was consolidated away")
    rc, _, err = run(capsys, ddir, "read", "orders", "--as-of", "2", "--from", "1")  # said `as_of 1` for --from 1
    assert_one_line_error(rc, err, "--from 1 for 'orders'", "[since 2, sealed 2]", "read at a time in that range")
    assert state(ddir) == before


def test_read_never_sealed(tmp_path, capsys):
    d = tmp_path / "data"
    ok(capsys, d, "relation", "add", "orders", "--schema", SCHEMA)
    rc, _, err = run(capsys, d, "read", "orders", "--as-of", "0")
    assert_one_line_error(rc, err, "never sealed")


def test_invalid_name_creates_no_data_dir(tmp_path, capsys):
    d = tmp_path / "fresh"
    rc, _, err = run(capsys, d, "relation", "add", "../etc", "--schema", "a:int64")
    assert_one_line_error(rc, err, "invalid relation name")
    rc, _, err = run(capsys, d, "relation", "add", "ok", "--schema", "a:int65")
    assert_one_line_error(rc, err, "int65", code=2)
    assert not d.exists()


def test_failed_write_leaves_no_partial_file(ddir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "snap.parquet"
    out.write_bytes(b"previous content")

    def broken(table, where, **kw):
        with open(where, "wb") as f:
            f.write(b"PAR1 half")
        raise OSError(28, "No space left on device", str(where))

    monkeypatch.setattr(cli_files.pq, "write_table", broken)
    rc, _, err = run(capsys, ddir, "read", "orders", "--as-of", "2", "--out", str(out))
    assert_one_line_error(rc, err, "No space left on device")
    assert out.read_bytes() == b"previous content"
    assert sorted(os.listdir(tmp_path)) == sorted(["data", "seed.csv", "snap.parquet"])


def test_unexpected_exception_is_one_line(ddir, capsys, monkeypatch):
    def boom(args):
        raise RuntimeError("something\nbroke")

    monkeypatch.setattr(cli_parser, "cmd_seal", boom)  # build_parser binds the commands
    rc, _, err = run(capsys, ddir, "seal", "orders", "3")
    assert_one_line_error(rc, err, "internal error: RuntimeError: something broke", "SEDIMENT_DEBUG=1")


# --- real processes -------------------------------------------------------------------------


def _sediment(*argv: str, cwd: os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SEDIMENT_DEBUG", "SEDIMENT_PROGRESS")}
    return subprocess.run([sys.executable, "-m", "sediment", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=60)


def test_entry_point_end_to_end(tmp_path):
    src = write_csv(tmp_path / "u.csv", "1,alice,1,1\n2,bob,1,1\n")
    steps = [
        ["relation", "add", "orders", "--schema", SCHEMA],
        ["append", "orders", src],
        ["seal", "orders", "1"],
    ]
    for argv in steps:  # default data dir: ./sediment-data under cwd
        proc = _sediment(*argv, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    proc = _sediment("read", "orders", "--as-of", "1", cwd=tmp_path)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, '"id","name","diff"\n1,"alice",1\n2,"bob",1\n', "")
    assert (tmp_path / "sediment-data" / "LOCK").exists()
    proc = _sediment("--version", cwd=tmp_path)
    assert proc.stdout.strip() == f"sediment {sediment.__version__}"
    script = os.path.join(os.path.dirname(sys.executable), "sediment")  # the console script
    if os.path.exists(script):
        proc = subprocess.run([script, "relation", "list"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert (proc.returncode, proc.stdout) == (0, "orders\tid:int64,name:string\tsince=0\tsealed=1\tschema_version=0\n")


def test_entry_point_errors_have_no_traceback(tmp_path):
    proc = _sediment("--data-dir", "d", "relation", "add", "../etc", "--schema", "a:int64", cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "sediment: error: invalid relation name '../etc': use 1-128 characters from [A-Za-z0-9_.-], starting "
        "with a letter or underscore"]
    proc = _sediment("seal", cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "d").exists()
