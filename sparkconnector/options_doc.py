"""``docs/spark.md``, generated from the source's option table
(``python -m headwater.sparkconnector.options_doc > docs/spark.md``)."""

from __future__ import annotations

from typing import Final

from headwater.sparkconnector.planning import (
    SINK_OPTIONS,
    SOURCE_OPTIONS,
    options_table_markdown,
)

SPARK_DOC_HEAD: Final = """# The Spark source's and sink's options

Generated from `SOURCE_OPTIONS` and `SINK_OPTIONS` in `sparkconnector/planning.py`
(`python -m headwater.sparkconnector.options_doc > docs/spark.md`; a test keeps it in sync).

`spark.read.format("headwater")` and `spark.readStream.format("headwater")` take the
options of Spark's Kafka source (spark-sql-kafka-0-10, Spark 4) where this table says
**same**, with the difference it names where it says **differs**, and Headwater's own
where it says **Headwater**. The sink (`write` and `writeStream`) does the same for
Spark's Kafka sink. Names are case-insensitive, as Spark's are. A job written for
`format("kafka")` runs with `format("headwater")` unless it uses an option marked
otherwise here.

Every option is checked before the query runs:

- at `load()`: every name, and every value that means the same for batch and stream
  reads (when the read gives no schema of its own; else when the query starts);
- when the query starts: what depends on the kind of read (`endingOffsets` is for batch
  reads, `groupId` for streams), and for the sink, every option;
- once the partitions are known: Kafka's rules for per-partition JSON (it names every
  partition the query reads) and for offsets past a partition's end (data loss, which
  `failOnDataLoss` decides).

An option marked **refused** fails with the reason in this table; an option not in this
table fails too, naming the closest valid ones. That includes a typo
(`startingOffset`) and a Kafka client setting (`kafka.*`) that Headwater does not honour.
Kafka's security settings are honoured, and are listed here. So an option never does
nothing silently.

## Reading only the columns a query uses

Spark 4.3 tells a Python data source neither which columns a query uses nor how to
prune them (its Python scan implements filter pushdown only), so every read carries all
the columns into Spark, `value` included. A query that needs fewer names them as a
schema, any of the source's columns with the source's types, in any order:

```python
spark.read.format("headwater").schema("offset BIGINT, timestamp TIMESTAMP")
```

Only those columns are built and sent to Spark. A column the source does not have, or
a type that differs (`offset INT`), fails with the valid columns named. Kafka's source
refuses a schema; this is Headwater's own.

## Starting and restarting a stream

A stream restarted from its checkpoint reads, in its first micro-batch, everything
produced while it was down, as Kafka's source does: after an hour's stop at 50,000
records/s that is 180 million records in one micro-batch, and no result until it is
done. `maxOffsetsPerTrigger` bounds every micro-batch, the first included, so results
come after the first bounded batch and the backlog is worked off in steps:

```python
spark.readStream.format("headwater").option("maxOffsetsPerTrigger", "1000000")
```

Spark's own start-up comes first: a query's first micro-batch ends about 2.7 s after
`start()` even when it is small, 2.3 s of it before the micro-batch begins (Spark starts
a Python process for the source's offsets), and the first job of a session that reads
records takes about 3.5 s more while Spark starts its Python workers (2-core machine,
BENCHMARKS.md; `headwater bench spark --parts restart` measures both).

## Errors

Errors name the option or the problem in one line, such as
`[PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source instance: ValueError:
headwater source: kafka.bootstrap.servers is required (there is no default): ...`,
when the session sets `spark.sql.execution.pyspark.udf.hideTraceback.enabled` to
`true` (Headwater's own tools do). Without it, Spark prints the Python traceback before
that line. Errors a stream raises while planning micro-batches (data loss, a partition
without a record as recent as `startingTimestamp`) come with a traceback either way:
Spark 4.3's streaming source runner does not honour the setting. The error is the
traceback's last line.

`[DATA_SOURCE_NOT_FOUND] Failed to find the data source: headwater` means Spark's Python
workers run an interpreter without Headwater: call
`headwater.sparkconnector.register(spark)` (README, "Spark Structured Streaming").
"""

SINK_DOC_HEAD: Final = """\
Batch writes take `mode("append")` only. Spark's default save mode (error if
exists) and `overwrite` fail, as `overwrite` does for Kafka's sink: a topic cannot be
truncated, and "exists" has no meaning for it. Streams take the append and complete
output modes (README, "Spark Structured Streaming").
"""


def spark_doc() -> str:
    """``docs/spark.md``."""
    return (
        f"{SPARK_DOC_HEAD}\n## Reading\n\n{options_table_markdown(SOURCE_OPTIONS)}\n"
        f"\n## Writing\n\n{SINK_DOC_HEAD}\n{options_table_markdown(SINK_OPTIONS)}\n"
    )


if __name__ == "__main__":
    print(spark_doc(), end="")
