"""The bounds of a pushed batch, shared by the leader that applies it
(`hakafka.pipeline.push`) and the clients that cut files and frames into batches
(`hakafka push`, the Spark sink): row i of a writer's batch with sequence s is offset
s * 2**SEQUENCE_BITS + i of the writer's partition, a signed 64-bit offset as Kafka's are."""

SEQUENCE_BITS = 20
MAX_ROWS = 1 << SEQUENCE_BITS  # rows in one batch
MAX_SEQUENCE = (1 << (63 - SEQUENCE_BITS)) - 1
