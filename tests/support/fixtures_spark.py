"""Fixtures for the Spark tests: one local SparkSession for the whole run, and a coordinator.

``spark`` is a real ``local[2,2]`` session (two cores; a failed task is tried twice, so
retries are exercised; UI off, loopback only) with the ``sediment`` data source registered, started once per test session because a JVM takes seconds to
start. It depends on ``moto_server`` so that the AWS test credentials are in the
environment before the JVM starts: Spark's Python workers inherit the JVM's environment,
and the S3 reads run in them. ``coordinator`` is an engine on the test's directory served
by a real Flight server on 127.0.0.1 (what ``sediment serve`` runs), with a fresh token.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

import sediment


@pytest.fixture(scope="session")
def spark(moto_server: Any) -> Iterator[Any]:
    """A local[2,2] SparkSession shared by every Spark test (skipped when PySpark is missing)."""
    pytest.importorskip("pyspark", reason="the Spark tests need PySpark (pip install -e '.[test]')")
    from sediment.spark_jobs.session import local_spark

    session = local_spark("sediment-tests", master="local[2,2]", shuffle_partitions=2, driver_memory="1g")
    try:
        yield session
    finally:
        session.stop()


@dataclass
class Coordinator:
    """An engine served on a loopback port; ``uri`` and ``token`` are what Spark jobs get."""

    engine: sediment.Engine
    server: Any
    token: str

    @property
    def uri(self) -> str:
        return self.server.uri

    def options(self, relation: str) -> dict[str, str]:
        """The data source options that reach ``relation`` on this coordinator."""
        return {"uri": self.uri, "token": self.token, "relation": relation}


@pytest.fixture
def coordinator(tmp_path: Any) -> Iterator[Callable[..., Coordinator]]:
    """``coordinator(**engine_options)``: open an engine on the test's directory and serve it."""
    from sediment.server import SedimentFlightServer

    opened: list[Coordinator] = []

    def start(**options: Any) -> Coordinator:
        engine = sediment.open(tmp_path / f"data{len(opened)}", **options)
        token = uuid.uuid4().hex
        try:
            server = SedimentFlightServer(engine, "grpc://127.0.0.1:0", token)
        except BaseException:
            engine.close()
            raise
        opened.append(Coordinator(engine, server, token))
        return opened[-1]

    yield start
    for c in opened:
        try:
            c.server.stop(grace=10.0)
        finally:
            c.engine.close()


def append_updates(c: Any, updates: list[tuple], relation: str = "orders") -> None:
    """Append (id, item, time, diff) tuples to ``relation`` through a coordinator's engine,
    as a feed would (the Spark tests' relations have the columns id and item)."""
    import pyarrow as pa

    cols = list(zip(*updates, strict=True))
    c.engine.append(relation, pa.table({"id": pa.array(cols[0], pa.int64()), "item": pa.array(cols[1], pa.string()),
                                        "time": pa.array(cols[2], pa.int64()), "diff": pa.array(cols[3], pa.int64())}))


def append_wal_tail(c: Any, n: int, distinct: int, relation: str = "orders") -> None:
    """``n`` updates of ``distinct`` ids (item "x", time 1, diff 1) appended and sealed at 1,
    left in the WAL tail: the coordinator runs with ``compact_interval=None``, so compaction
    waits for a full segment."""
    import pyarrow as pa

    c.engine.append(relation, pa.table({"id": pa.array([i % distinct for i in range(n)], pa.int64()),
                                        "item": pa.repeat(pa.scalar("x"), n),
                                        "time": pa.repeat(pa.scalar(1, pa.int64()), n),
                                        "diff": pa.repeat(pa.scalar(1, pa.int64()), n)}))
    c.engine.seal(relation, 1)
    assert c.engine.trace_info(relation)["batches"] == 0  # all of it is WAL tail


def ids_failing_at(spark: Any, last: int, partitions: int = 2) -> Any:
    """``spark.range(0, last + 1)`` as a column ``id`` whose task raises on ``last``: a job
    that fails in one task after the others wrote their rows."""
    from pyspark.sql import functions as F

    @F.udf("long", useArrow=False)
    def fail_on_last(i: int) -> int:
        if i == last:
            raise RuntimeError("boom in one task")
        return i

    return spark.range(0, last + 1, numPartitions=partitions).select(fail_on_last("id").alias("id"))
