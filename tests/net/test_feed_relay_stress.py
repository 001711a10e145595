"""The feed's relay under a crowd: 200 subscriber threads that block, time out at once, are
closed from another thread, stop reading, or are dropped for lag while they sleep in the
relay, beside a writer appending back to back. Every reader still reading gets every update
once, in order; no one is left asleep; and once all are done the relay holds no wake-up
(a count that drifted up would stop the relay starting wake-ups, down would wake too many)."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest
from support.waiting import until

from sediment.errors import EngineClosed, FeedOverrun

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])
UPDATES = 300
SUBSCRIBERS = 200
STALL = 10.0  # seconds a reader waits for an update already written before it calls it a stall
ROLES = ["blocking", "timing out", "blocking", "closed", "stopping", "dropped"]


def one_row(i: int) -> pa.Table:
    return pa.table({"k": pa.array([i], pa.int64()), "v": pa.array(["v"], pa.string()),
                     "time": pa.array([i + 1], pa.int64()), "diff": pa.array([1], pa.int64())})


def _reader(sub, role: str, out: list, ended: list) -> None:
    try:
        while len(out) < UPDATES:
            event = sub.next(timeout=0.001 if role == "timing out" else STALL)
            if event is None:
                if sub.closed:
                    break
                if role != "timing out":
                    ended.append("stalled")
                    return
                continue
            if event.kind == "updates":
                out.extend(event.table.column("k").to_pylist())
                if role == "stopping":
                    break
    except (FeedOverrun, EngineClosed) as exc:
        ended.append(exc)
        return
    ended.append("done")




@pytest.mark.embedded_only  # reads the relay's count of wake-ups
def test_a_crowd_of_subscribers_in_every_role_gets_every_update_once_in_order(open_engine, monkeypatch):
    from sediment.engine import feed as feed_mod

    monkeypatch.setattr(feed_mod, "CHECK_EVERY", 8)  # lag checks often: "dropped" ones go while asleep
    eng = open_engine()
    eng.add_relation("r", SCHEMA)
    eng.seal("r", 0)
    roles = [ROLES[n % len(ROLES)] for n in range(SUBSCRIBERS)]
    subs = [eng.subscribe("r", max_lag=1 if role == "dropped" else None) for role in roles]
    assert all(sub.next(timeout=5).kind == "snapshot" for sub in subs)
    feed = eng.view.relations["r"].feed
    got: list[list[int]] = [[] for _ in subs]
    ended: list[list] = [[] for _ in subs]
    threads = [threading.Thread(target=_reader, args=args, daemon=True)
               for args in zip(subs, roles, got, ended, strict=True)]
    for th in threads:
        th.start()
    closed = [sub for sub, role in zip(subs, roles, strict=True) if role == "closed"]
    steady = [out for out, role in zip(got, roles, strict=True) if role == "blocking"]
    try:
        for i in range(UPDATES):
            eng.append("r", one_row(i))
            if i % 20 == 10:  # now and then every blocking reader gets there and sleeps: the relay wakes them all
                assert until(lambda i=i: all(len(out) > i for out in steady), STALL), f"update {i} never reached them all"
            if i % 50 == 25 and closed:  # closed from another thread while they may sleep in the relay
                for sub in closed[:len(closed) // 5 + 1]:
                    sub.close()
                del closed[:len(closed) // 5 + 1]
        deadline = time.monotonic() + 2 * STALL
        for th in threads:
            th.join(timeout=max(0.0, deadline - time.monotonic()))
        stalled = [n for n, th in enumerate(threads) if th.is_alive()]
        assert not stalled, f"{len(stalled)} subscribers never finished, e.g. {[roles[n] for n in stalled[:5]]}"
    finally:
        for sub in subs:  # ends the readers of a failed run at once
            sub.close()
    for n, (role, out, end) in enumerate(zip(roles, got, ended, strict=True)):
        assert end != ["stalled"], f"subscriber {n} ({role}) waited {STALL} s for an update that was written"
        if role in ("blocking", "timing out"):
            assert out == list(range(UPDATES)), f"subscriber {n} ({role}) missed or repeated updates"
        elif role == "stopping":
            assert out and out == list(range(out[0], out[-1] + 1)), f"subscriber {n}: {out}"
        else:  # a prefix, in order, until it was closed or dropped
            assert out == list(range(len(out))), f"subscriber {n} ({role}): {out[:20]}"
    dropped = [end for role, end in zip(roles, ended, strict=True) if role == "dropped"]
    assert sum(isinstance(e[0], FeedOverrun) for e in dropped if e) > len(dropped) // 2, "the lag checks dropped no one"
    assert feed.relay._running == 0, f"the relay counts {feed.relay._running} wake-ups once every subscriber is done"
