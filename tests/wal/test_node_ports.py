"""Storage nodes in tests get their ports without a race (tests/support/ports.py): a fresh
node binds port 0 and reports the port it got; a node restarted at its address waits while
another process holds the port, and fails naming the port if it stays taken. The node's own
refusal of a port in use is one typed line."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import trio
from support.ports import PortGrabber, PortTaken
from support.replication import (
    KEY,
    Node,
    live_node_pids,
    make_refused_directory,
    process_gone,
    start_all,
    stop_all,
)

from sediment.wal.replication.replica import ReplicaConnection, tcp_connect
from sediment.wal.replication.wire import MsgType

pytestmark = pytest.mark.timeout(180)


def answers(node: Node) -> bool:
    """Whether the node at ``node.address`` opens partition 0 for a coordinator."""
    async def open_partition() -> bool:
        async with trio.open_nursery() as nursery:
            conn = await ReplicaConnection.open(nursery, node.address, tcp_connect, KEY, 0, 30.0)
            ok = (await conn.call(MsgType.OPEN, 1)).ok
            conn.kill("done")
            return ok

    return trio.run(open_partition)


def holding(port: int) -> socket.socket:
    """A listener of this process on ``port``: the other process that took a node's port."""
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def test_a_fresh_node_reports_the_port_it_bound(tmp_path: Path) -> None:
    node = Node(tmp_path / "node")
    with pytest.raises(AssertionError, match="before its first start"):
        _ = node.address
    node.start()
    try:
        assert node.port and node.address == f"127.0.0.1:{node.port}"
        assert answers(node)
    finally:
        node.kill()


def test_a_restart_waits_while_another_process_holds_the_port_and_gets_it_back(tmp_path: Path) -> None:
    node = Node(tmp_path / "node")
    node.start()
    address = node.address
    node.kill()
    held = holding(node.port)
    restarted: list[BaseException | None] = []
    starter = threading.Thread(target=lambda: restarted.append(run_capturing(node.start)))
    starter.start()
    try:
        starter.join(1.0)
        assert starter.is_alive() and node.proc is None  # still waiting: the port is someone else's
        held.close()
        starter.join(60)
        assert restarted == [None]
        assert node.address == address and answers(node)
    finally:
        held.close()
        starter.join(60)
        if node.proc is not None:
            node.kill()


def run_capturing(call) -> BaseException | None:
    try:
        call()
    except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
        return exc
    return None


def test_a_restart_whose_port_stays_taken_fails_naming_the_port_and_leaves_nothing_running(tmp_path: Path) -> None:
    node = Node(tmp_path / "node")
    node.start()
    node.kill()
    node.restart_deadline = 1.0
    before = list(node.pids)
    with holding(node.port):
        started = time.monotonic()
        with pytest.raises(PortTaken, match=f"127.0.0.1:{node.port} stayed taken"):
            node.start()
        assert time.monotonic() - started < 30
        assert node.proc is None
        # the node itself, told to bind the taken port, refuses in one typed line and exits
        assert node.start_at(node.port) is None
        cli = subprocess.run([sys.executable, "-m", "sediment", "storage-node", "--dir", str(node.dir), "--listen",
                              node.address, "--cluster-key", str(KEY)], capture_output=True, text=True, timeout=60)
        assert cli.returncode == 1 and cli.stderr.count("\n") == 1, cli.stderr
        assert f"cannot listen on {node.address}: Address already in use" in cli.stderr
    assert len(node.pids) == len(before) + 1 and all(process_gone(pid) for pid in node.pids)


@pytest.mark.slow
def test_nodes_start_and_restart_while_another_process_keeps_grabbing_ephemeral_ports(tmp_path: Path) -> None:
    nodes = [Node(tmp_path / f"node{i}") for i in range(3)]
    with PortGrabber(seconds=120):
        try:
            start_all(nodes)
            addresses = [n.address for n in nodes]
            for _round in range(3):
                assert all(answers(n) for n in nodes)
                stop_all(nodes)
                start_all(nodes)  # each back at its address, while the grabber takes ports
                assert [n.address for n in nodes] == addresses
            assert all(answers(n) for n in nodes)
        finally:
            stop_all(nodes)


def test_when_the_second_node_fails_to_start_the_first_is_stopped(tmp_path: Path) -> None:
    nodes = [Node(tmp_path / "node0"), Node(tmp_path / "node1")]
    make_refused_directory(nodes[1].dir)
    with pytest.raises(AssertionError, match="node1 did not start"):
        start_all(nodes)
    assert nodes[0].pids and all(process_gone(pid) for pid in nodes[0].pids + nodes[1].pids)
    assert live_node_pids(nodes[0].dir) == []


def test_the_nodes_fixture_stops_its_first_node_when_the_second_fails(tmp_path: Path, request) -> None:
    make_refused_directory(tmp_path / "node1")
    with pytest.raises(AssertionError, match="node1 did not start"):
        request.getfixturevalue("nodes")
    assert live_node_pids(tmp_path / "node0") == []


def test_in_process_nodes_restart_on_their_ports_once_another_process_lets_one_go(tmp_path: Path) -> None:
    from support.wal_backends import InProcessNodes

    nodes = InProcessNodes(tmp_path, n=2)
    nodes.start()
    addresses = nodes.addresses
    nodes.stop()
    held = holding(nodes.ports[1])
    starter = threading.Thread(target=nodes.start)
    try:
        starter.start()
        starter.join(1.0)
        assert starter.is_alive()  # node 1 waits for its port
        held.close()
        starter.join(60)
        assert not starter.is_alive() and nodes.addresses == addresses
        for port in nodes.ports:
            socket.create_connection(("127.0.0.1", port), timeout=10).close()
    finally:
        held.close()
        starter.join(60)
        nodes.stop()


def test_a_nodes_stderr_goes_to_a_file_and_its_tail_shows_when_it_fails(tmp_path):
    """A node's stderr is a file, not a pipe nobody reads (a chatty node would block once the
    pipe filled); a start that fails shows what the node wrote there."""
    import os

    node = Node(tmp_path / "n0")
    node.start()
    try:
        assert os.readlink(f"/proc/{node.proc.pid}/fd/2") == str(node.log_path)
    finally:
        node.kill()
    bad = Node(tmp_path / "n1", extra_args=("--segment-bytes", "lots"))
    with pytest.raises(AssertionError, match="invalid count .lots."):
        bad.start()
    assert "invalid count 'lots'" in bad.stderr_tail()


@pytest.mark.parametrize(("argv", "code", "words"), [
    (["--listen", "127.0.0.1:99999"], 2, ["invalid address '127.0.0.1:99999'"]),  # bound port 34463
    (["--listen", "nohost"], 2, ["invalid address 'nohost'"]),  # an internal error, after making --dir
    (["--metrics-listen", "x"], 2, ["invalid address 'x'"]),
    (["--segment-bytes", "0"], 2, ["--segment-bytes", "positive"]),  # taken as given
    (["--checkpoint-records", "-1"], 2, ["--checkpoint-records", "positive"]),
    (["--listen", "nohost.invalid:0"], 1, ["cannot listen on nohost.invalid:0", "this machine"]),
])
def test_storage_node_refuses_a_bad_address_or_count_in_one_line(tmp_path: Path, argv, code, words) -> None:
    """Before listening, and before its directory is made (a host that does not resolve is
    found by binding the address once first)."""
    d = tmp_path / "node"
    cli = subprocess.run([sys.executable, "-m", "sediment", "storage-node", "--dir", str(d), "--listen",
                          "127.0.0.1:0", "--cluster-key", str(KEY), *argv], capture_output=True, text=True, timeout=30)
    assert cli.returncode == code and cli.stderr.count("\n") == 1, cli.stderr
    assert all(w in cli.stderr for w in words) and "internal error" not in cli.stderr, cli.stderr
    assert not d.exists()


def test_a_second_node_on_the_same_directory_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    """Two nodes on one --dir both served it, appending to the same segment files; the second
    is refused by the directory's lock in one line, the first serves on, nothing changed."""
    node = Node(tmp_path / "node")
    node.start()
    try:
        assert answers(node)
        before = sorted((p.relative_to(node.dir), p.stat().st_size, p.stat().st_mtime_ns) for p in node.dir.rglob("*"))
        cli = subprocess.run([sys.executable, "-m", "sediment", "storage-node", "--dir", str(node.dir), "--listen",
                              "127.0.0.1:0", "--cluster-key", str(KEY)], capture_output=True, text=True, timeout=60)
        assert cli.returncode == 1 and cli.stderr.count("\n") == 1, (cli.stdout, cli.stderr)
        assert f"storage node directory {node.dir} is in use by another process" in cli.stderr
        assert "give each node its own --dir" in cli.stderr and "listening on" not in cli.stdout
        after = sorted((p.relative_to(node.dir), p.stat().st_size, p.stat().st_mtime_ns) for p in node.dir.rglob("*"))
        assert after == before and answers(node)
    finally:
        node.kill()
    node.start()  # the lock went with the killed process: the node starts again on its directory
    try:
        assert answers(node)
    finally:
        node.kill()
    afile = tmp_path / "afile"
    afile.write_text("mine")
    cli = subprocess.run([sys.executable, "-m", "sediment", "storage-node", "--dir", str(afile), "--listen",
                          "127.0.0.1:0", "--cluster-key", str(KEY)], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 1 and cli.stderr.count("\n") == 1 and "exists and is not a directory" in cli.stderr
    assert afile.read_text() == "mine"


def test_ctrl_c_stops_a_storage_node_quietly_with_130(tmp_path):
    """A Ctrl-C reached the node's trio loop as a KeyboardInterrupt inside an exception group,
    which the command line's handler did not take for one: a traceback and exit 1."""
    from support.terminal import sigint_as_at_a_terminal

    proc = subprocess.Popen([sys.executable, "-m", "sediment", "storage-node", "--dir", str(tmp_path / "node"),
                             "--listen", "127.0.0.1:0", "--cluster-key", str(KEY)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_as_at_a_terminal)
    try:
        assert proc.stdout.readline().startswith("listening on 127.0.0.1:")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
        assert proc.stderr.read() == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_taken_metrics_port_is_refused_before_the_node_directory_is_made(tmp_path):
    """It failed after the directory and its control file were made, saying only "Address
    already in use"."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cli = subprocess.run([sys.executable, "-m", "sediment", "storage-node", "--dir", str(tmp_path / "node"),
                              "--listen", "127.0.0.1:0", "--cluster-key", str(KEY),
                              "--metrics-listen", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 1 and cli.stderr.count("\n") == 1, cli.stderr
    assert f"cannot listen on 127.0.0.1:{port} (--metrics-listen): Address already in use" in cli.stderr
    assert not (tmp_path / "node").exists()
