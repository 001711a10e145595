"""The feed's caches of decoded events are bounded in count as well as in bytes: with one-row
records the byte bound alone let them keep hundreds of thousands of Python objects, which
every full pass of the garbage collector walked. Subscribers read everything either way."""

from __future__ import annotations

import threading

import pyarrow as pa

from sediment.engine.feed import BULK_EVENTS, CACHE_EVENTS, UPDATES, FeedEvent, FeedLog

SCHEMA = pa.schema([("k", pa.int64())])
UPDATE_SCHEMA = SCHEMA.append(pa.field("time", pa.int64())).append(pa.field("diff", pa.int64()))


def one_row(i: int) -> pa.Table:
    return pa.table({"k": [i], "time": [i + 1], "diff": [1]}, schema=UPDATE_SCHEMA)


def test_the_decoded_events_kept_are_at_most_cache_events_however_small():
    feed = FeedLog()  # the default byte bound: 64 MiB, far above what these events weigh
    loads = []

    def load(lsn: int, version: int, written: int) -> pa.Table:
        loads.append(lsn)
        return one_row(lsn)

    for lsn in range(3 * CACHE_EVENTS):
        assert feed.event(lsn, 0, 0, load).table.column("k").to_pylist() == [lsn]
    assert len(feed._events) == CACHE_EVENTS
    assert min(feed._events) == 2 * CACHE_EVENTS, "the oldest events go first"
    assert feed.event(3 * CACHE_EVENTS - 1, 0, 0, load) is feed._events[3 * CACHE_EVENTS - 1]
    assert len(loads) == 3 * CACHE_EVENTS, "a kept event is not decoded again"
    assert feed.event(0, 0, 0, load).table.column("k").to_pylist() == [0], "an evicted one is read again"
    assert len(loads) == 3 * CACHE_EVENTS + 1


def test_the_merged_catch_up_events_kept_are_at_most_bulk_events():
    feed = FeedLog()
    parts = [FeedEvent(UPDATES, i + 1, one_row(i)) for i in range(4 * BULK_EVENTS + 1)]
    merged = [feed.bulk(i, i + 2, lambda i=i: parts[i:i + 2]) for i in range(4 * BULK_EVENTS)]
    assert len(feed._bulk) == BULK_EVENTS
    assert all(m.table.column("k").to_pylist() == [i, i + 1] for i, m in enumerate(merged))
    last = 4 * BULK_EVENTS - 1
    assert feed.bulk(last, last + 2, lambda: parts[last:last + 2]) is merged[-1], "a kept range is shared"


def test_subscribers_far_apart_read_every_update_past_the_count_bound(tmp_path):
    import sediment

    rows = 3 * CACHE_EVENTS
    with sediment.open(str(tmp_path / "d")) as eng:
        eng.add_relation("r", SCHEMA)
        feed = eng.view.relations["r"].feed
        live, behind = eng.subscribe("r"), eng.subscribe("r")
        assert live.next(timeout=5).kind == "snapshot" and behind.next(timeout=5).kind == "snapshot"
        seen: list[int] = []

        def read_live() -> None:
            while len(seen) < rows:
                event = live.next(timeout=10)
                assert event is not None
                if event.kind == UPDATES:
                    seen.extend(event.table.column("k").to_pylist())

        reader = threading.Thread(target=read_live)
        reader.start()
        for i in range(rows):
            eng.append("r", one_row(i))
        reader.join(timeout=60)
        assert seen == list(range(rows))
        assert len(feed._events) <= CACHE_EVENTS
        got: list[int] = []
        while len(got) < rows and (event := behind.next(timeout=5)) is not None:
            if event.kind == UPDATES:
                got.extend(event.table.column("k").to_pylist())
        assert got == list(range(rows)), "the subscriber behind missed, repeated or reordered updates"
        assert len(feed._events) <= CACHE_EVENTS and len(feed._bulk) <= BULK_EVENTS
        live.close()
        behind.close()


def test_subscribers_share_the_latest_progress_event(tmp_path):
    import sediment

    with sediment.open(str(tmp_path / "d")) as eng:
        eng.add_relation("r", SCHEMA)
        subs = [eng.subscribe("r") for _ in range(3)]
        assert all(sub.next(timeout=5).kind == "snapshot" for sub in subs)
        eng.append("r", one_row(0))
        eng.seal("r", 1)
        eng.seal("r", 2)
        steps = [[sub.next(timeout=5) for sub in subs] for _ in range(3)]  # in turn, as the relay wakes them
        seen = [list(events) for events in zip(*steps, strict=True)]
        assert [[e.kind for e in events] for events in seen] == [["updates", "progress", "progress"]] * 3
        assert [[e.time for e in events[1:]] for events in seen] == [[1, 2]] * 3
        assert all(seen[n][2] is seen[0][2] for n in range(3)), "each subscriber made its own event"
        assert all(sub.last_progress == 2 for sub in subs)


def test_the_last_subscriber_to_leave_lets_the_decoded_events_go(tmp_path):
    import sediment

    with sediment.open(str(tmp_path / "d")) as eng:
        eng.add_relation("r", SCHEMA)
        feed = eng.view.relations["r"].feed
        first, second = eng.subscribe("r"), eng.subscribe("r")
        for i in range(50):
            eng.append("r", one_row(i))
        eng.seal("r", 50)
        for sub in (first, second):
            got = []
            while len(got) < 50:
                event = sub.next(timeout=5)
                if event.kind == UPDATES:
                    got.extend(event.table.column("k").to_pylist())
            assert got == list(range(50))
        assert feed._events
        first.close()
        assert feed._events, "a subscriber is left: the cache stays"
        second.close()
        assert not feed._events and not feed._bulk and feed._progress is None
        assert feed._cache_bytes == 0 and feed._bulk_bytes == 0
        again = eng.subscribe("r")  # a new subscriber after that reads on as before
        assert again.next(timeout=5).kind == "snapshot"
        eng.append("r", one_row(50))
        assert again.next(timeout=5).table.column("k").to_pylist() == [50]
        again.close()
