"""`POST /insert` on the real stack: batches pushed into a pipeline's buffer beside its Kafka
topic land in ClickHouse once per (writer, sequence), through a kill -9 of the leader with
its disk lost (a batch answered on its copy before its flush included); a
follower names the leader; a batch that does not fit is refused whole, naming the column and
the row; a Flight put is applied once; `hakafka push` killed after its first batch and run
again pushes each batch once; a Spark Structured Streaming query through the kill and a
restart that runs its last micro-batch again lands each row once."""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from kazoo.client import KazooClient

from buffer.formats import encode_arrow
from buffer.push_client import Pushed, Pusher
from devstack.cluster import DaemonNode, LocalCluster, StackEndpoints
from devstack.records import create_topic
from devstack.records import produce as produce_records
from hakafka.coordination import paths
from hakafka.ops.push import default_writer
from hakafka.pipeline.push import first_offset
from tests.commands import hakafka
from tests.helpers.landing import assert_exactly_once, landed
from tests.helpers.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

PARTITIONS = 2
ARROW = "application/vnd.apache.arrow.stream"


def push(
    node: DaemonNode, writer: str, sequence: int, body: bytes, content_type: str
) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{node.url}/insert?pipeline=events&shard=0&writer={writer}&sequence={sequence}",
        data=body,
        headers={"Content-Type": content_type},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=90) as resp:
            return int(resp.status), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def rows(first: int, count: int) -> list[dict[str, Any]]:
    return [{"id": i, "kind": "push", "amount": i / 2} for i in range(first, first + count)]


def as_json(batch: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in batch)


def as_arrow(batch: list[dict[str, Any]]) -> bytes:
    return encode_arrow(pa.Table.from_pylist(batch))


def pushed(writer_partition: int, sequence: int, count: int) -> set[tuple[int, int]]:
    return {(writer_partition, first_offset(sequence) + i) for i in range(count)}


def writer_partitions(stack: StackEndpoints, zk_root: str) -> dict[str, int]:
    """Each push writer of pipeline `events` and its partition, as ZooKeeper numbers them
    (`<writer>@<shard>@<number>` znodes: `coordination/writers.py`)."""
    zk = KazooClient(hosts=f"{stack.zookeeper}{zk_root}", timeout=10.0)
    zk.start(timeout=10)
    try:
        children = zk.get_children(paths.writers("events"))
    finally:
        zk.stop()
        zk.close()
    numbers: dict[str, int] = {}
    for child in children:
        rest, _, number = child.rpartition("@")
        name = rest.rpartition("@")[0]
        numbers[name] = min(int(number), numbers.get(name, int(number)))
    return {name: -1 - n for name, n in numbers.items()}


def spark_files(folder: Path, files: int, rows_each: int) -> None:
    """`files` JSONEachRow files of `rows_each` rows of kind 'spark', ids from 10000."""
    folder.mkdir()
    for f in range(files):
        first = 10_000 + f * rows_each
        lines = (
            json.dumps({"id": i, "kind": "spark", "amount": 1.5}) + "\n"
            for i in range(first, first + rows_each)
        )
        (folder / f"part-{f}.json").write_text("".join(lines))


def test_pushes_land_once_beside_kafka_through_a_leader_killed(
    make_cluster: Any,
    *,
    stack: StackEndpoints,
    topic_prefix: str,
    ch_client: Any,
    tmp_path: Path,
    zk_root: str,
    spark: Any,
) -> None:
    topic = f"{topic_prefix}_events"
    create_topic(stack.kafka, topic, PARTITIONS)
    produced = produce_records(stack.kafka, topic, 2_000, partitions=PARTITIONS)
    cluster: LocalCluster = make_cluster(
        {"n1": [0], "n2": [0]}, shard_count=1, spark_on_followers=True
    )
    cluster.start()
    first = cluster.wait_leaders([0])[0]
    other = "n2" if first == "n1" else "n1"
    leader, follower = cluster.nodes[first], cluster.nodes[other]

    # A follower does not take it: it names the leader and where to reach it.
    status, answer = push(follower, "w1", 0, as_json(rows(0, 100)), "application/x-ndjson")
    assert status == 421, answer
    assert (answer["leader"], answer["http"]) == (first, leader.url)

    # Answered once flushed; a retry of the same batch is applied once.
    status, answer = push(leader, "w1", 0, as_json(rows(0, 100)), "application/x-ndjson")
    assert (status, answer["rows"], answer["duplicate"]) == (200, 100, False), answer
    status, answer = push(leader, "w1", 0, as_json(rows(0, 100)), "application/x-ndjson")
    assert (status, answer["rows"], answer["duplicate"]) == (200, 0, True), answer

    # A batch that does not fit is refused whole, with the column, the row and why.
    bad = rows(100, 3)
    bad[1]["kind"] = None
    status, answer = push(leader, "w1", 1, as_json(bad), "application/x-ndjson")
    assert status == 400, answer
    assert "column 'kind', row 1: null in a required column" in answer["message"]

    status, answer = push(leader, "w1", 1, as_arrow(rows(100, 50)), ARROW)
    assert (status, answer["rows"]) == (200, 50), answer

    # A Spark Structured Streaming query pushes four files, one a micro-batch, through the
    # kill of the leader below (its pushes go to the next leader).
    spark_in, checkpoint = tmp_path / "spark-in", tmp_path / "spark-checkpoint"
    spark_files(spark_in, 4, 250)

    def start_query() -> Any:
        return (
            spark.readStream.schema("id LONG, kind STRING, amount DOUBLE")
            .option("maxFilesPerTrigger", 1)
            .json(str(spark_in))
            .writeStream.format("hakafka")
            .option("urls", f"{follower.url},{leader.url}")
            .option("pipeline", "events")
            .option("writer", "stream")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )

    def spark_rows() -> int:
        return int(ch_client.command("SELECT count() FROM events WHERE kind = 'spark'"))

    query = start_query()
    wait_for(lambda: spark_rows() >= 250, 120, "the query's first micro-batch")

    # Answered once copied to the follower (push_acks = 1), before its flush: it survives
    # the leader's node dying with its disk.
    copied = Pusher(lambda: [leader.url], "events", 0, "w-copied")
    copied_rows = pa.Table.from_pylist([{**r, "kind": "copied"} for r in rows(0, 40)])
    assert copied.push(0, copied_rows) == Pushed(40, False, 1)
    assert int(ch_client.command("SELECT count() FROM events WHERE kind = 'copied'")) == 0

    # The leader dies with its disk; the next one knows from the checkpoint what w1
    # pushed, and gathers the copied batch from its own copies.
    leader.kill()
    shutil.rmtree(cluster.root / first, ignore_errors=True)
    assert cluster.wait_leaders([0])[0] == other
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    # The query restarted as if it had died after its last micro-batch's pushes, before
    # committing it: Spark runs that batch again, with its id, and its pushes are answered
    # as duplicates.
    commits = checkpoint / "commits"
    last = max(int(f.name) for f in commits.iterdir() if f.name.isdigit())
    for written in (commits / str(last), commits / f".{last}.crc"):
        written.unlink(missing_ok=True)
    again = start_query()
    again.awaitTermination(180)
    assert again.exception() is None, again.exception()
    assert spark_rows() == 1000
    status, answer = push(follower, "w1", 1, as_arrow(rows(100, 50)), ARROW)
    assert (status, answer["duplicate"]) == (200, True), answer
    status, answer = push(follower, "w1", 2, as_arrow(rows(150, 25)), ARROW)
    assert (status, answer["rows"]) == (200, 25), answer
    status, answer = push(follower, "w2", 0, as_json(rows(0, 10)), "application/x-ndjson")
    assert (status, answer["rows"]) == (200, 10), answer

    # `hakafka push` of a CSV file, as if killed after its first batch (the file then held
    # that batch only), run again over the whole file: the first batch is applied once.
    csv_file = tmp_path / "orders.csv"
    csv_file.write_text("id,kind,amount\n" + "".join(f"{i},csv,{i}.5\n" for i in range(1000)))
    config = str(follower.config_path)
    command = ("push", "--config", config, "--pipeline", "events", "--batch-rows", "1000")
    done = hakafka(*command, str(csv_file))
    assert done.code == 0, done.err
    assert done.out.startswith("1000 rows in 1 batches"), done.out
    csv_file.write_text("id,kind,amount\n" + "".join(f"{i},csv,{i}.5\n" for i in range(2500)))
    done = hakafka(*command, str(csv_file))
    assert done.code == 0, done.err
    assert done.out.startswith("1500 rows in 3 batches (1 applied before)"), done.out
    assert f"as writer {default_writer(csv_file)}" in done.err
    # A file whose rows do not fit: refused, naming the batch, the column and the row.
    bad_file = tmp_path / "bad.jsonl"
    bad_file.write_text('{"id": 1, "kind": "x", "amount": 1}\n{"id": 2, "kind": null}\n')
    done = hakafka(*command, "--writer", "bad", str(bad_file))
    assert done.code == 1
    assert "batch 0 (sequence 0, rows from 0)" in done.err, done.err
    assert "column 'kind', row 1: null in a required column" in done.err, done.err

    # Over Flight (do_put, the target in its descriptor), applied once too.
    flight_rows = pa.Table.from_pylist([{**r, "kind": "flight"} for r in rows(0, 20)])
    flight = Pusher(lambda: [f"grpc://127.0.0.1:{follower.flight_port}"], "events", 0, "w-flight")
    assert flight.push(0, flight_rows) == Pushed(20, False, 1)
    assert flight.push(0, flight_rows).duplicate

    writers = writer_partitions(stack, zk_root)
    csv_writer = default_writer(csv_file)
    stream = writers["stream-t0-s0"]
    expected = (
        produced.good
        | pushed(writers["w1"], 0, 100)
        | pushed(writers["w1"], 1, 50)
        | pushed(writers["w1"], 2, 25)
        | pushed(writers["w2"], 0, 10)
        | pushed(writers[csv_writer], 0, 1000)
        | pushed(writers[csv_writer], 1, 1000)
        | pushed(writers[csv_writer], 2, 500)
        | pushed(writers["w-flight"], 0, 20)
        | pushed(writers["w-copied"], 0, 40)
        # Micro-batches 0..3, one file each: sequence batch id * 2**20.
        | {p for b in range(4) for p in pushed(stream, b << 20, 250)}
    )
    wait_for(lambda: landed(ch_client, "events") >= len(expected), 120, "every row")
    assert_exactly_once(ch_client, "events", expected)
    kinds = ch_client.query(
        "SELECT _partition < 0, kind = 'push', count() FROM events GROUP BY 1, 2 ORDER BY 1, 2"
    ).result_rows
    assert [tuple(r) for r in kinds] == [(0, 0, len(produced.good)), (1, 0, 3560), (1, 1, 185)]
