"""ZooKeeper over TLS next to plain, in one run: what a node taking a shard over pays for it.

For each mode a standalone ZooKeeper (plain `clientPort`, or TLS only: `secureClientPort`,
mutual TLS) and two `hakafka run` nodes of one shard, with a producer writing ~2,000
messages/s. Each round is an ops failover (`hakafka failover --json`, over the same
ZooKeeper): its seconds from the request to the new leader consuming, and the new leader's
own `leader.consuming` seconds (pipelines started -> `consuming` published). The raw baseline
is one ZooKeeper read (`exists`) round trip on the same ensemble, 500 times.

Run: .venv/bin/python bench/zookeeper_tls_bench.py [--rounds 6]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from benchstack import Bench, local_stack

from devstack.cluster import LocalCluster, PipelineSpec
from devstack.process import run_hakafka, wait_until
from devstack.records import EVENT_COLUMNS, create_topic, produce
from devstack.tls import CertificateFiles, make_certificates
from devstack.zookeeper import ZooKeeperEnsemble
from hakafka.coordination import ZkConfig, ZkTls

ROUNDS = 6
READS = 500
PARTITIONS = 4
MODES = ("plain", "tls")


def read_round_trips(config: ZkConfig) -> list[float]:
    """Seconds of each of `READS` `exists` calls on one session."""
    client = config.client(chroot=False)
    client.start(timeout=15)
    try:
        samples = []
        for _ in range(READS):
            began = time.perf_counter()
            client.exists("/zookeeper")
            samples.append(time.perf_counter() - began)
        return samples
    finally:
        client.stop()
        client.close()


def consuming_seconds(path: Path) -> list[float]:
    """The `seconds` of every `leader.consuming` event in a daemon's output."""
    found = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{") and '"leader.consuming"' in line:
            found.append(float(json.loads(line)["seconds"]))
    return found


def run_mode(bench: Bench, mode: str, certs: CertificateFiles, rounds: int) -> dict[str, Any]:
    tls = certs if mode == "tls" else None
    ensemble = ZooKeeperEnsemble(bench.root / f"zk-{mode}", tls=tls)
    ensemble.start(timeout=60)
    zk_tls = None if tls is None else ZkTls(str(tls.ca_file), str(tls.cert_file), str(tls.key_file))
    topic = f"zk_tls_bench_{mode}"
    create_topic(bench.stack.kafka, topic, PARTITIONS)
    cluster = LocalCluster(
        bench.root / f"cluster-{mode}",
        bench.stack,
        nodes={"n1": [0], "n2": [0]},
        shard_count=1,
        pipelines=[
            PipelineSpec(
                name="events",
                topic=topic,
                table=f"events_{mode}",
                columns=EVENT_COLUMNS,
                buffer={"min_rows": 5000, "min_bytes": 1, "min_age": 1, "max_age": 3},
            )
        ],
        zk_root=f"/bench-{mode}",
        session_timeout=3.0,
        spark_on_followers=True,
        zookeeper=ensemble.client_keys(),
        zookeeper_hosts=dict.fromkeys(("n1", "n2"), ensemble.hosts),
    )
    stop = threading.Event()

    def producing() -> None:
        start = 0
        while not stop.is_set():
            produce(bench.stack.kafka, topic, 1000, partitions=PARTITIONS, start=start)
            start += 1000
            stop.wait(0.5)

    producer = threading.Thread(target=producing, name="producer", daemon=True)
    try:
        raw = read_round_trips(ZkConfig(hosts=ensemble.hosts, root="/bench", tls=zk_tls))
        config = str(cluster.nodes["n1"].config_path)
        init = run_hakafka(["init", "--config", config], 120)
        if init.returncode != 0:
            raise RuntimeError(f"init ({mode}): {init.stderr.decode()}")
        cluster.start()
        cluster.wait_leaders([0])
        wait_until(
            lambda: all(n.flush_path_warm() for n in cluster.nodes.values()),
            timeout=180,
            what="both nodes' Spark warm",
        )
        producer.start()
        time.sleep(3)
        failovers = []
        for _ in range(rounds):
            done = run_hakafka(["failover", "--config", config, "--shard", "0", "--json"], 120)
            if done.returncode != 0:
                raise RuntimeError(f"failover ({mode}): {done.stderr.decode()}")
            failovers.append(float(json.loads(done.stdout)["seconds"]))
            time.sleep(2)
        consuming = [s for n in cluster.nodes.values() for s in consuming_seconds(n.log_path)]
    finally:
        stop.set()
        if producer.is_alive():
            producer.join(timeout=30)
        cluster.stop()
        ensemble.stop()
    # The first `leader.consuming` of the run is the cold first election, not a failover.
    return {"raw": raw, "failover": failovers, "consuming": consuming[1:] or consuming}


def line(name: str, samples: list[float], unit: float, plain: list[float] | None) -> str:
    median, worst = statistics.median(samples), max(samples)
    ratio = "" if plain is None else f"{median / statistics.median(plain):>10.2f}x"
    return f"  {name:<34}{median * unit:>10.2f}{worst * unit:>10.2f}{ratio}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="ops failovers per mode")
    args = parser.parse_args()
    with local_stack("hakafka-zk-tls-bench-") as bench:
        certs = make_certificates(bench.root / "certs")
        found = {mode: run_mode(bench, mode, certs, args.rounds) for mode in MODES}
    print(
        f"ZooKeeper TLS bench: standalone ZooKeeper, 2 nodes of 1 shard, ~2,000 msg/s, "
        f"{args.rounds} ops failovers per mode; raw baseline: {READS} `exists` round trips"
    )
    print(f"  {'':<34}{'median':>10}{'max':>10}{'tls/plain':>11}")
    rows = (
        ("raw read round trip (ms)", "raw", 1000),
        ("ops failover -> consuming (s)", "failover", 1),
        ("election -> consuming (s)", "consuming", 1),
    )
    for mode in MODES:
        print(f"{mode}:")
        for name, key, unit in rows:
            plain = None if mode == "plain" else found["plain"][key]
            print(line(name, found[mode][key], unit, plain))


if __name__ == "__main__":
    main()
