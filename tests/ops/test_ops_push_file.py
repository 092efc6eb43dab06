"""`hakafka push`'s reading of a file: cut into batches of exactly N rows, the same cut on every
run (a re-run's batches keep their sequences), whatever the format; errors name the file."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from hakafka.ops import push
from hakafka.ops.cluster import UsageError


def cut(path: Path, fmt: push.FileFormat, rows: int) -> list[list[str]]:
    progress = push.Progress()
    found = [
        t.column("id").cast(pa.string()).to_pylist()
        for t in push.batches(path, fmt, rows, progress)
    ]
    assert progress.bytes_read == path.stat().st_size
    return found


def test_each_format_is_cut_into_the_same_batches(tmp_path: Path) -> None:
    ids = [str(i) for i in range(25)]
    csv_file = tmp_path / "rows.csv"
    csv_file.write_text("id,kind\n" + "".join(f"{i},k\n" for i in ids))
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("".join(f'{{"id": {i}, "kind": "k"}}\n' for i in ids))
    arrow = tmp_path / "rows.arrow"
    table = pa.table({"id": list(range(25)), "kind": ["k"] * 25})
    with pa.ipc.new_file(arrow, table.schema) as writer:
        for part in table.to_batches(max_chunksize=7):
            writer.write_batch(part)
    expected = [ids[0:10], ids[10:20], ids[20:25]]
    for path in (csv_file, jsonl, arrow):
        fmt = push.file_format(path, None)
        assert cut(path, fmt, 10) == expected, path
    # CSV values are text (the leader casts them) and an empty field is null.
    csv_file.write_text("id,kind\n1,\n2,x\n")
    (first,) = push.batches(csv_file, push.FileFormat.CSV, 10, push.Progress())
    assert first.column("kind").to_pylist() == [None, "x"]


def test_the_default_writer_is_the_same_for_the_same_file(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    assert push.default_writer(path) == push.default_writer(tmp_path / "." / "rows.csv")
    assert push.default_writer(path) != push.default_writer(tmp_path / "other.csv")


def test_unreadable_input_names_the_file_and_where(tmp_path: Path) -> None:
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text('{"id": 1}\n{"id": 2}\n{"id": \n')
    with pytest.raises(
        push.FileReadError, match=r"rows.jsonl: the 1 rows up to line 3 are not JSONEachRow"
    ):
        list(push.batches(jsonl, push.FileFormat.JSON_EACH_ROW, 2, push.Progress()))
    with pytest.raises(push.FileReadError, match="not an Arrow IPC stream or file"):
        list(push.batches(jsonl, push.FileFormat.ARROW, 2, push.Progress()))
    with pytest.raises(UsageError, match=r"rows.txt: name its format with --format"):
        push.file_format(tmp_path / "rows.txt", None)
