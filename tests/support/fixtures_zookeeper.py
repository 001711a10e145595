"""Fixtures for ZooKeeper tests: a real server from Debian's package.

One server per test session (start-up costs a JVM). ``stop()``/``start()`` restart it
on the same port and data directory so tests can take ZooKeeper away mid-operation.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.ports import RESTART_DEADLINE, free_port, restart_on_port

ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"
SLF4J_JAR = "/usr/share/java/slf4j-simple.jar"
# The JVM's start until it serves: 1-13 s measured on 2 shared cores at load 8-28, over 20 s
# at load 35-47 (seven people's suites at once). Waited for as a condition: the bound costs
# nothing when the server is quick.
READY_TIMEOUT = 60.0
# ZooKeeperServerMain logs this after the server reached RUNNING (ContainerManager starts next).
READY_LINE = b"ContainerManager - Using checkIntervalMs"
# What the JVM logs (then exits) when another process holds its port.
IN_USE_LINE = b"BindException: Address already in use"
FRESH_PORT_TRIES = 5
STOP_TIMEOUT = 10.0
# ZooKeeper grants a session timeout between 2 and 20 ticks (unless told otherwise) and expires
# sessions in tick-sized buckets: a short tick lets a 3 s session be granted as asked and end
# within a tick of its timeout (with tickTime=2000 it was granted 4 s and ended 4-6 s late).
TICK_MS = 250
MAX_SESSION_MS = 60_000


def four_letter_word(port: int, word: str, timeout: float = 1.0) -> str:
    """Send a ZooKeeper four-letter command and return the reply ('' when unreachable)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(word.encode())
            chunks = []
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                chunks.append(chunk)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


class ZooKeeperServer:
    """A ZooKeeperServerMain JVM on 127.0.0.1, started and stopped by PID."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port: int | None = None  # known once it first served
        self.hosts = ""
        self.data_dir = workdir / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config = workdir / "zoo.cfg"
        self.log_path = workdir / "zookeeper.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._output = threading.Condition()  # signalled by the thread reading the server's output
        self._ready = threading.Event()
        self._exited = threading.Event()
        self._in_use = threading.Event()
        self._pump: threading.Thread | None = None
        self.restart_deadline = RESTART_DEADLINE

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def _log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def start(self) -> None:
        """Start the server: a first start on a port free now, another one if the JVM finds it
        taken (ZooKeeper reads port 0 as "no port", so it cannot bind 0 and report); a start
        after stop() on the port it had, waiting while another process holds it."""
        if self._process is not None:
            return
        if self.port is not None:
            restart_on_port(self.port, lambda: self._attempt(self.port), "ZooKeeper", self.restart_deadline)
            return
        for _ in range(FRESH_PORT_TRIES):
            if self._attempt(free_port()):
                return
        pytest.fail(f"ZooKeeper found each of {FRESH_PORT_TRIES} free ports taken by the time it bound it")

    def _attempt(self, port: int) -> bool | None:
        """Run the server on ``port`` until it serves (True) or reports the port in use (None,
        after it exited); fail the test on anything else."""
        self.config.write_text(
            f"tickTime={TICK_MS}\n"
            f"maxSessionTimeout={MAX_SESSION_MS}\n"
            f"dataDir={self.data_dir}\n"
            "clientPortAddress=127.0.0.1\n"
            f"clientPort={port}\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=ruok,srvr,stat,envi,cons\n"
        )
        self._ready, self._exited, self._in_use = threading.Event(), threading.Event(), threading.Event()
        self._process = subprocess.Popen(
            [
                "java",
                "-Xmx256m",
                "-cp",
                f"{ZOOKEEPER_JAR}:{SLF4J_JAR}",
                "org.apache.zookeeper.server.ZooKeeperServerMain",
                str(self.config),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.workdir,
        )
        self._pump = threading.Thread(target=self._copy_output, args=(self._process,), daemon=True)
        self._pump.start()
        with self._output:
            self._output.wait_for(lambda: self._ready.is_set() or self._exited.is_set(), READY_TIMEOUT)
        if self._ready.is_set() and four_letter_word(port, "ruok") == "imok":
            self.port, self.hosts = port, f"127.0.0.1:{port}"
            return True
        exited = self._exited.is_set()
        self.stop()
        if self._in_use.is_set():
            return None
        if exited:
            pytest.fail(f"ZooKeeper exited during start-up; log tail:\n{self._log_tail()}")
        pytest.fail(
            f"ZooKeeper on 127.0.0.1:{port} did not log that it serves (or answer 'ruok') within "
            f"{READY_TIMEOUT}s; log tail:\n{self._log_tail()}"
        )

    def _copy_output(self, process: subprocess.Popen[bytes]) -> None:
        """Copy the server's output to the log file (so the pipe never fills) and signal
        the line that says it serves clients, then the end of its output (it exited)."""
        assert process.stdout is not None
        with open(self.log_path, "ab") as log:
            for line in process.stdout:
                log.write(line)
                log.flush()
                if IN_USE_LINE in line:
                    self._in_use.set()
                if READY_LINE in line:
                    with self._output:
                        self._ready.set()
                        self._output.notify_all()
        with self._output:
            self._exited.set()
            self._output.notify_all()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers; returns once the process is gone (its
        listening socket closes with it)."""
        process, self._process = self._process, None
        if process is None:
            return
        try:
            os.kill(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
        if self._pump is not None:
            self._pump.join(STOP_TIMEOUT)
        if process.stdout is not None:
            process.stdout.close()


@pytest.fixture(scope="session")
def zookeeper_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """A real ZooKeeper for the whole session; tests may stop() and start() it."""
    if not os.path.exists(ZOOKEEPER_JAR):
        pytest.fail(
            f"{ZOOKEEPER_JAR} is missing: run `make zookeeper` (apt-get install zookeeper) to "
            "install Debian's ZooKeeper for these tests"
        )
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def zookeeper(zookeeper_server: ZooKeeperServer) -> ZooKeeperServer:
    """The session server, started again if an earlier test left it stopped."""
    zookeeper_server.start()
    return zookeeper_server


@pytest.fixture
def zk_root(request: pytest.FixtureRequest) -> str:
    """A znode root unique to this test, so tests sharing the server never collide."""
    name = "".join(c if c.isalnum() else "_" for c in request.node.name)[:60]
    return f"/sediment-test/{name}-{uuid.uuid4().hex[:8]}"
