"""Ports for the servers tests start, without the race of "pick a free port, bind it later".

A server started fresh binds port 0 and reports the port it got (``listening on HOST:PORT``
for a storage node, ``serving ... on URI`` for ``sediment serve``). A server restarted at
the address it had (a test kills a node and brings it back) may find the port taken by
any other process on the machine meanwhile: the restart waits for the port to be free
and retries when the server still finds it in use, until a deadline, then fails the test
with :class:`PortTaken`, which names the port.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# A port another process took while the test's server was down is usually a short-lived
# client's or another test's: seconds. Past this the test fails, naming the port.
RESTART_DEADLINE = 30.0
POLL = 0.05  # the pace of the checks whether a taken port was freed
ADDRESS_IN_USE = os.strerror(errno.EADDRINUSE)  # "Address already in use", as servers print it


class PortTaken(AssertionError):
    """A server could not get its port back before the deadline: another process holds it."""


def address_in_use(exc: BaseException) -> bool:
    """Whether a failed listen raised EADDRINUSE (trio may wrap it in exception groups)."""
    if isinstance(exc, BaseExceptionGroup):
        return any(map(address_in_use, exc.exceptions))
    return isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE


def free_port() -> int:
    """A port free now, for a test that needs an address nobody listens on. Never for a
    server to bind later (another process may take it meanwhile): start servers on port 0."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a listener could bind ``host:port`` now (with SO_REUSEADDR, as servers bind:
    a port in TIME_WAIT counts as free)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
        return True


def restart_on_port(port: int, attempt: Callable[[], T | None], what: str,
                    deadline: float = RESTART_DEADLINE) -> T:
    """Run ``attempt`` (which starts a server on ``port`` and returns ``None`` when the server
    reported the address in use) until it succeeds; between attempts wait until the port is
    free again. Raise :class:`PortTaken` once ``deadline`` seconds have passed."""
    end = time.monotonic() + deadline
    while True:
        while not port_free(port):
            if time.monotonic() >= end:
                raise PortTaken(f"{what}: 127.0.0.1:{port} stayed taken by another process for {deadline}s; "
                                "the restart at the same address failed")
            time.sleep(POLL)  # no event tells when another process lets a port go
        started = attempt()
        if started is not None:
            return started
        if time.monotonic() >= end:
            raise PortTaken(f"{what}: 127.0.0.1:{port} was in use at every start for {deadline}s; "
                            "the restart at the same address failed")


GRABBER = """
import socket, sys, time
held, end = [], time.monotonic() + float(sys.argv[1])
print("grabbing", flush=True)
while time.monotonic() < end:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    held.append(s)
    if len(held) > int(sys.argv[2]):
        held.pop(0).close()
    time.sleep(0.001)
"""


class PortGrabber:
    """Another process that keeps binding ephemeral ports on 127.0.0.1 (holding the newest
    ``hold`` at a time, releasing the oldest) for at most ``seconds``: the machine's other
    servers, at their busiest. Stopped by its PID."""

    def __init__(self, seconds: float = 60.0, hold: int = 64) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", GRABBER, str(seconds), str(hold)],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().startswith("grabbing")

    def __enter__(self) -> PortGrabber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()
