"""The decoder of a pipeline's format (`make_decoder`).

Each format's module loads only for the pipelines that use it: Arrow's JSON and CSV readers,
fastavro and protobuf are not imported by a process that only reads the options.
"""

from __future__ import annotations

from pathlib import Path

from hakafka.consumer.batch import Decoder
from hakafka.consumer.errors import SchemaError
from hakafka.consumer.options import DecodeOptions, Format
from hakafka.consumer.raw_decoder import RawDecoder
from hakafka.consumer.registry import RegistrySettings, SchemaRegistry
from hakafka.consumer.schema import PipelineSchema


def make_decoder(
    format: Format,
    schema: PipelineSchema,
    options: DecodeOptions | None = None,
    *,
    registry: RegistrySettings | None = None,
    schema_file: Path | None = None,
) -> Decoder:
    """The decoder for pipeline `format`. `avro` reads the Confluent wire format through
    `registry`, or plain records of the schema in `schema_file`; `protobuf` needs `registry`.
    SchemaError for an unknown format or a schema the format cannot read."""
    try:  # an untyped caller may pass the plain string
        kind = Format(format)
    except ValueError:
        allowed = ", ".join(f.value for f in Format)
        raise SchemaError(f"unknown format {format!r}; use one of {allowed}") from None
    # Imported here: each format's parser loads only for the pipelines that use it.
    if kind is Format.JSON:
        from hakafka.consumer.json_decoder import JsonDecoder

        return JsonDecoder(schema, options)
    if kind is Format.CSV:
        from hakafka.consumer.csv_decoder import CsvDecoder

        return CsvDecoder(schema, options)
    if kind is Format.AVRO:
        from hakafka.consumer.avro import AvroDecoder

        return AvroDecoder(
            schema,
            options,
            registry=None if registry is None else SchemaRegistry(registry),
            schema_file=schema_file,
        )
    if kind is Format.PROTOBUF:
        from hakafka.consumer.protobuf import ProtobufDecoder

        if registry is None:
            raise SchemaError("format 'protobuf' needs a schema registry ([schema_registry])")
        return ProtobufDecoder(schema, options, registry=SchemaRegistry(registry))
    return RawDecoder(schema, options)
