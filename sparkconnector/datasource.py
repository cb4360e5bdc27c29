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

from headwater.sparkconnector import planning
from headwater.sparkconnector.sink import HeadwaterBatchWriter, HeadwaterStreamWriter
from headwater.sparkconnector.source import (
    HEADERS_DDL,
    READ_SCHEMA_DDL,
    HeadwaterBatchReader,
    HeadwaterStreamReader,
    parse_source_options,
)

NAME: Final = "headwater"


class HeadwaterDataSource(DataSource):
    """``format("headwater")``: see the README's Spark section for options and guarantees."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        include_headers = planning.include_headers(self.options)
        return READ_SCHEMA_DDL + (", " + HEADERS_DDL if include_headers else "")

    def reader(self, schema: StructType) -> DataSourceReader:
        return HeadwaterBatchReader(parse_source_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return HeadwaterStreamReader(parse_source_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return HeadwaterBatchWriter(dict(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return HeadwaterStreamWriter(dict(self.options), schema)
