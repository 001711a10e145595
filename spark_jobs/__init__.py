"""Spark jobs that feed the WAL and read consolidated traces, and the ``sediment`` data source.

``sediment.spark_jobs.register(spark)`` makes ``format("sediment")`` and ``USING sediment``
available in a session; sessions that can import the installed ``pyspark_sediment`` module
find the source by themselves.
"""

from typing import Any


def register(spark: Any) -> None:
    """Register the ``sediment`` data source in ``spark`` (idempotent)."""
    from sediment.spark_jobs.datasource import register as _register

    _register(spark)
