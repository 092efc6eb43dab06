"""Helper process for the worker warm-up test: a fresh SparkRuntime (no Python worker has run
yet), `warm_workers` unless told `cold`, then one task per core that reports what its Python
worker held before the task. Prints one JSON line: {"cores": N, "tasks": [{"pid", "flush_imported",
"clickhouse_imported", "frozen"}, ...]}.

Usage: python spark_warm_probe.py warm|cold
"""

from __future__ import annotations

import gc
import json
import os
import sys
from collections.abc import Iterable, Iterator

from spark_bridge.flush import warm_workers
from spark_bridge.runtime import SparkRuntime, SparkSettings


def held(_: Iterable[int]) -> Iterator[dict[str, object]]:
    """Executor side: what this worker had before the task (this function, pickled by value,
    imports nothing of its own)."""
    yield {
        "pid": os.getpid(),
        "flush_imported": "spark_bridge.flush" in sys.modules,
        "clickhouse_imported": "clickhouse_connect.driver.httpclient" in sys.modules,
        "frozen": gc.get_freeze_count() > 0,
    }


def main() -> None:
    runtime = SparkRuntime(SparkSettings(driver_memory="600m"))
    session = runtime.start()
    try:
        if sys.argv[1] == "warm":
            warm_workers(session)
        cores = session.sparkContext.defaultParallelism
        tasks = session.sparkContext.parallelize(range(cores), cores).mapPartitions(held).collect()
    finally:
        runtime.stop()
    print(json.dumps({"cores": cores, "tasks": tasks}))


if __name__ == "__main__":
    main()
