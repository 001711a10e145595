"""A real ``sediment serve`` process for tests: started on a free port, ready once it prints
its ``serving ... on URI`` line, stopped by its PID. Its stderr is read all along by a thread
that keeps the last lines (a pipe nobody reads would fill and block a chatty server)."""

from __future__ import annotations

import collections
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from support.ports import ADDRESS_IN_USE, restart_on_port


class Served:
    """``sediment serve --data-dir DIR --listen 127.0.0.1:0 [extra...]`` with a fresh token
    (or ``token``: a restarted server's clients keep theirs)."""

    def __init__(self, data_dir: Path | str, *extra: str, token: str | None = None) -> None:
        self.token = token or "t-" + os.urandom(8).hex()
        self.env = {**os.environ, "SEDIMENT_TOKEN": self.token}
        self.proc = subprocess.Popen([sys.executable, "-m", "sediment", "serve", "--data-dir", str(data_dir),
                                      "--listen", "127.0.0.1:0", *extra], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=self.env)
        self.lines: queue.Queue = queue.Queue()
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=200)
        threading.Thread(target=self._pump, daemon=True).start()
        self._stderr_reader = threading.Thread(target=self._drain_stderr, daemon=True)
        self._stderr_reader.start()
        self.metrics_url: str | None = None
        try:
            self._wait_serving()
        except BaseException:
            self.kill()  # a server that did not come up is not left running
            raise

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)  # the end of its output: it exited

    def _drain_stderr(self) -> None:
        for line in self.proc.stderr:
            self.stderr_tail.append(line.rstrip("\n"))

    def _wait_serving(self) -> None:
        while True:
            line = self.lines.get(timeout=60)
            if line is None:
                self._stderr_reader.join(10)
            assert line is not None, "sediment serve exited before serving: " + "\n".join(self.stderr_tail)[-2000:]
            if line.startswith("metrics on "):
                self.metrics_url = line.split()[-1]
            elif line.startswith("serving "):
                self.uri = line.split()[-1]
                return

    def stop(self) -> int:
        """SIGTERM to its PID; its exit code."""
        os.kill(self.proc.pid, signal.SIGTERM)
        return self.proc.wait(timeout=60)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)


@contextmanager
def served_engine(data_dir: Path | str, token: str, schema: Any, server_class: Any = None) -> Iterator[tuple]:
    """An engine with relation ``r`` of ``schema`` (sealed at 0) served in this process on
    127.0.0.1 (by ``server_class``, a SedimentFlightServer by default), and a client of it:
    yields (engine, server, client), all closed after."""
    import sediment
    from sediment.client import Client
    from sediment.server import SedimentFlightServer

    engine = sediment.open(str(data_dir), segment_bytes=1 << 20)
    engine.add_relation("r", schema)
    engine.seal("r", 0)
    server = (server_class or SedimentFlightServer)(engine, "grpc://127.0.0.1:0", token)
    client = Client(server.uri, token)
    try:
        yield engine, server, client
    finally:
        client.close()
        server.stop(grace=30)
        engine.close()


def serve_again(data, port: int, token: str) -> Served:
    """``sediment serve`` on 127.0.0.1:PORT again (after a kill), waiting for the port."""

    def attempt() -> Served | None:
        try:
            return Served(data, "--listen", f"127.0.0.1:{port}", token=token)
        except AssertionError as exc:
            if ADDRESS_IN_USE in str(exc) or "port in use" in str(exc):
                return None
            raise

    return restart_on_port(port, attempt, "sediment serve")
