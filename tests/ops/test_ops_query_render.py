"""How `hakafka query` prints a result: JSON as the servers answer it."""

from __future__ import annotations

import datetime as dt
import json
import math

import pyarrow as pa

from hakafka.ops.query import render


def test_json_output_is_valid_json_with_nan_and_inf_as_null() -> None:
    # It printed bare NaN and Infinity, which JSON parsers refuse.
    table = pa.table(
        {
            "x": pa.array([1.5, math.nan, math.inf, -math.inf]),
            "at": pa.array([dt.datetime(2026, 11, 24, 9, 0)] * 4, pa.timestamp("ms", "UTC")),
        }
    )
    text = render(table, "json").decode()
    assert json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c))) == [
        {"x": 1.5, "at": "2026-11-24T09:00:00+00:00"},
        {"x": None, "at": "2026-11-24T09:00:00+00:00"},
        {"x": None, "at": "2026-11-24T09:00:00+00:00"},
        {"x": None, "at": "2026-11-24T09:00:00+00:00"},
    ]
    assert render(table.slice(0, 0), "json") == b"[]\n"


def test_arrow_and_csv_output_carry_the_result_as_it_is() -> None:
    table = pa.table({"id": pa.array([1, 2], pa.int64()), "kind": ["a", None]})
    assert pa.ipc.open_stream(render(table, "arrow")).read_all().equals(table)
    assert render(table, "csv").decode().splitlines() == ['"id","kind"', '1,"a"', "2,"]
