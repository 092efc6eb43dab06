"""Shard-wide settings: what every node of a cluster must share, and how a config differs.

A re-flush must write the same rows in the same tasks as the attempt it repeats (invariant 6),
and a shard's partitions, checkpoints and ClickHouse tables must mean the same on every
node. So these settings are recorded once in ZooKeeper (`/settings`, a `ClusterSettings`), by
`hakafka init` or by the first daemon to start, and a node whose config differs stands for
election in no shard:

- `shard_count`, the ClickHouse `engine`;
- per pipeline: `topic`, `table`, `columns`, `meta_columns`, `format`, `on_error`,
  `max_message_bytes`, `transform` and the explicit `partitions` lists;
- the ClickHouse endpoints per shard, as the union of what every node's config names: for a
  MergeTree shard (deduplication log per server) every node names the same endpoints, and
  each leader checks that they reach one server (`chlib.tables.check_one_table`).

Everything else may differ per node (`spark.rows_per_task`, buffer thresholds and limits,
WAL options, ports, paths, credentials, timeouts, log options).

`compare` names each difference by its config key with both values and says whether it is
compatible (safe to record with `hakafka init --update` while blocks may be in doubt: a
pipeline added or removed, a column added that is not required, columns reordered outside
CSV) or not, with the migration steps for the latter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from chlib.tables import Engine
from hakafka.config import Config, PipelineConfig
from hakafka.consumer import ColumnSpec, Format
from hakafka.coordination import (
    ClusterSettings,
    CoordinationError,
    PipelineSettings,
    SettingsStore,
    paths,
)

AGREE_ATTEMPTS = 5
ABSENT = "(none)"

# How an incompatible change gets recorded: by hand, with the cluster stopped and drained.
RECORD_STEPS = (
    "stop hakafka on every node; check that `hakafka status` shows no pending block (else "
    "start one node with the recorded config until it is flushed); {change}; then record the "
    "new settings with `hakafka init --replace --config NEW` (refused while a daemon runs or a "
    "block is pending) and start the nodes with the new config"
)


@dataclass(frozen=True)
class Difference:
    """One shard-wide setting that differs: `key` as in the config file, the `recorded` and
    the `configured` value (JSON text, `(none)` when absent), and, for an incompatible one,
    the `migration` steps."""

    key: str
    recorded: str
    configured: str
    compatible: bool
    migration: str = ""

    def __str__(self) -> str:
        kind = "compatible" if self.compatible else f"incompatible; to migrate: {self.migration}"
        return f"{self.key}: recorded {self.recorded}, this config {self.configured} ({kind})"


@dataclass(frozen=True)
class Agreement:
    """What `agree` found: the record did not exist and these settings are it now
    (`created`), or the `differences` between the record and the config, and whether the
    record was left as it was because of them (`refused`)."""

    created: bool
    differences: tuple[Difference, ...]
    refused: bool


def cluster_settings(config: Config) -> ClusterSettings:
    """The shard-wide settings of `config`, endpoints being those this config names."""
    return ClusterSettings(
        shard_count=config.shard_count,
        engine=config.clickhouse.engine.value,
        endpoints={
            shard: tuple(sorted({str(ep) for ep in nodes.values()}))
            for shard, nodes in sorted(config.clickhouse.replicas.items())
        },
        pipelines={p.name: _pipeline_settings(p) for p in config.pipelines},
    )


def _pipeline_settings(p: PipelineConfig) -> PipelineSettings:
    return PipelineSettings(
        topic=p.topic,
        table=p.table,
        columns=tuple((c.name, c.clickhouse_type) for c in p.columns),
        meta_columns=p.meta_columns,
        format=p.format.value,
        on_error=p.on_error.value,
        max_message_bytes=p.max_message_bytes,
        transform=p.transform,
        partitions={shard: tuple(parts) for shard, parts in sorted(p.partitions.items())},
    )


def _text(value: object) -> str:
    return ABSENT if value is None else json.dumps(value)


def _incompatible(key: str, recorded: object, configured: object, change: str) -> Difference:
    return Difference(
        key, _text(recorded), _text(configured), False, RECORD_STEPS.format(change=change)
    )


def compare(recorded: ClusterSettings, wanted: ClusterSettings) -> list[Difference]:
    """Every difference of `wanted` (a node's settings) from `recorded`, in config order."""
    found = []
    if recorded.shard_count != wanted.shard_count:
        found.append(
            _incompatible(
                "shard_count",
                recorded.shard_count,
                wanted.shard_count,
                "run hakafka reshard with this config (it moves each partition's checkpoint "
                "to its new shard while the cluster runs)",
            )
        )
    if recorded.engine != wanted.engine:
        found.append(
            _incompatible(
                "clickhouse.engine",
                recorded.engine,
                wanted.engine,
                "create the tables again with the new engine and move the rows into them",
            )
        )
    elif recorded.engine == Engine.MERGE_TREE:
        # Each leader checks that the endpoints it names reach one table (by UUID); that
        # covers the shard only if every node names the same endpoints.
        for shard in sorted({*recorded.endpoints, *wanted.endpoints}):
            was, now = recorded.endpoints.get(shard, ()), wanted.endpoints.get(shard, ())
            if was and now and set(was) != set(now):
                found.append(
                    Difference(
                        f"clickhouse.replicas.{shard}",
                        _text(list(was)),
                        _text(list(now)),
                        False,
                        "MergeTree keeps its deduplication log per server, so every node "
                        f"must name the same endpoints of one ClickHouse server for shard "
                        f"{shard}; to move the shard to another server: "
                        + RECORD_STEPS.format(change="move its tables to that server"),
                    )
                )
    for name in sorted(set(recorded.pipelines) | set(wanted.pipelines)):
        before, after = recorded.pipelines.get(name), wanted.pipelines.get(name)
        if before is None or after is None:
            shown = [
                _text(None if p is None else f"{p.topic} -> {p.table}") for p in (before, after)
            ]
            found.append(Difference(f'pipeline "{name}"', shown[0], shown[1], True))
        else:
            found += _compare_pipeline(name, before, after)
    return found


def _compare_pipeline(
    name: str, before: PipelineSettings, after: PipelineSettings
) -> list[Difference]:
    key = f'pipeline "{name}": '
    found = []
    for field, change in (
        ("topic", "a pending block holds offsets of the recorded topic"),
        ("table", "move the rows to the new table"),
        ("format", "a re-fetched pending block must decode as it did"),
        ("on_error", "a re-fetched pending block must split rows and dead letters as it did"),
        ("max_message_bytes", "a re-fetched pending block must decode as it did"),
        ("transform", "a re-flushed pending block must be transformed as it was"),
    ):
        was, now = getattr(before, field), getattr(after, field)
        if was != now:
            found.append(_incompatible(key + field, was, now, change))
    if before.meta_columns != after.meta_columns:
        found.append(
            _incompatible(
                key + "meta_columns",
                list(before.meta_columns),
                list(after.meta_columns),
                f"ALTER TABLE {after.table} ADD or DROP the meta columns on every server",
            )
        )
    found += _compare_columns(key, after.table, after.format, before.columns, after.columns)
    for shard in sorted(set(before.partitions) | set(after.partitions)):
        was_parts, now_parts = before.partitions.get(shard), after.partitions.get(shard)
        if was_parts != now_parts:
            found.append(
                _incompatible(
                    f"{key}partitions.{shard}",
                    None if was_parts is None else list(was_parts),
                    None if now_parts is None else list(now_parts),
                    "run hakafka reshard with this config (it moves each partition's "
                    "checkpoint to its new shard while the cluster runs)",
                )
            )
    return found


def _compare_columns(
    key: str,
    table: str,
    format: str,
    before: tuple[tuple[str, str], ...],
    after: tuple[tuple[str, str], ...],
) -> list[Difference]:
    was, now = dict(before), dict(after)
    found = []
    for column, ch_type in before:
        if column not in now:
            found.append(
                _incompatible(
                    f"{key}columns.{column}",
                    ch_type,
                    None,
                    f"ALTER TABLE {table} DROP COLUMN {column} on every server",
                )
            )
        elif now[column] != ch_type:
            found.append(
                _incompatible(
                    f"{key}columns.{column}",
                    ch_type,
                    now[column],
                    f"ALTER TABLE {table} MODIFY COLUMN {column} {now[column]} on every server",
                )
            )
    for column, ch_type in after:
        if column in was:
            continue
        if ColumnSpec(column, ch_type).is_required:
            found.append(
                _incompatible(
                    f"{key}columns.{column}",
                    None,
                    ch_type,
                    f"declare it Nullable({ch_type}) to add it compatibly, or ALTER TABLE "
                    f"{table} ADD COLUMN {column} {ch_type} on every server",
                )
            )
        else:
            found.append(Difference(f"{key}columns.{column}", ABSENT, _text(ch_type), True))
    kept_before = [c for c, _ in before if c in now]
    kept_after = [c for c, _ in after if c in was]
    if kept_before != kept_after:
        reordered = Difference(f"{key}columns", _text(kept_before), _text(kept_after), True)
        if format == Format.CSV:
            reordered = _incompatible(
                f"{key}columns", kept_before, kept_after, "CSV fields are read by position"
            )
        found.append(reordered)
    return found


def agree(store: SettingsStore, config: Config, *, accept_compatible: bool = False) -> Agreement:
    """Agree with the recorded settings: record `config`'s if nothing is recorded (atomic: of
    two nodes racing, one records and the other compares); otherwise compare, and when they
    agree add this config's ClickHouse endpoints to the record. With `accept_compatible`
    (`hakafka init --update`) compatible differences are recorded too; any other difference
    leaves the record as it was (`refused`)."""
    wanted = cluster_settings(config)
    for _ in range(AGREE_ATTEMPTS):
        found = store.read()
        if found is None:
            if store.create(wanted):
                return Agreement(created=True, differences=(), refused=False)
            continue  # another node recorded first: compare with theirs
        recorded, version = found
        differences = tuple(compare(recorded, wanted))
        if differences and not (accept_compatible and all(d.compatible for d in differences)):
            return Agreement(created=False, differences=differences, refused=True)
        source = wanted if differences else recorded
        merged = source.with_endpoints(recorded.endpoints).with_endpoints(wanted.endpoints)
        if merged == recorded or store.replace(merged, version):
            return Agreement(created=False, differences=differences, refused=False)
    raise CoordinationError(
        f"{paths.SETTINGS} changed {AGREE_ATTEMPTS} times while this node compared its "
        "settings with it; try again"
    )
