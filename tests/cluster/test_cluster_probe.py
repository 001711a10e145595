"""The manager's quick check for dead members (cluster/probe.py), on real sockets: a port
that accepted once and now refuses is suspected; one never seen accepting, or one that stops
answering (a paused process whose kernel still queues connections), is not."""

from __future__ import annotations

import socket
import threading

from sediment.cluster.probe import PeerProbe, address_of, refused


def listener(backlog: int = 8) -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(backlog)
    return s


def uri(s: socket.socket) -> str:
    return f"grpc://127.0.0.1:{s.getsockname()[1]}"


def closed_port_uri() -> str:
    s = listener()
    u = uri(s)
    s.close()
    return u


def test_a_port_that_accepted_and_then_refuses_is_suspected_once_confirmed():
    alive, dying = listener(), listener()
    members = {"m-1": uri(alive), "m-2": uri(dying), "m-3": closed_port_uri()}
    changes = threading.Event()
    probe = PeerProbe(lambda: members, lambda: True, changes.set)
    probe.look()
    assert probe.refusing() == set() and not changes.is_set()  # m-3 never accepted: not suspected
    dying.close()  # the process died: its listening socket closed with it
    probe.look()
    assert probe.refusing() == {"m-2"} and changes.is_set()
    changes.clear()
    members.pop("m-2")  # its session ended: it is no longer a member
    probe.look()
    assert probe.refusing() == set() and changes.is_set()
    alive.close()


def test_a_paused_process_is_not_suspected():
    paused = listener(backlog=1)  # never accept()s, as a SIGSTOPped process: the kernel queues
    members = {"m-1": uri(paused)}
    probe = PeerProbe(lambda: members, lambda: True, lambda: None)
    for _ in range(5):
        probe.look()
    assert probe.refusing() == set()
    paused.close()


def test_only_a_refusal_counts_and_addresses_parse():
    assert refused(("127.0.0.1", int(closed_port_uri().rsplit(":", 1)[1]))) is True
    assert address_of("grpc+tls://h.example:8815") == ("h.example", 8815)
    assert address_of("grpc://nohost") is None and address_of("") is None
