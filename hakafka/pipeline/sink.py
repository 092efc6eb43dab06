"""Where a pipeline's blocks go: its two ClickHouse tables, the shard's replicas, the flush.

`PipelineSink` flushes a `PlannedBlock` through Spark: first its rows into `<table>`, then
its dead letters into `<table>_dead_letter`, each task with the deduplication token
`<pipeline>:<task key>` (the key names the task's offsets, see `blockplan`), so a re-flush of
the same tasks (by this node or the next leader) adds nothing twice.

A new term needs one reachable replica, not all: in production each node runs its own
ClickHouse replica, so the node failure that causes an election usually takes one replica
down with it. `ensure_tables` creates the tables on the replicas that answer (a health ping
first, so a dead one costs at most a second) and fails only when none does; a replica that
did not answer gets its tables before anything is written to it (`flush` checks again,
at most every `RECHECK_S`), and until then writes go to the replicas that have them.

With a non-replicated engine the shard's endpoints must all reach one server (one table, one
deduplication log): each replica that gets its tables shows their UUIDs, and a replica whose
tables differ from another's is refused (`UnsafeTableError`) before anything is written to it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import structlog
from clickhouse_connect.driver.client import Client
from pyspark.sql import SparkSession

from chlib.replicas import Replica
from chlib.tables import (
    SchemaMismatchError,
    TableSpec,
    UnsafeTableError,
    check_one_table,
    ensure_table,
    table_uuid,
)
from hakafka.config import Config, PipelineConfig
from hakafka.consumer import PipelineSchema
from hakafka.pipeline.blockplan import PlannedBlock
from hakafka.pipeline.parts import Flushed
from hakafka.settings import connection_of, handoff_options, table_specs
from spark_bridge.flush import FlushTarget, flush

log = structlog.get_logger("hakafka.pipeline")

PING_TIMEOUT_S = 1.0
RECHECK_S = 10.0  # how often a replica without its tables is tried again


class TablesUnreachableError(RuntimeError):
    """No writable replica of the shard could be given its tables; the text names each
    replica and why."""


class PipelineSink:
    """Flushes the blocks of one pipeline of one shard through the node's Spark session."""

    def __init__(
        self,
        config: Config,
        pipeline: PipelineConfig,
        schema: PipelineSchema,
        spark: Callable[[], SparkSession],
        recheck_s: float = RECHECK_S,
    ) -> None:
        """`recheck_s`: how long a replica that did not get its tables is left alone."""
        self._pipeline = pipeline
        self._recheck_s = recheck_s
        self._spark = spark
        self.rows_spec, self.dead_spec = table_specs(config, pipeline, schema)
        self.connection = connection_of(config)
        self.handoff = handoff_options(config)
        # Replicas (host, port) that have the tables this term, and when to try the others.
        self._lock = threading.Lock()
        self._ready: set[tuple[str, int]] = set()
        self._retry_at: dict[tuple[str, int], float] = {}
        # The tables' UUIDs (rows, dead letters) as each replica that has them shows them.
        self._uuids: dict[str, tuple[str | None, str | None]] = {}

    def ensure_tables(self, replicas: tuple[Replica, ...]) -> None:
        """Create both tables on every writable replica that answers, if missing (each new
        term checks them all again). TablesUnreachableError if none answers;
        SchemaMismatchError or UnsafeTableError if a table exists but cannot be used, or
        replicas of a non-replicated table reach different tables."""
        with self._lock:
            self._ready.clear()
            self._retry_at.clear()
            self._uuids.clear()
        errors = {r.name: self._ensure_on(r) for r in replicas if r.writable}
        if errors and all(e is not None for e in errors.values()):
            raise TablesUnreachableError(
                "no replica could be given the tables: "
                + "; ".join(f"{name}: {error}" for name, error in errors.items())
            )

    def _ensure_on(self, replica: Replica) -> str | None:
        """Make sure `replica` has both tables; None when it does, else why not (it is tried
        again after RECHECK_S)."""
        key = (replica.host, replica.port)
        with self._lock:
            if key in self._ready:
                return None
            if time.monotonic() < self._retry_at.get(key, 0.0):
                return "did not answer lately"
        if not self.connection.ping(replica.host, replica.port, PING_TIMEOUT_S):
            error = f"no answer to a ping within {PING_TIMEOUT_S:g} s"
        else:
            try:
                client: Client = self.connection.client(replica.host, replica.port)
                try:
                    uuids = tuple(self._ensure_table(client, spec) for spec in self.specs)
                finally:
                    client.close()
            except (SchemaMismatchError, UnsafeTableError):
                raise
            except Exception as exc:  # unreachable or failing: the others may take the block
                error = f"{type(exc).__name__}: {exc}"[:300]
            else:
                error = None
                self._check_one_server(f"{replica.name} ({replica.host}:{replica.port})", uuids)
        with self._lock:
            if error is None:
                self._ready.add(key)
                self._retry_at.pop(key, None)
            else:
                self._retry_at[key] = time.monotonic() + self._recheck_s
        if error is not None:
            log.warning(
                "tables.replica_skipped",
                replica=replica.name,
                error=error,
                retry_s=self._recheck_s,
            )
        return error

    @property
    def specs(self) -> tuple[TableSpec, TableSpec]:
        return self.rows_spec, self.dead_spec

    @staticmethod
    def _ensure_table(client: Client, spec: TableSpec) -> str | None:
        ensure_table(client, spec)
        return table_uuid(client, spec.database, spec.table)

    def _check_one_server(self, replica: str, uuids: tuple[str | None, ...]) -> None:
        """Record `replica`'s table UUIDs; UnsafeTableError (and nothing recorded) if a
        non-replicated table differs from another replica's."""
        with self._lock:
            seen = {**self._uuids, replica: (uuids[0], uuids[1])}
        for i, spec in enumerate(self.specs):
            unsafe = check_one_table(spec, {name: found[i] for name, found in seen.items()})
            if unsafe is not None:
                raise unsafe
        with self._lock:
            self._uuids[replica] = (uuids[0], uuids[1])

    def flush(self, block: PlannedBlock, replicas: tuple[Replica, ...]) -> Flushed:
        """Write the block's rows and dead letters; returns once ClickHouse acknowledged both.
        Only replicas that have the tables are written to (one without is tried first)."""
        ready = tuple(r for r in replicas if r.writable and self._ensure_on(r) is None)
        if not ready and any(r.writable for r in replicas):
            raise TablesUnreachableError(
                f"no writable replica of {[r.name for r in replicas]} has the tables yet"
            )
        replicas = ready or replicas  # none writable: the write names that itself
        spark, sealed = self._spark(), block.block
        rows = flush(
            spark,
            sealed.block_id,
            sealed.rows.table,
            self._target(self.rows_spec, replicas, self._pipeline.transform or None),
            block.rows,
        )
        dead = 0
        if sealed.dead_letters is not None:
            target = self._target(self.dead_spec, replicas, None)
            dead = flush(spark, sealed.block_id, sealed.dead_letters.table, target, block.dead).rows
        return Flushed(rows=rows.rows, dead_letters=dead, replica=rows.replica)

    def _target(
        self, spec: TableSpec, replicas: tuple[Replica, ...], transform: str | None
    ) -> FlushTarget:
        return FlushTarget(
            database=spec.database,
            table=spec.table,
            replicas=replicas,
            token_prefix=self._pipeline.name,
            connection=self.connection,
            transform=transform,
            handoff=self.handoff,
        )
