"""`hakafka wal inspect|verify`: this node's WAL directories, as the wal library reports them."""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from hakafka.config import Config
from hakafka.ops.cluster import UsageError
from hakafka.settings import wal_dir
from wal import cli as wal_cli


def wal_dirs(config: Config, pipeline: str | None) -> list[tuple[int, str, Path]]:
    """(shard, pipeline, directory) of every WAL this node keeps, optionally one pipeline's."""
    names = [p.name for p in config.pipelines]
    if pipeline is not None and pipeline not in names:
        raise UsageError(f"--pipeline {pipeline}: the config has pipelines {', '.join(names)}")
    return [
        (shard, name, wal_dir(config, shard, name))
        for shard in config.shards
        for name in names
        if pipeline in (None, name)
    ]


def check(config: Config, action: str, pipeline: str | None, out: TextIO) -> int:
    """Run `inspect` or `verify` over each WAL directory; 1 if any log is damaged, else 0.
    A missing directory means the node never led that shard: reported, not an error."""
    code = 0
    for shard, name, directory in wal_dirs(config, pipeline):
        print(f"== shard {shard}, pipeline {name}: {directory}", file=out)
        if not directory.is_dir():
            print("no WAL here (this node has not led the shard)", file=out)
            continue
        run = wal_cli.inspect if action == "inspect" else wal_cli.verify
        code = max(code, run(directory, out))
    return code
