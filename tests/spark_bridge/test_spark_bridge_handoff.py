"""`spark_bridge.handoff`: a block's slices served to the flush tasks over Flight, each only
to the task holding its ticket."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyarrow import flight

from spark_bridge.handoff import SliceHandoff, fetch_slice


def test_slice_handoff_serves_each_slice_by_its_ticket_only() -> None:
    table = pa.table({"v": list(range(10))})
    with SliceHandoff("127.0.0.1", [table.slice(0, 4), table.slice(4)]) as handoff:
        second = pa.Table.from_batches(handoff.source.fetch(1))
        assert second["v"].to_pylist() == list(range(4, 10))
        with pytest.raises(flight.FlightUnauthorizedError, match="unknown block slice ticket"):
            list(fetch_slice(handoff.source.location, b"guessed-ticket"))
