"""One CLI process does not lock everyone out: a data directory held by `sediment serve` or by
a local `sediment tail` is found through the SERVER record beside its LOCK, and the other
commands work through that server. Real processes throughout, stopped by their PIDs."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading

import pytest
from support.served import Served
from support.terminal import sigint_as_at_a_terminal

import sediment
from sediment.cli.discover import SERVER_FILE, read_record
from sediment.errors import DataDirLocked


def test_the_record_is_written_and_removed_durably(tmp_path, monkeypatch):
    """The real fsync calls, recorded by path: the record's file before its rename, and the
    data directory after the rename and after the removal."""
    from sediment.cli.discover import remove_record, write_record

    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        real_fsync(fd)
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))

    monkeypatch.setattr(os, "fsync", fsync)
    write_record(str(tmp_path), "grpc://127.0.0.1:1")
    assert synced[-1] == str(tmp_path) and synced[-2].startswith(str(tmp_path / SERVER_FILE) + ".")
    assert sorted(os.listdir(tmp_path)) == [SERVER_FILE]  # no temporary file left
    synced.clear()
    remove_record(str(tmp_path))
    assert synced == [str(tmp_path)] and os.listdir(tmp_path) == []


def test_the_documented_record_reads_as_written(tmp_path):
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent.parent / "docs" / "formats.md").read_text()
    section = doc[doc.index("### Server record (`SERVER`)"):]
    example = section[section.index("```") + 3:].split("```")[0].strip()
    (tmp_path / SERVER_FILE).write_text(example + "\n")
    assert read_record(str(tmp_path)) == json.loads(example)
    (tmp_path / SERVER_FILE).write_text(example.replace('"version": 1', '"version": 2'))
    assert read_record(str(tmp_path)) is None  # a version this code does not know is not read


def _env(token: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SEDIMENT_TOKEN"}
    if token is not None:
        env["SEDIMENT_TOKEN"] = token
    return env


def _cli(data, *argv: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sediment", "--data-dir", str(data), *argv], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_commands_on_a_served_directory_use_its_server(tmp_path):
    data = tmp_path / "data"
    served = Served(data)
    try:
        record = read_record(str(data))
        assert record is not None and record["pid"] == served.proc.pid and record["uri"] == served.uri
        assert "token" not in record  # serve's token comes from its user, never written down
        assert os.stat(data / SERVER_FILE).st_mode & 0o077 == 0
        updates = tmp_path / "u.csv"
        updates.write_text("id,item,time,diff\n1,tea,1,1\n2,cake,2,1\n")
        env = _env(served.token)
        steps = [["relation", "add", "orders", "--schema", "id:int64,item:string"], ["append", "orders", str(updates)],
                 ["seal", "orders", "1"], ["relation", "list"], ["stats", "--json"], ["read", "orders", "--as-of", "1"]]
        outs = []
        for step in steps:
            done = _cli(data, *step, env=env)
            assert done.returncode == 0, (step, done.stderr)
            assert done.stderr.splitlines()[0] == f"sediment: {data} is served by process {served.proc.pid} " \
                                                  f"on {served.uri}: using it", step
            outs.append(done.stdout)
        assert outs[3].startswith("orders\tid:int64,item:string\tsince=0\tsealed=1")
        assert json.loads(outs[4])["relations"]["orders"]["sealed"] == 1
        assert outs[5].splitlines()[1:] == ['1,"tea",1']

        second = _cli(data, "serve", "--listen", "127.0.0.1:0", env=env)  # needs the directory itself
        assert second.returncode == 1
        assert second.stderr.strip() == f"sediment: error: {data} is held by process {served.proc.pid}, which " \
                                        f"serves it on {served.uri}; stop that process first, or use the " \
                                        "directory through it"
        # in Python too the lock names the server, and how to reach the engine through it
        with pytest.raises(DataDirLocked, match=f"in use by process {served.proc.pid}, which serves it on "
                                                f"{re.escape(served.uri)}: reach the engine there "
                                                fr"\(sediment.connect\('{re.escape(served.uri)}', token=...\)"):
            sediment.open(data)
        refused = _cli(data, "relation", "list", env=_env())
        assert refused.returncode == 2
        assert "pass --token T or set $SEDIMENT_TOKEN" in refused.stderr and str(served.proc.pid) in refused.stderr
    finally:
        assert served.stop() == 0
    assert not (data / SERVER_FILE).exists()  # removed on a clean stop
    alone = _cli(data, "read", "orders", "--as-of", "1", env=_env())
    assert alone.returncode == 0 and "served by" not in alone.stderr  # opened directly again
    assert alone.stdout.splitlines()[1:] == ['1,"tea",1']


@pytest.mark.slow
def test_a_stale_record_is_ignored(tmp_path):
    data = tmp_path / "data"
    served = Served(data)
    client = sediment.connect(served.uri, token=served.token)
    client.add_relation("r", sediment.parse_schema_spec("id:int64"))
    client.close()
    served.kill()  # SIGKILL: the record stays behind, the lock goes with the process
    assert read_record(str(data))["pid"] == served.proc.pid
    listed = _cli(data, "relation", "list", env=_env(served.token))
    assert listed.returncode == 0 and "served by" not in listed.stderr and listed.stdout.startswith("r\t")

    # the lock held by a process that serves nothing, beside a record of a process that is gone
    holder = subprocess.Popen([sys.executable, "-c", "import sys, sediment\n"
                               f"e = sediment.open({str(data)!r})\nprint('open', flush=True)\nsys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "open\n"
        locked = _cli(data, "relation", "list", env=_env(served.token))
        assert locked.returncode == 1 and "in use by another sediment process" in locked.stderr
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=60)


@pytest.mark.slow
def test_a_local_tail_does_not_block_writers(tmp_path):
    data = tmp_path / "data"
    env = _env()  # no token anywhere: the tail makes one up and records it
    assert _cli(data, "relation", "add", "fresh", "--schema", "id:int64", env=env).returncode == 0
    tail = subprocess.Popen([sys.executable, "-m", "sediment", "--data-dir", str(data), "tail", "fresh"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=sigint_as_at_a_terminal)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line.rstrip("\n")) for line in tail.stdout] and None,
                     daemon=True).start()
    try:
        assert lines.get(timeout=60) == "event,time,id,diff"  # subscribed (never sealed: from the start)
        record = read_record(str(data))
        assert record is not None and record["pid"] == tail.pid and record["token"]
        updates = tmp_path / "u.csv"
        updates.write_text("id,time,diff\n7,1,1\n8,2,1\n")
        for step in (["append", "fresh", str(updates)], ["seal", "fresh", "2"]):
            done = _cli(data, *step, env=env)
            assert done.returncode == 0, (step, done.stderr)
            assert f"served by process {tail.pid}" in done.stderr
        assert [lines.get(timeout=60) for _ in range(3)] == ["update,1,7,1", "update,2,8,1", "progress,2,,"]
    finally:
        os.kill(tail.pid, signal.SIGINT)
        tail.wait(timeout=60)
    assert not (data / SERVER_FILE).exists()
    after = _cli(data, "read", "fresh", "--as-of", "2", env=env)
    assert after.returncode == 0 and "served by" not in after.stderr and after.stdout.splitlines()[1:] == ["7,1", "8,1"]
