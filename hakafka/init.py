"""`hakafka init`: create the ZooKeeper layout and the ClickHouse tables, idempotently."""

from __future__ import annotations

from hakafka.config import Config
from hakafka.daemon import pipeline_schema
from hakafka.ops.cluster import connect
from hakafka.sink import PipelineSink, shard_replicas


def initialize(config: Config) -> list[str]:
    """Create what is missing for every shard of the cluster; return what was done."""
    done = []
    shards = range(config.shard_count)
    with connect(config) as coordinator:
        coordinator.init_paths(shards)
    done.append(f"zookeeper: layout for shards {list(shards)} under {config.zookeeper.root}")
    for pipeline in config.pipelines:
        sink = PipelineSink(config, pipeline, pipeline_schema(pipeline))
        for shard in shards:
            if shard not in config.clickhouse.replicas:
                continue
            replicas = shard_replicas(config, shard, lambda r: r)
            sink.ensure_tables(replicas)
            where = ", ".join(f"{r.name} ({r.host}:{r.port})" for r in replicas)
            done.append(
                f"clickhouse: {config.clickhouse.database}.{pipeline.table} and "
                f"{pipeline.dead_letter_table} on shard {shard}: {where}"
            )
    return done
