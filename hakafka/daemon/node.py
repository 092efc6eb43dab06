"""The daemon process of one node (`Daemon`).

Start-up: validate the config (done by the caller), open the query services (Flight, and
the admin HTTP endpoint with /health /ready /status /metrics /query, and the status page at
/ with its /status/history), connect to ZooKeeper,
register the node, agree on the shard-wide settings (`SettingsGuard`: a node whose settings
differ from the recorded ones stays up but stands nowhere), stand in the election of every
shard it serves, tell systemd READY=1.
Then the main loop pings the systemd watchdog while healthy and waits for signals.

Shutdown (SIGTERM/SIGINT): stop consuming, let an in-flight flush finish within
`FLUSH_GRACE_S`, release leadership, stop Spark; bounded by `SHUTDOWN_BOUND_S` (the unit's
TimeoutStopSec is above it). A second signal exits at once. SIGHUP reopens the log file;
SIGUSR1 dumps every thread's stack to stderr.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import gc
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from types import FrameType

import pyarrow as pa
import structlog

from buffer import Catalog, SqlEngine
from buffer.flight import FlightQueryServer
from buffer.http import HttpQueryServer, PostRoute, Route
from hakafka import __version__
from hakafka.config import Config, advertised_host
from hakafka.coordination import CoordinationError, Coordinator, NodeInfo
from hakafka.daemon.balancer import Balancer
from hakafka.daemon.flush_path import FlushPath
from hakafka.daemon.forwarding import Forwarder
from hakafka.daemon.history import StatusHistory, sample_of
from hakafka.daemon.idle_lag import IdleLag, idle_pipelines, owned_watermarks
from hakafka.daemon.insert_route import InsertRoute
from hakafka.daemon.page import status_page
from hakafka.daemon.push_replicas import ReplicaRoutes
from hakafka.daemon.reload import plan_reload
from hakafka.daemon.replica_store import ReplicaStore
from hakafka.daemon.report import node_status
from hakafka.daemon.reshard_follower import ReshardFollower
from hakafka.daemon.settings_guard import SettingsGuard
from hakafka.daemon.shard import ShardRunner
from hakafka.daemon.wiring import PipelineFactory
from hakafka.faults import CrashPlan
from hakafka.logs import LogSink
from hakafka.metrics import Metrics
from hakafka.sdnotify import Notifier
from hakafka.settings import (
    client_tls,
    query_limits,
    server_limits,
    server_tls,
    spark_settings,
    zk_config,
)
from spark_bridge.flush import warm_workers
from spark_bridge.jvm_output import log_line
from spark_bridge.runtime import SparkRuntime

log = structlog.get_logger("hakafka.daemon")

FLUSH_GRACE_S = 20.0
SHUTDOWN_BOUND_S = 40.0
MAIN_LOOP_S = 1.0
# A consumed batch allocates ~10^4 GC-tracked Message objects: at CPython's default (700, 10,
# 10) the collector runs ~15 times per batch, and each older-generation pass walks everything
# the daemon holds (Spark's py4j, kazoo, Arrow). Measured: consume + decode uses ~12% less CPU.
GC_THRESHOLDS = (50_000, 10, 10)


class StartupError(RuntimeError):
    """The daemon cannot start; the text names the config key and what to do."""


@contextlib.contextmanager
def _listening(key: str, endpoint: str) -> Iterator[None]:
    try:
        yield
    except Exception as exc:  # OSError from http.server, ArrowException from Flight
        raise StartupError(
            f"{key}: cannot listen on {endpoint} ({exc}); is another hakafka running? "
            "stop it or choose another port"
        ) from None


def use_jemalloc() -> None:
    """Allocate Arrow memory from jemalloc unless $ARROW_DEFAULT_MEMORY_POOL chose a pool:
    the buffer's byte accounting tracks RSS within 10% with it, the default pool does not."""
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        return
    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except NotImplementedError:
        log.warning("arrow.no_jemalloc", pool=pa.default_memory_pool().backend_name)


def node_info(config: Config, http_port: int, flight_port: int) -> NodeInfo:
    """What `nodes/<node>` records for servers on these ports: their URLs at the advertised
    host (`config.advertised_host`), https and grpc+tls when `[server]` has TLS."""
    s = config.server
    secure = server_tls(config) is not None
    return NodeInfo(
        host=socket.gethostname(),
        http=f"{'https' if secure else 'http'}://{advertised_host(s, s.http)}:{http_port}",
        flight=f"{'grpc+tls' if secure else 'grpc'}://{advertised_host(s, s.flight)}:{flight_port}",
        pid=os.getpid(),
        version=__version__,
    )


class Daemon:
    """One node of a hakafka cluster."""

    def __init__(
        self,
        config: Config,
        logs: LogSink | None = None,
        reload: Callable[[], Config] | None = None,
    ) -> None:
        """`reload` reads the config again (SIGHUP, `systemctl reload`); None: SIGHUP only
        reopens the log file."""
        self.config = config
        self.logs = logs
        self.metrics = Metrics.create()
        self.catalog = Catalog()
        self.engine = SqlEngine(self.catalog, query_limits(config))
        # Spark's own output (banners, log4j, its workers' stderr) as `spark.output` events,
        # in the log's sink and format: never on the daemon's stdout or stderr.
        self.spark = SparkRuntime(spark_settings(config), output=log_line)
        self.notifier = Notifier.from_environment()
        self.crash = CrashPlan.from_environment()
        self.started_at = time.time()
        self._stop = threading.Event()
        self.flush_path = FlushPath(self.spark.start, warm_workers, self._stop.is_set)
        self._signals: list[str] = []  # names of the stop signals received
        self._reload = reload
        self._hup = threading.Event()
        self.history = StatusHistory()
        self._page = status_page()
        token = config.server.token.value or None
        flight_ep, http_ep = config.server.flight, config.server.http
        limits = server_limits(config)
        tls = server_tls(config)
        self.replica_store = ReplicaStore(config.data_dir / "push-replicas")
        copies = ReplicaRoutes(
            self.replica_store,
            leads=lambda shard: any(r.shard == shard and r.leading for r in self.runners),
            leader_epoch=self._leader_epoch,
        )
        inserts = InsertRoute(
            runners=lambda: self.runners,
            leader_of=self._leader_endpoints,
            configured=lambda: frozenset(p.name for p in self.config.pipelines),
            shard_count=lambda: self.config.shard_count,
        )
        with _listening("server.flight", str(flight_ep)):
            self.flight = FlightQueryServer(
                self.engine,
                flight_ep.host,
                flight_ep.port,
                token,
                forward=self._forward,
                limits=limits,
                tls=tls,
                observe=self.metrics.observe_query,
                put=inserts.put,
            )
        with _listening("server.http", str(http_ep)):
            self.http = HttpQueryServer(
                self.engine,
                http_ep.host,
                http_ep.port,
                token,
                routes={
                    "/health": Route(lambda: (200, "text/plain", b"ok\n"), public=True),
                    "/ready": Route(self._ready_route, public=True),
                    "/": Route(lambda: (200, "text/html; charset=utf-8", self._page)),
                    "/status": Route(self._status_route),
                    "/status/history": Route(self._history_route),
                    "/metrics": Route(self._metrics_route, public=True),
                },
                post_routes={
                    "/insert": PostRoute(inserts),
                    "/replica/push": PostRoute(copies.push),
                    "/replica/fetch": PostRoute(copies.fetch),
                },
                forward=self._forward,
                limits=limits,
                tls=tls,
                observe=self.metrics.observe_query,
            )
        corrections = self.metrics.leadership_corrections
        self.coordinator = Coordinator(
            zk_config(config),
            config.node,
            node_info(config, self.http.port, self.flight.port),
            on_correction=lambda shard, action: corrections.labels(str(shard), action).inc(),
        )
        self.forwarder = Forwarder(
            self.coordinator,
            config.shards,
            lambda: [r.shard for r in self.runners if r.leading],
            token,
            client_tls(config),
            wait_s=config.zookeeper.session_timeout + 2.0,
        )
        self.pipelines = pipelines = PipelineFactory(
            config,
            self.coordinator,
            self.spark.start,
            catalog=self.catalog,
            metrics=self.metrics,
            crash=self.crash,
            replica_store=self.replica_store,
        )
        self.runners = [
            ShardRunner(
                shard,
                self.coordinator,
                pipelines.for_shard(shard),
                metrics=self.metrics,
                flush_grace_s=FLUSH_GRACE_S,
                stuck_after_s=config.server.stuck_after,
                warm_up=self.flush_path.warm,
            )
            for shard in config.shards
        ]
        self.guard = SettingsGuard(self.coordinator, config, self.runners)
        moves = self.metrics.balance_moves
        self.balancer = Balancer(
            self.coordinator,
            config,
            lambda: {r.shard: t for r in self.runners if (t := r.token) is not None},
            on_move=lambda move: moves.labels(str(move.shard)).inc(),
        )
        self.reshard = ReshardFollower(self.coordinator, self.guard, self.runners)
        self.idle_lag = IdleLag(
            lambda: idle_pipelines(self.runners, self.config.pipelines),
            lambda p, shard: self.coordinator.pauses.checkpoint(shard, p.name).offsets.get(
                p.topic, {}
            ),
            lambda p, shard: owned_watermarks(self.config, p, shard),
        )

    # -- lifecycle -------------------------------------------------------------------------

    def run(self) -> int:
        """Serve until a signal asks to stop; returns the process exit code."""
        self._install_signals()
        use_jemalloc()
        # pyarrow imports pandas on its first conversion (0.5-1 s): do it before any election, so
        # that it never stalls a new leader's first batch.
        pa.array([0])
        # Start-up's objects (modules, config, servers) live as long as the process: keep them
        # out of every collection, and collect young objects per few batches, not per 700.
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        self.http.start()
        self.coordinator.start()
        self.coordinator.register()
        if self.config.spark.on_followers:
            # Beside standing, not before it: a node that is elected first flushes once
            # Spark is up, and consumes meanwhile.
            self.flush_path.warm_in_background()
        for runner in self.runners:
            runner.start()
        # A term that begins during a reshard must begin drained: its state first.
        self.reshard.start()
        self.idle_lag.start()
        self.reshard.poll()
        self.guard.start()
        self.balancer.start()
        log.info(
            "daemon.started",
            node=self.config.node,
            shards=list(self.config.shards),
            http=self.coordinator.endpoints.http,
            flight=self.coordinator.endpoints.flight,
        )
        self.notifier.ready(self._status_line())
        self._main_loop()
        return self._shutdown()

    def _main_loop(self) -> None:
        interval = self.notifier.watchdog_interval
        next_ping = 0.0
        while not self._stop.wait(MAIN_LOOP_S if interval is None else min(MAIN_LOOP_S, interval)):
            if self._hup.is_set():
                self._hup.clear()
                if self.logs is not None:
                    self.logs.reopen()
                log.info("daemon.logs_reopened")
                self._reload_config()
            now = time.monotonic()
            if interval is not None and now >= next_ping and self.healthy():
                self.notifier.watchdog()
                next_ping = now + interval
            self.guard.poll()
            self.reshard.poll()
            self.notifier.status(self._status_line())
            self._update_pipeline_metrics()
            if self.history.due(now):
                self.history.add(sample_of(self.runners, self.metrics.registry))

    def _shutdown(self) -> int:
        began = time.monotonic()
        self.notifier.stopping()
        if self._signals:
            log.info("daemon.signal", signal=self._signals[0])
        log.info("daemon.stopping")
        # The unit's TimeoutStopSec is just above this bound: exit by ourselves, with a log
        # line saying so, rather than be SIGKILLed by systemd.
        bound = threading.Timer(SHUTDOWN_BOUND_S, self._shutdown_overran)
        bound.daemon = True
        bound.start()
        self.balancer.stop()
        for runner in self.runners:
            runner.stop(FLUSH_GRACE_S)
        self.idle_lag.stop()
        self.pipelines.close()
        self.coordinator.close()
        self.http.close()
        self.flight.shutdown()
        self.engine.close()
        self.spark.stop()
        bound.cancel()
        log.info("daemon.stopped", seconds=round(time.monotonic() - began, 3))
        return 0

    def _shutdown_overran(self) -> None:
        self._emergency("daemon.shutdown_overran", "error", bound_s=SHUTDOWN_BOUND_S)
        os._exit(1)

    def _emergency(self, event: str, level: str, **fields: object) -> None:
        """Log without locks: a thread stuck in a write must not keep the process alive."""
        (self.logs or LogSink()).emergency(event, level, **fields)

    def request_stop(self) -> None:
        self._stop.set()

    def _install_signals(self) -> None:
        # Handlers run on the main thread between bytecodes, maybe inside a log write that
        # holds the sink's lock: they only set flags, or write without locks and exit.
        def on_stop(signum: int, _frame: FrameType | None) -> None:
            self._signals.append(signal.Signals(signum).name)
            if len(self._signals) > 1:
                self._emergency("daemon.exit_now", "warning", signal=self._signals[-1])
                os._exit(1)
            self._stop.set()

        def on_hup(_signum: int, _frame: FrameType | None) -> None:
            self._hup.set()

        # SIGUSR1 dumps every thread's stack to stderr: how to see where a stuck daemon waits.
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGHUP, on_hup)

    # -- health and status -----------------------------------------------------------------

    def healthy(self) -> bool:
        """Connected to ZooKeeper and no pipeline of a led shard has failed or is stuck."""
        return not self.problems()

    def problems(self) -> list[str]:
        """Why this node is not ready, one line each; [] when it is."""
        now = time.monotonic()
        found = [] if self.coordinator.connected else ["ZooKeeper is not connected"]
        return found + [line for r in self.runners for line in r.problems(now)]

    def _status_line(self) -> str:
        if self.guard.drift:
            return f"standing in no shard: {len(self.guard.drift)} settings differ from the record"
        roles = ", ".join(
            f"shard {r.shard}: {'leader' if r.leading else 'follower'}" for r in self.runners
        )
        lag = sum(sum(p.lag().values()) for r in self.runners for p in r.pipelines)
        return f"{roles}; lag {lag}"

    def _update_pipeline_metrics(self) -> None:
        self.metrics.zookeeper_connected.set(1 if self.coordinator.connected else 0)
        self.metrics.ready.set(1 if self.healthy() else 0)
        self.metrics.flush_ready.set(1 if self.flush_path.status.ready else 0)
        # Rebuilt each time: a shard this node stopped leading must not keep its old values.
        self.metrics.kafka_lag.clear()
        self.metrics.checkpoint_lag.clear()
        self.metrics.stalled.clear()
        self.metrics.pipeline_state.clear()
        now = time.monotonic()
        for runner in self.runners:
            if runner.leading:
                for name in runner.paused:
                    self.metrics.pipeline_state.labels(name, str(runner.shard), "paused").set(1)
            for p in runner.pipelines:
                labels = {"pipeline": p.config.name, "shard": str(runner.shard)}
                self.metrics.stalled.labels(**labels).set(round(p.stalled_for(now), 1))
                self.metrics.pipeline_state.labels(**labels, state=p.state_name()).set(1)
                positions = p.positions()
                checkpoint = p.status.checkpoint
                for partition, behind in p.lag().items():
                    self.metrics.kafka_lag.labels(**labels, partition=str(partition)).set(behind)
                for partition, position in positions.items():
                    done = checkpoint.get(partition, position)
                    self.metrics.checkpoint_lag.labels(**labels, partition=str(partition)).set(
                        position - done
                    )
        # Paused and drained pipelines run no consumer: their lag from checkpoint and watermark.
        led = {r.shard for r in self.runners if r.leading}
        for (name, shard), lags in self.idle_lag.lags().items():
            if shard in led:
                for partition, behind in lags.items():
                    self.metrics.kafka_lag.labels(name, str(shard), str(partition)).set(behind)

    def _ready_route(self) -> tuple[int, str, bytes]:
        problems = self.problems()
        if not problems:
            return 200, "text/plain", b"ready\n"
        return 503, "text/plain", "".join(f"not ready: {p}\n" for p in problems).encode()

    def _status_route(self) -> tuple[int, str, bytes]:
        import json

        status = node_status(
            node=self.config.node,
            runners=self.runners,
            coordinator=self.coordinator,
            started_at=self.started_at,
            healthy=self.healthy(),
        )
        status["flush_path"] = self.flush_path.status.report(time.monotonic())
        drift = self.guard.drift
        status["settings_drift"] = None if drift is None else [str(d) for d in drift]
        return 200, "application/json", json.dumps(status, default=str).encode()

    def _history_route(self) -> tuple[int, str, bytes]:
        import json

        return 200, "application/json", json.dumps(self.history.report()).encode()

    def _metrics_route(self) -> tuple[int, str, bytes]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return 200, CONTENT_TYPE_LATEST, generate_latest(self.metrics.registry)

    def _reload_config(self) -> None:
        """Read the config again; apply what may change live, log what may not (by key)."""
        if self._reload is None:
            return
        try:
            read = self._reload()
        except Exception as exc:  # a bad file: keep running as configured (ConfigError says why)
            log.error("config.reload_failed", error=str(exc))
            return
        plan = plan_reload(self.config, read)
        for refusal in plan.refused:
            log.warning("config.reload_refused", key=refusal.key, reason=refusal.reason)
        config = self.config = plan.config
        token = config.server.token.value or None
        self.http.reconfigure(token, server_limits(config))
        self.flight.reconfigure(token)
        self.forwarder = dataclasses.replace(self.forwarder, token=token)
        self.engine.limits = query_limits(config)
        self.pipelines.reconfigure(config)
        for runner in self.runners:
            runner.retune(config, config.server.stuck_after)
        if self.logs is not None:
            self.logs.level = config.log_level
        log.info("config.reloaded", applied=list(plan.applied), refused=len(plan.refused))

    def _leader_epoch(self, shard: int) -> int | None:
        """The epoch of `shard`'s leader as ZooKeeper has it (None: no leader, or ZooKeeper
        cannot say now)."""
        try:
            info = self.coordinator.leader_of(shard)
        except CoordinationError:
            return None
        return None if info is None else info.epoch

    def _leader_endpoints(self, shard: int) -> tuple[str, str, str] | None:
        """`shard`'s leader and its HTTP and Flight addresses as ZooKeeper names them (None:
        no leader, or ZooKeeper cannot say now)."""
        try:
            info = self.coordinator.leader_of(shard)
            found = None if info is None else self.coordinator.nodes().get(info.node)
        except CoordinationError:
            return None
        if info is None:
            return None
        return (info.node, found.http, found.flight) if found else (info.node, "", "")

    def _forward(self, sql: str, params: Mapping[str, str]) -> pa.Table | None:
        """The query servers' `forward` (built before the forwarder, which needs their ports)."""
        return self.forwarder(sql, params)
