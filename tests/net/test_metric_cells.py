"""The instruments every append moves (sediment_appends_total, sediment_rows_appended_total,
sediment_append_latency_seconds, sediment_group_commit_records) are plain numbers and
per-thread histogram cells read at scrape time: what a scrape shows must still be every
observation, from any number of threads, including threads that have finished."""

from __future__ import annotations

import threading

import pyarrow as pa
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import sediment
from sediment.clock import ManualClock
from sediment.metrics import PlainCounter, ThreadHistogram

SCHEMA = pa.schema([("id", pa.int64())])


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    from prometheus_client.exposition import generate_latest
    return _samples(generate_latest(registry).decode())


def test_histogram_counts_every_observation_of_live_and_finished_threads():
    registry = CollectorRegistry(auto_describe=True)
    h = ThreadHistogram(registry, "t_seconds", "test", buckets=(0.001, 0.01))
    go = threading.Event()
    finished = []

    def work(value: float, n: int) -> None:
        go.wait()
        for _ in range(n):
            h.observe(value)
        finished.append(n)

    threads = [threading.Thread(target=work, args=(0.0005 if k % 2 else 0.005, 1000)) for k in range(16)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join()
    h.observe(1.0)  # this thread's cell stays live
    first = _scrape(registry)
    assert first[("sediment_t_seconds_count", ())] == 16_001
    assert first[("sediment_t_seconds_bucket", (("le", "0.001"),))] == 8000
    assert first[("sediment_t_seconds_bucket", (("le", "0.01"),))] == 16_000
    assert first[("sediment_t_seconds_bucket", (("le", "+Inf"),))] == 16_001
    assert abs(first[("sediment_t_seconds_sum", ())] - (8000 * 0.0005 + 8000 * 0.005 + 1.0)) < 1e-6
    h.observe(0.0001)
    again = _scrape(registry)  # the finished threads' cells were folded once, not twice
    assert again[("sediment_t_seconds_count", ())] == 16_002
    assert again[("sediment_t_seconds_bucket", (("le", "0.001"),))] == 8001


def test_cells_of_finished_threads_are_folded_even_without_a_scrape():
    registry = CollectorRegistry(auto_describe=True)
    h = ThreadHistogram(registry, "t_seconds", "test")
    for _ in range(20):  # 20 x 25 short-lived threads, never scraped meanwhile
        threads = [threading.Thread(target=h.observe, args=(0.002,)) for _ in range(25)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert h.cells <= 128  # the list follows the live threads, not every thread that ever observed
    got = _scrape(registry)
    assert got[("sediment_t_seconds_count", ())] == 500
    assert got[("sediment_t_seconds_bucket", (("le", "0.0025"),))] == 500


def test_plain_counter_series_are_created_at_zero_and_removed():
    registry = CollectorRegistry(auto_describe=True)
    c = PlainCounter(registry, "things", "test", "relation")
    c.labels(relation="a").inc(3)
    c.labels(relation="b")
    got = _scrape(registry)
    assert got[("sediment_things_total", (("relation", "a"),))] == 3
    assert got[("sediment_things_total", (("relation", "b"),))] == 0
    c.remove("a")
    assert ("sediment_things_total", (("relation", "a"),)) not in _scrape(registry)


def test_an_engine_s_append_instruments_move_with_appends_from_many_threads(tmp_path):
    threads, each = 8, 25
    with sediment.open(tmp_path / "data", clock=ManualClock()) as engine:
        engine.add_relation("r", SCHEMA)
        before = _samples(engine.metrics.exposition().decode())

        def work(k: int) -> None:
            for i in range(each):
                engine.append("r", pa.table({"id": [k * 1000 + i, k * 1000 + i], "time": [1, 2], "diff": [1, 1]}))

        ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        after = _samples(engine.metrics.exposition().decode())
        n = threads * each
        rel = (("relation", "r"),)
        assert after[("sediment_appends_total", rel)] - before[("sediment_appends_total", rel)] == n
        assert after[("sediment_rows_appended_total", rel)] - before[("sediment_rows_appended_total", rel)] == 2 * n
        assert after[("sediment_append_latency_seconds_count", ())] - \
            before[("sediment_append_latency_seconds_count", ())] == n
        assert after[("sediment_append_latency_seconds_sum", ())] > before[("sediment_append_latency_seconds_sum", ())]
        groups = after[("sediment_group_commit_records_count", ())] - before[("sediment_group_commit_records_count", ())]
        records = after[("sediment_group_commit_records_sum", ())] - before[("sediment_group_commit_records_sum", ())]
        assert 1 <= groups <= records <= n  # each group wrote one or more records, a record one append or several joined
        engine.seal("r", 2)
        got = engine.snapshot("r", as_of=2)
        assert got.num_rows == n and set(got.column("diff").to_pylist()) == {2}  # each append's two rows
