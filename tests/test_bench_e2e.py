"""bench/e2e_bench.py: the producers' fast encoding writes the rows `message` describes, and a
paced producer claims ids in batches, not a few at a time."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from e2e_bench import MIN_CLAIM, PRODUCE_CHUNK, Messages, message, next_claim


def test_the_producers_encoding_is_message_byte_for_byte_across_periods() -> None:
    encode = Messages()
    ids = [*range(300), Messages.PERIOD - 1, Messages.PERIOD, 3 * Messages.PERIOD + 17]
    for i in [*ids, 123_456_789, 1 << 40]:
        assert encode(i) == message(i), i


def test_a_paced_claim_waits_for_min_claim_ids_except_at_the_end_of_the_load() -> None:
    endless = sys.maxsize
    # A few due ids are left for later: claiming them spun a paced producer on a core.
    assert next_claim(0, 10, endless) == 0
    assert next_claim(5_000, 5_000 + MIN_CLAIM - 1, endless) == 5_000
    assert next_claim(0, MIN_CLAIM, endless) == MIN_CLAIM
    assert next_claim(0, 10 * PRODUCE_CHUNK, endless) == PRODUCE_CHUNK
    # Nothing due (claimed up to `due` already), or due beyond a small rest of the load.
    assert next_claim(700, 600, endless) == 700
    assert next_claim(990, 2_000, 1_000) == 1_000
