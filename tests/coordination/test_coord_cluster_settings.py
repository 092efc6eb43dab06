"""The shard-wide settings record (`/settings`) and how a config is compared with it: unit
tests, with an in-memory stand-in for the ZooKeeper store (tests/ops and tests/daemon use
the real one)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from hakafka.config import Config
from hakafka.coordination import ClusterSettings, SettingsStore, paths
from hakafka.coordination.errors import CorruptZnodeError
from hakafka.drift import agree, cluster_settings, compare
from tests.helpers.configs import SETTINGS_BASE, config, edited


def differ(recorded: Config, other: Config) -> list[tuple[str, str, str, bool]]:
    return [
        (d.key, d.recorded, d.configured, d.compatible)
        for d in compare(cluster_settings(recorded), cluster_settings(other))
    ]


def test_the_record_round_trips_through_its_json() -> None:
    settings = cluster_settings(
        config({'name = "orders"': 'name = "orders"\npartitions = {0 = [0, 2], 1 = [1]}'})
    )
    raw = settings.encode()
    assert ClusterSettings.decode(paths.SETTINGS, raw) == settings
    value = json.loads(raw)
    assert value["endpoints"] == {"0": ["10.0.0.1:8123"], "1": ["10.0.0.2:8123"]}
    assert value["pipelines"]["orders"]["columns"] == [["id", "Int64"], ["amount", "Float64"]]
    assert value["pipelines"]["orders"]["partitions"] == {"0": [0, 2], "1": [1]}


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda v: v.pop("engine"), "znode /settings: missing field 'engine'"),
        (lambda v: v.update(shard_count="2"), "field 'shard_count' has the wrong type"),
        (
            lambda v: v["pipelines"]["orders"].update(columns=[["id"]]),
            "pipeline 'orders': 'columns' must be [name, type] pairs",
        ),
        (
            lambda v: v["pipelines"]["orders"].update(partitions={"x": [1]}),
            "pipeline 'orders': 'partitions' must map shards to partitions",
        ),
        (lambda v: v.update(endpoints={"0": "h:1"}), "'endpoints' must map shards"),
    ],
)
def test_a_damaged_record_is_refused_naming_what_is_wrong(damage: Any, message: str) -> None:
    value = json.loads(cluster_settings(config()).encode())
    damage(value)
    with pytest.raises(CorruptZnodeError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ClusterSettings.decode(paths.SETTINGS, json.dumps(value).encode())


def test_settings_that_may_differ_per_node_are_not_compared() -> None:
    other = config(
        {
            'node = "n1"': 'node = "n2"',
            "shards = [0, 1]": "shards = [1]",
            "rows_per_task = 1000": "rows_per_task = 7",
            "max_age = 50": "max_age = 90",
        }
    )
    assert differ(config(), other) == []


def test_each_shard_wide_difference_names_its_key_and_both_values() -> None:
    other = config(
        {
            'on_error = "dead_letter"': 'on_error = "skip"\ntransform = "SELECT * FROM block"',
            "shard_count = 2": "shard_count = 3",
            'topic = "orders"': 'topic = "orders2"',
        }
    )
    assert differ(config(), other) == [
        ("shard_count", "2", "3", False),
        ('pipeline "orders": topic', '"orders"', '"orders2"', False),
        ('pipeline "orders": on_error', '"dead_letter"', '"skip"', False),
        ('pipeline "orders": transform', '""', '"SELECT * FROM block"', False),
    ]
    (on_error,) = [d for d in compare(cluster_settings(config()), cluster_settings(other))][2:3]
    assert "hakafka init --replace" in on_error.migration
    assert str(on_error).startswith(
        'pipeline "orders": on_error: recorded "dead_letter", this config "skip" (incompatible; '
        "to migrate: stop hakafka on every node"
    )


def test_column_changes_are_classified() -> None:
    other = config(
        {
            'amount = "Float64"': 'amount = "Float32"\nnote = "Nullable(String)"\nqty = "Int32"',
            'id = "Int64"\n': "",
        }
    )
    found = compare(cluster_settings(config()), cluster_settings(other))
    assert [(d.key, d.recorded, d.configured, d.compatible) for d in found] == [
        ('pipeline "orders": columns.id', '"Int64"', "(none)", False),
        ('pipeline "orders": columns.amount', '"Float64"', '"Float32"', False),
        ('pipeline "orders": columns.note', "(none)", '"Nullable(String)"', True),
        ('pipeline "orders": columns.qty', "(none)", '"Int32"', False),
    ]
    removed, retyped, _, required = found
    assert "ALTER TABLE orders DROP COLUMN id" in removed.migration
    assert "ALTER TABLE orders MODIFY COLUMN amount Float32" in retyped.migration
    assert "declare it Nullable(Int32) to add it compatibly" in required.migration


def test_reordered_columns_matter_only_to_csv() -> None:
    swapped = {'id = "Int64"\namount = "Float64"': 'amount = "Float64"\nid = "Int64"'}
    assert differ(config(), config(swapped)) == [
        ('pipeline "orders": columns', '["id", "amount"]', '["amount", "id"]', True)
    ]
    csv = {'on_error = "dead_letter"': 'on_error = "dead_letter"\nformat = "csv"'}
    assert differ(config(csv), config(csv, edited(SETTINGS_BASE, swapped))) == [
        ('pipeline "orders": columns', '["id", "amount"]', '["amount", "id"]', False)
    ]


def test_pipelines_added_or_removed_are_compatible() -> None:
    second = SETTINGS_BASE + '\n[[pipelines]]\nname = "refunds"\ntopic = "r"\ntable = "refunds"\n'
    second += '[pipelines.columns]\nid = "Int64"\n'
    assert differ(config(), config(text=second)) == [
        ('pipeline "refunds"', "(none)", '"r -> refunds"', True)
    ]
    assert differ(config(text=second), config()) == [
        ('pipeline "refunds"', '"r -> refunds"', "(none)", True)
    ]


def test_mergetree_with_two_servers_for_one_shard_across_nodes_is_refused() -> None:
    # Each config alone names one server per shard (the loader accepts it); together two.
    other = config({'n1 = "10.0.0.1:8123"': 'n2 = "10.0.0.9:8123"'})
    (found,) = compare(cluster_settings(config()), cluster_settings(other))
    assert (found.key, found.recorded, found.configured, found.compatible) == (
        "clickhouse.replicas.0",
        '["10.0.0.1:8123"]',
        '["10.0.0.9:8123"]',
        False,
    )
    assert "MergeTree keeps its deduplication log per server" in found.migration
    replicated = {'engine = "MergeTree"': 'engine = "ReplicatedMergeTree"'}
    assert (
        differ(
            config(replicated),
            config({**replicated, 'n1 = "10.0.0.1:8123"': 'n2 = "10.0.0.9:8123"'}),
        )
        == []
    )


@dataclass
class MemoryStore:
    """`SettingsStore` in memory; `rival` is recorded by "another node" just before this
    node's first create or replace, as if it won a race."""

    record: ClusterSettings | None = None
    version: int = 0
    rival: ClusterSettings | None = None
    writes: list[str] = field(default_factory=list)

    def read(self) -> tuple[ClusterSettings, int] | None:
        return None if self.record is None else (self.record, self.version)

    def _race(self) -> bool:
        if self.rival is None:
            return False
        self.record, self.rival = self.rival, None
        self.version += 1
        return True

    def create(self, settings: ClusterSettings) -> bool:
        if self._race() or self.record is not None:
            return False
        self.record = settings
        self.writes.append("create")
        return True

    def replace(self, settings: ClusterSettings, version: int) -> bool:
        if self._race() or version != self.version:
            return False
        self.record, self.version = settings, self.version + 1
        self.writes.append("replace")
        return True


def store(memory: MemoryStore) -> SettingsStore:
    return cast(SettingsStore, memory)


def test_the_first_node_records_and_a_racing_one_compares_with_its_record() -> None:
    memory = MemoryStore()
    assert agree(store(memory), config()).created
    assert memory.record == cluster_settings(config())
    skip = config({'on_error = "dead_letter"': 'on_error = "skip"'})
    racing = MemoryStore(rival=cluster_settings(config()))
    agreement = agree(store(racing), skip)
    assert agreement.refused and not agreement.created
    assert [d.key for d in agreement.differences] == ['pipeline "orders": on_error']
    assert racing.record == cluster_settings(config()) and racing.writes == []


def test_agreeing_nodes_add_their_endpoints_version_checked() -> None:
    replicated = {'engine = "MergeTree"': 'engine = "ReplicatedMergeTree"'}
    first = config(replicated)
    second = config({**replicated, 'n1 = "10.0.0.1:8123"': 'n2 = "10.0.0.9:8123"'})
    # Another node adds its own endpoint between this node's read and its write: the write
    # is refused by version, read again, and the union of all three is recorded.
    third = cluster_settings(first).with_endpoints({1: ("10.0.0.3:8123",)})
    memory = MemoryStore(record=cluster_settings(first))
    memory.rival = third
    agreement = agree(store(memory), second)
    assert not agreement.refused and agreement.differences == ()
    assert memory.record is not None
    assert memory.record.endpoints == {
        0: ("10.0.0.1:8123", "10.0.0.9:8123"),
        1: ("10.0.0.2:8123", "10.0.0.3:8123"),
    }
    assert memory.writes == ["replace"]


def test_update_records_only_compatible_differences() -> None:
    nullable = {'amount = "Float64"': 'amount = "Float64"\nnote = "Nullable(String)"'}
    memory = MemoryStore(record=cluster_settings(config()))
    refused = agree(store(memory), config(nullable))
    assert refused.refused and memory.writes == []
    accepted = agree(store(memory), config(nullable), accept_compatible=True)
    assert not accepted.refused and [d.key for d in accepted.differences] == [
        'pipeline "orders": columns.note'
    ]
    assert memory.record == cluster_settings(config(nullable))
    retyped = {'amount = "Float64"': 'amount = "Float32"\nnote = "Nullable(String)"'}
    before = memory.record
    assert agree(store(memory), config(retyped), accept_compatible=True).refused
    assert memory.record == before
