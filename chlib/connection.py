"""How to reach a ClickHouse server over HTTP(S): credentials, TLS options, clients, /ping."""

from __future__ import annotations

import ipaddress
import ssl
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


def is_loopback(host: str) -> bool:
    """Whether `host` (`[::1]` brackets allowed) is localhost or in 127.0.0.0/8 or ::1."""
    try:
        ip = ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        return host == "localhost"  # any other host name may resolve anywhere
    return ip.is_loopback


def parse_bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    """The boolean option `key`; a value that is not a boolean is a ValueError naming `key`."""
    raw = options.get(key)
    if raw is None:
        return default
    value = str(raw).strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"option {key!r}: expected true/false, got {raw!r}")


@dataclass(frozen=True)
class Connection:
    """Credentials and TLS settings shared by every host of one ClickHouse cluster."""

    user: str = "default"
    password: str = field(default="", repr=False)
    secure: bool = False
    verify: bool = True
    ca_cert: str | None = None
    connect_timeout: float = 10.0

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> Connection:
        """Read ``user``, ``password``, ``secure``, ``verify``, ``ca_cert`` from string options."""
        return cls(
            user=options.get("user") or "default",
            password=options.get("password") or "",
            secure=parse_bool(options, "secure", False),
            verify=parse_bool(options, "verify", True),
            ca_cert=options.get("ca_cert") or None,
        )

    def to_options(self) -> dict[str, str]:
        """The inverse of `from_options` (the password included: Spark redacts it in plans)."""
        options = {
            "user": self.user,
            "password": self.password,
            "secure": str(self.secure).lower(),
            "verify": str(self.verify).lower(),
        }
        if self.ca_cert:
            options["ca_cert"] = self.ca_cert
        return options

    def client(self, host: str, port: int, database: str | None = None, **kwargs: Any) -> Client:
        """A clickhouse-connect HTTP client for `host:port` (raises if it cannot connect).
        Its inserts are compressed (lz4) unless `host` is a loopback address."""
        import clickhouse_connect

        options: dict[str, Any] = {
            "host": host,
            "port": port,
            "username": self.user,
            "password": self.password,
            "interface": "https" if self.secure else "http",
            "secure": self.secure,
            "verify": self.verify,
            "connect_timeout": self.connect_timeout,
            # On loopback, compression is CPU spent at both ends to save no network:
            # an insert of 56 MiB of Arrow cost the client 94 ms of CPU with lz4, 34 without.
            "compress": not is_loopback(host),
        }
        if self.ca_cert:
            options["ca_cert"] = self.ca_cert
        if database:
            options["database"] = database
        options.update(kwargs)
        return clickhouse_connect.get_client(**options)

    def ping(self, host: str, port: int, timeout: float) -> bool:
        """True if ``GET /ping`` on `host:port` answers 200 within `timeout` seconds."""
        scheme = "https" if self.secure else "http"
        context: ssl.SSLContext | None = None
        if self.secure:
            context = ssl.create_default_context(cafile=self.ca_cert)
            if not self.verify:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
        try:
            with urllib.request.urlopen(
                f"{scheme}://{host}:{port}/ping", timeout=timeout, context=context
            ) as response:
                return bool(response.status == 200)
        except (OSError, ValueError):
            return False
