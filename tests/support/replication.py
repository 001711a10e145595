"""Storage nodes as real processes on 127.0.0.1 and the helpers the replication tests share:
the cluster key, a node started and killed by its PID, a record, a wait on the coordinator."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from sediment.wal import record as rec
from sediment.wal.replication.replicated_log import ReplicatedLog
from support.ports import ADDRESS_IN_USE, RESTART_DEADLINE, restart_on_port

KEY = uuid.UUID("5e5e5e5e-0000-4000-8000-000000000001")
# A coordinator process: opens the engine at argv[1] with the JSON options of argv[2] and prints
# each time it has appended and sealed, until it is killed.
COORDINATOR = """
import json, sys, pyarrow as pa, sediment
options = json.loads(sys.argv[2])
eng = sediment.open(sys.argv[1], **options)
if "r" not in eng.relations():
    eng.add_relation("r", pa.schema([("k", pa.int64())]))
t = eng.sealed("r") + 1
while True:
    eng.append("r", pa.table({"k": [t], "time": [t], "diff": [1]}))
    eng.seal("r", t)
    print(t, flush=True)
    t += 1
"""


def wait_until(log: ReplicatedLog, predicate, timeout: float = 20.0, what: str = "condition") -> None:
    """Wait for ``predicate`` over the coordinator's state, re-checked on each change."""
    assert log.wait_for(predicate, timeout), (f"no {what} within {timeout}s (the coordinator: fenced "
                                              f"{log.coordinator.fenced}, replicas {log.replica_lag()})")


def stderr_tails(nodes: list[Node], lines: int = 20) -> str:
    """Each node's last stderr lines, for a failure message."""
    return "\n".join(f"--- {n.dir.name} ---\n{n.stderr_tail(lines)}" for n in nodes)


class Node:
    """A storage node subprocess (``python -m sediment.wal.replication.node.storage_node``).

    The first start binds port 0 and reads the port from the node's ``listening on`` line;
    a start after a kill binds that port again (a test restarts a node at the address the
    coordinator knows), waiting while another process holds it (support.ports). A start that
    fails kills the process it began. ``pids``: every process started, for the tests that
    check none is left behind. The node's stderr goes to ``log_path`` (every start appends),
    not to a pipe nobody reads, which a chatty node would fill and then block on;
    :meth:`stderr_tail` shows its end in failure messages."""

    def __init__(self, directory: Path, key: uuid.UUID = KEY, extra_args: tuple[str, ...] = ()) -> None:
        self.dir = directory
        self.extra_args = extra_args
        self.port: int | None = None
        self.key = key
        self.proc: subprocess.Popen | None = None
        self.pids: list[int] = []
        self.metrics_url: str | None = None
        self.restart_deadline = RESTART_DEADLINE
        self.log_path = directory.parent / f"{directory.name}.stderr.log"
        self._log_start = 0

    @property
    def address(self) -> str:
        assert self.port is not None, f"node {self.dir.name} has no address before its first start()"
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        if self.port is None:
            started = self.start_at(0)
            assert started is not None, "a node on port 0 cannot find its port in use"
            return
        restart_on_port(self.port, lambda: self.start_at(self.port), f"storage node {self.dir.name}",
                        self.restart_deadline)

    def start_at(self, port: int) -> bool | None:
        """Start on ``port``; ``None`` when the node reported the port in use (it exited)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            began = log.tell()
            proc = subprocess.Popen(
                [sys.executable, "-m", "sediment.wal.replication.node.storage_node", "--dir", str(self.dir),
                 "--listen", f"127.0.0.1:{port}", "--cluster-key", str(self.key), *self.extra_args],
                stdout=subprocess.PIPE, stderr=log, text=True)
        self.pids.append(proc.pid)
        try:
            line = proc.stdout.readline()
            if line.startswith("metrics on "):
                self.metrics_url = line.split()[-1]
                line = proc.stdout.readline()
        except BaseException:
            stop_process(proc)
            raise
        if line.startswith("listening on"):
            self.proc, self.port = proc, int(line.rsplit(":", 1)[1])
            self._log_start = began
            return True
        stop_process(proc)
        with open(self.log_path, "rb") as log:
            log.seek(began)
            err = log.read().decode(errors="replace")
        if ADDRESS_IN_USE in err and port != 0:
            return None
        raise AssertionError(f"node {self.dir.name} did not start: {line!r}; its stderr ends:\n{err[-4000:]}")

    def stderr_since_start(self) -> str:
        """What the node wrote to stderr since its last successful start."""
        with open(self.log_path, "rb") as log:
            log.seek(self._log_start)
            return log.read().decode(errors="replace")

    def stderr_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines the node (any of its starts) wrote to stderr."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no stderr yet)"

    def kill(self) -> None:
        assert self.proc is not None
        proc, self.proc = self.proc, None
        stop_process(proc)

    def records(self, partition: int = 0) -> list[bytes]:
        """The record bodies on disk, read with the segment scanner (node must be stopped or idle)."""
        from sediment.wal import segment as sg
        pdir = self.dir / str(partition)
        out: list[bytes] = []
        for name in sorted(os.listdir(pdir)):
            parsed = sg.parse_name(name)
            if parsed and parsed[1] == "seg":
                data = memoryview((pdir / name).read_bytes())
                for off in sg.scan_segment(str(pdir / name), parsed[0]).offsets:
                    u, _why = rec.check_frame(data, off)
                    out.append(bytes(data[off + rec.HEADER_SIZE:off + rec.HEADER_SIZE + u[4]]))
        return out


def stop_process(proc: subprocess.Popen) -> None:
    """SIGKILL to ``proc``'s PID (if it still runs) and reap it."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()


def start_all(nodes: list[Node]) -> None:
    """Start each node; if one fails, kill the ones already started before raising."""
    try:
        for n in nodes:
            n.start()
    except BaseException:
        stop_all(nodes)
        raise


def stop_all(nodes: list[Node]) -> None:
    """Kill every node still running, by its PID."""
    for n in nodes:
        if n.proc is not None:
            n.kill()


def process_gone(pid: int) -> bool:
    """Whether no process has ``pid`` any more (a process killed and reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def live_node_pids(directory: Path) -> list[int]:
    """PIDs of the live (not zombie) storage node processes serving ``directory``, found in
    /proc: for the tests that check a failed setup left none behind."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"storage_node" in b" ".join(cmdline) and str(directory).encode() in cmdline and state != "Z":
            found.append(int(pid))
    return found


def make_refused_directory(directory: Path) -> None:
    """A node directory with files but no control file: a node started on it exits
    (WalMissing) instead of serving, so a setup that starts it fails there."""
    directory.mkdir(parents=True)
    (directory / "stray").write_bytes(b"x")


def r(i: int) -> rec.Record:
    return rec.Record(rec.RecordKind.UPDATES, relation_id=1, t_lo=i, t_hi=i, body=f"rec-{i}".encode())
