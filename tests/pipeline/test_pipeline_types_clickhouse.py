"""The ClickHouse types of #26 against the real engine (chdb behind the HTTP front) and real
Spark: decoded from JSON, flushed, and read back through `read_table` with equal values;
then end to end through a `hakafka run` node: columns read from nested paths, a pipeline
with `columns = "from_table"` filling a table made by hand, bad values as dead letters with
their reasons, and the refusal of a table with an unsupported column type."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from chlib import Replica, TableSpec, ensure_table
from devstack.clickhouse import ClickHouseService
from devstack.records import create_topic
from hakafka.consumer import Format, MessageColumns, PipelineSchema, make_decoder
from spark_bridge.flush import FlushTarget, flush_block
from spark_bridge.reader import read_table
from spark_bridge.runtime import prepare_session
from tests.commands import edit, hakafka
from tests.helpers.landing import landed
from tests.helpers.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark]

UUIDS = [
    "123e4567-e89b-12d3-a456-426614174000",
    "00000000-0000-0000-0000-000000000000",
    "ffffffff-ffff-ffff-ffff-ffffffffffff",
]
# IPv6 text as written in messages -> as ClickHouse prints it (what hakafka decodes it to).
IPV6 = {
    "2001:DB8:0:0::1": "2001:db8::1",
    "::ffff:1.2.3.4": "::ffff:1.2.3.4",
    "10.1.2.3": "::ffff:10.1.2.3",
    "::": "::",
    "fe80::1:2:3:4": "fe80::1:2:3:4",
    "2001:db8:0:1:1:1:1:1": "2001:db8:0:1:1:1:1:1",
    "::1.2.3.4": "::1.2.3.4",
    "::0.0.1.2": "::102",
}
TYPES = {
    "u": "UUID",
    "e": "Enum8('a' = 1, 'b' = -2)",
    "e16": "Enum16('x y' = 1000, 'z' = 2)",
    "ip4": "IPv4",
    "ip6": "IPv6",
    "fs": "FixedString(4)",
    "m": "Map(String, UInt32)",
    "tn": "Tuple(a Int32, b String)",
    "tu": "Tuple(Int32, Nullable(String))",
    "n": "Nested(a Int32, b UUID)",
    "j": "JSON",
    "ids": "Array(Nullable(UUID))",
    "lu": "LowCardinality(Nullable(UUID))",
}


def message(i: int) -> dict[str, Any]:
    ip6 = list(IPV6)[i % len(IPV6)]
    return {
        "u": UUIDS[i % 3].upper() if i % 2 else UUIDS[i % 3],
        "e": "ab"[i % 2],
        "e16": ["x y", "z"][i % 2],
        "ip4": f"{i % 256}.{255 - i % 256}.0.{i % 7}",
        "ip6": ip6,
        "fs": "abcd"[: i % 5],
        "m": {f"k{j}": i * 10 + j for j in range(i % 3)},
        "tn": {"a": -i, "b": f"s{i}"},
        "tu": [i, None if i % 4 == 0 else f"t{i}"],
        "n": [{"a": j, "b": UUIDS[j % 3]} for j in range(i % 3)],
        "j": {"k": i, "nested": {"list": [1, "two"], "flag": i % 2 == 0}},
        "ids": [UUIDS[0], None] if i % 2 else [],
        "lu": None if i % 3 == 0 else UUIDS[1],
    }


def expected(i: int) -> dict[str, Any]:
    """What `read_table` gives back for `message(i)`, in Spark's Python values."""
    sent = message(i)
    return {
        "u": UUIDS[i % 3],
        "e": sent["e"],
        "e16": sent["e16"],
        "ip4": sent["ip4"],
        "ip6": IPV6[sent["ip6"]],
        "fs": sent["fs"].encode().ljust(4, b"\0"),
        "m": dict(sent["m"]),
        "tn": sent["tn"],
        "tu": {"1": i, "2": sent["tu"][1]},
        "n": sent["n"],
        "j": sent["j"],
        "ids": sent["ids"],
        "lu": sent["lu"],
    }


def spark_rows(df: Any, key: str) -> list[dict[str, Any]]:
    rows = [r.asDict(recursive=True) for r in df.collect()]
    for row in rows:
        if "j" in row:
            row["j"] = json.loads(row["j"])
    return sorted(rows, key=lambda r: r[key])


def test_every_new_type_round_trips_from_json_through_clickhouse_and_read_table(
    spark: SparkSession, clickhouse: ClickHouseService, ch_database: str, ch_client: Any
) -> None:
    prepare_session(spark)
    schema = PipelineSchema.of(list(TYPES.items()))
    values: list[bytes | None] = [json.dumps(message(i)).encode() for i in range(60)]
    n = len(values)
    decoded = make_decoder(Format.JSON, schema).decode_columns(
        MessageColumns(["t"] * n, [0] * n, list(range(n)), [0] * n, [None] * n, values)
    )
    assert decoded.bad == 0
    spec = TableSpec(ch_database, "typed", tuple(schema.clickhouse_columns()), "(_offset)")
    assert ensure_table(ch_client, spec) is True
    assert ensure_table(ch_client, spec) is False  # the created table matches its spec

    class Block:
        block_id = "b1"

        def to_table(self) -> pa.Table:
            return pa.Table.from_batches([decoded.rows])

    target = FlushTarget(
        ch_database, "typed", (Replica("r1", clickhouse.host, clickhouse.port),), "pipe"
    )
    assert flush_block(spark, Block(), target).rows == n
    df = read_table(
        spark, "typed", hosts=[(clickhouse.host, clickhouse.port)], database=ch_database
    )
    got = spark_rows(df, "_offset")
    assert [r.pop("_offset") for r in got] == list(range(n))
    assert [r.pop("_partition") for r in got] == [0] * n
    assert got == [expected(i) for i in range(n)]
    # The buffer's form and ClickHouse's agree: what was decoded is what comes back.
    assert [IPV6[message(i)["ip6"]] for i in range(n)] == decoded.rows.column("ip6").to_pylist()
    assert ch_client.query("SELECT count() FROM typed WHERE e = 'b' AND has(ids, u)").result_rows
    # Columns chosen and filters pushed down work on the cast columns too.
    some = read_table(
        spark,
        "typed",
        hosts=[(clickhouse.host, clickhouse.port)],
        database=ch_database,
        columns=["u", "ip4", "_offset"],
    ).where("u = '123e4567-e89b-12d3-a456-426614174000'")
    assert sorted(r["_offset"] for r in some.collect()) == list(range(0, n, 3))


# -- end to end through a hakafka node ---------------------------------------------------

PATH_COLUMNS = """\
id = { type = "UInt64", path = "meta.id" }
sku = { type = "Nullable(String)", path = "items[0].sku" }
second_tag = { type = "Nullable(UUID)", path = "items[1].tags[0]" }
u = "UUID"
e = "Enum8('a' = 1, 'b' = -2)"
ip4 = "IPv4"
fs = "FixedString(4)"
attrs = { type = "Map(String, String)", path = "meta.attrs" }
"""
HAND_MADE = """
CREATE TABLE {table} (
  id UInt64,
  ip6 IPv6,
  state Enum8('off' = 0, 'on' = 1),
  hosts Map(String, Array(IPv4)),
  point Tuple(x Float64, y Float64),
  n Nested(k String, v UInt8),
  doc JSON,
  {extra}
  _topic LowCardinality(String),
  _partition Int32,
  _offset Int64,
  _timestamp DateTime64(3),
  _key Nullable(String)
) ENGINE = MergeTree ORDER BY (_partition, _offset)
SETTINGS non_replicated_deduplication_window = 10000
"""


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for value in values:
        producer.produce(topic, value=value, partition=0)
    assert producer.flush(30) == 0


def path_message(i: int) -> dict[str, Any]:
    return {
        "meta": {"id": 1000 + i, "attrs": {"src": f"s{i}"}, "other": [1, 2]},
        "items": [{"sku": f"sku{i}"}, {"tags": [UUIDS[i % 3]]}] if i % 2 else [],
        "u": UUIDS[i % 3],
        "e": "ab"[i % 2],
        "ip4": f"10.0.{i}.1",
        "fs": "xy",
        "ignored": {"deep": True},
    }


def table_message(i: int) -> dict[str, Any]:
    return {
        "id": i,
        "ip6": list(IPV6)[i % len(IPV6)],
        "state": ["off", "on"][i % 2],
        "hosts": {"a": [f"192.168.0.{i}"], "b": []},
        "point": {"x": i / 2, "y": -i},
        "n": [{"k": f"k{i}", "v": i % 200}],
        "doc": {"i": i, "s": "é"},
    }


def test_paths_from_table_and_bad_values_end_to_end(  # noqa: PLR0917 -- fixtures
    make_cluster: Any,
    stack: Any,
    topic_prefix: str,
    ch_database: str,
    ch_client: Any,
    spark: SparkSession,
    clickhouse: ClickHouseService,
    tmp_path: Path,
) -> None:
    ch_client.command(HAND_MADE.format(table="hand", extra=""), settings={"flatten_nested": 0})
    paths_topic, table_topic = f"{topic_prefix}_paths", f"{topic_prefix}_hand"
    for topic in (paths_topic, table_topic):
        create_topic(stack.kafka, topic, 1)
    cluster = make_cluster({"n1": [0]})
    # make_cluster's own pipeline reads an unused topic; two more are added by config edits.
    node = cluster.nodes["n1"]
    buffer = "[pipelines.buffer]\nmin_rows = 1000\nmin_bytes = 1\nmin_age = 1\nmax_age = 2\n"
    node.config_path.write_text(
        node.config_path.read_text()
        + f'\n[[pipelines]]\nname = "paths"\ntopic = "{paths_topic}"\ntable = "paths"\n'
        + f"[pipelines.columns]\n{PATH_COLUMNS}{buffer}"
        + f'\n[[pipelines]]\nname = "hand"\ntopic = "{table_topic}"\ntable = "hand"\n'
        + f'columns = "from_table"\n{buffer}'
    )
    good_paths = [json.dumps(path_message(i)).encode() for i in range(20)]
    bad_paths = {
        20: (
            {**path_message(20), "u": "not-a-uuid"},
            "column 'u' (JSON /u): expected UUID, got string \"not-a-uuid\"",
        ),
        21: (
            {**path_message(21), "e": "c"},
            "column 'e' (JSON /e): expected Enum8('a' = 1, 'b' = -2), got string \"c\"",
        ),
        22: (
            {**path_message(22), "ip4": "10.0.0.256"},
            "column 'ip4' (JSON /ip4): expected IPv4, got string \"10.0.0.256\"",
        ),
        23: (
            {**path_message(23), "fs": "abcde"},
            "column 'fs' (JSON /fs): expected FixedString(4), got string \"abcde\"",
        ),
        24: (
            {**path_message(24), "meta": {"id": 5}, "items": [{"sku": 1}]},
            "column 'sku' (JSON /items/0/sku): expected String, got number 1",
        ),
    }
    good_table = [json.dumps(table_message(i)).encode() for i in range(10)]
    bad_table = {
        10: (
            {**table_message(10), "hosts": {"a": ["1.2.3.4", "1.2.3.400"]}},
            "column 'hosts' (JSON /hosts/a/1): expected IPv4, got string \"1.2.3.400\"",
        ),
        11: (
            {**table_message(11), "state": "maybe"},
            "column 'state' (JSON /state): expected Enum8(",
        ),
    }
    produce(
        stack.kafka,
        paths_topic,
        good_paths + [json.dumps(v).encode() for v, _ in bad_paths.values()],
    )
    produce(
        stack.kafka,
        table_topic,
        good_table + [json.dumps(v).encode() for v, _ in bad_table.values()],
    )

    node.start()
    node.wait_up()
    cluster.wait_leaders([0])
    wait_for(lambda: landed(ch_client, "paths") == 20, 180, "20 rows in paths")
    wait_for(lambda: landed(ch_client, "hand") == 10, 60, "10 rows in hand")
    wait_for(lambda: landed(ch_client, "paths_dead_letter") == 5, 60, "5 dead letters of paths")
    wait_for(lambda: landed(ch_client, "hand_dead_letter") == 2, 60, "2 dead letters of hand")

    for table, bad in (("paths_dead_letter", bad_paths), ("hand_dead_letter", bad_table)):
        reasons = dict(
            ch_client.query(f"SELECT _offset, _error FROM {table} ORDER BY _offset").result_rows
        )
        assert sorted(reasons) == sorted(bad)
        for offset, (_, reason) in bad.items():
            assert reasons[offset].startswith(reason), (offset, reasons[offset])

    hosts = [(clickhouse.host, clickhouse.port)]
    got = spark_rows(
        read_table(spark, "paths", hosts=hosts, database=ch_database).drop(
            "_topic", "_partition", "_timestamp", "_key"
        ),
        "_offset",
    )
    assert got == [
        {
            "id": Decimal(1000 + i),
            "sku": f"sku{i}" if i % 2 else None,
            "second_tag": UUIDS[i % 3] if i % 2 else None,
            "u": UUIDS[i % 3],
            "e": "ab"[i % 2],
            "ip4": f"10.0.{i}.1",
            "fs": b"xy\0\0",
            "attrs": {"src": f"s{i}"},
            "_offset": i,
        }
        for i in range(20)
    ]
    got = spark_rows(
        read_table(spark, "hand", hosts=hosts, database=ch_database).drop(
            "_topic", "_partition", "_timestamp", "_key"
        ),
        "_offset",
    )
    for row in got:
        row["doc"] = json.loads(row.pop("doc"))
    assert got == [
        {
            "id": Decimal(i),
            "ip6": IPV6[list(IPV6)[i % len(IPV6)]],
            "state": ["off", "on"][i % 2],
            "hosts": {"a": [f"192.168.0.{i}"], "b": []},
            "point": {"x": i / 2, "y": float(-i)},
            "n": [{"k": f"k{i}", "v": i % 200}],
            "doc": {"i": i, "s": "é"},
            "_offset": i,
        }
        for i in range(10)
    ]

    # A table with a column hakafka cannot fill refuses the config, naming the column.
    ch_client.command(
        HAND_MADE.format(table="refused", extra="v Variant(Int8, String),"),
        settings={"flatten_nested": 0, "allow_experimental_variant_type": 1},
    )
    refused = tmp_path / "refused.toml"
    refused.write_text(node.config_path.read_text())
    edit(refused, r'^table = "hand"$', 'table = "refused"')
    run = hakafka("init", "--config", str(refused))
    assert run.code == 1, run
    assert (
        "pipelines[2].columns: pipeline 'hand': columns = \"from_table\": table "
        f"{ch_database}.refused has columns hakafka cannot fill: column 'v' has type "
        "Variant(Int8, String), which is not supported (supported: Int8"
    ) in run.err, run.err
