"""The cluster as `spark_bridge.reader.read_table` reads it, built from a hakafka config.

`spark_bridge` never imports `hakafka`: it reads a plain `chlib.Cluster`. This module
fills one from the config (`[clickhouse.replicas]`: every shard's replicas) and ZooKeeper
(nodes under replacement now, not to be read), and for fresh reads (`include_buffer`) adds
`LeaderBuffers`: each shard leader's buffer of the pipeline, and its checkpoint.

    from hakafka.ops.cluster_view import load_cluster_view
    cluster = load_cluster_view(Path("/etc/hakafka/hakafka.toml"), "events", include_buffer=True)
    df = read_table(spark, "events", cluster=cluster, database="analytics",
                    connection=Connection(...), include_buffer=True)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pyarrow as pa

from chlib.cluster import Cluster, ShardReplicas
from hakafka.config import Config, PipelineConfig, load_config
from hakafka.coordination.writers import PUSH_TOPIC
from hakafka.ops.cluster import OpsError, connect
from hakafka.ops.query import query_shards
from hakafka.settings import client_tls, shard_replicas


@dataclass(frozen=True)
class LeaderBuffers:
    """`chlib.LiveBuffer` of one pipeline: its shard leaders' buffers over Flight (as
    `hakafka query` asks them: every shard answers, its next leader within the session
    timeout + 2 s, or the read fails naming it) and its checkpoint in ZooKeeper, each read
    anew at every call."""

    config: Config
    pipeline: PipelineConfig

    def rows(self) -> pa.Table:
        name = self.pipeline.name.replace('"', '""')
        with connect(self.config) as coordinator:
            return query_shards(
                coordinator,
                list(range(self.config.shard_count)),
                f'SELECT * FROM "{name}"',
                token=self.config.server.token.value or None,
                tls=client_tls(self.config),
                wait_s=self.config.zookeeper.session_timeout + 2.0,
            ).table

    def checkpoint(self) -> dict[int, int]:
        """Partition -> next offset, merged over the shards (a partition's checkpoint lives in
        the one shard that owns it; a push writer's, negative, in the one it pushes to)."""
        merged: dict[int, int] = {}
        with connect(self.config) as coordinator:
            for shard in range(self.config.shard_count):
                stored = coordinator.pauses.checkpoint(shard, self.pipeline.name)
                merged.update(stored.offsets.get(self.pipeline.topic, {}))
                # Push writers are numbered for the whole cluster: unique over the shards.
                merged.update(stored.offsets.get(PUSH_TOPIC, {}))
        return merged


def pipeline_of(config: Config, table: str) -> PipelineConfig:
    """The pipeline that writes `table`; OpsError naming the tables the config has."""
    for pipeline in config.pipelines:
        if pipeline.table == table:
            return pipeline
    tables = sorted(p.table for p in config.pipelines)
    raise OpsError(f"no pipeline writes table {table!r}; the config's tables: {tables}")


def cluster_view(config: Config, table: str, *, include_buffer: bool = False) -> Cluster:
    """Every shard of `config` with its ClickHouse replicas, those of nodes under replacement
    (ZooKeeper, read now) marked not to be read; with `include_buffer`, the buffers and the
    checkpoint of the pipeline writing `table`."""
    live = LeaderBuffers(config, pipeline_of(config, table)) if include_buffer else None
    with connect(config) as coordinator:
        shards = tuple(
            ShardReplicas(
                shard, shard_replicas(config, shard, partial(coordinator.writable_replicas, shard))
            )
            for shard in sorted(config.clickhouse.replicas)
        )
    return Cluster(shards, live)


def load_cluster_view(path: Path, table: str, *, include_buffer: bool = False) -> Cluster:
    """`cluster_view` of the config file at `path`."""
    return cluster_view(load_config(path), table, include_buffer=include_buffer)
