"""The CLI against a real `sediment serve` process (--connect): the same commands give the same
output as on a data directory, and commands that need the files refuse --connect."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading

import pytest

from sediment.cli import main as cli_main

pytestmark = pytest.mark.slow


@pytest.fixture
def served(tmp_path):
    token = "t-" + os.urandom(8).hex()
    proc = subprocess.Popen([sys.executable, "-m", "sediment", "serve", "--data-dir", str(tmp_path / "served"),
                             "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "SEDIMENT_TOKEN": token})
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        while not (line := lines.get(timeout=60)).startswith("serving "):
            pass
        yield line.split()[-1], token
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


def _run(capsys, argv: list[str]) -> tuple[int, str]:
    code = cli_main(argv)
    out = capsys.readouterr()
    return code, out.out


def test_remote_cli_gives_the_same_output_as_on_a_data_directory(tmp_path, served, capsys, monkeypatch):
    uri, token = served
    csv = tmp_path / "updates.csv"
    csv.write_text("id,item,time,diff\n1,tea,1,1\n2,cake,1,1\n2,cake,2,-1\n3,jam,2,2\n")
    steps = [
        ["relation", "add", "orders", "--schema", "id:int64,item:string"],
        ["append", "orders", str(csv)],
        ["seal", "orders", "2"],
        ["read", "orders", "--as-of", "1"],
        ["read", "orders", "--as-of", "2"],
        ["since", "orders", "1"],
        ["relation", "list"],
        ["compact"],
        ["read", "orders", "--as-of", "2"],
        ["tail", "orders", "--count", "1"],
    ]
    local = ["--data-dir", str(tmp_path / "local")]
    remote = ["--connect", uri, "--token", token]
    outputs = []
    for step in steps:
        code_local, out_local = _run(capsys, [*local, *step])
        code_remote, out_remote = _run(capsys, [*remote, *step])
        if step == ["compact"]:  # the server's background compacter may have run first: "was" may be lower
            was_local, was_remote = (int(re.search(r"\(was (\d+)\)", o).group(1)) for o in (out_local, out_remote))
            assert was_remote <= was_local, (out_remote, out_local)
            out_local, out_remote = (re.sub(r"\(was \d+\)", "(was N)", o) for o in (out_local, out_remote))
        assert (code_remote, out_remote) == (code_local, out_local), step
        assert code_local == 0, (step, out_local)
        outputs.append(out_remote)
    assert outputs[3].splitlines()[1:] == ['1,"tea",1', '2,"cake",1']  # as of 1
    assert outputs[8].splitlines()[1:] == ['1,"tea",1', '3,"jam",2']  # as of 2, after compaction

    monkeypatch.setenv("SEDIMENT_TOKEN", token)  # the default token
    code, out = _run(capsys, ["--connect", uri, "stats", "--json"])
    assert code == 0 and '"orders"' in out


def test_remote_cli_refuses_file_commands_and_a_missing_token(served, capsys, monkeypatch):
    uri, _token = served
    monkeypatch.delenv("SEDIMENT_TOKEN", raising=False)
    assert cli_main(["--connect", uri, "verify"]) == 2
    assert "data directory's files" in capsys.readouterr().err
    assert cli_main(["--connect", uri, "relation", "list"]) == 2
    assert "token" in capsys.readouterr().err
