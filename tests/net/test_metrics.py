"""Metrics and stats: a real HTTP scrape of /metrics (in process and from `sediment serve`),
`sediment stats`, and Engine.stats() over the network, each checked to move as the engine works."""

from __future__ import annotations

import json
import urllib.request

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.served import Served

import sediment
from sediment.cli import main as cli_main
from sediment.metrics import MetricsServer
from sediment.server import serve_local

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def _updates(ids: range, t: int) -> pa.Table:
    return pa.table({"id": list(ids), "name": [f"n{i}" for i in ids], "time": [t] * len(ids),
                     "diff": [1] * len(ids)})


def _scrape(url: str) -> dict[tuple[str, tuple], float]:
    """Every sample of the exposition, keyed by (name, sorted labels)."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _rel(samples: dict, name: str, relation: str) -> float:
    return samples[(name, (("relation", relation),))]


def test_metrics_endpoint_counts_appends_and_follows_compaction(tmp_path):
    with sediment.open(tmp_path / "data") as engine:
        server = MetricsServer(engine.metrics, "127.0.0.1", 0)
        try:
            engine.add_relation("r", SCHEMA)
            before = _scrape(server.url)
            assert _rel(before, "sediment_relation_sealed", "r") == -1
            assert _rel(before, "sediment_rows_appended_total", "r") == 0  # exported from the relation's creation

            for t in range(1, 4):
                engine.append("r", _updates(range(t * 100, t * 100 + 50), t))
            engine.seal("r", 3)
            mid = _scrape(server.url)
            assert _rel(mid, "sediment_rows_appended_total", "r") == 150
            assert _rel(mid, "sediment_appends_total", "r") == 3
            assert mid[("sediment_append_latency_seconds_count", ())] == 3
            assert _rel(mid, "sediment_relation_sealed", "r") == 3
            assert _rel(mid, "sediment_relation_tail_records", "r") == 3
            assert _rel(mid, "sediment_relation_compaction_lag", "r") == 4  # times 0..3 not in batches
            assert mid[("sediment_wal_backlog_records", ())] == 3
            assert mid[("sediment_wal_backlog_bytes", ())] > 0

            engine.compact()
            after = _scrape(server.url)
            assert _rel(after, "sediment_relation_batches", "r") >= 1
            assert _rel(after, "sediment_relation_rows", "r") == 150
            assert _rel(after, "sediment_relation_trace_upper", "r") == 4
            assert _rel(after, "sediment_relation_compaction_lag", "r") == 0
            assert _rel(after, "sediment_relation_tail_records", "r") == 0
            assert after[("sediment_wal_backlog_bytes", ())] == 0
            assert after[("sediment_compaction_passes_total", ())] > mid.get(("sediment_compaction_passes_total", ()), 0)
            assert _rel(after, "sediment_batches_written_total", "r") >= 1
            puts = after.get(("sediment_blob_requests_total", (("op", "put_if_absent"),)), 0) + \
                after.get(("sediment_blob_requests_total", (("op", "put_file"),)), 0)
            assert puts >= 1 and puts > mid.get(("sediment_blob_requests_total", (("op", "put_if_absent"),)), 0)
            assert after[("sediment_group_commit_records_count", ())] >= 4  # 3 appends and a seal, at least
        finally:
            server.stop()


def test_stats_cli_matches_engine_stats(tmp_path, capsys):
    data = str(tmp_path / "data")
    with sediment.open(data) as engine:
        engine.add_relation("r", SCHEMA)
        engine.append("r", _updates(range(10), 1))
        engine.seal("r", 1)
        expected = engine.stats()
    assert cli_main(["--data-dir", data, "stats", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    rel = got["relations"]["r"]
    assert rel == {**expected["relations"]["r"], "seconds_since_last_batch": rel["seconds_since_last_batch"]}
    assert rel["sealed"] == 1 and rel["tail_records"] == 1 and rel["rows"] == 0
    assert got["wal"]["kind"] == "file" and got["wal"]["backlog_records"] == 1
    assert cli_main(["--data-dir", data, "stats"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[2].split()[0] == "relation"
    assert text.splitlines()[3].split()[:2] == ["r", "0"]


def test_stats_over_the_network_equals_the_engines(tmp_path):
    engine = sediment.open(tmp_path / "data")
    client = serve_local(engine)
    try:
        client.add_relation("r", SCHEMA)
        client.append("r", _updates(range(20), 2))
        client.seal("r", 2)
        remote = client.stats()
        local = engine.stats()
        assert remote["relations"]["r"] == local["relations"]["r"]
        assert remote["relations"]["r"]["tail_records"] == 1
        assert remote["wal"]["end_lsn"] == local["wal"]["end_lsn"] > 0
    finally:
        client.close()


@pytest.mark.slow
def test_sediment_serve_exposes_metrics_over_http(tmp_path):
    served = Served(tmp_path / "data", "--metrics-listen", "127.0.0.1:0")
    try:
        assert served.metrics_url is not None, "the metrics line comes before the ready line"
        assert _scrape(served.metrics_url).get(("sediment_appends_total", (("relation", "r"),))) is None  # no relation yet
        client = sediment.connect(served.uri, token=served.token)
        try:
            client.add_relation("r", SCHEMA)
            client.append("r", _updates(range(7), 1))
        finally:
            client.close()
        samples = _scrape(served.metrics_url)
        assert _rel(samples, "sediment_rows_appended_total", "r") == 7
        assert _rel(samples, "sediment_relation_tail_records", "r") == 1
    finally:
        assert served.stop() == 0


@pytest.mark.slow
def test_storage_nodes_expose_metrics_over_http(tmp_path):
    """Three real storage nodes with --metrics-listen: after acknowledged appends, a quorum of
    them counted every record, and each reports its partition's next LSN."""
    import uuid

    from support.replication import Node, start_all, stop_all

    from sediment.metadata.memory import MemoryMetadataStore
    from sediment.wal import record as rec
    from sediment.wal.replication.replicated_log import ReplicatedLog

    key = uuid.uuid4()
    nodes = [Node(tmp_path / f"n{i}", key, ("--metrics-listen", "127.0.0.1:0")) for i in range(3)]
    start_all(nodes)
    urls, addresses = [n.metrics_url for n in nodes], [n.address for n in nodes]
    try:
        log = ReplicatedLog.open(addresses, MemoryMetadataStore(), 0, key, timeout=5.0)
        try:
            for i in range(10):
                log.append([rec.Record(rec.RecordKind.UPDATES, relation_id=1, t_lo=i, t_hi=i, body=b"x" * 100)])
            end = log.end_lsn
        finally:
            log.close()
        scraped = [_scrape(url) for url in urls]
        counted = [s.get(("sediment_node_records_appended_total", (("partition", "0"),)), 0) for s in scraped]
        assert sum(c >= 10 for c in counted) >= 2, counted  # every acknowledged append was counted on a quorum
        for s, c in zip(scraped, counted, strict=True):
            if c >= 10:
                assert s[("sediment_node_partition_next_lsn", (("partition", "0"),))] >= 10
                assert s[("sediment_node_syncs_total", (("partition", "0"),))] >= 1
        assert end >= 10
    finally:
        stop_all(nodes)


@pytest.mark.slow
def test_a_replicated_engine_reports_quorum_latency_and_replica_lag(tmp_path):
    from support.replication import KEY, Node, start_all

    from sediment.metadata.memory import MemoryMetadataStore

    nodes = [Node(tmp_path / f"node{i}") for i in range(3)]
    start_all(nodes)
    try:
        with sediment.open(tmp_path / "data", replicas=[n.address for n in nodes], metadata=MemoryMetadataStore(),
                           cluster_key=str(KEY), blob=f"file://{tmp_path}/blobs") as engine:
            engine.add_relation("r", SCHEMA)
            for t in range(1, 6):
                engine.append("r", _updates(range(t * 10, t * 10 + 3), t))
            samples = {(name, labels): v for (name, labels), v in
                       _collect(engine.metrics.exposition().decode()).items()}
            assert samples[("sediment_quorum_latency_seconds_count", ())] >= 5
            lags = {dict(labels)["replica"]: v for (name, labels), v in samples.items()
                    if name == "sediment_replica_lag_records"}
            assert set(lags) == {n.address for n in nodes}
            assert all(v >= 0 for v in lags.values())
            assert engine.stats()["replicas"].keys() == lags.keys()
    finally:
        for n in nodes:
            if n.proc is not None:
                n.kill()


def _collect(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}
