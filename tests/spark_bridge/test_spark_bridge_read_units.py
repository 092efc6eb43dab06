"""Pure logic of shard-aware reads: options and hosts, filter push-down, failover, the
checkpoint split."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql.datasource import EqualTo, GreaterThan, In, IsNull, Not, StringStartsWith

from chlib.cluster import committed_condition
from spark_bridge.datasource import SOURCE_NAME
from spark_bridge.reader import above_checkpoint
from spark_bridge.source_options import ClickHouseOptions, parse_hosts, parse_shards
from spark_bridge.source_reader import (
    ShardReadError,
    ShardSlice,
    filter_sql,
    read_replicas,
    sql_literal,
)


def test_the_source_has_a_name_of_its_own() -> None:
    # `clickhouse` is the official ClickHouse Spark connector's source name.
    assert SOURCE_NAME == "hakafka_clickhouse"


def test_options_follow_spark_jdbc_names_and_refuse_the_old_ones() -> None:
    base = {"database": "db", "table": "t", "shards": "h1:1,h2:2;h3:3"}
    options = ClickHouseOptions.parse(
        {**base, "partitionColumn": "_offset", "numPartitions": "4", "lowerBound": "-5"}
    )
    assert options.shards == ((("h1", 1), ("h2", 2)), (("h3", 3),))
    assert (options.partition_column, options.num_partitions, options.lower_bound) == (
        "_offset",
        4,
        -5,
    )
    assert ClickHouseOptions.parse(options.to_options()) == options, "to_options round-trips"
    with pytest.raises(ValueError, match="'partition_by' is now 'partitionColumn'"):
        ClickHouseOptions.parse({**base, "partition_by": "v"})
    with pytest.raises(ValueError, match="'numPartitions' needs option 'partitionColumn'"):
        ClickHouseOptions.parse({**base, "numPartitions": "3"})
    with pytest.raises(ValueError, match="'numPartitions': expected an integer >= 1, got '0'"):
        ClickHouseOptions.parse({**base, "partitionColumn": "v", "numPartitions": "0"})
    with pytest.raises(ValueError, match="'committed_offsets': expected JSON"):
        ClickHouseOptions.parse({**base, "committed_offsets": "[1]"})
    with pytest.raises(ValueError, match="expected host:port, got 'h4'"):
        parse_shards("h1:1;h4")


def test_a_failed_replica_hands_the_read_to_the_next_and_a_retry_starts_further() -> None:
    hosts = (("a", 1), ("b", 1), ("c", 1))
    asked: list[str] = []

    def fetch(host: str, _port: int) -> str:
        asked.append(host)
        if host == "a":
            raise ConnectionError("refused")
        return host

    assert read_replicas(hosts, ShardSlice(0, 0, None), 0, fetch) == "b"
    assert asked == ["a", "b"]
    asked.clear()
    assert read_replicas(hosts, ShardSlice(0, 2, None), 0, fetch) == "c"
    assert read_replicas(hosts, ShardSlice(0, 2, None), 1, fetch) == "b", "retry: next one"
    with pytest.raises(ShardReadError, match=r"shard 4: every replica failed: a:1: Connection"):
        read_replicas((("a", 1),), ShardSlice(4, 0, None), 0, fetch)


def test_the_checkpoint_splits_rows_between_clickhouse_and_the_buffer() -> None:
    assert committed_condition({}) == "false"
    assert committed_condition({1: 60, 0: 80}) == (
        "_offset < multiIf(_partition = 0, 80, _partition = 1, 60, 0)"
    )
    rows = pa.table(
        {
            "_partition": pa.array([0, 0, 1, 1, 5], pa.int32()),
            "_offset": pa.array([79, 80, 59, 60, 0], pa.int64()),
        }
    )
    above = above_checkpoint(rows, {0: 80, 1: 60})
    assert list(
        zip(above["_partition"].to_pylist(), above["_offset"].to_pylist(), strict=True)
    ) == [
        (0, 80),
        (1, 60),
        (5, 0),
    ], "a partition without a checkpoint: all its buffered rows"
    assert above_checkpoint(rows, {}).num_rows == 5


def test_hosts_option_names_the_bad_entry() -> None:
    assert parse_hosts("h1:8123, [::1]:9000") == (("h1", 8123), ("::1", 9000))
    with pytest.raises(ValueError, match="expected host:port, got 'h2'"):
        parse_hosts("h1:8123,h2")
    with pytest.raises(ValueError, match="'hosts' is required"):
        parse_hosts(" , ")


def test_filters_become_where_clauses_or_stay_in_spark() -> None:
    assert filter_sql(EqualTo(("kind",), "o'clock")) == "`kind` = 'o\\'clock'"
    assert filter_sql(GreaterThan(("id",), 5)) == "`id` > 5"
    assert filter_sql(In(("id",), (1, 2))) == "`id` IN (1, 2)"
    assert filter_sql(IsNull(("amount",))) == "`amount` IS NULL"
    assert filter_sql(Not(EqualTo(("id",), 1))) == "NOT (`id` = 1)"
    assert filter_sql(StringStartsWith(("kind",), "cl")) is not None
    assert filter_sql(EqualTo(("a", "b"), 1)) is None, "nested fields are not pushed down"
    assert sql_literal(None) == "NULL" and sql_literal(True) == "true"
