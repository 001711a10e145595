"""``sediment verify`` on a directory another process has open: it says so before its
notes, since that process's write under way can read as a crash's torn tail; with no
holder, no such note. The holder is a real process, found through /proc/locks without
taking the directory's lock."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from sediment._fs import flock_holder, lock_file
from sediment.cli import main
from sediment.engine.data_dir import DataDir

HOLDER = textwrap.dedent("""
    import sys
    import pyarrow as pa
    import sediment
    e = sediment.open(sys.argv[1])
    e.add_relation("r", pa.schema([("k", pa.int64())]))
    e.append("r", pa.table({"k": [1], "time": [1], "diff": [1]}))
    print("ready", flush=True)
    sys.stdin.readline()
    e.close()
""")


@pytest.fixture
def held(tmp_path):
    """A data directory held open by a child process; (path, the child's pid)."""
    data = str(tmp_path / "d")
    child = subprocess.Popen([sys.executable, "-c", HOLDER, data], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        yield data, child.pid
    finally:
        child.stdin.close()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(timeout=10)


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="reads Linux's /proc/locks")
def test_verify_names_the_process_that_holds_the_directory(held, capsys):
    data, pid = held
    assert flock_holder(DataDir(data).lock) == pid
    assert main(["--data-dir", data, "verify"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith(f"note: {data} is in use by process {pid}:"), out
    assert out[-1] == "ok: no problems"


def test_verify_of_a_directory_no_one_holds_has_no_such_note(tmp_path, capsys):
    import pyarrow as pa

    import sediment

    data = str(tmp_path / "d")
    with sediment.open(data) as engine:
        engine.add_relation("r", pa.schema([("k", pa.int64())]))
        engine.append("r", pa.table({"k": [1], "time": [1], "diff": [1]}))
    assert main(["--data-dir", data, "verify"]) == 0
    out = capsys.readouterr().out
    assert "in use by process" not in out and out.splitlines()[-1] == "ok: no problems"


def test_a_lock_this_process_holds_or_no_lock_names_no_other_process(tmp_path):
    path = str(tmp_path / "LOCK")
    open(path, "w").close()
    assert flock_holder(path) is None
    fd = lock_file(path)
    try:
        assert flock_holder(path) is None  # our own
    finally:
        os.close(fd)
    assert flock_holder(str(tmp_path / "missing")) is None
