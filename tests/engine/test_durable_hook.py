"""``Engine.append(..., durable=f)``: ``f`` runs once the append is durable and visible, on
whichever thread synced its group, before the call returns; never for an append that was
refused. A served append stream acknowledges through it (sediment/net/append_stream.py
EarlyAck), so the acknowledgement leaves without waiting for the stream's thread to wake."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from sediment.clock import ManualClock
from sediment.errors import TimeAlreadySealed

pytestmark = pytest.mark.embedded_only  # the hook is the engine's: the server's use is tested in tests/net
SCHEMA = pa.schema([("k", pa.int64())])


def rows(keys, t=1):
    return pa.table({"k": pa.array(keys, pa.int64()), "time": pa.array([t] * len(keys), pa.int64()),
                     "diff": pa.array([1] * len(keys), pa.int64())})


@pytest.mark.every_log
def test_the_hook_runs_once_after_the_append_is_visible_and_before_it_returns(open_engine):
    engine = open_engine(clock=ManualClock())
    engine.add_relation("r", SCHEMA)
    seen = []

    def hook():
        seen.append(sorted(k for b in engine.replay("r") for k in b.column("k").to_pylist()))

    engine.append("r", rows([1, 2]), durable=hook)
    assert seen == [[1, 2]]
    engine.append("r", rows([3]), durable=hook)
    assert seen == [[1, 2], [1, 2, 3]]
    assert engine.view.durable_hooks == {}


def test_a_hook_that_raises_fails_neither_the_append_nor_the_log(open_engine):
    engine = open_engine(clock=ManualClock())
    engine.add_relation("r", SCHEMA)
    engine.append("r", rows([1]), durable=lambda: 1 / 0)
    engine.append("r", rows([2]))
    assert sum(b.num_rows for b in engine.replay("r")) == 2


def test_a_refused_append_never_runs_its_hook(open_engine):
    engine = open_engine(clock=ManualClock())
    engine.add_relation("r", SCHEMA)
    engine.seal("r", 5)
    called = []
    with pytest.raises(TimeAlreadySealed):
        engine.append("r", rows([1], t=5), durable=lambda: called.append(1))
    assert called == [] and engine.view.durable_hooks == {}


def test_concurrent_appends_each_run_their_own_hook_once(open_engine):
    engine = open_engine(clock=ManualClock())
    engine.add_relation("r", SCHEMA)
    calls: dict[int, int] = {}
    threads_of: dict[int, set[int]] = {}
    lock = threading.Lock()

    def work(w: int) -> None:
        for i in range(25):
            key = w * 100 + i

            def hook(key=key):
                with lock:
                    calls[key] = calls.get(key, 0) + 1
                    threads_of.setdefault(w, set()).add(threading.get_ident())

            engine.append("r", rows([key]), durable=hook)
            assert calls[key] == 1  # before the append returned

    workers = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert calls == {w * 100 + i: 1 for w in range(8) for i in range(25)}
    assert engine.view.durable_hooks == {}
    assert sum(b.num_rows for b in engine.replay("r")) == 200
