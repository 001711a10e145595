"""A local SparkSession set up the way sediment's jobs, tests and demo need it.

Python Data Sources run their ``read``/``write``/``commit`` in Python workers that
Spark starts itself, so those workers must run the interpreter that has sediment
installed (``PYSPARK_PYTHON``); the machine may have no routable address, so Spark
binds to loopback (``SPARK_LOCAL_IP``); and the UI is off (no port, faster start).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any, NoReturn

DEFAULT_MASTER = "local[2]"
QUIET_LOG4J = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2-quiet.properties")


def python_environment() -> None:
    """Point Spark's Python workers at this interpreter and Spark itself at loopback, unless
    the caller already chose (spark-submit on a cluster sets these on purpose)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def local_spark(app_name: str = "sediment", *, master: str | None = None, shuffle_partitions: int = 4,
                driver_memory: str = "2g", conf: dict[str, Any] | None = None, quiet: bool = False) -> Any:
    """A SparkSession (``local[2]`` unless ``master`` says otherwise, or one already running)
    with the sediment data source registered. Few shuffle partitions: the default 200 makes
    every small consolidation spend most of its time scheduling empty tasks.

    ``quiet`` (the command-line jobs, unless :func:`debugging`): no Spark logs at all, from
    the JVM's start on, nor PySpark's own error log: a failed task printed about 120 lines
    of Java stacks before the job's one-line error, which said the same; and a driver JVM
    started here passes its stderr through :func:`start_driver_filtered` (the JVM's
    incubator-module line dropped). Other sessions (tests, the demo, benchmarks) start Spark
    the usual way."""
    python_environment()
    from pyspark.sql import SparkSession

    from sediment.spark_jobs.datasource import register

    options = {"spark.app.name": app_name,
               "spark.ui.enabled": "false",
               "spark.ui.showConsoleProgress": "false",
               "spark.sql.shuffle.partitions": str(shuffle_partitions),
               "spark.driver.memory": driver_memory,
               "spark.driver.host": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
               "spark.sql.session.timeZone": "UTC",
               "spark.sql.execution.arrow.maxRecordsPerBatch": "65536",  # fewer, larger Arrow batches
               "spark.sql.python.filterPushdown.enabled": "true"}
    if master is not None or "SPARK_MASTER" not in os.environ and not _submitted():
        options["spark.master"] = master or DEFAULT_MASTER
    if quiet:  # read when the JVM starts: its first lines already
        options["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{QUIET_LOG4J}"
    options.update((key, str(value)) for key, value in (conf or {}).items())
    if quiet and "spark.master" in options:
        start_driver_filtered(options)
    builder = SparkSession.builder
    for key, value in options.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("OFF" if quiet else "ERROR")
    if quiet:
        _quiet_pyspark_loggers()
    register(spark)
    return spark


def start_driver_filtered(options: dict[str, str]) -> None:
    """Start the driver JVM (unless one runs in this process) with its stderr passed on line by
    line, but for the line the JVM prints as it boots because Spark's launcher always adds
    ``--add-modules=jdk.incubator.vector`` (JavaModuleOptions, which no setting turns off):
    "WARNING: Using incubator modules: jdk.incubator.vector" came before a job's one-line
    error. Every other line is passed on, so a JVM that cannot start (no java), runs out of
    memory or crashes still says so, before the job's error when it fails to start. The pipe
    is ours, not Popen's, so what a launch that failed wrote is read too. (What the JVM
    writes after this process has exited is lost.)"""
    import threading

    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._active_spark_context is not None:  # getOrCreate uses the running one
        return
    conf = SparkConf(loadDefaults=False).setAll(list(options.items()))
    read_end, write_end = os.pipe()
    passer = threading.Thread(target=_pass_on, args=(read_end,), name="driver-stderr", daemon=True)
    passer.start()
    try:
        gateway = launch_gateway(conf, popen_kwargs={"stderr": write_end})
    except BaseException:
        os.close(write_end)
        passer.join(LAUNCH_OUTPUT_WAIT)  # the launcher has exited: its last words, before the job's error
        raise
    os.close(write_end)
    SparkContext(conf=conf, gateway=gateway)


JVM_INCUBATOR_WARNING = b"WARNING: Using incubator modules: "
LAUNCH_OUTPUT_WAIT = 5.0  # seconds a failed launch's stderr may take to reach its end


def _pass_on(fd: int) -> None:
    from sediment._fs import write_all

    with os.fdopen(fd, "rb") as stream:
        for line in stream:
            if not line.startswith(JVM_INCUBATOR_WARNING):
                write_all(2, line)


def debugging() -> bool:
    """Whether ``SEDIMENT_DEBUG`` asks for tracebacks and Spark's logs."""
    return os.environ.get("SEDIMENT_DEBUG", "").strip() not in ("", "0")


def _quiet_pyspark_loggers() -> None:
    """PySpark logs a failed DataFrame query (as JSON) before raising it: the raise is enough."""
    import logging

    from pyspark.logger import PySparkLogger

    for name in ("DataFrameQueryContextLogger", "SQLQueryContextLogger"):
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL + 1)


def _submitted() -> bool:
    """Whether spark-submit launched us (it chooses the master; we must not override it)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ or "spark.master" in os.environ.get("PYSPARK_SUBMIT_ARGS", "")


class JobUsageError(Exception):
    """A job's command line that cannot be carried out as written: one line, exit code 2."""


class JobParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (argparse prints the usage block first), as
    the ``sediment`` command's are."""

    def error(self, message: str) -> NoReturn:
        raise JobUsageError(f"{message} (see `python -m {self.prog} --help`)")


def add_connection_args(parser: Any) -> None:
    """``--uri``, ``--token`` and ``--master``, shared by the jobs' command lines."""
    parser.add_argument("--uri", default=os.environ.get("SEDIMENT_URI"), required="SEDIMENT_URI" not in os.environ,
                        help="the coordinator, grpc://HOST:PORT (default $SEDIMENT_URI)")
    parser.add_argument("--token", default=None,
                        help="the coordinator's token (default $SEDIMENT_TOKEN; prefer the variable: a command "
                             "line is visible to other users)")
    parser.add_argument("--relation", required=True, help="the relation")
    parser.add_argument("--master", default=None,
                        help=f"Spark master (default {DEFAULT_MASTER}, or spark-submit's --master)")


def token_of(args: Any) -> str:
    """The token from ``--token`` or $SEDIMENT_TOKEN, or one clear error."""
    token = args.token or os.environ.get("SEDIMENT_TOKEN")
    if not token:
        raise JobUsageError("no token: pass --token T or set $SEDIMENT_TOKEN (the coordinator's)")
    return token


_CAUSE = re.compile(r"^([a-z_]\w*\.)*[A-Z]\w*: ")  # "sediment.errors.UnknownRelation: ...", "ValueError: ..."


def describe_error(exc: BaseException) -> str:
    """One line for a failed job. Spark wraps a Python worker's failure in a JVM exception
    whose text holds the worker's whole traceback; the line that says what went wrong is
    the last ``SomeError: message`` line of it."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    causes = [line for line in lines if _CAUSE.match(line) and not line.startswith("SQLSTATE")]
    return causes[-1] if causes else lines[0]


def run_job(prog: str, job: Any, argv: list[str] | None = None) -> int:
    """Run a job's ``main``-style function; a failure is one line on stderr and exit code 1
    (``SEDIMENT_DEBUG=1`` shows the traceback instead), a command line that cannot be carried
    out one line and exit code 2."""
    try:
        return int(job(argv) or 0)
    except JobUsageError as exc:
        sys.stderr.write(f"{prog}: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted\n")
        return 130
    except Exception as exc:  # noqa: BLE001 - every failure becomes one line
        if debugging():
            raise
        sys.stderr.write(f"{prog}: error: {describe_error(exc)}\n")
        return 1
