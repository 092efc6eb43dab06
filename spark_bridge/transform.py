"""Optional per-block transforms: a Python callable ``module:function`` or a SQL SELECT.

A transform must be deterministic and must not change the partitioning (no joins, no
aggregations, no repartition, no ORDER BY across the block): each Spark task's rows are one
ClickHouse insert whose deduplication token names the task, so a re-flush must put the same
rows in the same task. `check_partitioning` refuses plans that contain a shuffle.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

Transform = Callable[["DataFrame"], "DataFrame"]

BLOCK_VIEW = "block"
_CALLABLE_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_COMMENT_RE = re.compile(r"--[^\n]*|/\*.*?\*/", re.DOTALL)
_SELECT_RE = re.compile(r"^\s*(?:select|with)\b", re.IGNORECASE)


class TransformError(ValueError):
    """A transform that cannot be loaded or would break deterministic tasks."""


@dataclass(frozen=True)
class SqlTransform:
    """A SELECT over the view ``block`` (the block's DataFrame)."""

    sql: str

    def __post_init__(self) -> None:
        body = _COMMENT_RE.sub(" ", self.sql).strip().rstrip(";").strip()
        if not _SELECT_RE.match(body) or ";" in body:
            raise TransformError(
                f"SQL transform must be a single SELECT over the view {BLOCK_VIEW!r}: {self.sql!r}"
            )

    def __call__(self, df: DataFrame) -> DataFrame:
        body = _COMMENT_RE.sub(" ", self.sql).strip().rstrip(";")
        # `block` is a CTE over a per-call view, so concurrent flushes never share a name;
        # braces are doubled because spark.sql formats the text when given DataFrames.
        escaped = body.replace("{", "{{").replace("}", "}}")
        wrapped = f"WITH {BLOCK_VIEW} AS (SELECT * FROM {{bridge_block}}) SELECT * FROM ({escaped})"
        return df.sparkSession.sql(wrapped, bridge_block=df)


def load_transform(spec: str) -> Transform:
    """The transform named by `spec`: ``package.module:function`` or a SQL SELECT."""
    text = spec.strip()
    if _CALLABLE_RE.match(text):
        module_name, _, attr = text.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise TransformError(f"transform {spec!r}: cannot import {module_name}: {exc}") from exc
        function = getattr(module, attr, None)
        if not callable(function):
            raise TransformError(f"transform {spec!r}: {module_name} has no callable {attr!r}")
        transform: Transform = function
        return transform
    return SqlTransform(text)


def check_partitioning(df: DataFrame, what: str) -> None:
    """Raise `TransformError` if `df`'s physical plan shuffles (contains an Exchange)."""
    plan = physical_plan(df)
    if "Exchange" in plan:
        raise TransformError(
            f"{what} changes the partitioning (its plan contains a shuffle); transforms must be"
            f" row-local and deterministic:\n{plan}"
        )


def physical_plan(df: DataFrame) -> str:
    """The physical plan text of `df` (classic and Spark Connect sessions)."""
    explain = getattr(df, "_explain_string", None)
    if explain is not None:  # Spark Connect
        return str(explain(mode="simple"))
    jvm: Any = df.sparkSession.sparkContext._jvm
    return str(jvm.PythonSQLUtils.explainString(df._jdf.queryExecution(), "simple"))
