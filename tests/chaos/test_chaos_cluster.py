"""Chaos: three daemons, two shards, a seeded schedule of faults; exactly once at the end.

The cluster is n1 (shards 0 and 1), n2 (shard 0) and n3 (shard 1) on a 3-member ZooKeeper
ensemble, the broker on s3:// storage and a ClickHouse front. Each node has its own
`[spark] rows_per_task` (700, 1 100, 1 600), small against the blocks the run seals, so
blocks are flushed in several tasks and a block whose leader died is re-flushed by a node
that would have cut it otherwise. A producer writes known records (every 97th malformed)
while the driver SIGKILLs and SIGSTOPs leaders, restarts ZooKeeper members and the broker,
stops the ClickHouse front, marks and clears replacements and asks for failovers. Between two
faults (after 2 of the short run's, 25 of the long one's), with the producer running, the
driver reshards the cluster from 2 shards to 3 (n1 [0, 1, 2], n2 [0, 2], n3 [1, 2]):
`hakafka reshard` with the new layout, then every node restarted with its new config; a
failed attempt (the old layout consumes again) is said and tried once more 3 faults later,
and the faults go on over the three shards. Then everything is healed and the run must show:
every good record in `events` exactly once and every bad one in `events_dead_letter` exactly
once (by `_partition`, `_offset`), the reshard done, no shard ever led by two nodes at once
(leader znode epochs, checkpoint commits), no WAL damage, blocks of 3 or more tasks
committed, and every re-flush committed in the tasks its intent's writer planned (the
summary counts the re-flushes on a node whose rows_per_task differs from the writer's).
Where the machine allows it (root and iproute2), n1 runs in a network namespace of its own
behind a veth pair, and the driver also cuts that link: the partitioned leader must stop
committing and another node must take over its shards. Each node writes to ClickHouse
through an address of its own (its replica, in the production layout), and the driver also
kills a leader together with that replica: another node must checkpoint the shard while the
replica is still down. In the long run n3 has a 20 s ZooKeeper session (the others 3 s), so
a frozen server holds its replies for 8 s on a live connection.

Every leader change is timed from the new leader's `leader.elected` to its `leader.consuming`
(from the daemons' logs) and the distribution is printed with the final tally, the reshard
(when, request -> every shard consuming, the partitions moved) and the blocks' task counts.
The long run fails if any took longer than the ZooKeeper session timeout + 5 s; the short
one, which runs inside `make test` on a busy machine, only prints it.

The seed is printed; `CHAOS_SEED=<seed>` replays the same schedule.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from devstack.chaos.checks import (
    checkpoint_summary,
    commit_violations,
    configured_rows_per_task,
    consuming_bound,
    consuming_summary,
    daemon_logs,
    election_timings,
    flush_report,
    read_commits,
    repaired_corruption,
    too_slow,
    verify_wals,
)
from devstack.chaos.driver import SEED_ENV, ChaosDriver, ChaosTargets, ReshardPlan, chaos_seed
from devstack.chaos.liveness import LivenessMonitor, liveness_summary, recoveries
from devstack.chaos.netns import NetworkNamespace, netns_unavailable
from devstack.chaos.watcher import LeadershipWatcher
from devstack.clickhouse import ClickHouseService
from devstack.cluster import LocalCluster, PipelineSpec, StackEndpoints
from devstack.kafka import KafkaBroker
from devstack.process import DevstackError
from devstack.records import EVENT_COLUMNS, Produced, create_topic, produce, tally
from devstack.zk_proxy import ZkProxy
from devstack.zookeeper import ZooKeeperEnsemble
from hakafka.coordination import Coordinator, NodeInfo
from hakafka.coordination.session import ZkConfig
from tests.helpers.waiting import wait_for

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.integration,
    pytest.mark.spark,
    pytest.mark.slow(seconds=150),  # the short run
]

NODES = {"n1": [0, 1], "n2": [0], "n3": [1]}
SHARDS = [0, 1]
# The reshard during the run: 2 -> 3 shards, every node also serving the new shard 2.
RESHARDED = {"n1": [0, 1, 2], "n2": [0, 2], "n3": [1, 2]}
ALL_SHARDS = [0, 1, 2]
# Different per node, and small against the blocks the run seals (about 1 000 - 3 000 rows
# per shard and producer chunk, up to the 50 000 of max_rows after an outage), so that
# blocks have 3+ tasks and a block whose leader died is often re-flushed by a node that
# would have cut it otherwise (it must follow the recorded plan).
ROWS_PER_TASK = {"n1": 700, "n2": 1_100, "n3": 1_600}
PARTITIONS = 8
BAD_EVERY = 97
SESSION_TIMEOUT = 3.0
# Below 2/3 of the session timeout (when kazoo gives a silent connection up), so a frozen
# server makes a request time out on a live connection (zk_frozen).
REQUEST_TIMEOUT = 1.5
# The nodes' `[server] stuck_after`: a term without progress for this long is not ready.
STUCK_AFTER = 30.0
# The long run gives one node (with a ZooKeeper proxy) a 20 s session, as production often
# does: a frozen server then holds its replies for seconds on a live connection (zk_frozen).
LONG_SESSION = {"n3": 20.0}
DATABASE = "chaos"
WARM_UP = 2_000  # records produced and flushed before the first fault
NETNS_NODE = "n1"  # runs in its own network namespace where the machine allows it
# On s3:// tansu lists all of a partition's objects (one per batch) on every fetch, and moto
# serializes a listing at about 0.5 ms per object: with small batches, catching up after a
# broker restart crawled at a few hundred records a second. So a chunk goes out as one batch
# per partition, and chunks are large.
CHUNK_LINGER_MS = 250


@dataclass(frozen=True)
class Variant:
    """One chaos schedule: how many faults, how much data, and the bounds of every phase."""

    name: str
    faults: int
    gap: tuple[float, float]  # pause before each fault, seconds
    chaos_seconds: float  # the fault phase ends at this bound even if faults remain
    records: int  # at most this many, warm-up included
    chunk: int
    chunk_pause: float
    drain_seconds: float
    minimum_applied: int
    # Fail if a leader change took longer than session timeout + 5 s to consume. Only the
    # long run: the short one shares a 2-core machine with the rest of `make test`, where a
    # bound that tight would measure the machine's load, so it prints the distribution only.
    bound_consuming: bool
    reshard_after: int | None  # applied faults before the reshard (None: no reshard)
    session_timeouts: dict[str, float] = field(default_factory=dict)  # node -> own session
    # Warm standby (`[spark] on_followers`, the default) and a bound on every recovery: only
    # the long run; three Spark drivers beside the rest of `make test` would starve it.
    warm_standby: bool = False

    @property
    def shard_bound(self) -> float:
        """What `stuck_after` promises for a shard: a new term counts from the shard's last
        checkpoint, but while the shard has no leader at all its followers are ready; an
        election ends that within the longest session timeout (plus the monitor's 1 s
        sampling and the new leader's first look)."""
        return STUCK_AFTER + self.longest_session + 5.0

    @property
    def longest_session(self) -> float:
        return max([SESSION_TIMEOUT, *self.session_timeouts.values()])

    @property
    def recovery_bound(self) -> float:
        """After a fault ends, every shard progresses within this (the issue's bound: the
        session timeout + 10 s), unless the next fault comes first."""
        return self.longest_session + 10.0


LIE_PERSIST = 3  # probes in a row that make a ready-while-stuck a failure (see the monitor)
# The short run is inside `make test`: five faults around a reshard keep the suite's time
# (eight took a minute more); the long run is where the fault mix is exercised.
SHORT = Variant("short", 5, (3.0, 6.0), 90.0, 30_000, 2_000, 3.0, 150.0, 4, False, 2)
LONG = Variant(
    "long", 55, (2.0, 6.0), 1200.0, 400_000, 6_000, 10.0, 300.0, 50, True, 25, LONG_SESSION, True
)


class Producer(threading.Thread):
    """Produces known records `WARM_UP..variant.records-1` in chunks until done or stopped;
    a chunk is never in flight while the broker restarts (it holds `lock`)."""

    def __init__(self, bootstrap: str, topic: str, variant: Variant, lock: threading.Lock):
        super().__init__(name="chaos-producer", daemon=True)
        self.bootstrap, self.topic, self.variant, self.lock = bootstrap, topic, variant, lock
        self.produced = Produced()
        self.error: BaseException | None = None
        self._stop_requested = threading.Event()

    def run(self) -> None:
        v = self.variant
        try:
            for start in range(WARM_UP, v.records, v.chunk):
                if self._stop_requested.is_set():
                    return
                with self.lock:
                    self.produced |= produce(
                        self.bootstrap,
                        self.topic,
                        min(v.chunk, v.records - start),
                        partitions=PARTITIONS,
                        start=start,
                        bad_every=BAD_EVERY,
                        linger_ms=CHUNK_LINGER_MS,
                    )
                self._stop_requested.wait(v.chunk_pause)
        except BaseException as exc:
            self.error = exc

    def finish(self, timeout: float = 90.0) -> None:
        self._stop_requested.set()
        self.join(timeout)
        assert not self.is_alive(), f"producer still running {timeout:.0f} s after stop"


def make_namespace(
    tmp_path: Path, cluster: LocalCluster, stack: StackEndpoints
) -> tuple[NetworkNamespace | None, str]:
    """A network namespace for NETNS_NODE with forwarders to every service, or None and why
    not (then the run goes on without real partitions)."""
    reason = netns_unavailable()
    if reason is not None:
        return None, reason
    netns = NetworkNamespace(f"hkc{os.getpid() % 100_000}", tmp_path)
    node = cluster.nodes[NETNS_NODE]
    services = [
        int(hp.rsplit(":", 1)[1])
        for hp in (*stack.zookeeper.split(","), stack.kafka, stack.clickhouse)
    ] + cluster.replica_ports()
    try:
        netns.create()
        netns.forward(services, [node.http_port, node.flight_port])
    except DevstackError as exc:
        netns.delete()
        return None, f"could not set up the network namespace: {exc}"
    return netns, ""


def node_views(cluster: LocalCluster) -> dict[str, Any]:
    """What each daemon says of its shards: role, state, epoch, pipeline states, lag, errors."""
    return {
        name: [
            {k: s.get(k) for k in ("shard", "role", "state", "epoch")}
            | {
                "pipelines": [
                    (p.get("state"), p.get("lag"), p.get("error")) for p in s.get("pipelines", [])
                ]
            }
            for s in node.status().get("shards", [])
        ]
        for name, node in cluster.nodes.items()
    }


def wait_consuming_leaders(
    cluster: LocalCluster, shards: list[int], tag: str, timeout: float = 120.0
) -> None:
    """Every shard of `shards` has a consuming leader; else fail with what each node says of
    itself."""
    try:
        cluster.wait_leaders(shards, timeout=timeout)
    except DevstackError as exc:
        raise AssertionError(f"{tag} {exc}; the nodes say: {node_views(cluster)}") from None


def distinct_rows(client: Any, table: str) -> int:
    return int(client.command(f"SELECT uniqExact(_partition, _offset) FROM {table}"))


@pytest.mark.timeout(1800)
def test_chaos_every_record_exactly_once(
    tmp_path: Path,
    chaos_long: bool,
    chaos_zookeeper: ZooKeeperEnsemble,
    chaos_broker: KafkaBroker,
    chaos_clickhouse: ClickHouseService,
) -> None:
    variant = LONG if chaos_long else SHORT
    seed = chaos_seed()
    tag = f"[chaos {variant.name}, {SEED_ENV}={seed}]"
    print(f"\n{tag} replay with {SEED_ENV}={seed}", flush=True)
    began = time.monotonic()

    admin = chaos_clickhouse.client()
    admin.command(f"CREATE DATABASE IF NOT EXISTS {DATABASE}")
    topic = f"chaos_{uuid.uuid4().hex[:8]}"
    zk_root = f"/chaos/{topic}"
    stack = StackEndpoints(
        chaos_zookeeper.hosts, chaos_broker.bootstrap, f"127.0.0.1:{chaos_clickhouse.port}"
    )
    create_topic(stack.kafka, topic, PARTITIONS)
    members = [("127.0.0.1", m.client_port) for m in chaos_zookeeper.members]
    # Every node but the namespaced one (which reaches only the forwarded service ports)
    # talks to ZooKeeper through a proxy the zk_* faults act on.
    proxies = {name: ZkProxy(*members) for name in NODES if name != NETNS_NODE}
    cluster = LocalCluster(
        tmp_path / "cluster",
        stack,
        nodes=NODES,
        shard_count=len(SHARDS),
        pipelines=[
            PipelineSpec(
                name="events",
                topic=topic,
                table=f"{topic}_events",
                columns=EVENT_COLUMNS,
                buffer={
                    "min_rows": 2_000,
                    "max_rows": 50_000,
                    "min_bytes": 1,
                    "min_age": 1,
                    "max_age": 3,
                },
                lanes=2,  # each shard's partitions read by two lane processes
            )
        ],
        zk_root=zk_root,
        database=DATABASE,
        session_timeout=SESSION_TIMEOUT,
        session_timeouts=variant.session_timeouts,
        spark_on_followers=variant.warm_standby,
        rows_per_task=ROWS_PER_TASK,
        server={"stuck_after": STUCK_AFTER},
        zookeeper={"request_timeout": REQUEST_TIMEOUT},
        zookeeper_hosts={name: proxy.hosts for name, proxy in proxies.items()},
        replica_per_node=True,
    )
    table, dead_table = f"{topic}_events", f"{topic}_events_dead_letter"
    watcher = LeadershipWatcher(stack.zookeeper, zk_root, ALL_SHARDS)
    coordinator = Coordinator(
        ZkConfig(hosts=stack.zookeeper, root=zk_root, session_timeout_s=6.0),
        "chaos-driver",
        NodeInfo(host="", http="", flight="", pid=os.getpid(), version="chaos"),
    )
    producer: Producer | None = None
    liveness: LivenessMonitor | None = None
    netns, netns_skipped = make_namespace(tmp_path, cluster, stack)
    try:
        coordinator.start()
        targets = ChaosTargets(
            cluster,
            chaos_zookeeper,
            chaos_broker,
            chaos_clickhouse,
            coordinator,
            SHARDS,
            netns=netns,
            netns_node=NETNS_NODE if netns is not None else None,
            zk_proxies=proxies,
            request_timeout=REQUEST_TIMEOUT,
        )
        targets.start_cluster(timeout=120.0)
        wait_consuming_leaders(cluster, targets.shards, tag)
        watcher.start()
        liveness = LivenessMonitor(cluster, lambda: list(targets.shards))
        driver = ChaosDriver(targets, seed, session_timeout=SESSION_TIMEOUT)
        # Faults start once the first leaders have flushed (their Spark sessions are up);
        # the producer runs from then until the faults end.
        warm = produce(stack.kafka, topic, WARM_UP, partitions=PARTITIONS, bad_every=BAD_EVERY)
        client = chaos_clickhouse.client(database=DATABASE)
        wait_for(
            lambda: distinct_rows(client, table) > 0,
            180,
            f"{tag} the first flush",
            interval=1.0,
            retry_errors=True,
        )
        liveness.start()
        producer = Producer(stack.kafka, topic, variant, targets.broker_lock)
        producer.produced |= warm
        producer.start()
        reshard = (
            None
            if variant.reshard_after is None
            else ReshardPlan(variant.reshard_after, RESHARDED, len(ALL_SHARDS))
        )
        driver.run(
            variant.faults,
            gap=variant.gap,
            deadline=time.monotonic() + variant.chaos_seconds,
            reshard=reshard,
        )
        producer.finish()
        assert producer.error is None, f"{tag} producer failed: {producer.error!r}"
        good, bad = producer.produced.good, producer.produced.bad
        chaos_done = time.monotonic()

        driver.heal()
        wait_consuming_leaders(cluster, targets.shards, tag)
        client = chaos_clickhouse.client(database=DATABASE)
        try:
            wait_for(
                lambda: distinct_rows(client, table) >= len(good),
                variant.drain_seconds,
                f"{tag} every good record in {table} ({len(good)})",
                interval=1.0,
                retry_errors=True,
            )
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}; {distinct_rows(client, table)} there; the nodes say: {node_views(cluster)}"
            ) from None
        wait_for(
            lambda: distinct_rows(client, dead_table) >= len(bad),
            60,
            f"{tag} every bad record in {dead_table} ({len(bad)})",
            interval=1.0,
            retry_errors=True,
        )
        time.sleep(4)  # one more flush cycle: nothing may arrive twice afterwards
        liveness.stop()
        rows = tally(client, table, good)
        dead = tally(client, dead_table, bad)
        cluster.stop()

        logs = daemon_logs(cluster)
        doubled = watcher.violations() + commit_violations(
            read_commits(logs), watcher.observations()
        )
        wals = verify_wals(node.root / name for name, node in cluster.nodes.items())
        damaged = [w for w in wals if w.damaged] + repaired_corruption(logs)
        commits = read_commits(logs)
        cuts = [(c.led, c.taken_over, len(c.commits_while_cut)) for c in driver.partitions]
        timings = election_timings(logs)
        bound = consuming_bound(node.config_path for node in cluster.nodes.values())
        bounds = (STUCK_AFTER, variant.shard_bound)
        found = recoveries(driver.faults, driver.began, liveness, [a.at for a in driver.reshards])
        late = [r for r in found if r.slow(variant.recovery_bound)]
        flushes = flush_report(
            logs,
            configured_rows_per_task({n: node.config_path for n, node in cluster.nodes.items()}),
        )
        print(
            f"{tag} {driver.summary()}\n"
            f"{tag} {driver.reshard_summary()}\n"
            f"{tag} records: {len(good)} good, {len(bad)} bad; {table}: {rows}; "
            f"{dead_table}: {dead}\n"
            f"{tag} leader changes seen: {len(watcher.observations())}, checkpoint commits: "
            f"{len(commits)}, (shard, epoch, node): "
            f"{sorted({(c.shard, c.epoch, c.node) for c in commits})}\n"
            f"{tag} WAL dirs: {len(wals)}, torn tails (expected after SIGKILL): "
            f"{sum(w.torn_tail for w in wals)}, damaged: {len(damaged)}\n"
            f"{tag} network partitions of {NETNS_NODE}: "
            f"{netns_skipped or cuts}\n"
            f"{tag} {consuming_summary(timings, bound)}\n"
            f"{tag} {checkpoint_summary(timings)}\n"
            f"{tag} {flushes.summary()}\n"
            f"{tag} "
            f"{liveness_summary(found, liveness, bounds)}\n"
            f"{tag} recoveries slower than {variant.recovery_bound:g} s with the shards left "
            f"alone that long: {len(late)} of {len(found)} "
            f"({sum(r.alone is not None and r.alone < variant.recovery_bound for r in found)} "
            "followed sooner by the next fault)"
            "\n"
            f"{tag} chaos phase {chaos_done - began:.0f} s, total {time.monotonic() - began:.0f} s",
            flush=True,
        )
        applied = [f for f in driver.faults if f.outcome.startswith("applied")]
        errors = [f for f in driver.faults if f.outcome.startswith("error")]
        assert rows.exactly_once, f"{tag} {table}: {rows}"
        assert dead.exactly_once, f"{tag} {dead_table}: {dead}"
        assert not doubled, f"{tag} doubled leadership: {doubled}"
        assert not damaged, f"{tag} WAL damage: {damaged}"
        assert not errors, f"{tag} faults that could not be applied: {errors}"
        # Without warm standby the next leader starts Spark first: on the busy machine of
        # `make test` that alone has taken 48 s, so only the long run fails on it.
        stuck = [f for f in driver.faults if "NOT checkpointed" in f.outcome]
        if variant.warm_standby:
            assert not stuck, f"{tag} a shard stood still while a replica was down: {stuck}"
        assert not driver.unplanned_exits, (
            f"{tag} daemons died by themselves: {driver.unplanned_exits}"
        )
        assert len(good) > 0 and len(bad) > 0
        if reshard is not None:
            assert any(a.ok for a in driver.reshards), (
                f"{tag} the reshard to {len(ALL_SHARDS)} shards never completed: "
                f"{driver.reshard_summary()}"
            )
        assert flushes.wide(), f"{tag} no block of >= 3 tasks was committed: {flushes.summary()}"
        assert not flushes.off_plan(), (
            f"{tag} re-flushes that did not follow their recorded plan: {flushes.off_plan()}"
        )
        for cut in driver.partitions:
            assert cut.taken_over, f"{tag} nobody took over from partitioned {cut}"
            assert not cut.commits_while_cut, f"{tag} partitioned leader committed: {cut}"
        if variant.warm_standby:
            assert not late, f"{tag} shards slow to progress after a fault: {late}"
        # A lie of 3 probes in a row (3 s) fails the run; shorter ones are printed above.
        # A reshard rewrites every checkpoint: from the moment its new layout consumes, a
        # term counts its stall from that write (DESIGN, "Noticed and left alone").
        resets = [driver.began + a.at + a.seconds for a in driver.reshards if a.seconds]
        lies = liveness.ready_while_stuck(variant.shard_bound, persist=LIE_PERSIST, resets=resets)
        assert not lies, f"{tag} a shard stuck while its nodes said ready: {lies[:5]}"
        slow = too_slow(timings, bound) if variant.bound_consuming else None
        assert slow is None, f"{tag} {slow}"
        if netns_skipped:
            warnings.warn(f"chaos: network partition not run: {netns_skipped}", stacklevel=1)
        assert len(applied) >= variant.minimum_applied, (
            f"{tag} only {len(applied)} faults applied: {driver.faults}"
        )
    finally:
        if producer is not None and producer.is_alive():
            producer.finish()
        if liveness is not None:
            liveness.stop()
        watcher.stop()
        coordinator.close()
        cluster.stop()
        for proxy in proxies.values():
            proxy.close()
        if netns is not None:
            netns.delete()
        admin.close()
