"""The ``sediment`` data source on a real Spark standalone cluster: a Master and a Worker
started with pyspark's ``bin/spark-class`` on 127.0.0.1 (pyspark ships no ``sbin/``), a
driver in its own process, batches in moto's S3, and the S3 credentials given only as data
source options: the cluster's processes are started without any AWS variable, so the
executors (and the driver's planning worker) read S3 only because the options reach them.

Slow (two JVMs and a driver: about 80 s on 2 cores), so the whole suite's budget keeps it out of a
plain ``pytest`` run: ``make cluster-demo`` (or SEDIMENT_SPARK_CLUSTER=1) runs it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

pytest.importorskip("pyspark", reason="the Spark tests need PySpark (pip install -e '.[test]')")

SCHEMA = pa.schema([("id", pa.int64()), ("item", pa.string())])

DRIVER = """
import json, sys
from pyspark.sql import functions as F
from sediment.spark_jobs.session import local_spark
from sediment.spark_jobs.errors import sediment_errors
master, uri, token, key, secret = sys.argv[1:6]
spark = local_spark("cluster-test", master=master, conf={"spark.executor.memory": "512m", "spark.cores.max": "1"})
opts = {"uri": uri, "token": token, "relation": "orders", "aws_access_key_id": key, "aws_secret_access_key": secret}
rows = spark.range(0, 3000, numPartitions=3).select("id", (F.col("id") % 7).cast("string").alias("item"),
                                                   (F.col("id") % 3 + 1).alias("time"))
with sediment_errors():
    rows.write.format("sediment").options(**opts).option("seal", "true").mode("append").save()
print("WROTE", flush=True)
sys.stdin.readline()  # the test compacts the relation into S3 meanwhile
snap = spark.read.format("sediment").options(**opts).option("asOf", 2).load()
changes = spark.read.format("sediment").options(**opts).option("from", 2).load()
print("RESULT " + json.dumps({"snap": [list(r) for r in snap.collect()], "changes": [list(r) for r in changes.collect()],
                              "partitions": snap.rdd.getNumPartitions(), "master": spark.sparkContext.master}), flush=True)
spark.stop()
"""


def _no_aws(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not k.startswith("AWS_")}


class Log:
    """Drains a process's output in a thread (a full pipe would stall the JVM) and lets the
    test wait for a line, woken by the line's arrival."""

    def __init__(self, stream, what: str) -> None:
        self.lines: list[str] = []
        self.done = False
        self.what = what
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._drain, args=(stream,), daemon=True)
        self.thread.start()

    def _drain(self, stream) -> None:
        for line in stream:
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()
        with self.cond:
            self.done = True
            self.cond.notify_all()

    def wait(self, pattern: str, timeout: float = 240, also: Log | None = None) -> re.Match:
        found: list[re.Match] = []

        def seen() -> bool:
            found[:] = [m for m in (re.search(pattern, x) for x in self.lines) if m][:1]
            return bool(found) or self.done

        with self.cond:
            self.cond.wait_for(seen, timeout=timeout)
        if not found:
            raise AssertionError(f"{self.what} did not say {pattern!r}:\n" + "".join(self.lines[-40:]) +
                                 ("".join(also.lines[-60:]) if also is not None else ""))
        return found[0]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.s3
@pytest.mark.skipif(os.environ.get("SEDIMENT_SPARK_CLUSTER", "") == "0",
                    reason="SEDIMENT_SPARK_CLUSTER=0: the standalone-cluster test (30-80 s) is switched off")
def test_standalone_cluster_writes_and_reads_s3_batches_with_credentials_as_options(coordinator, s3_bucket,
                                                                                   tmp_path):
    endpoint, bucket = s3_bucket
    c = coordinator(blob=f"s3://{bucket}/rel", s3_endpoint=endpoint)
    c.engine.add_relation("orders", SCHEMA)
    import pyspark

    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"  # also where a venv's bin/ links to
    env = {**_no_aws(os.environ), "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(tmp_path), "SPARK_WORKER_DIR": str(tmp_path / "work")}
    master = subprocess.Popen([str(spark_class), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", "0", "--webui-port", "0"], env=env, cwd=tmp_path, text=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    procs = [master]
    try:
        url = Log(master.stderr, "the master").wait(r"Starting Spark master at (spark://[\d.]+:\d+)").group(1)
        worker = subprocess.Popen([str(spark_class), "org.apache.spark.deploy.worker.Worker", url, "--host",
                                   "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port", "0"],
                                  env=env, cwd=tmp_path, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        procs.append(worker)
        Log(worker.stderr, "the worker").wait(r"Successfully registered with master")
        driver = subprocess.Popen([sys.executable, "-c", DRIVER, url, c.uri, c.token, os.environ["AWS_ACCESS_KEY_ID"],
                                   os.environ["AWS_SECRET_ACCESS_KEY"]], env=env, cwd=tmp_path, text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        procs.append(driver)
        out, err = Log(driver.stdout, "the driver"), Log(driver.stderr, "the driver's stderr")
        out.wait(r"^WROTE", also=err)
        assert c.engine.sealed("orders") == 3
        c.engine.set_since("orders", 1)
        c.engine.compact()
        assert c.engine.trace_info("orders")["tail_records"] == 0  # every row is read from S3 now
        driver.stdin.write("go\n")
        driver.stdin.flush()
        result = json.loads(out.wait(r"^RESULT (.*)$", also=err).group(1))
        driver.wait(timeout=120)
        assert driver.returncode == 0, "".join(err.lines[-60:])
    finally:
        for p in reversed(procs):
            _stop(p)
    assert result["master"] == url
    snap = c.engine.snapshot("orders", 2)
    assert Counter(map(tuple, result["snap"])) == Counter(
        zip(*(snap.column(n).to_pylist() for n in ("id", "item", "diff")), strict=True))
    assert Counter(map(tuple, result["changes"])) == Counter({(i, str(i % 7), 3, 1): 1 for i in range(2, 3000, 3)})
