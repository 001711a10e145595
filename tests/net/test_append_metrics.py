"""The append counters (sediment_appends_total, sediment_rows_appended_total) count every durable
append and commit per relation, whichever way it came: in process, a transaction, append_many,
commit_all, a served client, and the CLI through a server. A relation's series exist at 0 from
its creation and go away when it is dropped."""

from __future__ import annotations

import subprocess
import sys
import urllib.request

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.served import Served

import sediment
from sediment.clock import ManualClock

SCHEMA = pa.schema([("id", pa.int64())])
APPENDS, ROWS, SEALS = "sediment_appends_total", "sediment_rows_appended_total", "sediment_seals_total"


def _rows(ids: range, t: int) -> pa.Table:
    return pa.table({"id": list(ids), "time": [t] * len(ids), "diff": [1] * len(ids)})


def _samples(text: str) -> dict[tuple[str, str], float]:
    return {(s.name, s.labels["relation"]): s.value for family in text_string_to_metric_families(text)
            for s in family.samples if "relation" in s.labels}


def _counts(samples: dict, relation: str) -> tuple[float | None, float | None]:
    return samples.get((APPENDS, relation)), samples.get((ROWS, relation))


def test_every_kind_of_append_counts_once_per_relation(tmp_path):
    with sediment.open(tmp_path / "data", clock=ManualClock()) as engine:
        def now() -> dict:
            return _samples(engine.metrics.exposition().decode())

        engine.add_relation("r", SCHEMA)
        engine.add_relation("s", SCHEMA)
        fresh = now()
        assert _counts(fresh, "r") == (0, 0) and fresh[(SEALS, "r")] == 0  # exported before any append

        engine.append("r", _rows(range(1), 1))
        with engine.transaction() as txn:
            txn.append("r", _rows(range(2), 2))
        assert _counts(now(), "r") == (2, 3)

        engine.append_many({"r": _rows(range(4), 3), "s": _rows(range(5), 3)})
        a, b = engine.transaction(), engine.transaction()
        a.append("r", _rows(range(1), 4))
        a.append("r", _rows(range(1), 5))  # two appends in one transaction: one commit
        b.append("s", _rows(range(6), 4))
        engine.commit_all([a, b])
        with pytest.raises(RuntimeError), engine.transaction() as aborted:
            aborted.append("r", _rows(range(9), 6))
            raise RuntimeError("abort")
        after = now()
        assert _counts(after, "r") == (4, 9)
        assert _counts(after, "s") == (2, 11)

        engine.drop_relation("s")
        assert _counts(now(), "s") == (None, None)
        engine.add_relation("s", SCHEMA)
        assert _counts(now(), "s") == (0, 0)


def test_relations_of_a_reopened_engine_are_exported_at_zero(tmp_path):
    with sediment.open(tmp_path / "data", clock=ManualClock()) as engine:
        engine.add_relation("r", SCHEMA)
        engine.append("r", _rows(range(3), 1))
    with sediment.open(tmp_path / "data", clock=ManualClock()) as engine:
        assert _counts(_samples(engine.metrics.exposition().decode()), "r") == (0, 0)  # counts since the open


@pytest.mark.slow
def test_served_appends_and_cli_appends_count(tmp_path):
    served = Served(tmp_path / "data", "--metrics-listen", "127.0.0.1:0")

    def scrape() -> dict:
        with urllib.request.urlopen(served.metrics_url, timeout=10) as response:
            return _samples(response.read().decode())

    try:
        client = sediment.connect(served.uri, token=served.token)
        try:
            client.add_relation("r", SCHEMA)
            assert _counts(scrape(), "r") == (0, 0)
            client.append("r", _rows(range(7), 1))
            with client.transaction() as txn:
                txn.append("r", _rows(range(2), 2))
            a, b = client.transaction(), client.transaction()  # as the Spark sink commits its tasks
            a.append("r", _rows(range(3), 3))
            b.append("r", _rows(range(4), 3))
            client.commit_all([a, b])
        finally:
            client.close()
        assert _counts(scrape(), "r") == (4, 16)
        updates = tmp_path / "u.csv"
        updates.write_text("id,time,diff\n1,3,1\n2,3,1\n3,4,1\n")
        done = subprocess.run([sys.executable, "-m", "sediment", "--connect", served.uri, "append", "r",
                               str(updates)], env=served.env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert _counts(scrape(), "r") == (5, 19)
    finally:
        assert served.stop() == 0
