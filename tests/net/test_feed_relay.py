"""The feed's relay: sleeping subscribers are woken a few at a time, each waking the next,
so no subscriber that times out, stops reading or closes may leave the others asleep; and
subscribers that catch up over the same events share one merged event."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])
UPDATES = 300


def one_row(i: int) -> pa.Table:
    return pa.table({"k": pa.array([i], pa.int64()), "v": pa.array(["v"], pa.string()),
                     "time": pa.array([i + 1], pa.int64()), "diff": pa.array([1], pa.int64())})


def _subscribed(eng, n: int) -> list:
    """``n`` subscribers of a new sealed relation "r", past their snapshots."""
    eng.add_relation("r", SCHEMA)
    eng.seal("r", 0)
    subs = [eng.subscribe("r") for _ in range(n)]
    assert all(sub.next(timeout=5).kind == "snapshot" for sub in subs)
    return subs


def _read_all(sub, out: list[int], timeout: float | None) -> None:
    """Read every update, with ``next(timeout)`` timing out again and again when given."""
    while len(out) < UPDATES:
        event = sub.next(timeout=timeout)
        if event is not None and event.kind == "updates":
            out.extend(event.table.column("k").to_pylist())


def _read_until_closed(sub, out: list[int]) -> None:
    for event in sub:
        if event.kind == "updates":
            out.extend(event.table.column("k").to_pylist())


def _read_one_then_stop(sub, out: list[int]) -> None:
    """Take the first live update and never call ``next`` again (the subscription stays open)."""
    while not out:
        event = sub.next(timeout=30)
        if event is not None and event.kind == "updates":
            out.extend(event.table.column("k").to_pylist())


def test_subscribers_that_time_out_stop_or_close_never_leave_the_others_asleep(open_engine):
    eng = open_engine()
    subs = _subscribed(eng, 60)
    got: list[list[int]] = [[] for _ in subs]
    roles = ["blocking", "timing out", "stopping", "closing"]
    threads = []
    for n, (sub, out) in enumerate(zip(subs, got, strict=True)):
        role = roles[n % len(roles)]
        if role == "stopping":
            target, args = _read_one_then_stop, (sub, out)
        elif role == "closing":
            target, args = _read_until_closed, (sub, out)
        else:
            target, args = _read_all, (sub, out, 0.001 if role == "timing out" else 30)
        threads.append(threading.Thread(target=target, args=args, daemon=True))
    for th in threads:
        th.start()
    closers = [subs[n] for n in range(len(subs)) if roles[n % len(roles)] == "closing"]
    for i in range(UPDATES):
        eng.append("r", one_row(i))
        if i == UPDATES // 2:
            for sub in closers:  # closed from another thread while they may sleep in the relay
                sub.close()
    for th in threads:
        th.join(timeout=60)
    assert not any(th.is_alive() for th in threads)
    for n, out in enumerate(got):
        role = roles[n % len(roles)]
        if role in ("blocking", "timing out"):
            assert out == list(range(UPDATES)), f"subscriber {n} ({role}) missed updates"
        elif role == "stopping":
            assert out and out[0] == 0
        else:
            assert out == list(range(len(out)))  # a prefix, in order, until it was closed
    for sub in subs:
        sub.close()


@pytest.mark.embedded_only  # compares event objects
def test_subscribers_behind_by_the_same_updates_share_one_merged_event(open_engine):
    eng = open_engine()
    subs = _subscribed(eng, 3)
    for i in range(20):
        eng.append("r", one_row(i))
    events = [sub.next(timeout=5) for sub in subs]
    assert events[0].kind == "updates" and events[0].table.column("k").to_pylist() == list(range(20))
    assert all(e is events[0] for e in events)
    made = []
    assert [e.encoded("wire", lambda: made.append(1) or "batches") for e in events] == ["batches"] * 3
    assert made == [1]
    for sub in subs:
        sub.close()
