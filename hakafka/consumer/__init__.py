"""Kafka consumption and decoding for the shard leader.

`PartitionConsumer` reads a shard's partitions (assign-only, explicit start offsets,
pause/resume, positions and lag); `make_decoder` turns message batches into Arrow
`DecodedBatch`es with the pipeline schema, bad messages isolated per `on_error`.
`schema` is the one place that maps ClickHouse types to Arrow types. The options a pipeline
chooses from are enums declared here: `Format`, `OnError`, `OutOfRange`.

Each format's decoder lives in its own module, which `make_decoder` imports when a pipeline
asks for that format: a process that only reads the config loads no format's parser.
"""

from hakafka.consumer.assignment import (
    ShardAssignment,
    check_explicit_assignment,
    partitions_for_shard,
)
from hakafka.consumer.batch import DecodedBatch, Decoder
from hakafka.consumer.dead_letter import dead_letter_batch, dead_letter_table_name
from hakafka.consumer.decode import make_decoder
from hakafka.consumer.errors import (
    ConsumerError,
    DecodeError,
    KafkaConsumeError,
    OffsetOutOfRangeError,
    SchemaError,
)
from hakafka.consumer.messages import MessageColumns
from hakafka.consumer.metrics import ConsumerMetrics
from hakafka.consumer.options import DecodeOptions, Format, OnError
from hakafka.consumer.partition_consumer import (
    MANAGED_SETTINGS,
    OffsetReset,
    OutOfRange,
    PartitionConsumer,
    redact_settings,
)
from hakafka.consumer.raw_decoder import RawDecoder
from hakafka.consumer.schema import (
    ALWAYS_META,
    DEAD_LETTER_COLUMNS,
    META_COLUMNS,
    ColumnSpec,
    PipelineSchema,
    arrow_type,
    dead_letter_arrow_schema,
)

__all__ = [
    "ALWAYS_META",
    "DEAD_LETTER_COLUMNS",
    "MANAGED_SETTINGS",
    "META_COLUMNS",
    "ColumnSpec",
    "ConsumerError",
    "ConsumerMetrics",
    "DecodeError",
    "DecodeOptions",
    "DecodedBatch",
    "Decoder",
    "Format",
    "KafkaConsumeError",
    "MessageColumns",
    "OffsetOutOfRangeError",
    "OffsetReset",
    "OnError",
    "OutOfRange",
    "PartitionConsumer",
    "PipelineSchema",
    "RawDecoder",
    "SchemaError",
    "ShardAssignment",
    "arrow_type",
    "check_explicit_assignment",
    "dead_letter_arrow_schema",
    "dead_letter_batch",
    "dead_letter_table_name",
    "make_decoder",
    "partitions_for_shard",
    "redact_settings",
]
