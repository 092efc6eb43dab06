"""bench/e2e_bench.py: the producers' fast encoding writes the rows `message` describes."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from e2e_bench import Messages, message


def test_the_producers_encoding_is_message_byte_for_byte_across_periods() -> None:
    encode = Messages()
    ids = [*range(300), Messages.PERIOD - 1, Messages.PERIOD, 3 * Messages.PERIOD + 17]
    for i in [*ids, 123_456_789, 1 << 40]:
        assert encode(i) == message(i), i
