"""A client's close() against a server that stopped answering (a ``sediment serve`` process
paused with SIGSTOP: its connections stay up, nothing comes back), and pooled append streams
whose server was killed and started again on its port: close() returns within its bound,
calls under way on other threads end typed, and an append on a stream that died while idle
goes on a new one instead of ending in OutcomeUnknown."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from urllib.parse import urlparse

import pyarrow as pa
import pytest
from support.served import Served, serve_again, served_engine
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
    (A plain append: test_close_ends_an_append_under_way_on_another_thread_with_call_cancelled.)"""
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


BIG = pa.schema([("blob", pa.large_binary())])


def in_stream_call(name: str) -> bool:
    """Whether some thread is in the append stream's method ``name`` now (its stack, read)."""
    for frame in sys._current_frames().values():
        while frame is not None:
            if frame.f_code.co_name == name and frame.f_code.co_filename.endswith("append_stream.py"):
                return True
            frame = frame.f_back
    return False


def _big_rows(megabytes: int) -> pa.Table:
    """One append of ``megabytes`` MiB: more than gRPC takes into its buffers from a stream
    that a paused server does not read, so its writes are held by flow control."""
    rows = [b"x" * (1 << 20)] * megabytes
    return pa.table({"blob": pa.array(rows, pa.large_binary()), "time": pa.array([1] * megabytes, pa.int64()),
                     "diff": pa.array([1] * megabytes, pa.int64())})


@pytest.mark.parametrize("case", ["acknowledgement", "probe", "held_write", "pipelined"])
def test_close_ends_an_append_under_way_on_another_thread_with_call_cancelled(tmp_path, case):
    """A plain append sent on its pooled stream to a server that stopped answering waited for
    its acknowledgement for good, close() or not: the stream was a do_put, which Arrow cannot
    cancel. It is now an exchange, which close() cancels: the append ends at once with
    CallCancelled (an OutcomeUnknown: it may have reached the server), whether it waited for
    its acknowledgement, for the probe of its idle stream, or (a large append, over
    INLINE_APPEND_BYTES, on a worker) in a write held by gRPC's flow control; and so does a
    pipelined flush waiting for its appends' acknowledgements."""
    server = Served(tmp_path / "data")
    try:
        client = sediment.connect(server.uri, token=server.token)
        client._streams._clock = clock = ManualClock()  # the pool's idle times, told here: a probe only when asked
        client.add_relation("r", SCHEMA)
        client.add_relation("big", BIG)
        client.append("r", ups([1]))  # its stream now idles in the pool
        pipe = client.pipelined("r") if case == "pipelined" else None
        with paused(server):
            if case == "probe":
                clock.advance(1.0)  # the idle stream is probed before the append goes out on it
            if case == "held_write":
                call = lambda: client.append("big", _big_rows(16))  # noqa: E731
            elif pipe is not None:
                pipe.append(ups([3]))
                call = pipe.flush
            else:
                call = lambda: client.append("r", ups([2]))  # noqa: E731
            thread, box = in_thread(call)
            where = {"held_write": "send", "probe": "probe"}.get(case, "receive")  # where the append waits
            poll_until(lambda: in_stream_call(where), BOUND, f"a thread to be in AppendStream.{where}")
            start = time.monotonic()
            closing, closed = in_thread(client.close)
            thread.join(BOUND)
            took = time.monotonic() - start
            assert not thread.is_alive(), f"the {case} append still blocked {BOUND}s after close()"
            assert took < 3.0, f"the {case} append ended {took:.1f}s after close()"
            assert box[0][0] == "raised" and isinstance(box[0][1], errors.CallCancelled), box
            closing.join(BOUND)
            assert not closing.is_alive() and closed == [("ok", None)], closed
        with sediment.connect(server.uri, token=server.token) as again:  # the server took what it read
            again.append("r", ups([4]))
            again.seal("r", 1)
            assert set(again.snapshot("r", 1).column("id").to_pylist()) - {2, 3} == {1, 4}
    finally:
        server.kill()


def test_a_closed_clients_call_threads_end_at_once(tmp_path):
    """A client's blocking calls run on worker threads of its own (sediment/net/call_gate.py),
    which wait 30 s for another call before they end; a closed client's end at once, so a
    process that connects and closes clients often does not hold every closed one's threads."""
    token = "close-" + os.urandom(8).hex()
    with served_engine(tmp_path / "data", token, SCHEMA) as (_engine, server, _client):
        before = set(threading.enumerate())
        client = sediment.connect(server.uri, token=token)
        start = threading.Barrier(4)

        def calls() -> None:
            start.wait()
            for _ in range(20):
                assert client.relations() == ["r"]
                assert client.snapshot("r", 0).num_rows == 0

        callers = [threading.Thread(target=calls) for _ in range(4)]
        for th in callers:
            th.start()
        for th in callers:
            th.join()
        workers = [t for t in threading.enumerate() if t not in before and t.name == "sediment-call"]
        assert workers, "the calls ran on no worker thread of the client"
        client.close()
        poll_until(lambda: not any(t.is_alive() for t in workers), 5, "the closed client's call threads to end")
