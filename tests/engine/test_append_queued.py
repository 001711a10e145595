"""``Engine.append_queued`` (engine/writer.py): a plain append checked and queued on the log,
made durable by the call it returns; what a server's append stream uses so that one
stream's appends share group commits. Real engine on a local directory."""

from __future__ import annotations

import pyarrow as pa
import pytest

import sediment
from sediment import errors
from sediment.clock import ManualClock

SCHEMA = pa.schema([("id", pa.int64())])


def ups(ids, t):
    n = len(ids)
    return pa.table({"id": pa.array(ids, pa.int64()), "time": pa.array([t] * n, pa.int64()),
                     "diff": pa.array([1] * n, pa.int64())})


def test_queued_appends_apply_in_order_and_a_refusal_queues_nothing(tmp_path):
    with sediment.open(str(tmp_path / "d"), clock=ManualClock()) as engine:
        engine.add_relation("r", SCHEMA)
        engine.seal("r", 3)
        feed = engine.subscribe("r")
        assert feed.next(timeout=5).kind == "snapshot"
        waits = [engine.append_queued("r", ups([i, i + 100], 5)) for i in range(3)]
        with pytest.raises(errors.TimeAlreadySealed):
            engine.append_queued("r", ups([7], 2))
        with pytest.raises(errors.SchemaMismatch):
            engine.append_queued("r", pa.table({"other": [1], "time": [5], "diff": [1]}))
        empty = engine.append_queued("r", ups([], 5))  # nothing to make durable
        assert empty.settled()
        empty.wait()
        for queued in waits:
            queued.wait()
            assert queued.settled()
        got = []
        while len(got) < 6:
            event = feed.next(timeout=10)
            assert event is not None, "the feed stalled"
            if event.kind == "updates":
                got += event.table.column("id").to_pylist()
        assert got == [0, 100, 1, 101, 2, 102]
        feed.close()
        engine.seal("r", 5)
        assert sorted(engine.snapshot("r", 5).column("id").to_pylist()) == [0, 1, 2, 100, 101, 102]
