"""The manager's quick check for dead members: a member whose advertised port refuses
connections, after it once accepted one, is treated as gone before its ZooKeeper session
ends.

A SIGKILLed process's listening socket closes with it, so the next connection to its port
is refused at once, while ZooKeeper ends its session only after the session timeout. Safety
never rests on this check: the manager only moves the member's partitions (as for a member
that leaves), and the old owner, dead or alive, is fenced where data lands: the new owner's
store session at the storage nodes, and its open's rewrite of every trace state and catalog
entry (metadata/fence.py), which makes the old owner's later commits fail. A paused process (SIGSTOP, a long GC) still accepts connections in the kernel, so
it is not suspected: its partitions move when its session ends. Only a refusal counts, never
a timeout or an unreachable network, and a refusal is confirmed by a second attempt.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

PROBE_INTERVAL = 0.2  # seconds between two looks at every member's port
CONFIRM_AFTER = 0.05  # seconds before a refusal is checked once more
CONNECT_TIMEOUT = 0.5
log = logging.getLogger(__name__)


def address_of(advertise: str) -> tuple[str, int] | None:
    """(host, port) of an advertised ``grpc://`` or ``grpc+tls://`` URI; None if it has none."""
    try:
        parts = urlsplit(advertise)
        return (parts.hostname, parts.port) if parts.hostname and parts.port else None
    except ValueError:
        return None


def refused(address: tuple[str, int], timeout: float = CONNECT_TIMEOUT) -> bool | None:
    """True: the connection was refused; False: accepted; None: neither (a timeout, no route)."""
    try:
        with socket.create_connection(address, timeout=timeout):
            return False
    except ConnectionRefusedError:
        return True
    except OSError as exc:
        return True if exc.errno == errno.ECONNREFUSED else None


class PeerProbe:
    """Looks at the ports of ``members()`` (id -> advertised URI) every ``interval`` seconds
    while ``active()``; calls ``changed()`` when the set of dead-looking members changes."""

    def __init__(self, members: Callable[[], dict[str, str]], active: Callable[[], bool],
                 changed: Callable[[], None], interval: float = PROBE_INTERVAL) -> None:
        self._members, self._active, self._changed = members, active, changed
        self._interval = interval
        self._accepted: set[str] = set()  # members whose port accepted a connection once
        self._refusing: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cluster-peer-probe", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def refusing(self) -> set[str]:
        """Members whose port refused connections at the last look (after accepting once)."""
        with self._lock:
            return set(self._refusing)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            if not self._active():
                continue
            try:
                self.look()
            except Exception as exc:  # noqa: BLE001 - a failed look is only a missed shortcut
                log.warning("peer probe: %s", exc)

    def look(self) -> None:
        """One look at every member's port."""
        members = self._members()
        now: set[str] = set()
        for member, advertise in members.items():
            address = address_of(advertise)
            if address is None:
                continue
            got = refused(address)
            if got and member in self._accepted and self._stop.wait(CONFIRM_AFTER) is False and refused(address):
                now.add(member)
            elif got is False:
                self._accepted.add(member)
        self._accepted &= set(members)
        with self._lock:
            changed, self._refusing = now != self._refusing, now
        if changed:
            if now:
                one = len(now) == 1
                log.warning("%s %s: %s removed from the members", "member" if one else "members",
                            ", ".join(sorted(now)), "it refuses connections and is" if one else
                            "they refuse connections and are")
            self._changed()
