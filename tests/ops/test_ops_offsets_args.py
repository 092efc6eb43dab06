"""The offset targets `hakafka offsets set` parses, with the errors it names."""

from __future__ import annotations

import pytest

from hakafka.ops.cluster import UsageError
from hakafka.ops.offsets import parse_offsets, parse_timestamp


def test_offsets_are_partition_colon_offset_pairs() -> None:
    assert parse_offsets("0:1200, 2:980") == {0: 1200, 2: 980}
    with pytest.raises(UsageError, match=r"--to-offset: '2=980' is not PARTITION:OFFSET"):
        parse_offsets("0:1200,2=980")
    with pytest.raises(UsageError, match="--to-offset: partition 0 is named twice"):
        parse_offsets("0:1,0:2")


def test_timestamps_are_iso_8601_in_utc_or_epoch_milliseconds() -> None:
    assert parse_timestamp("2026-11-24T09:00:00Z") == 1_795_510_800_000
    assert parse_timestamp("2026-11-24T09:00:00") == 1_795_510_800_000  # no offset: UTC
    assert parse_timestamp("2026-11-24T10:00:00+01:00") == 1_795_510_800_000
    assert parse_timestamp("1795510800000") == 1_795_510_800_000
    with pytest.raises(UsageError, match="--to-timestamp 'yesterday': not an ISO-8601 time"):
        parse_timestamp("yesterday")
