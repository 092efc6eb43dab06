"""Handing a block's slices from the driver to the Spark tasks that write them.

The block lives in the driver's memory as Arrow. A short-lived Arrow Flight server on the
driver's address serves each slice to the task that asks for it by ticket, straight from the
driver's buffers: nothing is pickled, copied through the JVM or written to a temp file, which
is what a broadcast of the same bytes costs (measured: the broadcast of a 1M-row block took
longer than inserting it). The server listens on `bind` and tells the tasks `host`: on a
cluster, an address the executors reach this process at (`runtime.handoff_address`: the
driver's host by default, which executors reach by construction; with Spark Connect the
daemon is not the driver, so it is configured). Each ticket carries a random secret: a process that
can reach the port but was not handed the ticket cannot read the block.

`HandoffOptions` says how it serves. With `HandoffTls` it serves `grpc+tls` with a
certificate and key read from their files for each handoff, and the tasks verify that
certificate against the CAs of `ca_file`, whose PEM bytes travel to them with the tickets
(`SliceSource`, inside the job's closure: never in argv, Spark's conf or its UI), else
against their system's CAs; a task that does not trust it fails (`HandoffTrustError`), it
never falls back to plain text. With a `PortRange` it listens on the first free port of the
range (ports a firewall lets the executors reach), and `HandoffPortsError` when none is free;
the port is free again once the handoff is closed.
"""

from __future__ import annotations

import errno
import re
import secrets
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

import pyarrow as pa
from pyarrow import flight

MAX_PORT = 65_535
UNNAMED_RANGE = "handoff_ports"  # what errors call a `PortRange` not named by its caller
_PORTS = re.compile(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?")
# How gRPC says a TLS client refused the server's certificate (not trusted, or another name).
_REFUSED_CERTIFICATE = re.compile(r"(?i)handshake failed|certificate")
# gRPC's reason inside a Flight error: what follows "last error: ", up to its debug context.
_GRPC_REASON = re.compile(r"last error: (.*?)(?:\. gRPC client debug context|$)", re.S)


@dataclass(frozen=True)
class PortRange:
    """TCP ports `first` to `last`, both included; `name` is what errors call the range (the
    config key it came from)."""

    first: int
    last: int
    name: str = UNNAMED_RANGE

    def __post_init__(self) -> None:
        if not 1 <= self.first <= MAX_PORT or not 1 <= self.last <= MAX_PORT:
            raise ValueError(f"ports must be within 1..{MAX_PORT}, got {self}")
        if self.first > self.last:
            raise ValueError(f"the first port must not exceed the last, got {self}")

    @classmethod
    def parse(cls, text: str, name: str = UNNAMED_RANGE) -> PortRange:
        """The range written `text`: one port (`41000`) or `FIRST-LAST` (`41000-41099`);
        ValueError with the problem otherwise."""
        match = _PORTS.fullmatch(text)
        if match is None:
            raise ValueError(
                f'must be a port or a range FIRST-LAST such as "41000-41099", got {text!r}'
            )
        first = int(match.group(1))
        return cls(first, int(match.group(2) or first), name)

    def __str__(self) -> str:
        return str(self.first) if self.first == self.last else f"{self.first}-{self.last}"

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.first, self.last + 1))


@dataclass(frozen=True)
class HandoffTls:
    """The handoff serves `grpc+tls` with the certificate chain `cert_file` and its key
    `key_file` (PEM). Tasks verify it against the CAs of `ca_file` (PEM), else their
    system's, for the name `server_name` (None: the host they connect to)."""

    cert_file: Path
    key_file: Path
    ca_file: Path | None = None
    server_name: str | None = None


@dataclass(frozen=True)
class HandoffOptions:
    """How a flush's handoff serves: on a port of `ports` (None: one the system picks), over
    TLS with `tls` (None: plain gRPC)."""

    ports: PortRange | None = None
    tls: HandoffTls | None = None


class HandoffPortsError(RuntimeError):
    """Every port of the handoff's `PortRange` is in use; the text names the range."""


class HandoffTrustError(RuntimeError):
    """A task does not trust the handoff's certificate; the text says against which CAs."""

    @classmethod
    def quoted_in(cls, text: str) -> HandoffTrustError | None:
        """The error a task raised, rebuilt from `text` (a Spark job's error, which quotes
        the task's traceback), or None when `text` holds none."""
        match = re.search(rf"{cls.__name__}: ([^\n]+)", text)
        return None if match is None else cls(match.group(1))


@dataclass(frozen=True)
class SliceSource:
    """What a task is handed to fetch slice `i`: where the handoff is, the slices' tickets and
    the CAs (PEM; None: the system's) its certificate is verified against, for the name
    `server_name`. It travels inside the job's closure: tickets and CAs are left out of its
    repr."""

    location: str
    tickets: tuple[bytes, ...] = field(repr=False)
    root_certs: bytes | None = field(default=None, repr=False)
    server_name: str | None = None

    def fetch(self, task: int) -> Iterator[pa.RecordBatch]:
        """Executor side: the record batches of slice `task`."""
        return fetch_slice(self.location, self.tickets[task], self.root_certs, self.server_name)


class _SliceServer(flight.FlightServerBase):  # type: ignore[misc]
    def __init__(
        self, location: str, slices: dict[bytes, pa.Table], pairs: list[flight.CertKeyPair]
    ) -> None:
        super().__init__(location, tls_certificates=pairs)
        self._slices = slices

    def do_get(
        self, context: flight.ServerCallContext, ticket: flight.Ticket
    ) -> flight.FlightDataStream:
        table = self._slices.get(ticket.ticket)
        if table is None:
            raise flight.FlightUnauthorizedError("unknown block slice ticket")
        return flight.RecordBatchStream(table)


def _port_in_use(host: str, port: int) -> bool:
    """Whether a listener holds `port` on `host`: a bind with SO_REUSEADDR (as gRPC's, so a
    closed handoff's connections in TIME_WAIT do not count) fails with EADDRINUSE. Any other
    bind error (`host` is no address of this machine) is raised."""
    address = host.removeprefix("[").removesuffix("]")
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise
    return False


class SliceHandoff:
    """Serves `slices` (slice `i` under ticket `i` of `source`) on `bind` (default `host`) as
    `options` say, until closed; tasks reach it through `source`, on `host`. Raises
    `HandoffPortsError` when every port of `options.ports` is in use."""

    def __init__(
        self,
        host: str,
        slices: Sequence[pa.Table],
        bind: str | None = None,
        options: HandoffOptions | None = None,
    ) -> None:
        options = options or HandoffOptions()
        tls = options.tls
        tickets = tuple(secrets.token_bytes(16) for _ in slices)
        served = dict(zip(tickets, slices, strict=True))
        # The files are read before serving starts: one that cannot be read leaves nothing open.
        pairs: list[flight.CertKeyPair] = []
        roots, name = None, None
        if tls is not None:
            pairs = [flight.CertKeyPair(tls.cert_file.read_bytes(), tls.key_file.read_bytes())]
            roots = None if tls.ca_file is None else tls.ca_file.read_bytes()
            name = tls.server_name
        scheme = "grpc+tls" if pairs else "grpc"
        # Serving starts here. `serve()` is never called: it only waits, and while it waits
        # Arrow's signal handler replaces the process's SIGTERM/SIGINT handlers.
        self._server = _serve(scheme, bind or host, served, pairs, options.ports)
        self.source = SliceSource(f"{scheme}://{host}:{self._server.port}", tickets, roots, name)

    def close(self) -> None:
        """Stop serving, after the fetches in progress end, and free the port; idempotent."""
        self._server.shutdown()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _serve(
    scheme: str,
    bind: str,
    slices: dict[bytes, pa.Table],
    pairs: list[flight.CertKeyPair],
    ports: PortRange | None,
) -> _SliceServer:
    """A server of `slices` on `bind`, with the certificates and keys `pairs` (TLS, with the
    `grpc+tls` scheme): on a port the system picks without `ports`, else on the first port of
    `ports` no one listens on (one taken meanwhile, by a concurrent handoff, is passed over).
    HandoffPortsError when each is in use."""
    if ports is None:
        return _SliceServer(f"{scheme}://{bind}:0", slices, pairs)
    for port in ports:
        if _port_in_use(bind, port):
            continue
        try:
            return _SliceServer(f"{scheme}://{bind}:{port}", slices, pairs)
        except pa.ArrowException:
            if not _port_in_use(bind, port):
                raise  # not the port: gRPC failed for another reason
    raise HandoffPortsError(
        f"{ports.name}: no free port in {ports} on {bind} for a flush's slice handoff: each "
        "is in use (by the handoffs of other flushes in progress, or by other programs); "
        f"widen {ports.name} or free a port"
    )


def fetch_slice(
    location: str,
    ticket: bytes,
    root_certs: bytes | None = None,
    server_name: str | None = None,
) -> Iterator[pa.RecordBatch]:
    """Executor side: the record batches of the slice behind `ticket` at `location`. A
    `grpc+tls` location is verified against `root_certs` (PEM; None: the system's CAs) for
    `server_name` (None: the location's host); HandoffTrustError if its certificate fails."""
    client = flight.connect(location, tls_root_certs=root_certs, override_hostname=server_name)
    try:
        try:
            reader = client.do_get(flight.Ticket(ticket))
        except flight.FlightUnavailableError as exc:
            if location.startswith("grpc+tls:") and _REFUSED_CERTIFICATE.search(str(exc)):
                raise _untrusted(location, root_certs, server_name, str(exc)) from exc
            raise
        for chunk in reader:
            yield chunk.data
    finally:
        client.close()


def _untrusted(
    location: str, root_certs: bytes | None, server_name: str | None, error: str
) -> HandoffTrustError:
    """The error of a task refusing the certificate at `location`: one line naming the
    handoff, the name checked, the CAs it was checked against and gRPC's reason."""
    match = _GRPC_REASON.search(error)
    reason = " ".join((match.group(1) if match else error).split())
    against = "the system's CAs" if root_certs is None else "the CA sent with the job"
    name = f" for the name {server_name}" if server_name else ""
    return HandoffTrustError(
        f"this task does not trust the certificate of the slice handoff at {location}"
        f"{name} (verified against {against}): {reason}"
    )
