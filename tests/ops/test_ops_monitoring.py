"""The Grafana dashboard and the Prometheus alert rules in `monitoring/` query only metrics a
running daemon exports, and the README lists every metric the daemon exports."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from devstack.cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "monitoring" / "grafana-dashboard.json"
ALERTS = ROOT / "monitoring" / "alerts.yml"
# Grafana's range variable is not PromQL: any duration stands for it when parsing.
GRAFANA_RANGE = "$__rate_interval"
LABEL_VALUES = re.compile(r"^label_values\((\w+),\s*\w+\)$")


def selectors(node: Any) -> Iterator[str]:
    """The metric names of every vector selector in a parsed PromQL expression."""
    if isinstance(node, promql_parser.VectorSelector):
        if node.name:  # None for `{__name__=~"..."}`, which the files do not use
            yield node.name
        return
    for attr in ("expr", "lhs", "rhs", "vector_selector", "param"):
        child = getattr(node, attr, None)
        if child is not None:
            yield from selectors(child)
    for child in getattr(node, "args", None) or ():
        yield from selectors(child)


def names_in(expr: str, where: str) -> set[str]:
    try:
        parsed = promql_parser.parse(expr.replace(GRAFANA_RANGE, "5m"))
    except ValueError as exc:
        raise AssertionError(f"{where}: not valid PromQL: {exc}\n{expr}") from exc
    found = set(selectors(parsed))
    assert found, f"{where}: no metric in {expr!r}"
    return found


def dashboard_queries() -> dict[str, str]:
    """Every PromQL query of the dashboard, by panel title and refId."""
    dashboard = json.loads(DASHBOARD.read_text())
    return {
        f"panel {panel['title']!r} {target['refId']}": target["expr"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    }


def dashboard_variables() -> dict[str, str]:
    """The metric each templating variable takes its values from (`label_values(m, l)`)."""
    found = {}
    for variable in json.loads(DASHBOARD.read_text())["templating"]["list"]:
        if variable["type"] == "query":
            match = LABEL_VALUES.match(variable["query"])
            assert match, f"variable {variable['name']}: unexpected query {variable['query']!r}"
            found[f"variable {variable['name']}"] = match.group(1)
    return found


def alert_queries() -> dict[str, str]:
    rules = yaml.safe_load(ALERTS.read_text())
    return {
        f"alert {rule['alert']}": rule["expr"]
        for group in rules["groups"]
        for rule in group["rules"]
    }


def used_metrics() -> dict[str, set[str]]:
    """Metric name -> where the dashboard or the rules use it."""
    used: dict[str, set[str]] = {}
    for where, expr in {**dashboard_queries(), **alert_queries()}.items():
        for name in names_in(expr, where):
            used.setdefault(name, set()).add(where)
    for where, name in dashboard_variables().items():
        used.setdefault(name, set()).add(where)
    return used


def exported(text: str) -> set[str]:
    """Every series name a scrape of `text` can have (a family without samples included)."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "summary": ("_sum", "_count", "_created"),
    }
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(family.name + s for s in suffixes.get(family.type, ()))
    return names


def test_dashboard_and_rules_parse_and_name_their_metrics() -> None:
    used = used_metrics()
    assert len(alert_queries()) >= 8 and len(dashboard_queries()) >= 20
    assert {
        "hakafka_kafka_lag",
        "hakafka_flushes_total",
        "hakafka_leader",
        "hakafka_ready",
        "hakafka_wal_sync_seconds_bucket",
        "hakafka_buffer_limit_bytes",
        "process_resident_memory_bytes",
    } <= used.keys()


@pytest.mark.integration
def test_every_metric_used_is_exported_and_every_exported_metric_is_documented(
    make_cluster: Any,
) -> None:
    cluster: LocalCluster = make_cluster({"n1": [0, 1]})
    cluster.start()
    assert cluster.wait_leaders([0, 1]) == {0: "n1", 1: "n1"}
    code, body = cluster.nodes["n1"].get("/metrics")
    assert code == 200
    scrape = body.decode()
    have = exported(scrape)
    missing = {name: sorted(where) for name, where in used_metrics().items() if name not in have}
    assert missing == {}, f"used by the dashboard or rules but not exported: {missing}"
    readme = (ROOT / "README.md").read_text()
    undocumented = sorted(
        family.name
        for family in text_string_to_metric_families(scrape)
        if family.name.startswith("hakafka_")
        and not family.name.endswith("_created")  # a counter's creation time
        and f"`{family.name}" not in readme
    )
    assert undocumented == []
