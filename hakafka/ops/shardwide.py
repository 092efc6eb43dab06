"""The recorded shard-wide settings (`/settings`, see `hakafka/drift.py`) for the operator
commands: `hakafka init` records them (or refuses a config that differs), `init --update`
records compatible changes, `init --replace` any change while the cluster is stopped and
drained, and `hakafka config check --cluster` shows the differences before a deploy."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

from chlib.tables import TableSpec, quote_identifier, table_columns
from hakafka.config import Config, PipelineConfig
from hakafka.coordination import Coordinator, paths
from hakafka.drift import Difference, agree, cluster_settings, compare
from hakafka.ops.cluster import OpsError
from hakafka.settings import pipeline_schema

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client


class Recording(StrEnum):
    """How `hakafka init` treats a config whose shard-wide settings differ from the record."""

    AGREE = "agree"  # refuse any difference (plain `init`)
    UPDATE = "update"  # record compatible differences, refuse the rest (`--update`)
    REPLACE = "replace"  # record whatever differs, only while no daemon runs (`--replace`)


def _settings_znode(config: Config) -> str:
    """The znode that records the shard-wide settings, as an operator finds it (with the root)."""
    return f"{config.zookeeper.root}{paths.SETTINGS}"


def _listed(differences: tuple[Difference, ...] | list[Difference]) -> str:
    return "\n".join(f"  - {d}" for d in differences)


def record_settings(coordinator: Coordinator, config: Config, how: Recording) -> list[str]:
    """Record `config`'s shard-wide settings as `how` allows; what was done, line by line.
    OpsError names every difference refused, with the migration steps."""
    where = _settings_znode(config)
    if how is Recording.REPLACE:
        return _replace(coordinator, config, where)
    agreement = agree(coordinator.settings, config, accept_compatible=how is Recording.UPDATE)
    if agreement.refused:
        compatible = all(d.compatible for d in agreement.differences)
        hint = (
            "every difference is compatible: record them with `hakafka init --update`"
            if compatible
            else "incompatible differences are never recorded by --update"
        )
        raise OpsError(
            f"this config's shard-wide settings differ from those recorded in {where} "
            f"({hint}):\n{_listed(agreement.differences)}"
        )
    if agreement.created:
        return [f"zookeeper: shard-wide settings recorded in {where} (nothing was recorded)"]
    done = [f"zookeeper: shard-wide settings agree with {where}"]
    done += [f"zookeeper: recorded in {where}: {d}" for d in agreement.differences]
    return done


def _replace(coordinator: Coordinator, config: Config, where: str) -> list[str]:
    running = sorted(coordinator.nodes())
    if running:
        raise OpsError(
            f"--replace refused: hakafka runs on {', '.join(running)}; stop it on every node "
            "first (a running node would go on with the settings it started with)"
        )
    wanted = cluster_settings(config)
    found = coordinator.settings.read()
    if found is None:
        coordinator.settings.create(wanted)
        return [f"zookeeper: shard-wide settings recorded in {where} (nothing was recorded)"]
    recorded, version = found
    pending = [
        f"shard {shard} pipeline {name}"
        for shard in range(recorded.shard_count)
        for name in recorded.pipelines
        if coordinator.pending_intent(shard, name) is not None
    ]
    if pending:
        raise OpsError(
            f"--replace refused: a block is pending in {', '.join(pending)}; start one node "
            "with the recorded config until `hakafka status` shows it flushed, then stop it"
        )
    differences = compare(recorded, wanted)
    if not coordinator.settings.replace(wanted, version):
        raise OpsError(f"--replace: {where} changed while it was compared; run it again")
    done = [f"zookeeper: shard-wide settings agree with {where}"]
    done += [f"zookeeper: replaced in {where}: {d}" for d in differences]
    return done


def cluster_check(coordinator: Coordinator, config: Config) -> tuple[list[str], bool]:
    """Compare `config` with the recorded settings without writing anything: the lines to
    print, and True when nothing differs (or nothing is recorded yet)."""
    where = _settings_znode(config)
    found = coordinator.settings.read()
    if found is None:
        return [f"{where}: nothing recorded yet (`hakafka init` or the first node records)"], True
    differences = compare(found[0], cluster_settings(config))
    if not differences:
        return [f"{where}: this config's shard-wide settings agree with the record"], True
    lines = [f"{where}: {len(differences)} shard-wide settings differ from the record:"]
    return lines + [f"  - {d}" for d in differences], False


def add_optional_columns(client: Client, spec: TableSpec, pipeline: PipelineConfig) -> list[str]:
    """Add to the existing table of `spec` each declared column it lacks that is not required
    (a compatible change recorded by `init --update`), after the declared column before it.
    Returns what was added; a missing table is left to `ensure_table`."""
    actual = table_columns(client, spec.database, spec.table)
    if actual is None:
        return []
    have = {name for name, _ in actual}
    added, previous = [], None
    for column in pipeline_schema(pipeline).columns:
        if column.name not in have and column.name in dict(spec.columns):
            if column.is_required:
                continue  # compare_columns reports it: adding it is not compatible
            after = f" AFTER {quote_identifier(previous)}" if previous else " FIRST"
            client.command(
                f"ALTER TABLE {spec.qualified_name} ADD COLUMN IF NOT EXISTS "
                f"{quote_identifier(column.name)} {column.clickhouse_type}{after}"
            )
            added.append(f"clickhouse: added column {column.name} to {spec.qualified_name}")
        previous = column.name
    return added
