"""ZooKeeper for the local stack: the 3.9 server bundled in PySpark's jars, 1 or 3 members.

Each member is a `QuorumPeerMain` JVM with its own data dir under the given root, bound to
127.0.0.1 on free ports. `tickTime` is 200 ms so sessions of 2-4 s are allowed (the server
accepts session timeouts from 2 to 300 ticks). The four-letter words `ruok, srvr, stat,
mntr, envi, conf, cons` are enabled: health is "srvr answers with a Mode".
"""

from __future__ import annotations

import shutil
import signal
import socket
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from devstack.process import (
    LOOPBACK,
    DevstackError,
    ManagedProcess,
    ensure_port_free,
    free_port,
    wait_until,
)
from devstack.tls import CertificateFiles

MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
TICK_MS = 200
# The jars QuorumPeerMain needs; taking all ~300 Spark jars would slow the JVM's start.
_JAR_PREFIXES = (
    "zookeeper-",
    "netty-",
    "slf4j-api-",
    "log4j-slf4j2-impl-",
    "log4j-api-",
    "log4j-core-",
    "metrics-core-",
    "snappy-java-",
    "commons-io-",
    "commons-cli-",
)
_LOG4J2 = """\
status = error
appender.console.type = Console
appender.console.name = console
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{ISO8601} %-5p [%t] %c{1}: %m%n
rootLogger.level = warn
rootLogger.appenderRef.console.ref = console
logger.zk.name = org.apache.zookeeper.server.quorum.QuorumPeer
logger.zk.level = info
"""


def java_binary() -> str:
    """The `java` executable, or a `DevstackError` that says how to install it."""
    java = shutil.which("java")
    if java is None:
        raise DevstackError(
            "java not found: ZooKeeper and Spark need a Java 17 runtime; "
            "run `apt-get install -y openjdk-17-jre-headless` (make test does it for you)"
        )
    return java


def pyspark_jars_dir() -> Path:
    """PySpark's `jars/` directory, located through the installed package."""
    try:
        import pyspark
    except ImportError:
        raise DevstackError(
            "pyspark is not installed: run `make test` or `pip install -e .`"
        ) from None
    jars = Path(pyspark.__file__).parent / "jars"
    if not any(jars.glob("zookeeper-*.jar")):
        raise DevstackError(f"no zookeeper-*.jar in {jars}: reinstall pyspark 4.x")
    return jars


def zookeeper_classpath() -> str:
    jars = pyspark_jars_dir()
    picked = sorted(str(jar) for jar in jars.glob("*.jar") if jar.name.startswith(_JAR_PREFIXES))
    return ":".join(picked)


def four_letter_word(
    port: int, word: str, timeout: float = 1.0, tls: ssl.SSLContext | None = None
) -> str:
    """Send a ZooKeeper four-letter command to 127.0.0.1:`port` (over TLS with `tls`) and
    return the answer."""
    with socket.create_connection((LOOPBACK, port), timeout=timeout) as raw:
        sock = raw if tls is None else tls.wrap_socket(raw, server_hostname=LOOPBACK)
        sock.sendall(word.encode("ascii"))
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def client_context(certificates: CertificateFiles) -> ssl.SSLContext:
    """A TLS client context that trusts `certificates`' CA and presents its certificate."""
    context = ssl.create_default_context(cafile=str(certificates.ca_file))
    context.load_cert_chain(str(certificates.cert_file), str(certificates.key_file))
    return context


def server_mode(port: int, tls: ssl.SSLContext | None = None) -> str | None:
    """`leader`, `follower` or `standalone` if the member on `port` serves clients, else None."""
    try:
        answer = four_letter_word(port, "srvr", tls=tls)
    except OSError:
        return None
    for line in answer.splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return None


@dataclass
class ZooKeeperMember:
    """One server of the ensemble: its id, ports and process."""

    myid: int
    client_port: int
    peer_port: int
    election_port: int
    data_dir: Path
    process: ManagedProcess | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None


class ZooKeeperEnsemble:
    """A standalone ZooKeeper server (`members=1`) or a quorum of 3, started by this object."""

    def __init__(
        self,
        root: Path,
        *,
        members: int = 1,
        client_ports: list[int] | None = None,
        tls: CertificateFiles | None = None,
    ):
        """With `tls`, each member serves clients over TLS only (`secureClientPort`, no plain
        port), with `tls`' certificate, and requires a client certificate its CA signed."""
        self.tls = tls
        self._context = None if tls is None else client_context(tls)
        if members not in (1, 3):
            raise ValueError(f"members must be 1 or 3, got {members}")
        if client_ports is not None and len(client_ports) != members:
            raise ValueError(f"client_ports needs {members} ports, got {len(client_ports)}")
        self.root = root
        self.members = [
            ZooKeeperMember(
                myid=i + 1,
                client_port=client_ports[i] if client_ports else free_port(),
                peer_port=free_port(),
                election_port=free_port(),
                data_dir=root / f"member-{i + 1}",
            )
            for i in range(members)
        ]

    def client_keys(self) -> dict[str, object]:
        """The `[zookeeper]` keys a node's config needs to reach this ensemble besides its
        `hosts`: with TLS, `tls` and the certificate files (mutual TLS); none without."""
        if self.tls is None:
            return {}
        return {
            "tls": True,
            "ca_file": str(self.tls.ca_file),
            "cert_file": str(self.tls.cert_file),
            "key_file": str(self.tls.key_file),
        }

    @property
    def hosts(self) -> str:
        """The connect string, `127.0.0.1:p1,127.0.0.1:p2,...`."""
        return ",".join(f"{LOOPBACK}:{m.client_port}" for m in self.members)

    def _write_config(self, member: ZooKeeperMember) -> Path:
        member.data_dir.mkdir(parents=True, exist_ok=True)
        (member.data_dir / "myid").write_text(f"{member.myid}\n")
        lines = [
            f"tickTime={TICK_MS}",
            "initLimit=50",
            "syncLimit=25",
            "minSessionTimeout=400",
            "maxSessionTimeout=60000",
            f"dataDir={member.data_dir}",
            *self._client_port_lines(member),
            "4lw.commands.whitelist=ruok,srvr,stat,mntr,envi,conf,cons",
            "admin.enableServer=false",
            "autopurge.purgeInterval=1",
            "maxClientCnxns=0",
        ]
        if len(self.members) > 1:
            lines += [
                f"server.{m.myid}={LOOPBACK}:{m.peer_port}:{m.election_port}" for m in self.members
            ]
        else:
            lines.append("standaloneEnabled=true")
        cfg = member.data_dir / "zoo.cfg"
        cfg.write_text("\n".join(lines) + "\n")
        (self.root / "log4j2.properties").write_text(_LOG4J2)
        return cfg

    def _client_port_lines(self, member: ZooKeeperMember) -> list[str]:
        if self.tls is None:
            return [f"clientPort={member.client_port}", f"clientPortAddress={LOOPBACK}"]
        keystore = member.data_dir / "keystore.pem"  # ZooKeeper's PEM keystore: key + chain
        keystore.touch(mode=0o600)
        keystore.write_bytes(self.tls.key_file.read_bytes() + self.tls.cert_file.read_bytes())
        return [
            f"secureClientPort={member.client_port}",
            f"secureClientPortAddress={LOOPBACK}",
            "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
            f"ssl.keyStore.location={keystore}",
            "ssl.keyStore.type=PEM",
            f"ssl.trustStore.location={self.tls.ca_file}",
            "ssl.trustStore.type=PEM",
            "ssl.clientAuth=need",
        ]

    def _spawn(self, member: ZooKeeperMember) -> None:
        ensure_port_free(member.client_port, what=f"ZooKeeper member {member.myid}")
        cfg = self._write_config(member)
        member.process = ManagedProcess(
            name=f"ZooKeeper member {member.myid}",
            argv=[
                java_binary(),
                "-Xmx256m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                f"-Dlog4j2.configurationFile={self.root / 'log4j2.properties'}",
                "-Dzookeeper.jmx.log4j.disable=true",
                "-cp",
                zookeeper_classpath(),
                MAIN_CLASS,
                str(cfg),
            ],
            log_path=member.data_dir / "zookeeper.log",
            marker=str(cfg),
        )
        member.process.start()

    def start(self, timeout: float = 30.0) -> None:
        """Start every member and wait until each one serves clients.

        If any member fails to start or to serve within `timeout` s, every member started
        here is stopped by PID before the error propagates: nothing is left running.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            for member in self.members:
                self._spawn(member)
            for member in self.members:
                self._wait_serving(member, timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every member by PID."""
        for member in self.members:
            if member.process is not None:
                member.process.stop()

    def healthy(self) -> bool:
        """True when every member serves clients."""
        return all(server_mode(m.client_port, self._context) is not None for m in self.members)

    def mode(self, myid: int) -> str | None:
        return server_mode(self.member(myid).client_port, self._context)

    def member(self, myid: int) -> ZooKeeperMember:
        for member in self.members:
            if member.myid == myid:
                return member
        raise KeyError(f"no ZooKeeper member {myid}")

    def leader_id(self) -> int | None:
        """The myid of the member that is quorum leader (or the standalone server)."""
        for member in self.members:
            if server_mode(member.client_port, self._context) in ("leader", "standalone"):
                return member.myid
        return None

    def stop_member(self, myid: int, *, sig: signal.Signals = signal.SIGTERM) -> None:
        """Stop one member (SIGKILL for a crash, SIGTERM for a clean stop)."""
        member = self.member(myid)
        if member.process is None:
            return
        if sig == signal.SIGKILL:
            member.process.kill()
        member.process.stop()

    def start_member(self, myid: int, timeout: float = 30.0) -> None:
        """Start a stopped member again on its ports and data and wait until it serves;
        if it does not serve within `timeout` s it is stopped again and the error raised."""
        member = self.member(myid)
        self._spawn(member)
        self._wait_serving(member, timeout)

    def _wait_serving(self, member: ZooKeeperMember, timeout: float) -> None:
        assert member.process is not None
        port, context = member.client_port, self._context
        member.process.wait_ready(lambda: server_mode(port, context) is not None, timeout=timeout)

    def wait_settled(self, timeout: float = 30.0) -> None:
        """Wait until the running members agree on one leader."""
        wait_until(self.leader_id_is_single, timeout=timeout, what="ZooKeeper leader election")

    def leader_id_is_single(self) -> bool:
        modes = [
            server_mode(m.client_port, self._context)
            for m in self.members
            if m.process and m.process.alive()
        ]
        return modes.count("leader") + modes.count("standalone") == 1 and None not in modes
