"""`hakafka init`: create the ZooKeeper layout and the ClickHouse tables, idempotently."""

from __future__ import annotations

from chlib.tables import (
    SchemaMismatchError,
    TableSpec,
    UnsafeTableError,
    check_one_table,
    ensure_table,
    quote_identifier,
    table_uuid,
)
from hakafka.config import Config
from hakafka.coordination import Coordinator
from hakafka.ops.cluster import OpsError, clickhouse_errors, connect
from hakafka.ops.shardwide import Recording, add_optional_columns, record_settings
from hakafka.settings import connection_of, pipeline_schema, shard_replicas, table_specs

DISTRIBUTED_SUFFIX = "_all"


def distributed_sql(spec: TableSpec, cluster: str) -> str:
    """The Distributed table `<table>_all` over `spec`'s table on every shard of the
    ClickHouse cluster `cluster` (a name of the servers' `remote_servers`). It has no sharding
    key: it is for queries; rows go in through hakafka, to each shard's own table."""
    table = quote_identifier(spec.table + DISTRIBUTED_SUFFIX)
    over = f"{quote_identifier(spec.database)}.{quote_identifier(spec.table)}"
    return (
        f"CREATE TABLE IF NOT EXISTS {quote_identifier(spec.database)}.{table} AS {over}"
        f" ENGINE = Distributed({quote_identifier(cluster)}, {quote_identifier(spec.database)},"
        f" {quote_identifier(spec.table)})"
    )


def initialize(
    config: Config, settings: Recording = Recording.AGREE, distributed: str | None = None
) -> list[str]:
    """Create what is missing for every shard of the cluster; return what was done.

    Every existing table is checked on every replica; OpsError lists each one refused (other
    columns, or an engine or window that would not deduplicate a re-flush) with its fix.
    With `distributed` (a ClickHouse cluster name), also a Distributed table `<table>_all`
    over each table on every replica (`distributed_sql`); a server that refuses it (e.g. it
    has no such cluster) is listed among the refusals.
    """
    done = []
    refused = []
    shards = range(config.shard_count)
    with connect(config) as coordinator:
        coordinator.init_paths(shards)
        done.append(f"zookeeper: layout for shards {list(shards)} under {config.zookeeper.root}")
        done.append(_restrict_acl(coordinator, config))
        # Tables follow the settings: nothing is created for a config the cluster refuses.
        done += record_settings(coordinator, config, settings)
    connection = connection_of(config)
    for pipeline in config.pipelines:
        specs = table_specs(config, pipeline, pipeline_schema(pipeline))
        for shard in shards:
            if shard not in config.clickhouse.replicas:
                continue
            replicas = shard_replicas(config, shard, lambda r: r)
            uuids: dict[TableSpec, dict[str, str | None]] = {spec: {} for spec in specs}
            for replica in replicas:
                where = f"clickhouse {replica.name} ({replica.host}:{replica.port})"
                with clickhouse_errors(where):
                    client = connection.client(replica.host, replica.port)
                try:
                    for spec in specs:
                        with clickhouse_errors(where):
                            done += add_optional_columns(client, spec, pipeline)
                        try:
                            with clickhouse_errors(where):
                                ensure_table(client, spec)
                                found = table_uuid(client, spec.database, spec.table)
                                uuids[spec][f"{replica.name} ({replica.host}:{replica.port})"] = (
                                    found
                                )
                        except (SchemaMismatchError, UnsafeTableError) as exc:
                            refused.append(
                                f"clickhouse {replica.name} ({replica.host}:{replica.port}): {exc}"
                            )
                            continue
                        if distributed is not None:
                            try:
                                client.command(distributed_sql(spec, distributed))
                            except Exception as exc:
                                refused.append(
                                    f"clickhouse {replica.name} ({replica.host}:{replica.port}):"
                                    f" distributed table {spec.table}{DISTRIBUTED_SUFFIX} over"
                                    f" cluster {distributed!r}: {' '.join(str(exc).split())[:400]}"
                                )
                finally:
                    client.close()
            for spec, found_on in uuids.items():
                if (apart := check_one_table(spec, found_on)) is not None:
                    refused.append(f"clickhouse shard {shard}: {apart}")
            where = ", ".join(f"{r.name} ({r.host}:{r.port})" for r in replicas)
            done.append(
                f"clickhouse: {config.clickhouse.database}.{pipeline.table} and "
                f"{pipeline.dead_letter_table} on shard {shard}: {where}"
            )
            if distributed is not None:
                done.append(
                    f"clickhouse: {pipeline.table}{DISTRIBUTED_SUFFIX} and "
                    f"{pipeline.dead_letter_table}{DISTRIBUTED_SUFFIX} (Distributed over "
                    f"cluster {distributed!r}) on shard {shard}: {where}"
                )
    if refused:
        # One server may serve several shards: each refusal once.
        raise OpsError("tables refused:\n" + "\n".join(dict.fromkeys(refused)))
    return done


def _restrict_acl(coordinator: Coordinator, config: Config) -> str:
    """With ZooKeeper auth: the root and everything under it made the auth user's only (a
    root created before auth kept its open ACL). Without: what that leaves open."""
    z = config.zookeeper
    if not z.auth_user:
        return (
            f"zookeeper: no auth_user: anyone who reaches ZooKeeper may change {z.root} "
            "(set [zookeeper] auth_user and auth_password_file, then run init again)"
        )
    changed = coordinator.restrict_acl()
    return (
        f"zookeeper: {z.root} and every znode under it: user {z.auth_user} only ({changed} changed)"
    )
