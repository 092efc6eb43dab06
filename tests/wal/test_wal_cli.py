"""`python -m wal inspect|verify DIR`: output and exit codes."""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from wal import Position
from wal.cli import main
from wal.segment import segment_name

Flip = Callable[[Path, int, int], bytes]
FillLog = Callable[..., list[tuple[Position, bytes, bytes]]]

REPO = Path(__file__).resolve().parents[2]


def test_inspect_lists_segments_counts_sizes_and_headers(tmp_path: Path, fill_log: FillLog) -> None:
    fill_log(tmp_path, [1000] * 10, segment_bytes=4000)
    out = io.StringIO()
    assert main(["inspect", str(tmp_path)], out) == 0
    text = out.getvalue()
    for index in range(4):
        size = (tmp_path / segment_name(index)).stat().st_size
        assert f"{segment_name(index)}" in text
        assert str(size) in text
    assert '{"seq": 0} / {"seq": 2}' in text
    assert "total: 4 segment(s), 10 record(s)" in text
    assert "CORRUPT" not in text and "TORN" not in text


def test_verify_reports_damage_with_position_and_exits_1(
    tmp_path: Path, fill_log: FillLog, flip: Flip
) -> None:
    written = fill_log(tmp_path, [1000] * 10, segment_bytes=4000)
    damaged = written[4][0]
    path = tmp_path / segment_name(damaged.segment)
    data = flip(path, damaged.offset + 100, 0xFF)
    result = subprocess.run(
        [sys.executable, "-m", "wal", "verify", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert f"CORRUPT: segment {damaged.segment}" in result.stdout
    assert f"at byte {damaged.offset}: record CRC mismatch" in result.stdout
    assert path.read_bytes() == data  # verify changes nothing


def test_verify_reports_torn_tail_and_clean_log(tmp_path: Path, fill_log: FillLog) -> None:
    written = fill_log(tmp_path, [1000] * 3)
    out = io.StringIO()
    assert main(["verify", str(tmp_path)], out) == 0
    assert out.getvalue().startswith(f"OK: {tmp_path}: 1 segment(s), 3 record(s)")
    path = tmp_path / segment_name(0)
    with open(path, "r+b") as file:
        file.truncate(path.stat().st_size - 1)
    out = io.StringIO()
    assert main(["verify", str(tmp_path)], out) == 1
    assert f"TORN TAIL: {path} at byte {written[2][0].offset}:" in out.getvalue()


def test_missing_directory_is_a_usage_error(tmp_path: Path) -> None:
    assert main(["verify", str(tmp_path / "nope")], io.StringIO()) == 2
