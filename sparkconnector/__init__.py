"""Spark Structured Streaming source and sink for Headwater: ``format("headwater")``.

``register(spark)`` registers the data source with a session. Without it, pyspark finds
the source by itself through the ``pyspark_headwater`` module (pyspark looks up modules
named ``pyspark_*`` that define ``DefaultSource``) when its Python workers run in an
environment where Headwater is installed.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from headwater.sparkconnector.datasource import HeadwaterDataSource


def register(spark: Any) -> None:
    """Register ``format("headwater")`` with ``spark`` (a SparkSession).

    Spark runs Python workers with ``PYSPARK_PYTHON``, else ``python3`` from the PATH,
    which need not be the interpreter Headwater is installed in. When ``PYSPARK_PYTHON``
    is not set, the session's workers use this interpreter (``sys.executable``) instead.
    Call it when Spark says ``[DATA_SOURCE_NOT_FOUND] Failed to find the data source:
    headwater``: the workers' interpreter does not have Headwater.
    """
    context = spark.sparkContext
    if "PYSPARK_PYTHON" not in os.environ and context.pythonExec == "python3":
        context.pythonExec = sys.executable
    spark.dataSource.register(HeadwaterDataSource)
