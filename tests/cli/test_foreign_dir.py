"""A directory that holds someone else's files and no engine (a home or project directory
given as ``--data-dir`` by mistake): `sediment verify` says it is no engine's instead of "ok",
and a cluster member's directory gets the same."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

import sediment
from sediment.cli import main
from sediment.engine.data_dir import DataDir


def listing(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, dirs, files in os.walk(root) for n in dirs + files)


@pytest.fixture
def home(tmp_path):
    home = tmp_path / "home"
    (home / "docs").mkdir(parents=True)
    (home / "notes.txt").write_text("mine\n")
    (home / ".profile").write_text("mine too\n")
    return home


def test_verify_reports_it_as_no_engines_directory(home, capsys):
    rc = main(["--data-dir", str(home), "verify"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert f"problem: {home} is not a sediment data directory" in out and "nothing was checked" in out, out
    assert "ok: no problems" not in out and "--repair" not in out, out


def test_new_empty_lost_and_found_and_engine_directories_are_still_used(tmp_path, capsys):
    volume = tmp_path / "volume"
    (volume / "lost+found").mkdir(parents=True)  # the top of a file system made for the data
    empty = tmp_path / "empty"
    empty.mkdir()
    for d in (tmp_path / "new", empty, volume):
        assert main(["--data-dir", str(d), "relation", "add", "r", "--schema", "id:int64"]) == 0, capsys.readouterr()
        assert main(["--data-dir", str(d), "relation", "add", "s", "--schema", "id:int64"]) == 0  # its own files
        assert main(["--data-dir", str(d), "verify"]) == 0
    interrupted = tmp_path / "interrupted"  # a first open stopped early leaves only the engine's own files
    interrupted.mkdir()
    (interrupted / "LOCK").write_bytes(b"")
    (interrupted / "REPLICATED.123.tmp").write_bytes(b"")
    with sediment.open(interrupted) as engine:
        engine.add_relation("r", pa.schema([("id", pa.int64())]))


def test_verify_refuses_a_cluster_members_directory_naming_the_cluster(tmp_path, capsys):
    member = tmp_path / "member"
    member.mkdir()
    DataDir(str(member)).mark_member("zk://127.0.0.1:2181/prod")
    (member / "LOCK").write_bytes(b"")
    rc = main(["--data-dir", str(member), "verify"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "is a cluster member's directory (a member of zk://127.0.0.1:2181/prod)" in out, out
    assert f"--data-dir {member}/partitions/N" in out and "ok: no problems" not in out, out
