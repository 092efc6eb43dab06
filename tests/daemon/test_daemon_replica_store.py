"""The copies of pushed batches a node keeps for the shard's leader: whole or not there,
refused from a leader older than the one that gathered them, trimmed once checkpointed, and
sent back in frames whose damage names its byte."""

from __future__ import annotations

from pathlib import Path

import pytest

from hakafka.daemon.push_replicas import ReplicaRoutes
from hakafka.daemon.replica_store import (
    ReplicaStore,
    StaleEpochError,
    StoredBatch,
    decode_batches,
    encode_batches,
)


def batch(partition: int, sequence: int, rows: int = 3) -> StoredBatch:
    return StoredBatch(partition, sequence, rows, f"{partition}/{sequence}".encode())


def test_copies_are_kept_gathered_and_trimmed_per_writer(tmp_path: Path) -> None:
    store = ReplicaStore(tmp_path)
    store.store("events", 0, 5, batch(-1, 1), trim=-1)
    store.store("events", 0, 5, batch(-1, 2), trim=-1)
    store.store("events", 0, 5, batch(-2, 0), trim=-1)
    store.store("events", 1, 5, batch(-1, 9), trim=-1)  # another shard: apart
    # A temporary file left by a crash mid-write is not a copy.
    (tmp_path / "events" / "0" / ".-1_3_3.arrows.tmp").write_bytes(b"torn")
    gathered = store.gather("events", 0, 5)
    assert [(b.partition, b.sequence, b.body) for b in gathered] == [
        (-2, 0, b"-2/0"),
        (-1, 1, b"-1/1"),
        (-1, 2, b"-1/2"),
    ]
    # Writer -1's checkpoint passed its batch 1 (sequence 1 ends at 2**20 + 3).
    store.store("events", 0, 5, batch(-1, 3), trim=(1 << 20) + 3)
    assert [(b.partition, b.sequence) for b in store.gather("events", 0, 5)] == [
        (-2, 0),
        (-1, 2),
        (-1, 3),
    ]


def test_after_a_new_leader_gathered_an_older_ones_copies_are_refused(tmp_path: Path) -> None:
    store = ReplicaStore(tmp_path)
    store.store("events", 0, 5, batch(-1, 1), trim=-1)
    store.gather("events", 0, 6)  # the term of epoch 6 gathered them
    with pytest.raises(StaleEpochError, match="a copy from epoch 5, but a leader of epoch 6"):
        store.store("events", 0, 5, batch(-1, 2), trim=-1)
    store.store("events", 0, 6, batch(-1, 2), trim=-1)
    # Survives a restart of the node: the fence is on disk.
    with pytest.raises(StaleEpochError):
        ReplicaStore(tmp_path).store("events", 0, 5, batch(-1, 3), trim=-1)


def test_frames_round_trip_and_a_torn_one_names_its_byte() -> None:
    batches = [batch(-1, 1), batch(-3, 7, rows=10)]
    raw = encode_batches(batches)
    assert decode_batches(raw) == batches
    assert decode_batches(b"") == []
    first = len(encode_batches(batches[:1]))
    with pytest.raises(ValueError, match=f"a frame at byte {first} runs past the end"):
        decode_batches(raw[:-2])


def test_the_routes_refuse_copies_for_a_led_shard_or_from_an_older_leader(tmp_path: Path) -> None:
    store = ReplicaStore(tmp_path)
    leading: set[int] = set()
    routes = ReplicaRoutes(store, leads=lambda s: s in leading, leader_epoch=lambda s: 7)
    params = {"pipeline": "events", "shard": "0", "partition": "-1", "sequence": "4",
              "rows": "3", "trim": "-1"}  # fmt: skip
    assert routes.push({**params, "epoch": "7"}, "", b"rows").status == 200
    stale = routes.push({**params, "epoch": "6", "sequence": "5"}, "", b"rows")
    assert stale.status == 409 and b"shard 0's leader has epoch 7" in stale.body
    leading.add(0)
    led = routes.push({**params, "epoch": "7", "sequence": "6"}, "", b"rows")
    assert led.status == 409 and b"this node leads shard 0" in led.body
    assert routes.push({**params, "epoch": "x"}, "", b"").status == 400
    fetched = routes.fetch({"pipeline": "events", "shard": "0", "epoch": "8"}, "", b"")
    assert [(b.partition, b.sequence) for b in decode_batches(fetched.body)] == [(-1, 4)]
