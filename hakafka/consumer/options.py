"""What a pipeline chooses about decoding: its `format`, what happens to a bad message
(`on_error`) and the limits and settings of `DecodeOptions`.

Plain Python: the config holds these members and checks these options without loading a
parser.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Format(StrEnum):
    """How a message's value is encoded (a pipeline's `format`)."""

    JSON = "json"
    RAW = "raw"
    CSV = "csv"
    AVRO = "avro"
    PROTOBUF = "protobuf"


class OnError(StrEnum):
    """What happens to a bad message (a pipeline's `on_error`)."""

    DEAD_LETTER = "dead_letter"
    SKIP = "skip"
    FAIL = "fail"


DEFAULT_MAX_MESSAGE_BYTES = 1 << 20
DEFAULT_DEAD_LETTER_BYTES = 64 << 10


@dataclass(frozen=True)
class DecodeOptions:
    """Per-pipeline decoding settings.

    `max_message_bytes`: a bigger value is a bad message. `dead_letter_bytes`: a dead
    letter keeps this much of its key and value. `use_threads`: let Arrow parse on several
    cores (off by default: the daemon runs one decoder per pipeline).
    """

    on_error: OnError = OnError.DEAD_LETTER
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    dead_letter_bytes: int = DEFAULT_DEAD_LETTER_BYTES
    use_threads: bool = False
    csv_delimiter: str = ","

    def __post_init__(self) -> None:
        """`on_error` as its member; ValueError naming an option out of its range."""
        try:  # an untyped caller may pass the plain string
            object.__setattr__(self, "on_error", OnError(self.on_error))
        except ValueError:
            raise ValueError(
                f"on_error must be dead_letter, skip or fail, got {self.on_error!r}"
            ) from None
        if self.max_message_bytes < 1:
            raise ValueError(f"max_message_bytes must be >= 1, got {self.max_message_bytes}")
        if self.dead_letter_bytes < 0:
            raise ValueError(f"dead_letter_bytes must be >= 0, got {self.dead_letter_bytes}")
        delimiter = self.csv_delimiter
        if len(delimiter) != 1 or not delimiter.isascii() or delimiter in '"\r\n':
            raise ValueError(
                "csv_delimiter must be one ASCII character other than a quote or a line "
                f"break, got {delimiter!r}"
            )
