"""Pure logic of spark_bridge: task slicing, filter pushdown, hosts, the slice handoff, insert
bodies."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest
from pyarrow import flight
from pyspark.sql.datasource import EqualTo, GreaterThan, In, IsNull, Not, StringStartsWith

from spark_bridge.datasource import arrow_file
from spark_bridge.handoff import SliceHandoff, fetch_slice
from spark_bridge.plan import sorted_rows, task_slices
from spark_bridge.source_options import parse_hosts
from spark_bridge.source_reader import filter_sql, sql_literal


def test_task_slices_are_a_pure_contiguous_cover() -> None:
    assert task_slices(0, 10) == []
    assert task_slices(10, 10) == [(0, 10)]
    assert task_slices(11, 10) == [(0, 6), (6, 5)]
    slices = task_slices(1_000_001, 250_000)
    assert len(slices) == 5
    assert slices[0][0] == 0 and sum(n for _, n in slices) == 1_000_001
    assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(slices))
    assert task_slices(1_000_001, 250_000) == slices, "same input, same tasks (same tokens)"


def test_filters_become_where_clauses_or_stay_in_spark() -> None:
    assert filter_sql(EqualTo(("kind",), "o'clock")) == "`kind` = 'o\\'clock'"
    assert filter_sql(GreaterThan(("id",), 5)) == "`id` > 5"
    assert filter_sql(In(("id",), (1, 2))) == "`id` IN (1, 2)"
    assert filter_sql(IsNull(("amount",))) == "`amount` IS NULL"
    assert filter_sql(Not(EqualTo(("id",), 1))) == "NOT (`id` = 1)"
    assert filter_sql(StringStartsWith(("kind",), "cl")) is not None
    assert filter_sql(EqualTo(("a", "b"), 1)) is None, "nested fields are not pushed down"
    assert sql_literal(None) == "NULL" and sql_literal(True) == "true"


def test_hosts_option_names_the_bad_entry() -> None:
    assert parse_hosts("h1:8123, [::1]:9000") == (("h1", 8123), ("::1", 9000))
    with pytest.raises(ValueError, match="expected host:port, got 'h2'"):
        parse_hosts("h1:8123,h2")
    with pytest.raises(ValueError, match="'hosts' is required"):
        parse_hosts(" , ")


def test_sorted_rows_orders_by_partition_then_offset_in_both_paths() -> None:
    # Consumed order (offsets rising per partition) and a shuffled order (they do not).
    consumed = pa.table(
        {"_partition": [1, 0, 1, 0, 2], "_offset": [5, 7, 6, 8, 1], "v": list("abcde")}
    )
    shuffled = consumed.take([3, 2, 4, 1, 0])
    for table in (consumed, shuffled):
        result = sorted_rows(table, "block b")
        assert list(
            zip(result["_partition"].to_pylist(), result["_offset"].to_pylist(), strict=True)
        ) == [
            (0, 7),
            (0, 8),
            (1, 5),
            (1, 6),
            (2, 1),
        ]
        assert result["v"].to_pylist() == ["b", "d", "a", "c", "e"]


def test_slice_handoff_serves_each_slice_by_its_ticket_only() -> None:
    table = pa.table({"v": list(range(10))})
    with SliceHandoff("127.0.0.1", [table.slice(0, 4), table.slice(4)]) as handoff:
        second = pa.Table.from_batches(handoff.source.fetch(1))
        assert second["v"].to_pylist() == list(range(4, 10))
        with pytest.raises(flight.FlightUnauthorizedError, match="unknown block slice ticket"):
            list(fetch_slice(handoff.source.location, b"guessed-ticket"))


@pytest.mark.parametrize(
    ("compression", "compressed"), [(None, False), ("lz4", True), ("zstd", True), ("gzip", False)]
)
def test_an_insert_body_is_the_table_as_one_arrow_file(
    compression: str | None, compressed: bool
) -> None:
    table = pa.table({"id": list(range(1000)), "note": ["x" * 50] * 1000})

    body = arrow_file(table, compression)

    reader = pa.ipc.open_file(body)
    assert reader.num_record_batches == 1  # one chunk, as deduplication needs
    assert reader.read_all().equals(table)
    # Arrow compresses its buffers with lz4 and zstd; gzip is HTTP-level, not Arrow's.
    assert (body.size < arrow_file(table, None).size) is compressed
