"""Builds each leadership term's `PipelineLeader`s with their real parts.

A pipeline's schema and sink live as long as the daemon; a term gets a fresh decoder, its
own fenced view of ZooKeeper, and a consumer and WAL opened on its pipeline thread.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from buffer import Catalog
from chlib.replicas import Replica
from hakafka.config import Config, PipelineConfig
from hakafka.consumer import PartitionConsumer, PipelineSchema
from hakafka.consumer.group_offsets import GroupOffsets, SharedGroupOffsets
from hakafka.coordination import Coordinator, Leadership
from hakafka.coordination.writers import read_writers
from hakafka.daemon.push_replicas import PushReplicas
from hakafka.daemon.replica_store import ReplicaStore
from hakafka.faults import CrashPlan
from hakafka.metrics import Metrics
from hakafka.pipeline import PipelineLeader, PipelineParts
from hakafka.pipeline.parts import Consumer, Fenced, LaneParts, Wal
from hakafka.pipeline.refetch import KafkaRefetch
from hakafka.pipeline.sink import PipelineSink
from hakafka.settings import (
    client_tls,
    decoder_of,
    lane_count,
    pipeline_schema,
    registry_of,
    shard_assignment,
    shard_replicas,
    wal_dir,
)
from wal import WriteAheadLog


@dataclass(frozen=True)
class _Pipeline:
    """What every term of one pipeline reuses."""

    config: PipelineConfig
    schema: PipelineSchema
    sink: PipelineSink
    mirror: SharedGroupOffsets  # one Kafka client for the group, whichever shards it leads


@dataclass
class PipelineFactory:
    """Makes the pipelines of a shard's term, unstarted."""

    config: Config
    coordinator: Coordinator
    spark: Callable[[], SparkSession]
    catalog: Catalog
    metrics: Metrics
    crash: CrashPlan
    replica_store: ReplicaStore
    _pipelines: list[_Pipeline] = field(init=False)
    # Sends copies of pushed batches to the shard's other nodes, for every pipeline.
    _copy_pool: ThreadPoolExecutor = field(
        init=False, default_factory=lambda: ThreadPoolExecutor(8, thread_name_prefix="push-copy")
    )

    def __post_init__(self) -> None:
        kafka = self.config.kafka
        self._pipelines = [
            _Pipeline(
                p,
                schema,
                PipelineSink(self.config, p, schema, self.spark),
                SharedGroupOffsets(
                    functools.partial(
                        GroupOffsets, kafka.bootstrap, p.topic, p.group, kafka.settings
                    )
                ),
            )
            for p in self.config.pipelines
            for schema in (pipeline_schema(p),)
        ]

    def reconfigure(self, config: Config) -> None:
        """Build later terms' pipelines with `config` (a reload changed only what a running
        pipeline may take: its `[buffer]` settings)."""
        by_name = {p.name: p for p in config.pipelines}
        self.config = config
        self._pipelines = [
            dataclasses.replace(p, config=by_name[p.config.name]) for p in self._pipelines
        ]

    def for_shard(
        self, shard: int
    ) -> Callable[[Leadership, str | None, bool], list[PipelineLeader]]:
        """`make(leadership, only, drain)`: the term's pipelines, or with `only` the one so
        named; with `drain`, in drain mode."""

        def make(leadership: Leadership, only: str | None, drain: bool) -> list[PipelineLeader]:
            fenced = leadership.fenced()  # one token for the whole term
            return [
                PipelineLeader(
                    config=p.config,
                    shard=shard,
                    decoder=decoder_of(p.config, p.schema, registry_of(self.config)),
                    parts=self._parts(p, shard, fenced),
                    assignment=shard_assignment(self.config, p.config, shard),
                    rows_per_task=self.config.spark.rows_per_task,
                    catalog=self.catalog,
                    metrics=self.metrics,
                    crash=self.crash,
                    drain=drain,
                )
                for p in self._pipelines
                if only is None or p.config.name == only
            ]

        return make

    def close(self) -> None:
        """Stop sending copies (at shutdown, once every pipeline stopped): queued sends are
        dropped, their pushes are answered by the flush or pushed again."""
        self._copy_pool.shutdown(wait=False, cancel_futures=True)

    def _peers(self, shard: int) -> list[str]:
        """The HTTP addresses of the shard's other candidates, not under replacement: where
        its pushed batches are copied and gathered from."""
        nodes, replacing = self.coordinator.nodes(), self.coordinator.replacing()
        return [
            nodes[n].http
            for n in self.coordinator.candidates(shard)
            if n != self.config.node and n in nodes and n not in replacing and nodes[n].http
        ]

    def _parts(self, p: _Pipeline, shard: int, fenced: Fenced) -> PipelineParts:
        config, pipeline = self.config, p.config
        kafka = config.kafka

        # Picklable, for lane processes (they forward their offset resets to be counted).
        consumer_of = functools.partial(
            PartitionConsumer,
            kafka.bootstrap,
            pipeline.topic,
            settings=dict(kafka.settings),
            out_of_range=kafka.out_of_range,
            group_id=f"hakafka-{config.node}",
        )

        def consumer() -> Consumer:
            return consumer_of(
                shard_assignment(config, pipeline, shard),
                on_reset=self.metrics.consumer.resets_of(pipeline.name, shard),
            )

        lanes = lane_count(pipeline)

        def open_wal() -> Wal:
            w = pipeline.wal
            return WriteAheadLog.open(
                wal_dir(config, shard, pipeline.name),
                fsync=w.fsync,
                segment_bytes=w.segment_bytes,
                interval_ms=w.interval_ms,
            )

        def replicas() -> tuple[Replica, ...]:
            return shard_replicas(
                config, shard, lambda r: self.coordinator.writable_replicas(shard, r)
            )

        return PipelineParts(
            consumer=consumer,
            open_wal=open_wal,
            refetch=KafkaRefetch(
                kafka.bootstrap,
                pipeline.topic,
                kafka.settings,
                out_of_range=kafka.out_of_range,
                on_reset=self.metrics.consumer.resets_of(pipeline.name, shard),
            ),
            sink=p.sink,
            fenced=fenced,
            replicas=replicas,
            mirror=p.mirror.mirror if kafka.commit_offsets else None,
            push_copies=PushReplicas(
                self.replica_store,
                pipeline.name,
                shard,
                fenced.epoch,
                peers=lambda: self._peers(shard),
                has_writers=lambda: any(
                    home == shard
                    for _number, home in read_writers(
                        self.coordinator.session, pipeline.name
                    ).values()
                ),
                pool=self._copy_pool,
                token=config.server.token.value or None,
                tls=client_tls(config),
            ),
            lanes=None
            if lanes == 1
            else LaneParts(
                consumer=consumer_of,
                decoder=functools.partial(decoder_of, pipeline, p.schema, registry_of(self.config)),
                count=lanes,
            ),
        )
