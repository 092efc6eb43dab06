"""Errors raised by the consumer package; each names what is wrong and where."""

from __future__ import annotations


class ConsumerError(Exception):
    """Base class of every error raised by `hakafka.consumer`."""


class SchemaError(ConsumerError):
    """A pipeline schema cannot be used: unknown or unsupported type, bad column name."""


class OffsetOutOfRangeError(ConsumerError):
    """A partition's next offset lies outside the broker's log (policy `fail`)."""

    def __init__(self, topic: str, partition: int, offset: int, low: int, high: int) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.low = low
        self.high = high
        super().__init__(
            f"offset {offset} of {topic}[{partition}] is out of range: the broker holds "
            f"offsets {low}..{high - 1} (low watermark {low}, high watermark {high}); "
            "retention ran past the checkpoint or the topic was recreated "
            "(out_of_range policy is 'fail')"
        )


class KafkaConsumeError(ConsumerError):
    """librdkafka reported a fatal or non-retriable error."""


class DecodeError(ConsumerError):
    """A message could not be decoded and the pipeline's `on_error` is `fail`."""

    def __init__(self, topic: str, partition: int, offset: int, reason: str) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.reason = reason
        super().__init__(f"cannot decode {topic}[{partition}] offset {offset}: {reason}")

    def __reduce__(self) -> tuple[type[DecodeError], tuple[str, int, int, str]]:
        # A lane process sends it to the pipeline thread pickled.
        return type(self), (self.topic, self.partition, self.offset, self.reason)
