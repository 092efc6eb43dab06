"""TLS for the query servers and their clients: which files, and the contexts made of them."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ServerTls:
    """A server's certificate chain and private key, both PEM files."""

    cert_file: Path
    key_file: Path

    def context(self) -> ssl.SSLContext:
        """A server context (TLS 1.2 or later) holding the certificate and key; raises
        OSError/ssl.SSLError when a file is unreadable or the key does not match."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        return context

    def pem(self) -> tuple[bytes, bytes]:
        """The certificate chain and the key as PEM bytes (what gRPC takes)."""
        return self.cert_file.read_bytes(), self.key_file.read_bytes()


@dataclass(frozen=True)
class ClientTls:
    """How a client checks the servers it sends the token to: against the CAs of `ca_file`
    (PEM), else the system's. A client given one refuses plain-text URLs: a downgraded
    address (written into ZooKeeper) must not get the token in clear."""

    ca_file: Path | None = None

    def context(self) -> ssl.SSLContext:
        """A verifying client context (host name checked) trusting `ca_file` or the system."""
        return ssl.create_default_context(cafile=self.ca_file)

    def root_certs(self) -> bytes | None:
        """The CAs as PEM bytes for gRPC, or None for the system's."""
        return None if self.ca_file is None else self.ca_file.read_bytes()
