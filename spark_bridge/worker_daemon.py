"""The Python worker daemon of a flush's Spark (`spark.python.daemon.module`): PySpark's own
daemon, with the flush's modules imported and the heap frozen before it forks any worker.

Spark forks a Python worker from this daemon for a task when none is idle, and kills a worker
idle for a minute; a fresh worker of PySpark's daemon then imported pyarrow, Flight and
clickhouse-connect in its first task (0.5 s of CPU, 1.3-1.8 s for a 1-row first flush). A
worker forked from here shares those modules, already loaded, with its daemon. `gc.freeze`
first, so that neither the workers' collections nor their copy-on-write touch them.
"""

from __future__ import annotations

import gc

from pyspark import daemon

from spark_bridge.flush import import_task_modules


def main() -> None:
    """Load what a flush task needs (`spark_bridge.flush` and `import_task_modules`), freeze
    the heap, then serve as PySpark's daemon."""
    import_task_modules()
    # Not `flush._freeze_worker_heap`: it runs once per process, and its forked workers would
    # inherit it as done, leaving the clients of their first task unfrozen.
    gc.collect()
    gc.freeze()
    daemon.manager()


if __name__ == "__main__":
    main()
