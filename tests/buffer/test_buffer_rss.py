"""The byte accounting (Arrow buffer sizes) is within 10% of the real RSS growth."""

from __future__ import annotations

import json

from tests.fresh import fresh_python

# Runs in a fresh interpreter so nothing else in the test session moves its RSS. Batches are
# built the way a decoder builds them: from Python values, 10k rows at a time.
SCRIPT = """
import gc, json, os
import pyarrow as pa
from buffer import MemoryTable, OffsetRange

PAGE = os.sysconf("SC_PAGE_SIZE")

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE

schema = pa.schema([("_offset", pa.int64()), ("amount", pa.float64()), ("key", pa.string())])
n = 10_000

def batch(i):
    offs = range(i * n, (i + 1) * n)
    return pa.record_batch(
        {"_offset": list(offs), "amount": [o * 0.5 for o in offs], "key": [f"k{o}" for o in offs]},
        schema=schema,
    )

table = MemoryTable("rss", schema, limit_bytes=1 << 40)
batch(0)
gc.collect()
before = rss()
i = 0
while table.nbytes < 200 << 20:
    table.append(batch(i), {("t", 0): OffsetRange(i * n, (i + 1) * n - 1)})
    i += 1
gc.collect()
print(json.dumps({"accounted": table.nbytes, "rss_growth": rss() - before,
                  "pool": pa.default_memory_pool().backend_name}))
"""


def test_accounted_bytes_match_rss_growth_within_10_percent() -> None:
    out = fresh_python(SCRIPT, timeout=240, env={"ARROW_DEFAULT_MEMORY_POOL": "jemalloc"})
    result = json.loads(out)
    assert result["pool"] == "jemalloc"
    assert result["accounted"] >= 200 << 20
    ratio = result["rss_growth"] / result["accounted"]
    assert 0.9 <= ratio <= 1.1, result
