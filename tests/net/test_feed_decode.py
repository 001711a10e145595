"""A record just made durable reaches every subscriber decoded once, from the engine's
memory: subscribers woken together neither read it back from the log nor each decode
their own copy; a record no longer in memory is read from the log, with the same result."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])
RECORDS = 40
SUBSCRIBERS = 8


def one_row(i: int) -> pa.Table:
    return pa.table({"k": pa.array([i], pa.int64()), "v": pa.array([f"v{i}"], pa.string()),
                     "time": pa.array([i + 1], pa.int64()), "diff": pa.array([1], pa.int64())})


def _counting(obj, name: str) -> list[int]:
    """Count the calls of ``obj.name`` (the call itself runs as before)."""
    calls: list[int] = []
    real = getattr(obj, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    setattr(obj, name, counted)
    return calls


def _read(sub, out: list, rows: int = RECORDS) -> None:
    while sum(e.table.num_rows for e in out) < rows:
        event = sub.next(timeout=30)
        assert event is not None, "the feed stalled"
        if event.kind == "updates":
            out.append(event)


@pytest.mark.embedded_only  # counts the engine's log reads and decodes
def test_subscribers_woken_together_share_one_decode_from_memory(open_engine):
    eng = open_engine()
    eng.add_relation("r", SCHEMA)
    eng.seal("r", 0)
    subs = [eng.subscribe("r") for _ in range(SUBSCRIBERS)]
    assert all(sub.next(timeout=5).kind == "snapshot" for sub in subs)
    log_reads = _counting(eng.reads.log, "read")
    decodes = _counting(eng.view.get("r"), "decode_body")
    got: list[list] = [[] for _ in subs]
    threads = [threading.Thread(target=_read, args=(sub, out), daemon=True) for sub, out in zip(subs, got, strict=True)]
    for th in threads:
        th.start()
    for i in range(RECORDS):
        eng.append("r", one_row(i))
    for th in threads:
        th.join(timeout=60)
    assert not any(th.is_alive() for th in threads)
    for out in got:
        assert pa.concat_tables([e.table for e in out]).column("k").to_pylist() == list(range(RECORDS))
    assert log_reads == [], "a record just made durable was read back from the log"
    assert len(decodes) == RECORDS, f"{len(decodes)} decodes of {RECORDS} records for {SUBSCRIBERS} subscribers"
    for sub in subs:
        sub.close()


@pytest.mark.embedded_only  # empties the engine's memory of record bodies
def test_a_record_no_longer_in_memory_is_read_from_the_log(open_engine):
    eng = open_engine()
    eng.add_relation("r", SCHEMA)
    eng.seal("r", 0)
    sub = eng.subscribe("r")
    assert sub.next(timeout=5).kind == "snapshot"
    log_reads = _counting(eng.reads.log, "read")
    for i in range(5):
        eng.append("r", one_row(i))
    eng.view.bodies.drop_below(1 << 62)
    out: list = []
    _read(sub, out, 5)
    assert pa.concat_tables([e.table for e in out]).to_pydict() == pa.concat_tables(
        [one_row(i) for i in range(5)]).to_pydict()
    assert log_reads, "the records were not read from the log"
    sub.close()

