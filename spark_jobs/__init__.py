"""Spark jobs that feed the WAL and read consolidated traces, and the ``sediment`` data source.

``sediment.spark_jobs.register(spark)`` makes ``format("sediment")`` and ``USING sediment``
available in a session; sessions that can import the installed ``pyspark_sediment`` module
find the source by themselves.

Which filters a read took: ``df.explain("formatted")`` lists them under the scan as
``PushedFilters: [...]`` (Spark's own plan text); ``pushed_filters(df)`` returns that list.
The default ``df.explain()`` cannot show them: it prints the scan's ``description()``, which
PySpark's scan of every Python data source fixes as ``(Python)``.
"""

import re
from typing import Any

_SCAN = re.compile(r"^\(\d+\) BatchScan sediment\b")
_PUSHED = re.compile(r"^PushedFilters: \[(.*)\]$")
_FILTER = re.compile(r"[A-Za-z]+\((?:[^()]|\([^()]*\))*\)")


def register(spark: Any) -> None:
    """Register the ``sediment`` data source in ``spark`` (idempotent)."""
    from sediment.spark_jobs.datasource import register as _register

    _register(spark)


def pushed_filters(df: Any) -> list[str]:
    """The filters the ``sediment`` scans of ``df`` took (in Spark's notation, such as
    ``LessThan(id,1000)``), read from the formatted plan: Spark evaluates none of these above
    the scan. Plans the query (a planning worker and a coordinator read plan), runs no job."""
    text = df._sc._jvm.PythonSQLUtils.explainString(df._jdf.queryExecution(), "formatted")
    out: list[str] = []
    in_scan = False
    for line in text.splitlines():
        if re.match(r"^\(\d+\) ", line):
            in_scan = bool(_SCAN.match(line))
        elif in_scan and (m := _PUSHED.match(line.strip())):
            out += _FILTER.findall(m.group(1))
    return out
