"""Lets PySpark find the ``sediment`` data source by itself.

When a session first resolves a Python data source, PySpark (4.x,
``pyspark/sql/worker/lookup_data_sources.py``) imports every top-level module on the Python
path whose name starts with ``pyspark_`` and registers its ``DefaultSource``. PySpark has no
entry-point mechanism for data sources; this module, installed as a top-level package by
``pip install sediment`` (pyproject: ``pyspark_sediment``), is that hook.
"""

from sediment.spark_jobs.datasource import SedimentDataSource as DefaultSource

__all__ = ["DefaultSource"]
