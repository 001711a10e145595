"""A client's close() against a server that stopped answering (a ``sediment serve`` process
paused with SIGSTOP: its connections stay up, nothing comes back), and pooled append streams
whose server was killed and started again on its port: close() returns within its bound,
calls under way on other threads end typed, and an append on a stream that died while idle
goes on a new one instead of ending in OutcomeUnknown."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from urllib.parse import urlparse

import pyarrow as pa
import pytest
from support.served import Served, serve_again
from support.waiting import poll_until

import sediment
from sediment import errors
from sediment.clock import ManualClock
from sediment.net import shared_subscription
from sediment.net.append_stream import CLOSE_WAIT_SECONDS

SCHEMA = pa.schema([("id", pa.int64())])
BOUND = 20.0  # seconds a test waits for what must end within a few


def ups(ids, t=1):
    return pa.table({"id": pa.array(ids, pa.int64()), "time": pa.array([t] * len(ids), pa.int64()),
                     "diff": pa.array([1] * len(ids), pa.int64())})


@contextmanager
def paused(server: Served):
    """SIGSTOP to the server's PID, once every thread of it has stopped (the signal is not
    taken at once); SIGCONT on the way out (the test then kills it)."""
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        poll_until(lambda: _all_stopped(server.proc.pid), BOUND, "the server's threads to stop")
        yield
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)


def _all_stopped(pid: int) -> bool:
    states = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
    return all(state in ("T", "t") for state in states)


def in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list]:
    """``call`` on a daemon thread; its outcome lands in the list: ("ok", value) or ("raised", exc)."""
    box: list = []

    def run() -> None:
        try:
            box.append(("ok", call()))
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            box.append(("raised", exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def timed(call: Callable[[], object], bound: float) -> float:
    """Run ``call`` on a thread; the seconds it took, failing the test if it is still running after ``bound``."""
    start = time.monotonic()
    thread, box = in_thread(call)
    thread.join(bound)
    assert not thread.is_alive(), f"still blocked after {bound}s"
    assert box[0][0] == "ok", box
    return time.monotonic() - start


@pytest.mark.parametrize("timeout", [None, 30.0])
def test_close_with_an_idle_append_stream_returns_within_its_bound_when_the_server_is_paused(tmp_path, timeout):
    """An append leaves its stream idle in the client's pool; closing it waited for the
    server's final status, which a paused server never sends: close() hung for good without a
    timeout (and for the whole timeout with one). It now waits at most CLOSE_WAIT_SECONDS."""
    server = Served(tmp_path / "data")
    try:
        client = sediment.connect(server.uri, token=server.token, timeout=timeout)
        client.add_relation("r", SCHEMA)
        client.append("r", ups([1]))
        with paused(server):
            took = timed(client.close, BOUND)
        assert took < CLOSE_WAIT_SECONDS + 3.0
        with pytest.raises(errors.EngineClosed):
            client.describe("r")
    finally:
        server.kill()


def test_close_ends_the_calls_waiting_on_other_threads_with_a_typed_error(tmp_path):
    """An action, a read and an append_many under way on other threads when the server stops
    answering waited for good, close() or not. Closing the client now ends each of them at
    once with CallCancelled (an OutcomeUnknown: the request may have reached the server).
    (Not a plain append: it waits on its own thread, see sediment/net/call_gate.py.)"""
    server = Served(tmp_path / "data")
    try:
        client = sediment.connect(server.uri, token=server.token)
        client.add_relation("r", SCHEMA)
        client.append("r", ups([1]))
        client.seal("r", 1)
        with paused(server):
            calls = {"seal": lambda: client.seal("r", 2), "snapshot": lambda: client.snapshot("r", 1),
                     "append_many": lambda: client.append_many({"r": ups([2], t=3)})}
            running = {name: in_thread(call) for name, call in calls.items()}
            poll_until(lambda: len(client._calls._waiting) == len(calls), BOUND, "the calls to be under way")
            timed(client.close, BOUND)
            for name, (thread, box) in running.items():
                thread.join(BOUND)
                assert not thread.is_alive(), f"{name} still blocked after close()"
                assert box[0][0] == "raised" and isinstance(box[0][1], errors.CallCancelled), (name, box)
                assert "was closed while this call waited" in str(box[0][1])
        with sediment.connect(server.uri, token=server.token) as again:  # answered once resumed
            assert again.sealed("r") in (1, 2)
    finally:
        server.kill()


def test_closing_one_of_several_shared_subscriptions_is_bounded_when_the_server_is_paused(tmp_path, monkeypatch):
    """Closing a shared subscription that is not the stream's last sends feed_leave, which
    waited for good on a paused server. It now gives up after LEAVE_SECONDS (the server goes
    on sending that subscription's events until the stream ends, and the client drops them);
    the other subscription still reads."""
    monkeypatch.setattr(shared_subscription, "LEAVE_SECONDS", 1.0)
    server = Served(tmp_path / "data")
    try:
        with sediment.connect(server.uri, token=server.token) as client:
            client.add_relation("r", SCHEMA)
            a, b = client.subscribe("r"), client.subscribe("r")
            assert a.next(timeout=BOUND) is not None and b.next(timeout=BOUND) is not None
            with paused(server):
                assert timed(a.close, BOUND) < 1.0 + 3.0
            client.append("r", ups([5], t=2))
            seen = []
            while not any(e.kind == "updates" for e in seen):
                seen.append(b.next(timeout=BOUND))
                assert seen[-1] is not None, "the remaining subscription got nothing"
            b.close()
    finally:
        server.kill()


def test_an_append_after_a_restart_on_the_same_port_goes_on_a_new_stream_not_outcome_unknown(tmp_path):
    """The server is killed and started again on its port while the client's append stream
    sits idle in its pool: the next plain append was sent on the dead stream and ended in
    OutcomeUnknown although no live server could have read it. The client now probes a
    stream it has not used for a while first: the probe gets no answer, nothing of the append
    was sent, and it goes on a new stream to the new server, applied once."""
    data = tmp_path / "data"
    server = Served(data)
    port = urlparse(server.uri).port
    try:
        with sediment.connect(server.uri, token=server.token) as client:
            client._streams._clock = clock = ManualClock()  # the pool's idle times, told here
            client.add_relation("r", SCHEMA)
            for n in range(2):
                client.append("r", ups([10 * n]))
                server.kill()
                server = serve_again(data, port, server.token)
                clock.advance(1.0)  # within the pool's idle window (2 s): the dead stream is still pooled
                client.append("r", ups([10 * n + 1]))  # OutcomeUnknown before
            client.seal("r", 1)
            assert sorted(client.snapshot("r", 1).column("id").to_pylist()) == [0, 1, 10, 11]
    finally:
        server.kill()


def test_an_append_on_a_stream_whose_server_died_while_idle_says_nothing_was_written(tmp_path):
    """Killed and not started again: the probe finds the idle stream dead, the new stream
    finds no server, and the append ends in CoordinatorUnavailable (nothing sent to a live
    server), not OutcomeUnknown."""
    server = Served(tmp_path / "data")
    try:
        with sediment.connect(server.uri, token=server.token) as client:
            client._streams._clock = clock = ManualClock()
            client.add_relation("r", SCHEMA)
            client.append("r", ups([1]))
            server.kill()
            clock.advance(1.0)
            with pytest.raises(errors.CoordinatorUnavailable) as failed:
                client.append("r", ups([2]))
            assert not isinstance(failed.value, errors.OutcomeUnknown)
    finally:
        server.kill()
