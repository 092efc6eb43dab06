"""The ZooKeeper layout: the one place that knows every znode path under the root.

Paths are relative to the chroot (the configured root), so they all start at `/`.
"""

from __future__ import annotations

import re

NODES = "/nodes"
REPLACING = "/replacing"
SHARDS = "/shards"
SETTINGS = "/settings"  # the shard-wide settings every node must share
RESHARD = "/reshard"  # a reshard in progress: leaders drain and hold
CANDIDATE_PREFIX = "n_"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


def check_name(kind: str, name: str) -> str:
    """Return `name` if it is usable as one znode name, else raise ValueError naming `kind`."""
    if not _NAME.match(name):
        raise ValueError(
            f"invalid {kind} name {name!r}: use 1-128 characters of letters, digits, '_', '.', '-'"
            " starting with a letter or digit"
        )
    return name


def child(parent: str, name: str) -> str:
    """The path of `name`, a child of `parent` as ZooKeeper listed it (so not checked again)."""
    return f"{parent.rstrip('/')}/{name}"


def node(node_id: str) -> str:
    return f"{NODES}/{check_name('node', node_id)}"


def replacing(node_id: str) -> str:
    return f"{REPLACING}/{check_name('node', node_id)}"


def shard(shard_id: int) -> str:
    if shard_id < 0:
        raise ValueError(f"invalid shard {shard_id}: shards are numbered from 0")
    return f"{SHARDS}/{shard_id}"


def election(shard_id: int) -> str:
    return f"{shard(shard_id)}/election"


def candidate_prefix(shard_id: int) -> str:
    return f"{election(shard_id)}/{CANDIDATE_PREFIX}"


def candidate(shard_id: int, name: str) -> str:
    """One candidate of `shard_id`'s election, by the name ZooKeeper gave it (`n_0000000007`)."""
    return child(election(shard_id), name)


def candidate_sequence(name: str) -> int:
    """The sequence number of candidate znode `name` (e.g. `n_0000000007` -> 7)."""
    return int(name.rsplit("_", 1)[1])


def leader(shard_id: int) -> str:
    return f"{shard(shard_id)}/leader"


def epoch(shard_id: int) -> str:
    return f"{shard(shard_id)}/epoch"


def failover(shard_id: int) -> str:
    return f"{shard(shard_id)}/failover"


def pin(shard_id: int) -> str:
    """Where `hakafka failover --hold` keeps a shard on a node: the balancer leaves it."""
    return f"{shard(shard_id)}/pin"


def pipelines(shard_id: int) -> str:
    """The parent of a shard's pipelines."""
    return f"{shard(shard_id)}/pipelines"


def pipeline(shard_id: int, name: str) -> str:
    return f"{pipelines(shard_id)}/{check_name('pipeline', name)}"


def checkpoint(shard_id: int, name: str) -> str:
    return f"{pipeline(shard_id, name)}/checkpoint"


def pending(shard_id: int, name: str) -> str:
    return f"{pipeline(shard_id, name)}/pending"


WRITERS = "/writers"  # push writers, per pipeline, for every shard


def writers(name: str) -> str:
    """The parent of the pipeline's push writers: `<writer>@<shard>@<sequence>` children,
    whose ZooKeeper sequence numbers the writer (`coordination/writers.py`)."""
    return f"{WRITERS}/{check_name('pipeline', name)}"


def paused_pipelines(shard_id: int) -> str:
    """The parent of a shard's pause flags."""
    return f"{shard(shard_id)}/paused"


def paused(shard_id: int, name: str) -> str:
    return f"{paused_pipelines(shard_id)}/{check_name('pipeline', name)}"


def drained(shard_id: int) -> str:
    """A shard's report that its leader drained for the reshard in progress."""
    shard(shard_id)  # validates the number
    return f"{RESHARD}/{shard_id}"


def shard_layout(shard_id: int) -> list[str]:
    """The persistent znodes of one shard, parents first (for idempotent creation)."""
    return [
        shard(shard_id),
        election(shard_id),
        pipelines(shard_id),
        paused_pipelines(shard_id),
    ]
