"""`format = "raw"`: the whole value of a message is the row's one column."""

from __future__ import annotations

import pyarrow as pa

from hakafka.consumer.batch import BatchDecoder, refuse_paths
from hakafka.consumer.errors import SchemaError
from hakafka.consumer.options import DecodeOptions
from hakafka.consumer.schema import PipelineSchema


class RawDecoder(BatchDecoder):
    """The whole value as the single declared column, which must be a String type."""

    def __init__(self, schema: PipelineSchema, options: DecodeOptions | None = None) -> None:
        super().__init__(schema, options)
        refuse_paths(schema, "raw")
        if len(schema.columns) != 1 or not pa.types.is_string(schema.columns[0].mapped.arrow):
            raise SchemaError(
                "format 'raw' needs exactly one declared column of type String, got "
                + ", ".join(f"{c.name} {c.clickhouse_type}" for c in schema.columns)
            )

    def _parse(self, joined: bytes, values: list[bytes]) -> pa.Table:
        del joined
        # UTF-8 was validated before: the cast only relabels the buffers.
        column = pa.array(values, pa.binary()).cast(pa.string())
        return pa.table({self._declared.names[0]: column})
