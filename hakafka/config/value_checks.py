"""The rules of single config values: each `*_problem` returns what is wrong with a value, or
None, and `checked` declares a section field whose value must pass one."""

from __future__ import annotations

import ipaddress
import re
import ssl
from collections.abc import Callable
from dataclasses import field
from pathlib import Path
from typing import Any

from spark_bridge.handoff import PortRange

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_HOST = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")


def ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`host` (`[::1]` brackets allowed) as an IP address, or None for a host name."""
    try:
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        return None


def checked(default: Any, check: Callable[[Any], str | None]) -> Any:
    """A config field whose value must also pass `check` (a problem text, or None)."""
    return field(default=default, metadata={"check": check})


def zk_root_problem(value: str) -> str | None:
    if not value.startswith("/") or value.endswith("/") or "//" in value:
        return f"must be an absolute ZooKeeper path like /hakafka/prod, got {value!r}"
    return None


def name_problem(value: str) -> str | None:
    return (
        None
        if NAME.match(value)
        else f"must be a plain identifier ([A-Za-z_][A-Za-z0-9_]*), got {value!r}"
    )


# `lanes = "auto"`: one lane per partition the shard owns, at most the cores and lanes_max.
LANES_AUTO = "auto"


def lanes_problem(value: int | str) -> str | None:
    if value == LANES_AUTO or (isinstance(value, int) and value >= 1):
        return None
    return f'must be "auto" or a number of lanes >= 1, got {value!r}'


def positive_problem(value: float) -> str | None:
    return None if value > 0 else f"must be > 0, got {value}"


def not_negative_problem(value: int) -> str | None:
    return None if value >= 0 else f"must be >= 0, got {value}"


def segment_problem(value: int) -> str | None:
    return None if value >= 1 << 20 else "must be at least 1048576 (1 MiB)"


def readable_problem(value: str) -> str | None:
    """A file this process can read (or "" for none)."""
    try:
        if value:
            Path(value).read_bytes()
    except OSError as exc:
        return f"cannot read {value}: {exc.strerror}"
    return None


def ca_file_problem(value: str) -> str | None:
    """A PEM file of CA certificates (or "" for the system's)."""
    if (unreadable := readable_problem(value)) is not None or not value:
        return unreadable
    try:
        ssl.create_default_context(cafile=value)
    except ssl.SSLError as exc:
        return f"{value} holds no PEM CA certificate ({exc.reason})"
    return None


def host_problem(value: str) -> str | None:
    """A host name or IP address (IPv6 in brackets or not), without scheme or port."""
    if not value or _HOST.match(value) or ip(value) is not None:
        return None
    return f"must be a host name or IP address without scheme or port, got {value!r}"


def transform_problem(value: str) -> str | None:
    if not value or value.lstrip().lower().startswith("select") or re.match(r"^[\w.]+:\w+$", value):
        return None
    return f"must be `module:function` or a SQL SELECT over the view `block`, got {value!r}"


def port_range_problem(value: str) -> str | None:
    """A `spark_bridge.handoff.PortRange` as written (or "" for none)."""
    try:
        if value:
            PortRange.parse(value)
    except ValueError as exc:
        return str(exc)
    return None
