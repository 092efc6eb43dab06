"""How a config's node is reached and what it sends in plain text: the host it advertises
(`advertised_host`, checked against a cluster spanning hosts, resolved by
`advertise_warning`), servers that would share a socket (`same_address`), and each hop
without TLS (`plain_text_hops`, what `require_tls = true` refuses)."""

from __future__ import annotations

import socket

from chlib.connection import is_loopback
from hakafka.config.sections import Config, Endpoint, NodeServerConfig
from hakafka.config.value_checks import ip


def advertised_host(server: NodeServerConfig, bind: Endpoint) -> str:
    """The host recorded in `nodes/<node>` for a server bound to `bind`: `server.advertise`,
    else the bind host, a wildcard (0.0.0.0, ::) standing for loopback (127.0.0.1, ::1)."""
    if server.advertise:
        return server.advertise
    address = ip(bind.host)
    if address is not None and address.is_unspecified:
        return "127.0.0.1" if address.version == 4 else "[::1]"
    return bind.host


def _other_hosts(config: Config) -> list[str]:
    """`node = endpoint` of the other nodes in [clickhouse.replicas] whose ClickHouse is not
    on loopback: such nodes run on other hosts, so this cluster spans several."""
    return [
        f"{node} = {endpoint}"
        for nodes in config.clickhouse.replicas.values()
        for node, endpoint in sorted(nodes.items())
        if node != config.node and not is_loopback(endpoint.host)
    ]


def check_advertise(config: Config, problems: list[str]) -> None:
    """On a cluster spanning hosts, the advertised hosts must be reachable from the others:
    else a follower would forward queries to "the leader" at its own loopback address."""
    s = config.server
    others = _other_hosts(config)
    local = sorted({h for ep in (s.http, s.flight) if is_loopback(h := advertised_host(s, ep))})
    if others and local:
        which = (
            f"{', '.join(local)} is a loopback address"
            if s.advertise
            else f"unset, so this node registers {', '.join(local)} (from its binds)"
        )
        problems.append(
            f"server.advertise: {which}, which other hosts cannot reach, while the cluster "
            f"spans hosts ([clickhouse.replicas] has {others[0]}); set server.advertise to "
            "the name or address others reach this node at"
        )


def same_address(a: Endpoint, b: Endpoint) -> bool:
    """True when servers bound to `a` and `b` would take the same socket: one port, and one
    host or a wildcard (0.0.0.0, ::) on either side."""
    if a.port != b.port:
        return False
    wildcard = any(ip is not None and ip.is_unspecified for ip in (ip(a.host), ip(b.host)))
    return wildcard or a.host == b.host


TLS_KAFKA_PROTOCOLS = ("SSL", "SASL_SSL")
SPARK_RPC_ENCRYPTION = ("spark.network.crypto.enabled", "spark.ssl.rpc.enabled")


def plain_text_hops(config: Config) -> list[str]:
    """Each hop of `config` that would carry data or control in plain text, named with the
    key that makes it so and the fix (what `require_tls = true` refuses)."""
    hops = []
    if not config.zookeeper.tls:
        hops.append("ZooKeeper: zookeeper.tls is false (set it, and connect to secureClientPort)")
    protocol = config.kafka.settings.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in TLS_KAFKA_PROTOCOLS:
        hops.append(
            f'Kafka: kafka.settings."security.protocol" is {protocol} (use '
            f"{' or '.join(TLS_KAFKA_PROTOCOLS)})"
        )
    if not config.clickhouse.secure:
        hops.append("ClickHouse: clickhouse.secure is false (HTTPS to every replica)")
    if not config.server.tls_cert_file:
        hops.append(
            "query servers and the Spark handoff: server.tls_cert_file is not set (HTTPS, "
            "grpc+tls, and the slices executors fetch)"
        )
    if config.schema_registry.url and any(
        u.strip().startswith("http://") for u in config.schema_registry.url.split(",")
    ):
        hops.append("schema registry: schema_registry.url is http:// (use https://)")
    remote = config.spark.remote
    if remote and "use_ssl=true" not in remote.replace(" ", "").lower():
        hops.append("Spark Connect: spark.remote has no ;use_ssl=true")
    if config.spark.master.startswith("spark://") and not any(
        config.spark.conf.get(key, "").lower() == "true" for key in SPARK_RPC_ENCRYPTION
    ):
        hops.append(
            f"Spark RPC: spark.master is a cluster but spark.conf sets neither "
            f"{' nor '.join(SPARK_RPC_ENCRYPTION)} to true"
        )
    return hops


def advertise_warning(config: Config) -> str | None:
    """What is wrong with `server.advertise` as seen from here (it does not resolve), or
    None. A warning, not an error: the host that checks a config may not be the one that
    resolves it, but a name nobody resolves makes `status`, `query` and forwarding fail."""
    host = config.server.advertise
    if not host or ip(host) is not None:
        return None
    try:
        socket.getaddrinfo(host, None)
    except (OSError, UnicodeError) as exc:
        return (
            f"server.advertise = {host!r} does not resolve here ({exc}): other nodes and "
            "the ops commands reach this node at that name; set the name or address they use"
        )
    return None
