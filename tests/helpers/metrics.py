"""Prometheus samples of one daemon node, read from its /metrics."""

from __future__ import annotations

from typing import Any


def samples(node: Any, name: str) -> dict[str, float]:
    """A metric's samples on `node`'s /metrics, by their label text (`{shard="0"}`, or "" for
    a sample without labels); asserts that /metrics answers 200."""
    code, body = node.get("/metrics")
    assert code == 200
    found = {}
    for line in body.decode().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            labels, value = line.rsplit(" ", 1)
            found[labels.removeprefix(name)] = float(value)
    return found


def metric(node: Any, name: str) -> float:
    """The sum of a metric's samples on `node`'s /metrics (0 if it has none)."""
    return sum(samples(node, name).values())
