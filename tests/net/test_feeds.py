"""Feeds: snapshot then every durable change, in order, for fast, slow and resuming subscribers."""

from __future__ import annotations

import threading
from collections import defaultdict

import pyarrow as pa
import pytest

from sediment import errors
from sediment.clock import ManualClock

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])


def ups(rows):
    ks, vs, ts, ds = zip(*rows, strict=True)
    return pa.table({"k": pa.array(ks, pa.int64()), "v": pa.array(vs, pa.string()),
                     "time": pa.array(ts, pa.int64()), "diff": pa.array(ds, pa.int64())})


class Consumer:
    """Consolidates a feed and checks it against the engine at every progress record."""

    def __init__(self, engine, name):
        self.engine, self.name = engine, name
        self.state = defaultdict(int)  # (k, v) -> diff, for updates at times <= the last progress
        self.future = []  # updates received at times not yet closed
        self.checked = []

    def apply(self, event):
        if event.kind == "snapshot":
            self.state = defaultdict(int, {(r["k"], r["v"]): r["diff"] for r in event.table.to_pylist()})
        elif event.kind == "updates":
            self.future += [(r["k"], r["v"], r["time"], r["diff"]) for r in event.table.to_pylist()]
        else:
            t = event.time
            for k, v, _time, d in [u for u in self.future if u[2] <= t]:
                self.state[(k, v)] += d
            self.future = [u for u in self.future if u[2] > t]
            mine = sorted((k, v, d) for (k, v), d in self.state.items() if d)
            want = [tuple(r.values()) for r in self.engine.snapshot(self.name, t).to_pylist()]
            assert mine == want, f"stream consolidated through {t} differs from snapshot({t})"
            self.checked.append(t)


def test_snapshot_then_live_changes(open_engine):
    eng = open_engine()
    eng.add_relation("r", SCHEMA)
    eng.append("r", ups([(1, "a", 1, 1), (2, "b", 1, 1), (3, "later", 9, 1)]))
    eng.seal("r", 1)
    with eng.subscribe("r") as sub:
        consumer = Consumer(eng, "r")
        first = [sub.next(timeout=5) for _ in range(2)]
        assert [e.kind for e in first] == ["snapshot", "updates"]
        assert first[1].table.column("time").to_pylist() == [9]
        for e in first:
            consumer.apply(e)
        eng.append("r", ups([(1, "a", 2, -1)]))
        eng.seal("r", 2)
        events = [sub.next(timeout=5) for _ in range(2)]
        assert [e.kind for e in events] == ["updates", "progress"]
        for e in events:
            consumer.apply(e)
        assert consumer.checked == [2]
        assert sub.next(timeout=0.05) is None


@pytest.mark.embedded_only  # reads Subscription.lag
def test_many_writers_fast_and_slow_subscribers_agree_with_snapshots(open_engine):
    eng = open_engine(segment_bytes=1 << 16)
    eng.add_relation("r", SCHEMA)
    eng.seal("r", 0)
    fast = [eng.subscribe("r") for _ in range(3)]
    slow = eng.subscribe("r")  # reads nothing until the writers are done: it must not slow them
    consumers = [Consumer(eng, "r") for _ in fast]
    stop = threading.Event()

    def read(sub, consumer):
        while not stop.is_set() or sub.lag:
            event = sub.next(timeout=0.2)
            if event is not None:
                consumer.apply(event)

    readers = [threading.Thread(target=read, args=pair) for pair in zip(fast, consumers, strict=True)]
    for th in readers:
        th.start()
    seal_lock = threading.Lock()

    def writer(w):
        for i in range(150):
            with seal_lock:
                t = eng.sealed("r") + 1
                eng.append("r", ups([(w * 1000 + i % 17, "x", t, 1), (i % 5, "y", t + 3, 1 if i % 3 else -1)]))
                if i % 4 == 0:
                    eng.seal("r", t)

    writers = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for th in writers:
        th.start()
    for th in writers:
        th.join()
    assert slow.lag > 600, "the slow subscriber read nothing, and the writers finished anyway"
    eng.seal("r", eng.sealed("r") + 10)
    stop.set()
    for th in readers:
        th.join()
    slow_consumer = Consumer(eng, "r")
    while (event := slow.next(timeout=0.2)) is not None:
        slow_consumer.apply(event)
    for consumer in [*consumers, slow_consumer]:
        assert len(consumer.checked) > 100
        assert consumer.checked[-1] == eng.sealed("r")
    for sub in [*fast, slow]:
        sub.close()


def test_resume_after_disconnect_loses_and_repeats_nothing(open_engine):
    eng = open_engine()
    eng.add_relation("r", SCHEMA)
    eng.seal("r", 0)
    sub = eng.subscribe("r")
    consumer = Consumer(eng, "r")
    for t in range(1, 6):
        eng.append("r", ups([(t, "a", t, 1), (t, "b", t + 1, 1)]))
        eng.seal("r", t)
    while (e := sub.next(timeout=0.1)) is not None:
        consumer.apply(e)
        if e.kind == "progress" and e.time == 3:
            break
    sub.close()  # disconnect; keep state as of the last progress (3), drop what came after it
    last = consumer.checked[-1]
    consumer.future = [u for u in consumer.future if u[2] <= last]
    for t in range(6, 9):
        eng.append("r", ups([(t, "a", t, 1)]))
        eng.seal("r", t)
    with eng.subscribe("r", as_of=last, resume=True) as again:
        while (e := again.next(timeout=0.1)) is not None:
            assert e.kind != "snapshot"
            consumer.apply(e)
    assert consumer.checked[-1] == 8


@pytest.mark.embedded_only  # looks at the feed log inside the engine
def test_lagging_subscriber_survives_compaction(open_engine):
    eng = open_engine(segment_bytes=1 << 13, compact=False)
    eng.add_relation("r", SCHEMA)
    eng.seal("r", 0)
    sub = eng.subscribe("r")
    consumer = Consumer(eng, "r")
    for t in range(1, 40):
        eng.append("r", ups([(t % 9, "z" * 200, t, 1)]))
        eng.seal("r", t)
        if t % 10 == 0:
            eng.compact()
    while (e := sub.next(timeout=0.1)) is not None:
        consumer.apply(e)
    assert consumer.checked[-1] == 39
    sub.close()
    eng.compact()
    assert not eng.view.relations["r"].feed.entries


def test_closing_the_engine_ends_subscriptions(open_engine):
    eng = open_engine()
    eng.add_relation("r", SCHEMA)
    eng.seal("r", 0)
    sub = eng.subscribe("r")
    assert sub.next(timeout=1).kind == "snapshot"
    eng.close()
    with pytest.raises(errors.EngineClosed):
        sub.next(timeout=1)


def test_a_subscription_read_after_the_engine_closed_raises_even_with_its_snapshot_unread(open_engine):
    eng = open_engine()
    eng.add_relation("r", SCHEMA)
    eng.append("r", ups([(1, "a", 1, 1)]))
    eng.seal("r", 0)
    sub = eng.subscribe("r")
    eng.close()
    with pytest.raises(errors.EngineClosed):
        sub.next(timeout=1)


def test_a_subscription_read_after_its_relation_was_dropped_raises_even_with_its_snapshot_unread(open_engine,
                                                                                                  access):
    eng = open_engine()
    eng.add_relation("r", SCHEMA)
    eng.append("r", ups([(1, "a", 1, 1)]))
    eng.seal("r", 0)
    sub = eng.subscribe("r")
    eng.drop_relation("r")
    reads = 1 if access == "embedded" else 3  # over the network the error may follow events on their way
    with pytest.raises(errors.UnknownRelation):
        for _ in range(reads):
            if sub.next(timeout=5) is None:
                break
    sub.close()


def test_a_closed_subscription_returns_none_even_with_its_snapshot_unread(open_engine):
    eng = open_engine()
    eng.add_relation("r", SCHEMA)
    eng.seal("r", 0)
    sub = eng.subscribe("r")
    sub.close()
    assert sub.next(timeout=1) is None
    assert list(sub) == []


def test_cli_tail_prints_snapshot_updates_and_progress(tmp_path, capsys):
    from sediment.cli import main

    data = str(tmp_path / "cli")
    csv = tmp_path / "u.csv"
    csv.write_text("k,v,time,diff\n1,a,1,1\n2,b,3,1\n")
    assert main(["--data-dir", data, "relation", "add", "r", "--schema", "k:int64,v:string"]) == 0
    assert main(["--data-dir", data, "append", "r", str(csv)]) == 0
    assert main(["--data-dir", data, "seal", "r", "2"]) == 0
    capsys.readouterr()
    assert main(["--data-dir", data, "tail", "r", "--idle-timeout", "0.2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["event,time,k,v,diff", "snapshot,2,1,a,1", "update,3,2,b,1"]


def test_a_consumer_can_start_before_the_first_append_and_seal(open_engine):
    eng = open_engine()
    eng.add_relation("fresh", SCHEMA)
    with eng.subscribe("fresh") as sub:  # nothing appended, never sealed
        first = sub.next(timeout=5)
        assert (first.kind, first.time, first.table.num_rows) == ("snapshot", -1, 0)
        assert first.table.schema.names == ["k", "v", "diff"]
        consumer = Consumer(eng, "fresh")
        consumer.apply(first)
        eng.append("fresh", ups([(1, "a", 1, 1), (2, "b", 3, 1)]))
        eng.seal("fresh", 1)
        eng.append("fresh", ups([(1, "a", 2, -1)]))
        eng.seal("fresh", 3)
        events = [sub.next(timeout=5) for _ in range(4)]
        assert [e.kind for e in events] == ["updates", "progress", "updates", "progress"]
        assert [e.time for e in events if e.kind == "progress"] == [1, 3]
        for e in events:
            consumer.apply(e)
        assert consumer.checked == [1, 3]
        assert sub.next(timeout=0.05) is None


def test_an_as_of_out_of_range_names_the_time_given(open_engine):
    eng = open_engine()
    eng.add_relation("fresh", SCHEMA)
    with pytest.raises(errors.AsOfOutOfRange, match=r"as_of 4 for 'fresh' .*never sealed"):
        eng.subscribe("fresh", 4)


def test_cli_tail_on_a_relation_never_sealed_prints_every_update(tmp_path, capsys):
    from sediment.cli import main

    data = str(tmp_path / "cli")
    csv = tmp_path / "u.csv"
    csv.write_text("k,v,time,diff\n1,a,1,1\n2,b,3,1\n")
    assert main(["--data-dir", data, "relation", "add", "r", "--schema", "k:int64,v:string"]) == 0
    capsys.readouterr()
    assert main(["--data-dir", data, "tail", "r", "--idle-timeout", "0.2"]) == 0
    assert capsys.readouterr().out.splitlines() == ["event,time,k,v,diff"]
    assert main(["--data-dir", data, "append", "r", str(csv)]) == 0
    capsys.readouterr()
    assert main(["--data-dir", data, "tail", "r", "--idle-timeout", "0.2"]) == 0
    assert capsys.readouterr().out.splitlines() == ["event,time,k,v,diff", "update,1,1,a,1", "update,3,2,b,1"]


def one_row(i):
    return ups([(i, "v", i + 1, 1)])


def test_a_subscriber_that_stalls_through_thousands_of_updates_gets_exactly_what_it_missed(open_engine):
    eng = open_engine()
    eng.add_relation("r", SCHEMA)
    eng.seal("r", 0)
    live, stalled = eng.subscribe("r"), eng.subscribe("r")
    for sub in (live, stalled):
        assert sub.next(timeout=5).kind == "snapshot"
    seen = []

    def read_live():
        while len(seen) < 3000:
            event = live.next(timeout=10)
            assert event is not None, "the live subscriber starved"
            seen.extend(event.table.column("k").to_pylist())

    reader = threading.Thread(target=read_live)
    reader.start()
    for i in range(3000):  # the stalled subscriber reads nothing meanwhile: the writer must not wait for it
        eng.append("r", one_row(i))
    reader.join()
    got = []
    while (event := stalled.next(timeout=0.5)) is not None:
        assert event.kind == "updates"
        got.extend(event.table.column("k").to_pylist())
    assert seen == list(range(3000))
    assert got == list(range(3000)), "the stalled subscriber missed, repeated or reordered updates"
    live.close()
    stalled.close()


@pytest.mark.embedded_only  # shrinks the feed's cache so that the catch-up reads the WAL
def test_catch_up_past_the_cache_reads_the_wal_and_keeps_it_until_read(open_engine):
    eng = open_engine(segment_bytes=1 << 16, clock=ManualClock())
    eng.add_relation("r", SCHEMA)
    eng.seal("r", 0)
    feed = eng.view.relations["r"].feed
    feed._cache_limit = 4096  # a few recent records: the rest must come from the log again
    sub = eng.subscribe("r")
    assert sub.next(timeout=5).kind == "snapshot"
    for i in range(2000):
        eng.append("r", one_row(i))
    eng.compact()  # into the trace; the log is still kept from the subscriber's cursor
    assert feed.oldest_lsn() is not None
    got = []
    while (event := sub.next(timeout=0.5)) is not None:
        got.extend(event.table.column("k").to_pylist())
    assert got == list(range(2000))
    assert feed.oldest_lsn() is None
    sub.close()


@pytest.mark.embedded_only  # a remote client buffers what its stream brings: the server's subscriber never lags
def test_a_subscriber_past_its_bound_is_dropped_and_resumes_from_its_last_progress(open_engine):
    eng = open_engine()
    eng.add_relation("r", SCHEMA)
    eng.seal("r", 0)
    sub = eng.subscribe("r", max_lag=1000)
    consumer = Consumer(eng, "r")
    for t in range(1, 4):
        eng.append("r", ups([(t, "a", t, 1), (t, "later", t + 5, 1)]))
        eng.seal("r", t)
    while (event := sub.next(timeout=0.2)) is not None and consumer.checked[-1:] != [3]:
        consumer.apply(event)
    for i in range(4, 2600):  # the subscriber stalls: past its bound it is dropped, the writer never waits
        eng.append("r", ups([(i, "b", i, 1)]))
        if i % 100 == 0:
            eng.seal("r", i)
    with pytest.raises(errors.FeedOverrun, match=r"'r' dropped this subscriber.*as_of=3 and resume=True"):
        while sub.next(timeout=0.5) is not None:
            pass
    sub.close()
    consumer.future = [u for u in consumer.future if u[2] <= 3]
    eng.seal("r", 2600)
    with eng.subscribe("r", as_of=3, resume=True) as again:
        while (event := again.next(timeout=0.2)) is not None:
            consumer.apply(event)
    assert consumer.checked[-1] == 2600


@pytest.mark.embedded_only  # looks at the feed log inside the engine
def test_a_dropped_subscriber_holds_neither_the_feed_log_nor_the_wal(open_engine):
    eng = open_engine(clock=ManualClock())
    eng.add_relation("r", SCHEMA)
    eng.seal("r", 0)
    stalled = eng.subscribe("r", max_lag=500)
    live = eng.subscribe("r")
    feed = eng.view.relations["r"].feed
    for sub in (live, stalled):
        assert sub.next(timeout=5).kind == "snapshot"
    for i in range(5000):
        eng.append("r", one_row(i))
        if i % 100 == 99:
            while live.next(timeout=0) is not None:
                pass
    assert stalled.id not in feed.cursors
    assert len(feed.entries) <= 100 + 1024, "the feed log still holds the dropped subscriber's window"
    assert feed.oldest_lsn() is None or feed.oldest_lsn() > feed.entries[0][1] - 1
    with pytest.raises(errors.FeedOverrun):
        stalled.next(timeout=1)
    stalled.close()
    live.close()


@pytest.mark.embedded_only  # compares event objects: the same change is one object for every subscriber
def test_a_change_is_decoded_once_and_shared_by_every_subscriber(open_engine):
    eng = open_engine()
    eng.add_relation("r", SCHEMA)
    eng.seal("r", 0)
    subs = [eng.subscribe("r") for _ in range(50)]
    for sub in subs:
        assert sub.next(timeout=5).kind == "snapshot"
    eng.append("r", one_row(7))
    events = [sub.next(timeout=5) for sub in subs]
    assert all(e is events[0] for e in events)
    assert events[0].table.column("k").to_pylist() == [7]
    made = []
    wire = [e.encoded("wire", lambda: made.append(1) or "batches") for e in events]
    assert wire == ["batches"] * 50 and made == [1]
    for sub in subs:
        sub.close()


def test_many_subscribers_each_get_every_update_in_order(open_engine):
    eng = open_engine()
    eng.add_relation("r", SCHEMA)
    eng.seal("r", 0)
    subs = [eng.subscribe("r") for _ in range(40)]
    got = [[] for _ in subs]

    def read(sub, out):
        while len(out) < 500:
            event = sub.next(timeout=10)
            assert event is not None
            if event.kind == "updates":
                out.extend(event.table.column("k").to_pylist())

    readers = [threading.Thread(target=read, args=pair) for pair in zip(subs, got, strict=True)]
    for th in readers:
        th.start()
    for i in range(500):
        eng.append("r", one_row(i))
    for th in readers:
        th.join()
    assert all(out == list(range(500)) for out in got)
    for sub in subs:
        sub.close()


def test_a_max_lag_below_one_is_refused_and_subscribes_nothing(open_engine):
    eng = open_engine()
    eng.add_relation("r", SCHEMA)
    with pytest.raises(errors.InvalidArgument, match="max_lag"):
        eng.subscribe("r", max_lag=0)
    assert eng.stats()["relations"]["r"]["subscribers"] == 0


def test_a_served_change_is_encoded_once_for_every_remote_subscriber(tmp_path, monkeypatch):
    import uuid

    import sediment
    from sediment import server as served
    from sediment.client import Client
    from sediment.net import feed_streams

    made = []
    real = feed_streams.event_batches
    monkeypatch.setattr(feed_streams, "event_batches",
                        lambda event, schema, **kw: made.append(event.kind) or real(event, schema, **kw))
    token = uuid.uuid4().hex
    with sediment.open(str(tmp_path / "d")) as eng:
        eng.add_relation("r", SCHEMA)
        eng.seal("r", 0)
        server = served.SedimentFlightServer(eng, "grpc://127.0.0.1:0", token)
        try:
            with Client(server.uri, token) as client:
                subs = [client.subscribe("r", shared=False) for _ in range(3)]  # a stream each
                assert [s.next(timeout=10).kind for s in subs] == ["snapshot"] * 3
                eng.append("r", one_row(5))
                got = [s.next(timeout=10) for s in subs]
                assert [e.table.column("k").to_pylist() for e in got] == [[5]] * 3
                for s in subs:
                    s.close()
        finally:
            server.stop(grace=10)
    assert made.count("snapshot") == 3, "each subscription has its own snapshot"
    assert made.count("updates") == 1, "the live change was encoded once per subscriber, not once"


_CTRL_C_IN_ANOTHER_THREAD = """
import signal, sys, threading, time, uuid
import pyarrow as pa
import sediment
eng = sediment.open(sys.argv[1])
eng.add_relation("r", pa.schema([("k", pa.int64())]))
eng.seal("r", 0)
if sys.argv[2] == "served":
    from sediment import server as served
    from sediment.client import Client
    token = uuid.uuid4().hex
    server = served.SedimentFlightServer(eng, "grpc://127.0.0.1:0", token)
    sub = Client(server.uri, token).subscribe("r")
else:
    sub = eng.subscribe("r")
assert sub.next(timeout=10).kind == "snapshot"
main = threading.main_thread()

def in_next():
    # the main thread's stack holds sub.next (not Thread.start's own wait for the nudger)
    f = sys._current_frames().get(main.ident)
    while f is not None:
        if f.f_code.co_name == "next" and f.f_locals.get("self") is sub:
            return True
        f = f.f_back
    return False

def asleep():
    # the main thread is inside its wait and blocked in the kernel (state S in /proc)
    waiting = sub.sleeping if hasattr(sub, "sleeping") else in_next()
    with open(f"/proc/self/task/{main.native_id}/stat") as f:
        return waiting and f.read().rsplit(")", 1)[1].split()[0] == "S"

def nudge():
    # the kernel may pick any thread for a process's SIGINT: this one takes it
    deadline = time.monotonic() + 30
    while not asleep() and time.monotonic() < deadline:
        time.sleep(0.01)
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)

threading.Thread(target=nudge, daemon=True).start()
try:
    sub.next()
except KeyboardInterrupt:
    print("interrupted", flush=True)
    import os
    os._exit(0)
"""


@pytest.mark.parametrize("where", ["local", "served"])
def test_ctrl_c_taken_by_another_thread_ends_a_subscription_wait(tmp_path, where):
    """A SIGINT the kernel hands to a thread other than the main one runs Python's handler
    only when the main thread runs again: a subscription's endless wait in the main thread
    must wake up for it (`sediment tail` once ignored Ctrl-C this way, now and then)."""
    import subprocess
    import sys

    from support.terminal import sigint_as_at_a_terminal

    proc = subprocess.run([sys.executable, "-c", _CTRL_C_IN_ANOTHER_THREAD, str(tmp_path / "d"), where],
                          capture_output=True, text=True, timeout=60, preexec_fn=sigint_as_at_a_terminal)
    assert proc.stdout.strip() == "interrupted", proc.stderr[-2000:]
