"""``docs/spark.md``, generated from the source's option table
(``python -m headwater.sparkconnector.options_doc > docs/spark.md``)."""

from __future__ import annotations

from typing import Final

from headwater.sparkconnector.planning import options_table_markdown

SPARK_DOC_HEAD: Final = """# The Spark source's options

Generated from `SOURCE_OPTIONS` in `sparkconnector/planning.py`
(`python -m headwater.sparkconnector.options_doc > docs/spark.md`; a test keeps it in sync).

`spark.read.format("headwater")` and `spark.readStream.format("headwater")` take the
options of Spark's Kafka source (spark-sql-kafka-0-10, Spark 4) where this table says
**same**, with the difference it names where it says **differs**, and Headwater's own
where it says **Headwater**. Names are case-insensitive, as Spark's are.

Every option is checked when the reader is created, before the query starts:

- an option marked **refused** fails with the reason in this table;
- an option not in this table fails too, naming the closest valid ones. That includes
  a typo (`startingOffset`) and a Kafka client setting (`kafka.*`) that Headwater does
  not honour. Kafka's security settings are honoured, and are listed here.

So an option never does nothing silently.
"""


def spark_doc() -> str:
    """``docs/spark.md``."""
    return f"{SPARK_DOC_HEAD}\n## Reading\n\n{options_table_markdown()}\n"


if __name__ == "__main__":
    print(spark_doc(), end="")
