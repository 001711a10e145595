"""The Spark driver's bulk commit (spark_jobs/bulk_commit.py) against a Flight coordinator on
127.0.0.1, without a Spark session: a commit whose reply is lost is asked again with the same
job and the rows land once; a typed refusal aborts the load; an outcome that stays unknown
raises OutcomeUnknown naming the job and keeps the staged files."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest

from sediment.client import Client
from sediment.errors import NotPartitionOwner, OutcomeUnknown, SchemaMismatch
from sediment.spark_jobs.bulk_commit import commit_load

SCHEMA = pa.schema([("id", pa.int64()), ("item", pa.string())])


@pytest.fixture
def served(coordinator):
    c = coordinator(compact_interval=None)
    c.engine.add_relation("bulk", SCHEMA)
    with Client(c.uri, c.token) as client:
        yield c, client


def stage(client, job: str) -> str:
    path = client.bulk_stage("bulk", job)
    pq.write_table(pa.table({"id": [1, 2], "item": ["a", "b"]}), os.path.join(path, "part-00000.parquet"))
    return path


def replies_lost(monkeypatch, calls: list[str], lost: int, reached: bool) -> None:
    """The replies of the first ``lost`` bulk commits are lost (a reset connection), after the
    call reached the coordinator when ``reached``; later calls are answered."""
    plain = Client.bulk_commit

    def losing(self, *args, **kwargs):
        calls.append("commit")
        if len(calls) > lost or reached:
            got = plain(self, *args, **kwargs)
            if len(calls) > lost:
                return got
        raise flight.FlightUnavailableError("Connection reset by peer")

    monkeypatch.setattr(Client, "bulk_commit", losing)


def test_a_commit_whose_reply_is_lost_is_asked_again_and_lands_once(served, monkeypatch):
    c, client = served
    stage(client, "job-1")
    calls: list[str] = []
    replies_lost(monkeypatch, calls, lost=1, reached=True)
    got = commit_load(client, "bulk", "job-1", time_=3, diff=None, pause=0)
    assert len(calls) == 2 and got["committed"] is False  # the retry found the first attempt's commit
    assert (got["rows"], got["min_time"], got["max_time"], got["counts_known"]) == (2, 3, 3, True)  # as it kept them
    c.engine.seal("bulk", 3)
    assert sorted(c.engine.snapshot("bulk", 3).column("id").to_pylist()) == [1, 2]


def test_a_typed_refusal_aborts_the_load(served):
    c, client = served
    path = stage(client, "job-2")
    with pytest.raises(SchemaMismatch):  # the file has no time column and the commit gives no load time
        commit_load(client, "bulk", "job-2", time_=None, diff=None, pause=0)
    assert not os.path.exists(path) and not c.engine.view.relations["bulk"].trace.pending


def test_an_outcome_that_stays_unknown_names_the_job_and_keeps_the_staged_files(served, monkeypatch):
    c, client = served
    path = stage(client, "job-3")
    calls: list[str] = []
    replies_lost(monkeypatch, calls, lost=99, reached=False)
    with pytest.raises(OutcomeUnknown, match="'job-3'"):
        commit_load(client, "bulk", "job-3", time_=3, diff=None, attempts=3, pause=0)
    assert len(calls) == 3 and "part-00000.parquet" in os.listdir(path)
    assert not c.engine.view.relations["bulk"].trace.pending


def test_a_retry_a_member_no_longer_serves_leaves_the_outcome_unknown(served, monkeypatch):
    """The first commit landed and its reply was lost; the retry meets a member that gave the
    relation's partition away (refused before it looks at the committed loads): not a proof
    that nothing was committed, so no abort and no plain refusal."""
    c, client = served
    stage(client, "job-4")
    calls: list[str] = []
    replies_lost(monkeypatch, calls, lost=1, reached=True)
    losing = Client.bulk_commit

    def moved_after_the_first(self, *args, **kwargs):
        if calls:
            calls.append("refused")
            raise NotPartitionOwner("relation 'bulk' is served by another member now")
        return losing(self, *args, **kwargs)

    monkeypatch.setattr(Client, "bulk_commit", moved_after_the_first)
    with pytest.raises(OutcomeUnknown, match="'job-4'.*NotPartitionOwner"):
        commit_load(client, "bulk", "job-4", time_=3, diff=None, pause=0)
    assert calls == ["commit", "refused"] and c.engine.view.relations["bulk"].trace.loads == ("job-4",)
