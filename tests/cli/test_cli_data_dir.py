"""Which directories a command may open: every command but ``relation add`` and ``serve``
works on an existing engine, so pointed at a directory an engine was never made in (none of
``meta/``, ``wal/``, ``REPLICATED``), or at none, it fails with NotADataDir (exit 1) and
leaves the directory exactly as it was, instead of making it a data directory first."""

from __future__ import annotations

import pytest
from test_cli import assert_one_line_error, ok, run

import sediment
from sediment.cli.common import require_engine_dir
from sediment.errors import NotADataDir

COMMANDS = {  # the read-only ones first; then those that write to a relation that must exist
    "read": ["read", "r", "--as-of", "1"],
    "relation list": ["relation", "list"],
    "relation describe": ["relation", "describe", "r"],
    "stats": ["stats"],
    "tail": ["tail", "r", "--as-of", "0", "--idle-timeout", "0.1"],
    "compact": ["compact"],
    "seal": ["seal", "r", "1"],
    "since": ["since", "r", "1"],
    "relation drop": ["relation", "drop", "r"],
    "relation alter": ["relation", "alter", "r", "--add", "x:int64"],
    "verify --repair": ["verify", "--repair"],
}


def listing(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("holding", ["nothing", "a file"])
def test_a_directory_without_an_engine_is_refused_and_left_as_it_was(tmp_path, capsys, command, holding):
    d = tmp_path / "mine"
    d.mkdir()
    if holding == "a file":
        (d / "notes.txt").write_text("keep")
    before = listing(tmp_path)
    rc, _out, err = run(capsys, d, *COMMANDS[command])
    assert listing(tmp_path) == before, f"{command} changed {d}"
    if command == "verify --repair":  # verify reports; there is nothing to repair
        if holding == "nothing":
            assert rc == 0 and err == ""
        else:  # someone else's files: no engine's directory, and so not "ok"
            assert rc == 1 and err == "" and f"problem: {d} is not a sediment data directory" in _out, _out
        return
    assert_one_line_error(rc, err, f"{d} is not a sediment data directory", "relation add")


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_missing_directory_is_not_created(tmp_path, capsys, command):
    d = tmp_path / "a" / "data"
    rc, _out, err = run(capsys, d, *COMMANDS[command])
    assert rc == 1 and listing(tmp_path) == [], err


def test_with_shared_metadata_a_new_or_empty_directory_may_be_used_but_not_a_full_one(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(NotADataDir, match="not a sediment data directory"):
        require_engine_dir(str(mine), shared=True)
    require_engine_dir(str(tmp_path / "new"), shared=True)  # a new coordinator's directory
    (tmp_path / "empty").mkdir()
    require_engine_dir(str(tmp_path / "empty"), shared=True)
    with pytest.raises(NotADataDir, match="no data directory"):
        require_engine_dir(str(tmp_path / "new"), shared=False)


def test_creating_commands_still_make_the_directory_and_every_layout_is_found(tmp_path, capsys):
    d = tmp_path / "data"
    d.mkdir()  # empty: relation add makes it a data directory, as before
    ok(capsys, d, "relation", "add", "r", "--schema", "id:int64")
    assert "r\tid:int64" in ok(capsys, d, "relation", "list")
    ring = tmp_path / "data-ring"  # a device ring's engine: its log outside, its metadata in meta/
    with sediment.open(ring, wal=f"device:{tmp_path / 'ring'}", wal_capacity=8 << 20) as eng:
        eng.add_relation("r", sediment.parse_schema_spec("id:int64"))
    assert "r\tid:int64" in ok(capsys, ring, "relation", "list")


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("metadata", ["missing", "empty"])
def test_a_metadata_directory_without_a_store_is_refused_and_not_created(tmp_path, capsys, command, metadata):
    """``--metadata DIR`` (a local journal store) for a command that does not create an engine:
    refused with NotADataDir, and neither DIR nor the data directory is made."""
    meta = tmp_path / "m"
    if metadata == "empty":
        meta.mkdir()
    before = listing(tmp_path)
    rc, out, err = run(capsys, tmp_path / "d", "--metadata", str(meta), *COMMANDS[command])
    assert listing(tmp_path) == before, f"{command} created {listing(tmp_path)}"
    if command == "verify --repair":  # verify reports (no such data directory); it opens nothing
        assert rc == 1 and "no such data directory" in out
        return
    assert_one_line_error(rc, err, f"--metadata {meta}", "nothing was created")


def test_a_metadata_directory_made_by_relation_add_serves_the_other_commands(tmp_path, capsys):
    meta = tmp_path / "m"
    ok(capsys, tmp_path / "d", "--metadata", str(meta), "relation", "add", "r", "--schema", "id:int64")
    assert "r\tid:int64" in ok(capsys, tmp_path / "d", "--metadata", str(meta), "relation", "list")


@pytest.mark.parametrize("command", sorted(set(COMMANDS) - {"verify --repair"}))
def test_with_shared_metadata_a_directory_holding_only_a_lock_is_refused_and_left_as_it_was(tmp_path, capsys,
                                                                                             command):
    """A cluster member's directory holds only its LOCK until its first partition opens (as
    does one whose engine's first open was stopped): it was taken for a new coordinator's,
    which left blobs/ behind in it and blamed a missing write-ahead log."""
    meta = tmp_path / "m"
    ok(capsys, tmp_path / "d", "--metadata", str(meta), "relation", "add", "r", "--schema", "id:int64")
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "LOCK").touch()
    before = listing(tmp_path)
    rc, _out, err = run(capsys, locked, "--metadata", str(meta), *COMMANDS[command])
    assert listing(tmp_path) == before, f"{command} changed {locked}"
    assert_one_line_error(rc, err, f"{locked} holds only a LOCK file", "cluster member", "--connect zk://")


@pytest.mark.parametrize("command", [*sorted(set(COMMANDS) - {"verify --repair"}), "relation add"])
@pytest.mark.parametrize("shared", [False, True])
def test_a_cluster_members_directory_is_named_and_left_as_it_was(tmp_path, capsys, command, shared):
    """A member records its cluster in MEMBER (sediment serve --cluster): every command, the
    creating ones too, names the cluster to reach instead of making an engine beside the
    member's partitions (the member would then refuse to start on it)."""
    meta = tmp_path / "m"
    ok(capsys, tmp_path / "d", "--metadata", str(meta), "relation", "add", "r", "--schema", "id:int64")
    member = tmp_path / "member"
    member.mkdir()
    (member / "LOCK").touch()
    (member / "MEMBER").write_text('{"cluster": "zk://127.0.0.1:2181/prod", "format": "sediment-member", '
                                   '"version": 1}\n')  # as docs/formats.md spells it
    before = listing(tmp_path)
    argv = ["relation", "add", "r2", "--schema", "id:int64"] if command == "relation add" else COMMANDS[command]
    rc, _out, err = run(capsys, member, *(["--metadata", str(meta)] if shared else []), *argv)
    assert listing(tmp_path) == before, f"{command} changed {member}"
    assert_one_line_error(rc, err, f"{member} is a cluster member's directory",
                          "a member of zk://127.0.0.1:2181/prod", "--connect zk://127.0.0.1:2181/prod")
    with pytest.raises(NotADataDir, match="cluster member's directory"):
        sediment.open(member)
    assert listing(tmp_path) == before
