"""Feeds: snapshot then every durable change, in order, for fast, slow and resuming subscribers."""

from __future__ import annotations

import threading
from collections import defaultdict

import pyarrow as pa
import pytest

from sediment import errors

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
