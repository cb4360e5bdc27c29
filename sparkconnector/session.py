"""A local SparkSession for Headwater's own tools (``make demo``, ``headwater bench
spark``, the tests): ``local[2]``, no UI or progress bars, 2 shuffle partitions, errors
only in the log, errors raised in Python as one line without a traceback, and Python
workers on this interpreter unless PYSPARK_PYTHON says otherwise."""

from __future__ import annotations

import os
import sys
from typing import Any


def local_session(app_name: str) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession  # noqa: PLC0415 (the environment first)

    session = (
        SparkSession.builder.master("local[2]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        # A ceiling, not a reservation: at Spark's 1g default, a long-lived session that
        # ran many streaming queries (the test module's) ran out of heap.
        .config("spark.driver.memory", "2g")
        # Errors raised in Python (a bad option, data loss) as one line, without the
        # Python traceback (docs/spark.md, "Errors").
        .config("spark.sql.execution.pyspark.udf.hideTraceback.enabled", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session
