"""`hakafka init`: create the ZooKeeper layout and the ClickHouse tables, idempotently."""

from __future__ import annotations

from hakafka.config import Config
from hakafka.ops.cluster import connect
from hakafka.ops.shardwide import Recording, add_optional_columns, record_settings
from hakafka.settings import connection_of, pipeline_schema, shard_replicas, table_specs
from spark_bridge.tables import ensure_table


def initialize(config: Config, settings: Recording = Recording.AGREE) -> list[str]:
    """Create what is missing for every shard of the cluster; return what was done."""
    done = []
    shards = range(config.shard_count)
    with connect(config) as coordinator:
        coordinator.init_paths(shards)
        done.append(f"zookeeper: layout for shards {list(shards)} under {config.zookeeper.root}")
        # Tables follow the settings: nothing is created for a config the cluster refuses.
        done += record_settings(coordinator, config, settings)
    connection = connection_of(config)
    for pipeline in config.pipelines:
        specs = table_specs(config, pipeline, pipeline_schema(pipeline))
        for shard in shards:
            if shard not in config.clickhouse.replicas:
                continue
            replicas = shard_replicas(config, shard, lambda r: r)
            for replica in replicas:
                client = connection.client(replica.host, replica.port)
                try:
                    for spec in specs:
                        done += add_optional_columns(client, spec, pipeline)
                        ensure_table(client, spec)
                finally:
                    client.close()
            where = ", ".join(f"{r.name} ({r.host}:{r.port})" for r in replicas)
            done.append(
                f"clickhouse: {config.clickhouse.database}.{pipeline.table} and "
                f"{pipeline.dead_letter_table} on shard {shard}: {where}"
            )
    return done
