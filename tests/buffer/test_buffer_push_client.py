"""`buffer.push_client.Pusher` against a stand-in HTTP server that answers as a leader, a
follower or a node that cannot take the batch now: it follows the named leader, retries the
same (writer, sequence) until acknowledged, and fails at once on a refused batch."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

import pyarrow as pa
import pytest

from buffer.flight import FlightQueryServer
from buffer.http import Reply
from buffer.limits import ServerLimits
from buffer.push_client import Pushed, Pusher, PushRejectedError, PushUnavailableError
from buffer.sql import SqlEngine
from hakafka.daemon.insert_route import PUT_PATH
from retry_policy import Backoff

Answer = tuple[int, dict[str, object]]


@dataclass
class Script:
    """What the stand-in answers, in order (the last one repeats), and what it was sent."""

    answers: list[Answer]
    seen: list[tuple[str, dict[str, str], int]] = field(default_factory=list)

    def next(self) -> Answer:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def serve(script: Script) -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            rows = pa.ipc.open_stream(body).read_all().num_rows
            query = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
            script.seen.append((self.headers.get("Authorization", ""), query, rows))
            status, answer = script.next()
            raw = json.dumps(answer).encode()
            self.send_response(status)
            if status in (429, 503):
                self.send_header("Retry-After", "1")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *_args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def leader() -> Iterator[tuple[str, Script]]:
    script = Script([(200, {"rows": 3, "duplicate": False})])
    for url in serve(script):
        yield url, script


def quick(urls: list[str], wait_s: float = 10.0) -> Pusher:
    return Pusher(
        lambda: urls, "events", 0, "w", token="t0k", wait_s=wait_s, retry=Backoff(0.01, 0.05)
    )


BATCH = pa.table({"id": [1, 2, 3]})


def test_a_follower_names_the_leader_and_the_push_goes_there(
    leader: tuple[str, Script],
) -> None:
    leader_url, at_leader = leader
    follower = Script([(421, {"message": "not the leader", "http": leader_url})])
    for follower_url in serve(follower):
        pusher = quick([follower_url])
        assert pusher.push(7, BATCH) == Pushed(3, False, 2)
        # The leader is remembered: the next batch goes straight to it.
        assert pusher.push(8, BATCH) == Pushed(3, False, 1)
    assert len(follower.seen) == 1
    sent = [
        (auth, q["writer"], q["sequence"], q["pipeline"], q["shard"], n)
        for auth, q, n in at_leader.seen
    ]
    assert sent == [
        ("Bearer t0k", "w", "7", "events", "0", 3),
        ("Bearer t0k", "w", "8", "events", "0", 3),
    ]


def test_not_now_is_retried_as_the_same_batch_until_acknowledged() -> None:
    script = Script(
        [
            (503, {"message": "pipeline events of shard 0 is recovering"}),
            (504, {"message": "not flushed within 60 s"}),
            (200, {"rows": 0, "duplicate": True}),
        ]
    )
    for url in serve(script):
        # A dead node first (connection refused): the next one is tried.
        assert quick(["http://127.0.0.1:1", url]).push(4, BATCH) == Pushed(0, True, 6)
    assert [q["sequence"] for _, q, _ in script.seen] == ["4", "4", "4"]


def test_a_refused_batch_fails_at_once_with_the_servers_reason() -> None:
    script = Script([(400, {"message": "column 'kind', row 1: null in a required column"})])
    for url in serve(script):
        with pytest.raises(PushRejectedError, match="column 'kind', row 1") as refused:
            quick([url]).push(0, BATCH)
    assert refused.value.status == 400 and len(script.seen) == 1


def test_a_batch_pushed_out_of_order_fails_at_once_as_409() -> None:
    message = "sequence 5 of this writer is below where it is and was never applied"
    script = Script([(409, {"error": "out_of_order", "message": message})])
    for url in serve(script):
        with pytest.raises(PushRejectedError, match="sequence 5 of this writer") as refused:
            quick([url]).push(5, BATCH)
    assert refused.value.status == 409 and len(script.seen) == 1


def test_past_the_wait_it_fails_naming_the_last_reason() -> None:
    script = Script([(429, {"message": "buffer at its limit"})])
    for url in serve(script):
        with pytest.raises(
            PushUnavailableError, match=r"sequence 2 .* within 1.5 s .*buffer at its limit"
        ):
            quick([url], wait_s=1.5).push(2, BATCH)
    # Retry-After (1 s) is honoured: no tight loop.
    assert 2 <= len(script.seen) <= 3


def flight_server(engine: SqlEngine, script: Script) -> FlightQueryServer:
    def put(path: list[str], table: pa.Table) -> Reply:
        script.seen.append(("", dict(zip(PUT_PATH, path, strict=True)), table.num_rows))
        status, answer = script.next()
        return Reply(status, "application/json", json.dumps(answer).encode())

    return FlightQueryServer(engine, put=put, limits=ServerLimits(max_request_bytes=64 << 10))


def test_over_flight_a_follower_names_the_leader_and_not_now_is_retried(
    engine: SqlEngine,
) -> None:
    at_leader = Script(
        [
            (429, {"error": "buffer_full", "message": "buffer at its limit"}),
            (200, {"rows": 3, "duplicate": False}),
        ]
    )
    leader = flight_server(engine, at_leader)
    follower_script = Script(
        [(421, {"error": "not_leader", "message": "no", "flight": leader.location})]
    )
    follower = flight_server(engine, follower_script)
    try:
        pusher = quick([follower.location])
        assert pusher.push(5, BATCH) == Pushed(3, False, 3)
    finally:
        leader.shutdown()
        follower.shutdown()
    assert [
        (q["pipeline"], q["shard"], q["writer"], q["sequence"], n) for _, q, n in at_leader.seen
    ] == [("events", "0", "w", "5", 3)] * 2


def test_over_flight_a_bad_batch_fails_with_its_reason_and_a_large_one_is_cut_off(
    engine: SqlEngine,
) -> None:
    script = Script(
        [
            (400, {"error": "bad_batch", "message": "column 'kind', row 1: null"}),
            (409, {"error": "out_of_order", "message": "sequence 1 of this writer is below"}),
        ]
    )
    server = flight_server(engine, script)
    try:
        with pytest.raises(PushRejectedError, match=r"column 'kind', row 1: null") as bad:
            quick([server.location]).push(0, BATCH)
        assert bad.value.status == 400
        with pytest.raises(PushRejectedError, match=r"sequence 1 of this writer") as twice:
            quick([server.location]).push(1, BATCH)
        assert twice.value.status == 409
        large = pa.table({"id": list(range(20_000))})  # 160 KB, over the 64 KiB bound
        with pytest.raises(PushRejectedError, match=r"more than 65536 bytes in one put"):
            quick([server.location]).push(1, large)
    finally:
        server.shutdown()
    assert len(script.seen) == 2  # the large one never reached the handler
