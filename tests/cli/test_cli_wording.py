"""What a new user reads on a first run: counts in their grammar ("1 row", not "1 rows"), one
wording for every refused time, and `read --progress` saying what it does, as the other
commands' progress does."""

from __future__ import annotations

import io
import re

import pytest

from sediment.cli import main
from sediment.clock import ManualClock
from sediment.progress import Progress
from sediment.wording import counted


def run(capsys: pytest.CaptureFixture[str], data_dir, *argv: str) -> tuple[int, str, str]:
    rc = main(["--data-dir", str(data_dir), *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def one_row_relation(tmp_path, capsys) -> str:
    """A relation holding one update at time 1, sealed through 1."""
    data = tmp_path / "data"
    src = tmp_path / "one.csv"
    src.write_text("id,time,diff\n7,1,1\n")
    for argv in (("relation", "add", "r", "--schema", "id:int64"), ("append", "r", str(src)), ("seal", "r", "1")):
        rc, out, err = run(capsys, data, *argv)
        assert rc == 0, err
        if argv[0] == "append":
            assert out == f"appended 1 row to r from {src} (times 1..1)\n", out
    return str(data)


def test_counted_says_one_in_the_singular():
    assert counted(1, "batch") == "1 batch" and counted(2, "batch") == "2 batches"
    assert counted(0, "row") == "0 rows" and counted(1, "row") == "1 row"
    assert counted(1, "open transaction") == "1 open transaction"


def test_commands_print_one_row_and_one_batch_in_the_singular(tmp_path, capsys):
    data = one_row_relation(tmp_path, capsys)
    rc, out, err = run(capsys, data, "compact", "--progress")
    assert rc == 0, err
    assert re.fullmatch(r"compacted r: 1 batch, 1 row, upper 2, 0 WAL records left \(was \d+\)\n", out), out
    assert re.search(r"^compact 1 relation: done in", err, re.M), err
    rc, out, err = run(capsys, data, "read", "r", "--as-of", "1", "--out", str(tmp_path / "r.csv"))
    assert (rc, out) == (0, f"wrote 1 row of r as of 1 to {tmp_path / 'r.csv'}\n"), err
    rc, out, err = run(capsys, data, "verify")
    assert rc == 0 and " 1 problems" not in out and "1 files" not in out, out


def test_progress_lines_count_one_row_in_the_singular():
    lines = io.StringIO()
    clock = ManualClock()
    with Progress(1, "append f.csv", "rows", stream=lines, clock=clock, force=True) as bar:
        clock.advance(2.0)
        bar.update(1)
    assert lines.getvalue().splitlines() == ["append f.csv: started, 1 row",
                                             "append f.csv: done, 1 row in 2.0 s (0 rows/s)"]


@pytest.mark.parametrize("word", ["abc", "1.5", "-3", str(1 << 63)])
def test_a_refused_time_gets_one_wording_with_the_range(tmp_path, capsys, word):
    data = one_row_relation(tmp_path, capsys)
    rc, out, err = run(capsys, data, "seal", "r", word)
    assert rc == 2 and out == "", err
    assert err.count("\n") == 1 and err.startswith("sediment: error: argument T: invalid time "), err
    assert "a time is an integer in" in err and "[0, 2**63)" in err and "such as 2" in err, err
    rc, _out, err = run(capsys, data, "read", "r", "--as-of", word)
    assert rc == 2 and "argument --as-of: invalid time" in err and "[0, 2**63)" in err, err


def test_read_shows_progress_when_asked_and_nothing_otherwise(tmp_path, capsys):
    data = one_row_relation(tmp_path, capsys)
    rc, out, err = run(capsys, data, "read", "r", "--as-of", "1", "--progress")
    assert rc == 0 and out.splitlines() == ['"id","diff"', "7,1"], err
    assert [line.split(",")[0] for line in err.splitlines()] == ["read r as of 1: started", "read r as of 1: done"], err
    assert "1 row in" in err
    rc, out, err = run(capsys, data, "read", "r", "--as-of", "1", "--from", "0", "--progress")
    assert rc == 0 and err.splitlines()[0] == "read r changes in (0, 1]: started", err
    rc, out, err = run(capsys, data, "read", "r", "--as-of", "1")
    assert rc == 0 and err == "", err


def test_cluster_status_without_a_cluster_names_the_flag_not_an_empty_string(capsys, monkeypatch):
    monkeypatch.delenv("SEDIMENT_METADATA", raising=False)
    assert main(["cluster", "status"]) == 2
    err = capsys.readouterr().err
    assert err == "sediment: error: cluster status needs --connect zk://HOST:PORT/NAME or s3://BUCKET/PREFIX\n", err
