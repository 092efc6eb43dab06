"""The status page at the admin endpoint's `/`, opened in a real headless browser (Debian's
`chromium`, which `make install` provides) against a 2-node cluster on the local stack: it
renders both shards with their leaders and epochs, charts with data points, the last flushes,
and nothing on the console; without the token the endpoint answers 401 with a Basic challenge.

Chromium runs as a child of the test (its own process group, stopped by that id), with its
profile under the test's tmp_path and no remote-debugging port. `--dump-dom` and
`--screenshot` run the page's script with a virtual-time budget, so its 2 s refreshes run;
`--enable-logging=stderr` prints every console message as a `CONSOLE` line.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from buffer.push_client import Pusher
from devstack.cluster import DaemonNode, LocalCluster, StackEndpoints
from devstack.process import wait_until
from devstack.records import create_topic, produce

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

TOKEN = "status-page-token"
PARTITIONS = 4
ROWS = 6_000
CHROMIUM_TIMEOUT_S = 90.0
# Virtual time the page runs for before the DOM is dumped: its first fetches plus two refreshes.
PAGE_BUDGET_MS = 5_000


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    ancestors: list[Element]
    text: list[str] = field(default_factory=list)

    def inside(self, other: Element) -> bool:
        return any(a is other for a in self.ancestors)

    @property
    def content(self) -> str:
        return "".join(self.text).strip()


class Dom(HTMLParser):
    """Every element of an HTML document with its ancestors and the text inside it."""

    VOID = frozenset({"meta", "link", "br", "img", "input", "hr"})

    def __init__(self, html: str) -> None:
        super().__init__()
        self.elements: list[Element] = []
        self._open: list[Element] = []
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs}, list(self._open))
        self.elements.append(element)
        if tag not in self.VOID:
            self._open.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append(Element(tag, {k: v or "" for k, v in attrs}, list(self._open)))

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i].tag == tag:
                del self._open[i:]
                return

    def handle_data(self, data: str) -> None:
        for element in self._open:
            element.text.append(data)

    def by_id(self, id_: str) -> Element:
        (found,) = [e for e in self.elements if e.attrs.get("id") == id_]
        return found

    def find(self, tag: str, within: Element | None = None, **attrs: str) -> list[Element]:
        return [
            e
            for e in self.elements
            if e.tag == tag
            and all(e.attrs.get(k.replace("_", "-")) == v for k, v in attrs.items())
            and (within is None or e.inside(within))
        ]


@dataclass(frozen=True)
class Browsed:
    stdout: str
    console: list[str]  # every console message the page logged


def run_chromium(tmp_path: Path, name: str, url: str, *args: str) -> Browsed:
    """Run headless chromium once on `url` (bounded; its whole process group is killed if it
    overruns or leaves helpers behind)."""
    binary = shutil.which("chromium")
    assert binary, "chromium is not installed: `make install` (or `make chromium`) installs it"
    argv = [
        binary,
        "--headless=new",
        "--disable-gpu",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / f'chromium-{name}'}",
        "--enable-logging=stderr",
        "--v=0",
        f"--virtual-time-budget={PAGE_BUDGET_MS}",
        *args,
        url,
    ]
    if os.geteuid() == 0:
        argv.insert(1, "--no-sandbox")  # chromium refuses to run as root with its sandbox
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=CHROMIUM_TIMEOUT_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its group: the zygote and renderers too
        if proc.poll() is None:
            proc.communicate()
    assert proc.returncode == 0, f"chromium exited {proc.returncode}:\n{stderr[-3000:]}"
    console = [line for line in stderr.splitlines() if ":CONSOLE" in line]
    return Browsed(stdout, console)


def get(node: DaemonNode, path: str, authorization: str | None) -> tuple[int, Any, bytes]:
    request = urllib.request.Request(node.url + path)
    if authorization is not None:
        request.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def basic(password: str) -> str:
    return "Basic " + base64.b64encode(f"ops:{password}".encode()).decode()


def history(node: DaemonNode) -> list[dict[str, Any]]:
    code, body = node.get("/status/history")
    assert code == 200, body
    samples: list[dict[str, Any]] = json.loads(body)["samples"]
    return samples


def test_status_page_in_a_headless_browser(
    make_cluster: Any, stack: StackEndpoints, topic_prefix: str, ch_client: Any, tmp_path: Path
) -> None:
    topic = f"{topic_prefix}_events"
    create_topic(stack.kafka, topic, PARTITIONS)
    # Two lanes: each shard's two partitions are read by a lane apiece.
    cluster: LocalCluster = make_cluster(
        {"n1": [0, 1], "n2": [0, 1]}, server={"token": TOKEN}, lanes=2
    )
    cluster.start()
    leaders = cluster.wait_leaders([0, 1])
    name = leaders[0]
    node = cluster.nodes[name]
    led = sorted(s for s, n in leaders.items() if n == name)
    produced = produce(stack.kafka, topic, ROWS, partitions=PARTITIONS)
    wait_until(
        lambda: int(ch_client.command("SELECT count() FROM events")) == len(produced.good),
        timeout=180,
        what=f"all {len(produced.good)} rows in ClickHouse",
        interval=0.5,
    )
    # Two samples after the rows were consumed: the lag and the rows/s lines have points.
    seen = len(history(node))
    wait_until(lambda: len(history(node)) >= seen + 2, timeout=30, what="two more history samples")
    latest = {p["shard"]: p for p in history(node)[-1]["pipelines"]}
    for shard in led:
        rows = sum(1 for p, _ in produced.good if p % 2 == shard)
        assert (latest[shard]["consumed_rows"], latest[shard]["flushed_rows"]) == (rows, rows)

    # A writer pushes a batch into the first shard this node leads (answered once flushed).
    pusher = Pusher(lambda: [node.url], "events", led[0], "page-writer", token=TOKEN)
    batch = pa.table({"id": list(range(40)), "kind": ["push"] * 40, "amount": [0.5] * 40})
    assert pusher.push(0, batch).rows == 40

    # Without the token, or with a wrong one, the page is refused with a Basic challenge.
    for authorization in (None, basic("wrong"), "Bearer wrong"):
        code, headers, _ = get(node, "/", authorization)
        assert code == 401, authorization
        assert 'Basic realm="hakafka"' in headers.get_all("WWW-Authenticate"), authorization
        assert get(node, "/status/history", authorization)[0] == 401
    code, headers, page = get(node, "/", basic(TOKEN))
    assert code == 200 and headers["Content-Type"].startswith("text/html")
    # Self-contained: the only URL in it is the SVG namespace.
    assert page.count(b"://") == page.count(b"http://www.w3.org/2000/svg") == 1

    url = f"http://ops:{TOKEN}@127.0.0.1:{node.http_port}/"
    browsed = run_chromium(tmp_path, "dom", url, "--dump-dom")
    status = node.status()
    assert browsed.console == [], "the page logged to the console:\n" + "\n".join(browsed.console)
    dom = Dom(browsed.stdout)

    assert dom.by_id("node").content == name
    assert dom.by_id("health").content == "healthy"
    assert dom.by_id("error").content == ""
    shards = dom.by_id("shards")
    for shard in (0, 1):
        (tr,) = dom.find("tr", shards, data_shard=str(shard))
        cells = [td.content for td in dom.find("td", tr)]
        (reported,) = [s for s in status["shards"] if s["shard"] == shard]
        assert reported["leader"]["node"] == leaders[shard]
        role = "leader" if shard in led else "follower"
        assert cells[:4] == [
            f"shard {shard}",
            leaders[shard],
            str(reported["leader"]["epoch"]),
            role,
        ]

    # Each pipeline this node leads: its partitions' lag and its last flushes, newest first.
    for shard in led:
        (box,) = dom.find("div", data_pipeline="events", data_shard=str(shard))
        (reported,) = [p for s in status["shards"] if s["shard"] == shard for p in s["pipelines"]]
        assert reported["recent_flushes"], reported
        codes = [c.content for c in dom.find("code", box)]
        assert codes == [f["block_id"] for f in reversed(reported["recent_flushes"])]
        partitions = {int(p) for p in reported["positions"]}
        assert partitions == {p for p in range(PARTITIONS) if p % 2 == shard}
        assert "of 1.0 GiB" in box.content  # the fill against buffer.limit_bytes
        # The lanes: a partition's rank among the shard's, modulo 2; every row of the term.
        (lanes,) = dom.find("table", box, **{"class": "lanes"})
        shown = [[td.content for td in dom.find("td", tr)] for tr in dom.find("tr", lanes)]
        shown = [row for row in shown if row]  # not the header's
        mine = sorted(partitions)
        assert [row[:2] for row in shown] == [["0", f"p{mine[0]}"], ["1", f"p{mine[1]}"]]
        for row, partition in zip(shown, mine, strict=True):
            read = sum(1 for p, _ in produced.good if p == partition)
            assert (row[3], row[4]) == (str(read), "0"), row

    # The pushes: into the first led shard only.
    for shard in led:
        (box,) = dom.find("div", data_pipeline="events", data_shard=str(shard))
        pushes = dom.find("table", box, **{"class": "pushes"})
        if shard != led[0]:
            assert pushes == []
            continue
        (table,) = pushes
        shown = [[td.content for td in dom.find("td", tr)] for tr in dom.find("tr", table)]
        (row,) = [r for r in shown if r]
        assert (row[1], row[2], row[3], row[4]) == ("40", "1", "0", "0"), row

    lag = dom.by_id("lag-chart")
    rate = dom.by_id("rate-chart")
    points = len(dom.find("circle", lag, **{"class": "point"}))
    assert points >= 2 * len(led), f"lag chart: {points} points"
    assert len(dom.find("polyline", lag)) == len(led)
    assert len(dom.find("polyline", rate)) == 2 * len(led)  # consumed and flushed per pipeline
    legend = dom.by_id("rate-legend").content
    for shard in led:
        assert f"events · shard {shard} consumed" in legend
        assert f"events · shard {shard} flushed" in legend

    screenshot = tmp_path / "status-page.png"
    shot = run_chromium(
        tmp_path, "screenshot", url, f"--screenshot={screenshot}", "--window-size=1280,1600"
    )
    assert shot.console == [], "\n".join(shot.console)
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"status page screenshot: {screenshot}")
