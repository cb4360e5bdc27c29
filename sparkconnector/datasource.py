"""``format("headwater")``: the data source pyspark instantiates, tying the readers
(``headwater.sparkconnector.source``) and writers (``headwater.sparkconnector.sink``)
together."""

from __future__ import annotations

from typing import Final

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from headwater.sparkconnector.sink import HeadwaterBatchWriter, HeadwaterStreamWriter
from headwater.sparkconnector.source import (
    HeadwaterBatchReader,
    HeadwaterStreamReader,
    RefusedStreamReader,
    parse_source_options,
    read_schema_ddl,
    requested_columns,
)

NAME: Final = "headwater"


class HeadwaterDataSource(DataSource):
    """``format("headwater")``: see the README's Spark section for options and guarantees."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        """The read schema; Spark asks for it at ``load()`` (reads only, and only when the
        query gives no schema), so the options are checked here, before any query runs,
        as far as they hold for batch and stream reads alike."""
        parsed = parse_source_options(self.options, streaming=None)
        return read_schema_ddl(parsed.include_headers)

    def reader(self, schema: StructType) -> DataSourceReader:
        """``schema``: the source's, or one the query gave, naming the columns to read
        (``requested_columns``)."""
        options = parse_source_options(self.options, streaming=False)
        return HeadwaterBatchReader(options, requested_columns(schema, options.include_headers))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """The stream reader, or, when the options are wrong, one that fails the query
        with the options' error when Spark first asks it anything: pyspark 4.3's stream
        runner hides an error raised here behind its own ``UnboundLocalError`` (its
        cleanup calls ``stop()`` on the reader that was never made)."""
        try:
            options = parse_source_options(self.options, streaming=True)
            columns = requested_columns(schema, options.include_headers)
        except ValueError as error:
            return RefusedStreamReader(error)
        return HeadwaterStreamReader(options, columns)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:  # as Kafka's sink: a topic cannot be truncated
            raise ValueError(
                "headwater sink: save mode overwrite is not supported (a topic is append-only, "
                'as in Kafka\'s sink); use mode("append")'
            )
        return HeadwaterBatchWriter(dict(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """``overwrite`` is Spark's complete output mode: as in Kafka's sink, each
        micro-batch appends the whole result table (nothing is truncated)."""
        return HeadwaterStreamWriter(dict(self.options), schema)
