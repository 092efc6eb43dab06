"""Exactly-once under drift and resharding (#21): what the flush plan costs a block, and how long
`hakafka reshard` pauses ingest under load, each next to a baseline of the same run.

1. Plan cost. Blocks of 100k and 1M messages of the e2e shape (bench/e2e_bench.py `message`,
   ~200 B of JSON, 7 columns + the 5 meta columns), on 8 partitions, decoded by the pipeline's
   JSON decoder and appended to a `PipelineBuffer` as the consume lane does (batches of
   CONSUME_BATCH messages, each a run of consecutive offsets from every partition in turn, so
   offsets ascend per partition and partitions interleave), one message in BAD_EVERY
   malformed (a dead letter), sealed into one block. Timed on that block, median of
   PLAN_REPEATS runs, at each ROWS_PER_TASK: `plan_block` (sort, cut along offsets, digest per
   task), `follow_plan` (a re-flush: sort, cut along the recorded tasks, recount and re-digest),
   and, as the baseline, what the flush did before #21 with the same block: `sorted_rows` and
   `task_slices` of rows and dead letters (sort and cut, no ranges, no digests). For scale,
   a direct clickhouse-connect `insert_arrow` of the sorted rows and dead letters into the local
   ClickHouse front (median of INSERT_REPEATS): the floor of what the flush itself costs.
2. Reshard pause. Per round, on the local stack and with a fresh ZooKeeper root, topic and
   table: n1 and n3 serve shards 0 and 1 of 2 (n1 leads both, n3 stands by), n2 is deployed
   with the 3-shard layout already and waits (its settings differ from the record). A producer
   writes RATE messages a second to 6 partitions throughout. First the baseline, on the same
   cluster under the same load: `hakafka failover --shard 0` (n3 takes shard 0 over); then
   `hakafka reshard --config <n2's config>` (n1 and n3 drain, the checkpoints move, n2 leads
   all three shards). The rounds run once with `spark.on_followers = true` (the default: every
   node keeps Spark warm, and a round waits until the standby's and n2's flush paths are) and
   once with `false` (the previous default: the new leaders start Spark when they first
   lead), the baseline of the same run. For each
   operation: the command's wall time; the time from the request until every shard it moves
   has a consuming leader of the new term (the `leader` znode's stamp), and until every
   partition has been checkpointed after that; the ingest gap: the longest time between
   consecutive checkpoint commits across the cluster, and the longest any one partition went
   without one (the `fenced.checkpoint_committed` events of every daemon, from GAP_LOOKBACK_S
   s before the request). Next to them the floors: the wall time of any operator command
   (`hakafka status`) and the steady interval between commits before the request. At the end
   of the round the producer stops and ClickHouse is counted: rows, distinct (_partition,
   _offset) and produced must agree (exit code 1 otherwise).

Run: PYTHONPATH=. .venv/bin/python bench/exactly_once_bench.py [--parts plan,reshard]
     [--rounds N] [--on-followers true,false]   (about 10 minutes)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import itertools
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from benchstack import Bench, ZkView, local_stack
from confluent_kafka import Producer
from e2e_bench import COLUMNS, SESSION_TIMEOUT, ZK_ROOT, message
from kazoo.exceptions import NoNodeError

from buffer import OffsetRange
from chlib import TableSpec, ensure_table
from devstack.chaos.checks import log_events
from devstack.cluster import DaemonNode, LocalCluster, PipelineSpec
from devstack.process import run_hakafka, wait_until
from devstack.records import EVENT_COLUMNS, Tally, create_topic, event, tally
from hakafka.config import META_COLUMNS, ColumnConfig, PipelineConfig
from hakafka.consumer import (
    DEAD_LETTER_COLUMNS,
    MessageColumns,
    PipelineSchema,
    dead_letter_arrow_schema,
)
from hakafka.coordination import LeaderInfo, PendingIntent, paths
from hakafka.logs import configure as configure_logs
from hakafka.pipeline.blockplan import Settings, block_settings, follow_plan, plan_block
from hakafka.pipeline.buffer import PipelineBlock, PipelineBuffer
from hakafka.pipeline.lane_reader import CONSUME_BATCH
from hakafka.settings import decoder_of, pipeline_schema
from spark_bridge.plan import sorted_rows, task_slices

# -- 1. plan cost ----------------------------------------------------------------------------

PLAN_PARTITIONS = 8
BLOCK_ROWS = (100_000, 1_000_000)
ROWS_PER_TASK = (500_000, 100_000)
BAD_EVERY = 97  # a prime: the dead letters spread over every partition (~1.0%)
PLAN_REPEATS = 7
INSERT_REPEATS = 5
TOPIC = "events"
PLAN_DATABASE = "plan_bench"

# -- 2. reshard pause ------------------------------------------------------------------------

PARTITIONS = 6
RATE = 3_000  # messages/s
ROUNDS = 3
# Seal a block at >= 1,000 rows once its oldest row is >= 0.5 s old (at 2 s whatever the
# rows): at RATE a shard commits about once a second, so a pause stands out from the cadence.
BUFFER: dict[str, int | float] = {"min_rows": 1_000, "min_bytes": 1, "min_age": 0.5, "max_age": 2}
OLD_NODES = ("n1", "n3")  # the 2-shard layout; n1 starts first and leads both shards
NEW_NODE = "n2"  # the 3-shard layout, waiting until the reshard records it
WARM_S = 5.0  # steady load before each operation, so the cadence before it is measured
GAP_LOOKBACK_S = 10.0
COMMAND_TIMEOUT_S = 180.0
SETTLE_TIMEOUT_S = 180.0  # a leader consuming, a partition checkpointed, ClickHouse complete

Row = tuple[str, ...]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


def timed(work: Callable[[], object]) -> float:
    """Seconds `work` takes, garbage collected first so that no collection lands inside it."""
    gc.collect()
    began = time.perf_counter()
    work()
    return time.perf_counter() - began


def table_rows(headers: Row, rows: Sequence[Row]) -> list[str]:
    """`rows` under `headers`, every column as wide as its widest cell."""
    widths = [max(len(r[i]) for r in (headers, *rows)) for i in range(len(headers))]
    return [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip()
        for r in (headers, *rows)
    ]


def plan_config() -> PipelineConfig:
    """The pipeline whose settings the plan records (the e2e pipeline: JSON, dead letters)."""
    columns = tuple(ColumnConfig(name, ch_type) for name, ch_type in COLUMNS.items())
    return PipelineConfig(name="events", topic=TOPIC, table="events", columns=columns)


def consumed_block(rows: int, config: PipelineConfig) -> PipelineBlock:
    """`rows` messages decoded by `config`'s decoder and appended in consume-lane batches,
    sealed into one block."""
    schema = pipeline_schema(config)
    decoder = decoder_of(config, schema)
    buffer = PipelineBuffer("events", schema.arrow_schema(), dead_letter_arrow_schema(), 1 << 40)
    per_partition = rows // PLAN_PARTITIONS
    run = CONSUME_BATCH // PLAN_PARTITIONS
    stamp = int(time.time() * 1000)
    for start in range(0, per_partition, run):
        partitions: list[int] = []
        offsets: list[int] = []
        values: list[bytes | None] = []
        for partition in range(PLAN_PARTITIONS):
            for offset in range(start, min(start + run, per_partition)):
                i = offset * PLAN_PARTITIONS + partition
                partitions.append(partition)
                offsets.append(offset)
                values.append(b"{bad json %d" % i if i % BAD_EVERY == 0 else message(i))
        n = len(offsets)
        decoded = decoder.decode_columns(
            MessageColumns([TOPIC] * n, partitions, offsets, [stamp] * n, [None] * n, values)
        )
        ranges = {key: OffsetRange(first, last) for key, (first, last) in decoded.ranges.items()}
        buffer.append(decoded.rows, decoded.dead_letters, ranges)
    block = buffer.seal()
    assert block is not None
    return block


def before_21(block: PipelineBlock, rows_per_task: int) -> None:
    """The flush's plan before #21: rows and dead letters sorted, each cut into slices."""
    for half in (block.rows, block.dead_letters):
        if half is not None:
            table = sorted_rows(half.table, f"block {block.block_id}")
            task_slices(table.num_rows, rows_per_task)


def insert_time(client: Any, block: PipelineBlock, schema: PipelineSchema) -> float:
    """Median seconds of a direct insert of the block's sorted rows and dead letters into
    tables of their own (a fresh token each time)."""
    tables = (f"rows_{block.row_count}", f"dead_{block.row_count}")
    columns = (schema.clickhouse_columns(), DEAD_LETTER_COLUMNS)
    for table, table_columns in zip(tables, columns, strict=True):
        spec = TableSpec(PLAN_DATABASE, table, tuple(table_columns), "(_partition, _offset)")
        ensure_table(client, spec)
    halves = plan_block(block, ROWS_PER_TASK[0]).block
    assert halves.dead_letters is not None
    pairs = ((tables[0], halves.rows.table), (tables[1], halves.dead_letters.table))

    def insert() -> None:
        token = f"bench:{time.monotonic_ns()}"
        for table, rows in pairs:
            client.insert_arrow(table, rows, settings={"insert_deduplication_token": token})

    seconds = [timed(insert) for _ in range(INSERT_REPEATS)]
    inserted = client.query(f"SELECT count() FROM {tables[0]}").result_rows[0][0]
    assert inserted == halves.row_count * INSERT_REPEATS, inserted
    return statistics.median(seconds)


def plan_times(
    block: PipelineBlock, rows_per_task: int, settings: Settings
) -> tuple[int, float, float, float]:
    """The tasks of the block's plan, and the median seconds of the flush's plan before #21,
    of `plan_block` and of `follow_plan` (its re-flush), timed in turn run after run so that a
    noisy second hits all three alike."""
    planned = plan_block(block, rows_per_task)
    assert sum(t.rows for t in planned.tasks) == block.row_count
    assert sum(t.dead for t in planned.tasks) == block.dead_count
    ranges = {p: (r.first, r.last + 1) for (_, p), r in block.ranges.items()}
    intent = PendingIntent(block.block_id, {TOPIC: ranges}, 1, planned.tasks, settings)
    # A node with another rows_per_task re-flushes along the recorded plan all the same.
    followed = follow_plan(block, intent, settings, 1 + rows_per_task // 3)
    assert (followed.rows, followed.dead) == (planned.rows, planned.dead)
    steps = (
        functools.partial(before_21, block, rows_per_task),
        functools.partial(plan_block, block, rows_per_task),
        functools.partial(follow_plan, block, intent, settings, rows_per_task),
    )
    runs = [[timed(step) for step in steps] for _ in range(PLAN_REPEATS)]
    before, plan, follow = (statistics.median(column) for column in zip(*runs, strict=True))
    return len(planned.tasks), before, plan, follow


def plan_rows(bench: Bench) -> list[str]:
    """The plan-cost table (section 1 of the docstring)."""
    config = plan_config()
    schema, settings = pipeline_schema(config), block_settings(config)
    bench.ch.client().command(f"CREATE DATABASE IF NOT EXISTS {PLAN_DATABASE}")
    client = bench.ch.client(database=PLAN_DATABASE)
    rows: list[Row] = []
    try:
        for count in BLOCK_ROWS:
            block = consumed_block(count, config)
            insert = insert_time(client, block, schema)
            for rows_per_task in ROWS_PER_TASK:
                tasks, before, plan, follow = plan_times(block, rows_per_task, settings)
                rows.append(
                    (
                        f"{count:,}",
                        f"{block.dead_count:,}",
                        f"{rows_per_task:,}",
                        f"{tasks}",
                        f"{before * 1000:,.1f} ms",
                        f"{plan * 1000:,.1f} ms",
                        f"{follow * 1000:,.1f} ms",
                        f"{insert * 1000:,.0f} ms",
                        f"{plan / before:.2f}",
                        f"{follow / before:.2f}",
                        f"{plan / insert:.3f}",
                    )
                )
    finally:
        client.close()
    headers = (
        "messages",
        "dead",
        "rows/task",
        "tasks",
        "before: sort+cut",
        "plan_block",
        "follow_plan",
        "insert (CH)",
        "plan/before",
        "follow/before",
        "plan/insert",
    )
    return [
        f"plan cost per block: e2e row shape ({len(COLUMNS)} columns + {len(META_COLUMNS)} meta), "
        f"{PLAN_PARTITIONS} partitions consumed in batches of {CONSUME_BATCH:,}, 1 message in "
        f"{BAD_EVERY} a dead letter; median of {PLAN_REPEATS} paired runs (insert: "
        f"{INSERT_REPEATS})",
        *("  " + line for line in table_rows(headers, rows)),
        "before: sorted_rows + task_slices (the flush before #21); insert (CH): direct "
        "insert_arrow of the sorted rows and dead letters into the local ClickHouse front",
    ]


# -- 2. reshard pause --------------------------------------------------------------------------


class Load:
    """RATE messages a second (`devstack.records.event`, the EVENT_COLUMNS shape) round-robin
    over PARTITIONS partitions, from a thread of this process until `stop`; `produced` holds
    the (partition, offset) of every message the broker acknowledged."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.produced: set[tuple[int, int]] = set()
        self.sent = self.undelivered = 0
        self.seconds = 0.0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-load", daemon=True)

    def _run(self) -> None:
        try:
            self._produce()
        except BaseException as exc:  # reported by stop(), in the bench's own thread
            self.error = exc

    def _produce(self) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 20})
        failed = [0]

        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                failed[0] += 1
            else:
                self.produced.add((msg.partition(), msg.offset()))

        began = time.monotonic()
        while not self._stop.is_set():
            due = int((time.monotonic() - began) * RATE)
            while self.sent < due:
                try:
                    producer.produce(
                        self.topic,
                        value=event(self.sent),
                        partition=self.sent % PARTITIONS,
                        on_delivery=delivered,
                    )
                    self.sent += 1
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
            self._stop.wait(0.02)
        self.seconds = time.monotonic() - began
        self.undelivered = producer.flush(60) + failed[0]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop producing and wait for the last acknowledgements (idempotent)."""
        self._stop.set()
        self._thread.join(90)
        if self._thread.is_alive() or self.error is not None:
            raise SystemExit(f"the producer failed: {self.error or 'it did not stop in 90 s'}")

    def rate(self) -> float:
        return self.sent / self.seconds if self.seconds else 0.0


class Leaders(ZkView):
    """The `leader` znodes of a cluster's shards, read from a ZooKeeper session of the bench's."""

    def consuming(self, shard: int, led_by: Callable[[str], bool]) -> float | None:
        """When (Unix time, the ZooKeeper server's stamp) the shard's leader last wrote its
        znode, if that leader is one `led_by` accepts and says `consuming`; else None."""
        path = paths.leader(shard)
        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            return None
        info = LeaderInfo.decode(path, data)
        return stat.mtime / 1000 if led_by(info.node) and info.status == "consuming" else None

    def standing(self, shard: int) -> set[str]:
        """The nodes standing in the shard's election."""
        election = paths.election(shard)
        found = set()
        for name in self.client.get_children(election):
            with contextlib.suppress(NoNodeError):
                found.add(self.client.get(f"{election}/{name}")[0].decode())
        return found


@dataclass(frozen=True)
class Commit:
    """One `fenced.checkpoint_committed` event of a daemon: when, and which partitions."""

    at: float
    partitions: frozenset[int]


def commits(nodes: Sequence[DaemonNode]) -> list[Commit]:
    """Every checkpoint commit of `nodes`, in time order (their log's own timestamps)."""
    found = [
        Commit(
            datetime.fromisoformat(e["timestamp"]).timestamp(),
            frozenset(int(p) for parts in e["offsets"].values() for p in parts),
        )
        for node in nodes
        for e in log_events(node.log_path, ["fenced.checkpoint_committed"])
    ]
    return sorted(found, key=lambda c: c.at)


def longest_gap(times: Sequence[float], what: str) -> float:
    """The longest interval between consecutive `times`; SystemExit naming `what` if there
    are fewer than two."""
    if len(times) < 2:
        raise SystemExit(f"fewer than 2 checkpoint commits of {what} around the operation")
    return max(b - a for a, b in itertools.pairwise(times))


@dataclass(frozen=True)
class Pause:
    """One operation under load, in seconds from its request (see the module docstring)."""

    command: float
    consuming: float
    resumed: float
    cluster_gap: float
    partition_gap: float
    steady: float  # median interval between the cluster's commits before the request


def command_seconds(*args: str, accept: Sequence[int] = (0,)) -> float:
    """Wall seconds of `hakafka ARGS` run as an operator does; SystemExit with its output if
    its exit code is not in `accept`."""
    began = time.monotonic()
    done = run_hakafka(args, COMMAND_TIMEOUT_S)
    took = time.monotonic() - began
    if done.returncode not in accept:
        output = (done.stdout + done.stderr).decode(errors="replace")
        raise SystemExit(f"hakafka {' '.join(args)} exited {done.returncode}:\n{output}")
    return took


@dataclass
class Round:
    """One round's cluster: the 2-shard nodes, the waiting 3-shard node, their leaders."""

    old: LocalCluster
    new: LocalCluster
    leaders: Leaders

    @property
    def nodes(self) -> list[DaemonNode]:
        return [*self.old.nodes.values(), *self.new.nodes.values()]

    def committed_after(self, since: float) -> dict[int, float]:
        """Partition -> its first checkpoint commit after `since` (Unix time)."""
        first: dict[int, float] = {}
        for commit in commits(self.nodes):
            if commit.at > since:
                for p in commit.partitions:
                    first.setdefault(p, commit.at)
        return first

    def operate(
        self, args: Sequence[str], shards: Sequence[int], led_by: Callable[[str], bool]
    ) -> Pause:
        """Run the operator command `args` under load and time the pause it makes: until each
        of `shards` has a consuming leader that `led_by` accepts, until every partition is
        checkpointed after that, and the commit gaps meanwhile."""
        time.sleep(WARM_S)
        requested = time.time()
        command = command_seconds(*args)
        stamps: dict[int, float] = {}

        def consuming() -> bool:
            for shard in shards:
                if shard not in stamps and (at := self.leaders.consuming(shard, led_by)):
                    stamps[shard] = at
            return len(stamps) == len(shards)

        wait_until(consuming, timeout=SETTLE_TIMEOUT_S, what="the new leaders consuming")
        done = max(stamps.values())
        wait_until(
            lambda: len(self.committed_after(done)) == PARTITIONS,
            timeout=SETTLE_TIMEOUT_S,
            what="every partition checkpointed by its new leader",
            interval=0.5,
        )
        resumed = max(self.committed_after(done).values())
        window = [c for c in commits(self.nodes) if requested - GAP_LOOKBACK_S <= c.at <= resumed]
        before = [c.at for c in window if c.at < requested]
        return Pause(
            command,
            done - requested,
            resumed - requested,
            longest_gap([c.at for c in window], "the cluster"),
            max(
                longest_gap([c.at for c in window if p in c.partitions], f"partition {p}")
                for p in range(PARTITIONS)
            ),
            statistics.median(b - a for a, b in itertools.pairwise(before)),
        )


@dataclass
class RoundResult:
    floor: float  # `hakafka status` wall time
    failover: Pause
    reshard: Pause
    load: Load
    counted: Tally


def run_round(bench: Bench, number: str, *, on_followers: bool) -> RoundResult:
    """One round on a fresh ZooKeeper root, topic and database (section 2 of the docstring)."""
    name = f"exactly_once_{number}"
    zk_root = f"{ZK_ROOT}/{name}"
    create_topic(bench.stack.kafka, name, PARTITIONS)
    bench.ch.client().command(f"CREATE DATABASE IF NOT EXISTS {name}")
    pipeline = PipelineSpec("events", name, "events", EVENT_COLUMNS, buffer=BUFFER)

    def layout(nodes: dict[str, list[int]], shard_count: int) -> LocalCluster:
        return LocalCluster(
            bench.root / name,
            bench.stack,
            nodes=nodes,
            shard_count=shard_count,
            pipelines=[pipeline],
            zk_root=zk_root,
            database=name,
            session_timeout=SESSION_TIMEOUT,
            spark_on_followers=on_followers,
        )

    old, new = layout({n: [0, 1] for n in OLD_NODES}, 2), layout({NEW_NODE: [0, 1, 2]}, 3)
    first, standby = (old.nodes[n] for n in OLD_NODES)
    waiting = new.nodes[NEW_NODE]
    with contextlib.ExitStack() as stack:
        stack.callback(new.stop)
        stack.callback(old.stop)
        command_seconds("init", "--config", str(first.config_path))
        first.start()
        first.wait_up(90)
        old.wait_leaders([0, 1])
        for node in (standby, waiting):
            node.start()
        for node in (standby, waiting):
            node.wait_up(90)
        leaders = stack.enter_context(contextlib.closing(Leaders(bench.stack.zookeeper, zk_root)))
        cluster = Round(old, new, leaders)
        load = Load(bench.stack.kafka, name)
        load.start()
        stack.callback(load.stop)
        wait_until(  # the first leader's Spark is up
            lambda: len(cluster.committed_after(0)) == PARTITIONS,
            timeout=SETTLE_TIMEOUT_S,
            what="every partition's first checkpoint",
            interval=0.5,
        )
        wait_until(
            lambda: standby.name in leaders.standing(0),
            timeout=SETTLE_TIMEOUT_S,
            what=f"{standby.name} standing in shard 0",
        )
        if on_followers:  # the deployment measured: warm standbys
            for node in (standby, waiting):
                wait_until(
                    node.flush_path_warm,
                    timeout=SETTLE_TIMEOUT_S,
                    what=f"{node.name}'s flush path warm",
                    interval=0.5,
                )
        # Any exit code: a cluster with a waiting node need not be healthy to be read.
        floor = command_seconds("status", "--config", str(first.config_path), accept=(0, 1))
        failover = cluster.operate(
            ["failover", "--config", str(first.config_path), "--shard", "0"],
            [0],
            lambda node: node != first.name,
        )
        reshard = cluster.operate(
            ["reshard", "--config", str(waiting.config_path), "--timeout", "120"],
            [0, 1, 2],
            lambda node: node == waiting.name,
        )
        time.sleep(WARM_S)  # the new layout consuming under load
        load.stop()
        client = bench.ch.client(database=name)
        stack.callback(client.close)
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        counted = tally(client, "events", load.produced)
        while counted.missing and time.monotonic() < deadline:
            time.sleep(1.0)
            counted = tally(client, "events", load.produced)
    return RoundResult(floor, failover, reshard, load, counted)


def spread(samples: Sequence[float]) -> str:
    """Median and max of per-round samples in ms (one value when there is one round)."""
    if len(samples) == 1:
        return ms(samples[0])
    return f"median {ms(statistics.median(samples))}, max {ms(max(samples))}"


def reshard_rows(results: Sequence[RoundResult], *, on_followers: bool) -> list[str]:
    """The reshard-pause table (section 2 of the docstring)."""
    measures = (
        ("command wall time", "command"),
        ("request -> moved shards consuming", "consuming"),
        ("request -> every partition checkpointed again", "resumed"),
        ("ingest gap: between any two commits", "cluster_gap"),
        ("ingest gap: longest of one partition", "partition_gap"),
    )
    rows: list[Row] = []
    for label, attr in measures:
        failover = [getattr(r.failover, attr) for r in results]
        reshard = [getattr(r.reshard, attr) for r in results]
        ratio = statistics.median(reshard) / statistics.median(failover)
        rows.append((label, spread(failover), spread(reshard), f"{ratio:.1f}"))
    steady = [p.steady for r in results for p in (r.failover, r.reshard)]
    floors = [r.floor for r in results]
    rows += [
        ("floor: commit interval before the request", spread(steady), "", ""),
        ("floor: hakafka status wall time", spread(floors), "", ""),
    ]
    for i, r in enumerate(results, 1):
        c = r.counted
        rows.append(
            (
                f"round {i}: {r.load.rate():,.0f} msg/s, {r.load.undelivered} undelivered",
                f"produced {len(r.load.produced):,}",
                f"rows {c.rows:,}, distinct {c.rows - c.duplicates:,}",
                "exactly once" if c.exactly_once else f"NOT: {c}",
            )
        )
    headers = ("", "ops failover --shard 0", "reshard 2 -> 3 shards", "reshard/failover")
    return [
        f"reshard pause: {PARTITIONS} partitions, a producer at {RATE:,} msg/s, blocks sealed at "
        f">= {BUFFER['min_rows']:,} rows and >= {BUFFER['min_age']} s (at {BUFFER['max_age']} s "
        f"regardless), session timeout {ms(SESSION_TIMEOUT)}, "
        f"spark.on_followers = {str(on_followers).lower()}, "
        f"{len(results)} round{'s' * (len(results) != 1)} (each: a fresh ZooKeeper root, topic "
        "and table; the failover first, then the reshard, on the same cluster), "
        f"{os.cpu_count()} cores",
        *("  " + line for line in table_rows(headers, rows)),
        "times from the request (the command's start); consuming: the leader znodes' stamps; "
        "commits: the daemons' fenced.checkpoint_committed events",
    ]


PARTS = ("plan", "reshard")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS), help="of: plan,reshard")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="reshard rounds")
    parser.add_argument(
        "--on-followers",
        default="true,false",
        help="spark.on_followers values, each a run of --rounds rounds (true: the default, "
        "Spark warm on every node; false: started when a node first leads)",
    )
    args = parser.parse_args()
    parts = args.parts.split(",")
    if unknown := [p for p in parts if p not in PARTS]:
        parser.error(f"unknown part(s) {unknown}; known: {', '.join(PARTS)}")
    values = {"true": True, "false": False}
    if unknown := [v for v in args.on_followers.split(",") if v not in values]:
        parser.error(f"--on-followers takes true and/or false, not {unknown}")
    configure_logs("console", "error")  # the tables, not every dead letter decoded
    exactly_once = True
    with local_stack("hakafka-exactly-once-bench-") as bench:
        if "plan" in parts:
            for line in plan_rows(bench):
                print(line, flush=True)
        for value in args.on_followers.split(",") if "reshard" in parts else []:
            on_followers, results = values[value], list[RoundResult]()
            try:
                for number in range(1, args.rounds + 1):
                    print(f"... reshard round {number}, on_followers {value}", file=sys.stderr)
                    tag = f"{number}_{'on' if on_followers else 'off'}"
                    results.append(run_round(bench, tag, on_followers=on_followers))
            finally:
                if results:
                    for line in reshard_rows(results, on_followers=on_followers):
                        print(line, flush=True)
            exactly_once &= all(r.counted.exactly_once for r in results)
    return 0 if exactly_once else 1


if __name__ == "__main__":
    sys.exit(main())
