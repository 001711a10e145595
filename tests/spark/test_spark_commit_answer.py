"""A Spark job's commit whose answer is lost, and its seal raced by another job's
(spark_jobs/job_commit.py), against a real Flight
coordinator on 127.0.0.1 that commits and then drops the connection, or drops it before the
commit arrives: the driver asks the coordinator what became of the job's transactions, so a
save whose commit landed succeeds (rows once, sealed), one whose commit never arrived is
committed again, and after a restart that forgot them the outcome is reported as unknown,
naming the job, never as a failure that invites writing the rows twice. A seal that another
job's seal overtook is no failure either: the rows are visible and the relation sealed."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pyarrow.flight as flight
import pytest

import sediment
from sediment.client import Client
from sediment.errors import OutcomeUnknown, TransactionError
from sediment.net.messages import Action
from sediment.server import SedimentFlightServer
from sediment.spark_jobs.job_commit import commit_job

SCHEMA = pa.schema([("id", pa.int64()), ("item", pa.string())])


class LosingServer(SedimentFlightServer):
    """A coordinator whose first ``commit_all`` answer is lost: after committing (``reached``)
    or before (the call never arrived)."""

    reached = True

    def __init__(self, *args, **kwargs) -> None:
        self.lost = 0
        super().__init__(*args, **kwargs)

    def _commit_all(self, args):
        if self.lost == 0 and not self.reached:
            self.lost += 1
            raise flight.FlightUnavailableError("Connection reset by peer")
        got = super()._commit_all(args)
        if self.lost == 0:
            self.lost += 1
            raise flight.FlightUnavailableError("Connection reset by peer")
        return got


def committed_ids(engine, relation="orders") -> list[int]:
    return sorted(i for b in engine.replay(relation) for i in b.column("id").to_pylist())


@pytest.mark.parametrize("reached", [True, False])
def test_a_row_write_whose_commit_answer_is_lost_succeeds_with_its_rows_once(spark, tmp_path, reached):
    engine = sediment.open(tmp_path / "data", compact_interval=None)
    token = uuid.uuid4().hex
    server = type("Losing", (LosingServer,), {"reached": reached})(engine, "grpc://127.0.0.1:0", token)
    try:
        engine.add_relation("orders", SCHEMA)
        engine.seal("orders", 0)
        df = spark.createDataFrame([(i, "x") for i in range(50)], "id long, item string")
        (df.write.format("sediment").option("uri", server.uri).option("token", token).option("relation", "orders")
         .option("seal", "true").mode("append").save())
        assert server.lost == 1  # the first answer was lost
        assert committed_ids(engine) == list(range(50))  # once: not lost, not resent twice
        assert engine.sealed("orders") == 1  # the save went on to seal, as a success does
    finally:
        server.stop(grace=5)
        engine.close()


def test_a_commit_answer_lost_across_a_restart_is_an_unknown_outcome_naming_the_job(tmp_path):
    data, token = tmp_path / "data", uuid.uuid4().hex
    engine = sediment.open(data, compact_interval=None)
    engine.add_relation("orders", SCHEMA)
    server = LosingServer(engine, "grpc://127.0.0.1:0", token)
    servers = [server]
    with Client(server.uri, token) as client:
        tx = client.transaction(group="spark-job-1")
        tx.append("orders", pa.table({"id": [1, 2], "item": ["a", "b"], "time": pa.array([1, 1], pa.int64()),
                                      "diff": pa.array([1, 1], pa.int64())}))

    def restarted() -> Client:
        """The first ask finds the coordinator restarted: it committed, then died."""
        if len(servers) == 1:
            servers[0].stop(grace=5)
            servers[0].engine.close()
            servers.append(SedimentFlightServer(sediment.open(data, compact_interval=None), "grpc://127.0.0.1:0",
                                                token))
        return Client(servers[-1].uri, token)

    calls = []

    def connect() -> Client:
        calls.append(1)
        return Client(server.uri, token) if len(calls) == 1 else restarted()

    try:
        with pytest.raises(OutcomeUnknown, match="spark-job-1.*no longer knows.*read the relation"):
            commit_job(connect, [tx.id], group="spark-job-1", relation="orders", pause=0)
        assert committed_ids(servers[-1].engine) == [1, 2]  # it had landed: a failure would invite a second write
    finally:
        servers[-1].stop(grace=5)
        servers[-1].engine.close()


def test_a_refused_commit_is_raised_at_once(coordinator):
    c = coordinator(compact_interval=None)
    c.engine.add_relation("orders", SCHEMA)
    with pytest.raises(TransactionError, match="not open on this server"):
        commit_job(lambda: Client(c.uri, c.token), [12345], group="spark-job-2", relation="orders", pause=0)


class RacingServer(SedimentFlightServer):
    """A coordinator where another job's seal, two times further, lands just before the first
    seal this test's job asks for (between its check of the sealed frontier and its seal)."""

    def _action_table(self):
        table = super()._action_table()
        plain = table[Action.SEAL]
        self.raced = False

        def seal(args):
            if not self.raced:
                self.raced = True
                self.engine.seal(args["name"], args["t"] + 2)
            return plain(args)

        table[Action.SEAL] = seal
        return table


@pytest.mark.parametrize("bulk", [False, True])
def test_a_save_whose_seal_another_job_overtook_succeeds(spark, tmp_path, bulk):
    engine = sediment.open(tmp_path / "data", compact_interval=None)
    token = uuid.uuid4().hex
    server = RacingServer(engine, "grpc://127.0.0.1:0", token)
    try:
        engine.add_relation("orders", SCHEMA)
        engine.seal("orders", 0)
        df = spark.createDataFrame([(i, "x") for i in range(20)], "id long, item string")
        (df.write.format("sediment").option("uri", server.uri).option("token", token).option("relation", "orders")
         .option("time", 5).option("seal", "true").option("bulk", str(bulk).lower()).mode("append").save())
        assert server.raced
        assert engine.sealed("orders") == 7  # the other job's seal; this one's (5) is within it
        assert sorted(engine.snapshot("orders", 7).column("id").to_pylist()) == list(range(20))
    finally:
        server.stop(grace=5)
        engine.close()
