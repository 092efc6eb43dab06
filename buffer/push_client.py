"""A writer's client of `POST /insert` and Flight `do_put`: pushes one batch at a time to the
shard's leader and retries it, the same (writer, sequence), until it is acknowledged (which
the server applies once however often it arrives).

Where to push: `urls()` gives the nodes to try (asked again before each round, so a caller
that reads the cluster's registry follows a failover): HTTP base URLs (``http://host:8300``,
`POST /insert`) or Flight ones (``grpc://host:8301``, `do_put`). A node that does not lead
the shard answers 421 naming the leader's address, which is tried next (one hop). Not now
(429 at the buffer limit, 503 no pipeline running, 504 not flushed in time, a refused or dropped
connection): the batch is pushed again after the server's Retry-After, or a short pause, up
to `wait_s`. A batch the server refuses as such (400) or a refused token (401, 403) fails at
once: pushing it again cannot help.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import pyarrow as pa
import pyarrow.flight as fl

from buffer.auth import bearer_header
from buffer.client import open_url, require_tls
from buffer.formats import encode_arrow
from buffer.tls import ClientTls
from retry_policy import Backoff

ARROW_STREAM = "application/vnd.apache.arrow.stream"
_AGAIN = frozenset({421, 429, 502, 503, 504})


class PushRejectedError(Exception):
    """The server refused the batch (400), the token (401, 403), or the batch's place (409:
    a higher sequence of the writer was applied before it; two pushers with one writer id):
    the message is its own."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class PushUnavailableError(Exception):
    """No node acknowledged the batch within the wait; the message names the last reason."""


@dataclass(frozen=True)
class Pushed:
    """An acknowledged batch: `rows` applied (0 and `duplicate` for a batch applied before),
    after `attempts` requests."""

    rows: int
    duplicate: bool
    attempts: int


@dataclass
class Pusher:
    """Pushes `writer`'s batches into `pipeline` of `shard`, at the nodes `urls()` names."""

    urls: Callable[[], Sequence[str]]
    pipeline: str
    shard: int
    writer: str
    token: str | None = None
    tls: ClientTls | None = None
    wait_s: float = 120.0
    """How long one batch may take, retries included, before PushUnavailableError."""
    request_timeout_s: float = 75.0
    """One request's wait: longer than the server's own (60 s), which then answers 504."""
    retry: Backoff = field(default_factory=lambda: Backoff(0.2, 2.0, jitter=0.5))
    _leader: str | None = None  # the last node that acknowledged, tried first
    _flight: dict[str, fl.FlightClient] = field(default_factory=dict, repr=False)
    """Flight connections kept per address (a writer pushes one batch at a time)."""

    def close(self) -> None:
        """Close the Flight connections kept (the pusher opens new ones if used again)."""
        clients, self._flight = list(self._flight.values()), {}
        for client in clients:
            client.close()

    def push(self, sequence: int, batch: pa.Table | pa.RecordBatch) -> Pushed:
        """Push `batch` as `sequence` until acknowledged (see the module)."""
        table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
        body = _Body(table)
        deadline = time.monotonic() + self.wait_s
        attempts, rounds, last, pause = 0, 0, "no node to push to", 0.0
        while True:
            tried: set[str] = set()
            busy: str | None = None  # a leader whose buffer is full: asked first next round
            queue = deque([*([self._leader] if self._leader else []), *self.urls()])
            while queue:
                url = queue.popleft()
                if url in tried:
                    continue
                tried.add(url)
                attempts += 1
                answer = self._post(url, sequence, body)
                if answer.status == 200:
                    self._leader = url
                    return Pushed(
                        int(answer.body["rows"]), bool(answer.body["duplicate"]), attempts
                    )
                last = f"{url}: {answer.message}"
                if answer.status not in _AGAIN:
                    raise PushRejectedError(answer.message, answer.status)
                pause = max(pause, answer.retry_after_s)
                if answer.status == 429:
                    busy = url
                leader = answer.body.get("flight" if _is_flight(url) else "http")
                if answer.status == 421 and isinstance(leader, str):
                    queue.appendleft(leader)  # the hop the node named
            self._leader = busy
            rounds += 1
            left = deadline - time.monotonic()
            if left <= 0:
                raise PushUnavailableError(
                    f"writer {self.writer} sequence {sequence} to pipeline {self.pipeline} "
                    f"shard {self.shard}: not acknowledged within {self.wait_s:g} s "
                    f"(last: {last})"
                )
            time.sleep(min(left, max(pause, self.retry.delay(rounds))))
            pause = 0.0

    def _post(self, url: str, sequence: int, body: _Body) -> _Answer:
        """One push to `url`; a failed connection answers as a 503 would."""
        if _is_flight(url):
            return self._put(url, sequence, body.table)
        params = urlencode(
            {
                "pipeline": self.pipeline,
                "shard": self.shard,
                "writer": self.writer,
                "sequence": sequence,
            }
        )
        headers = {"Content-Type": ARROW_STREAM}
        if self.token is not None:
            headers["Authorization"] = bearer_header(self.token)
        request = urllib.request.Request(
            f"{url.rstrip('/')}/insert?{params}", data=body.ipc(), method="POST", headers=headers
        )
        try:
            with open_url(request, self.tls, self.request_timeout_s) as response:
                return _Answer(int(response.status), _json(response.read()), 0.0)
        except urllib.error.HTTPError as exc:
            retry_after = exc.headers.get("Retry-After", "") if exc.headers else ""
            wait = float(retry_after) if retry_after.isdigit() else 0.0
            return _Answer(exc.code, _json(exc.read()), wait)
        except (urllib.error.URLError, OSError) as exc:
            return _Answer(503, {"message": f"no answer ({exc})"}, 0.0)

    def _put(self, url: str, sequence: int, table: pa.Table) -> _Answer:
        """One Flight `do_put` to `url`, its outcome as the HTTP route would answer."""
        path = [self.pipeline, str(self.shard), self.writer, str(sequence)]
        headers = (
            [] if self.token is None else [(b"authorization", bearer_header(self.token).encode())]
        )
        options = fl.FlightCallOptions(timeout=self.request_timeout_s, headers=headers)
        try:
            client = self._flight.get(url)
            if client is None:
                client = self._flight[url] = _flight_client(url, self.tls)
            writer, metadata = client.do_put(
                fl.FlightDescriptor.for_path(*path), table.schema, options
            )
            with writer:
                writer.write_table(table)
                writer.done_writing()
                answer = metadata.read()
            return _Answer(200, _json(b"" if answer is None else answer.to_pybytes()), 0.0)
        except fl.FlightUnauthenticatedError as exc:
            return _Answer(401, {"message": str(exc)}, 0.0)
        except fl.FlightTimedOutError as exc:
            return _Answer(504, _flight_answer(exc), 0.0)
        except fl.FlightUnavailableError as exc:
            found = _flight_answer(exc)
            kinds = {"not_leader": 421, "buffer_full": 429}
            return _Answer(
                kinds.get(str(found.get("error")), 503),
                found,
                1.0 if found.get("error") == "buffer_full" else 0.0,
            )
        except fl.FlightServerError as exc:
            found = _flight_answer(exc)
            return _Answer(409 if found.get("error") == "out_of_order" else 400, found, 0.0)
        except (fl.FlightError, OSError) as exc:
            if (dropped := self._flight.pop(url, None)) is not None:
                dropped.close()  # a connection that failed is not used again
            return _Answer(503, {"message": f"no answer ({exc})"}, 0.0)


def _is_flight(url: str) -> bool:
    return url.startswith("grpc")


def _flight_client(url: str, tls: ClientTls | None) -> fl.FlightClient:
    require_tls(url, tls)
    return fl.connect(url, tls_root_certs=None if tls is None else tls.root_certs())


def _flight_answer(exc: fl.FlightError) -> dict[str, Any]:
    """The JSON answer a Flight error carries as its extra info (else its kind there), with
    the error's message where the answer has none."""
    found: dict[str, Any] = {}
    if exc.extra_info:
        try:
            value = json.loads(exc.extra_info)
        except ValueError:
            value = {"error": exc.extra_info.decode("utf-8", "replace")}
        found = value if isinstance(value, dict) else {}
    found.setdefault("message", str(exc).split(". Detail:")[0])
    return found


@dataclass
class _Body:
    """A batch to push, encoded as an Arrow IPC stream once, when HTTP needs it."""

    table: pa.Table
    _ipc: bytes | None = None

    def ipc(self) -> bytes:
        if self._ipc is None:
            self._ipc = encode_arrow(self.table)
        return self._ipc


@dataclass(frozen=True)
class _Answer:
    status: int
    body: dict[str, Any]
    retry_after_s: float

    @property
    def message(self) -> str:
        return str(self.body.get("message", f"HTTP {self.status}"))


def _json(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        return {"message": raw[:200].decode("utf-8", "replace")}
    return value if isinstance(value, dict) else {"message": str(value)}
