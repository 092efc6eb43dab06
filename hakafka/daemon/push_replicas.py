"""Pushed batches copied to the shard's other nodes before they are answered, and gathered
back by the next leader (`pipeline/push.py` says when each is used).

Leader side (`PushReplicas`, one per pipeline and term): `replicate` sends a batch to every
other candidate of the shard (`POST /replica/push` with the term's epoch) on a shared pool
and resolves True once `acks` of them stored it, False once too few can; `recover` gathers
every copy of the pipeline's shard from this node's store and from the other candidates
(`POST /replica/fetch`), each raising its fence to the term's epoch first.
Node side (`ReplicaRoutes`): those two routes over this node's `ReplicaStore`; a node that
leads the shard refuses copies of it (409), as the store refuses an older epoch.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlencode

import pyarrow as pa
import structlog

from buffer.auth import bearer_header
from buffer.client import open_url
from buffer.formats import encode_arrow
from buffer.http import Reply
from buffer.tls import ClientTls
from hakafka.daemon.replica_store import (
    ReplicaStore,
    StaleEpochError,
    StoredBatch,
    decode_batches,
    encode_batches,
)
from hakafka.pipeline.push import RecoveredBatch

log = structlog.get_logger("hakafka.push")

REQUEST_TIMEOUT_S = 5.0  # one copy's request; a peer slower than this does not count


@dataclass
class PushReplicas:
    """The copies of one pipeline's pushed batches in one term (see the module)."""

    store: ReplicaStore
    pipeline: str
    shard: int
    epoch: int
    peers: Callable[[], Sequence[str]]  # the other candidates' HTTP base URLs, now
    has_writers: Callable[[], bool]  # any push writer bound to the shard (else no copies)
    pool: ThreadPoolExecutor
    token: str | None = None
    tls: ClientTls | None = None

    def replicate(
        self, partition: int, sequence: int, rows: pa.RecordBatch, acks: int, trim: int
    ) -> Future[bool]:
        """Send the batch to every peer; True once `acks` stored it, False once they cannot
        (too few peers, or too many failed). `trim`: the writer's checkpoint (older copies
        go)."""
        done: Future[bool] = Future()
        peers = list(self.peers())
        if len(peers) < acks:
            done.set_result(False)
            return done
        body = encode_arrow(rows)
        params = {
            "pipeline": self.pipeline,
            "shard": self.shard,
            "epoch": self.epoch,
            "partition": partition,
            "sequence": sequence,
            "rows": rows.num_rows,
            "trim": trim,
        }
        tally = _Tally(done, acks, len(peers))
        for url in peers:
            self.pool.submit(self._send, url, params, body).add_done_callback(tally.count)
        return done

    def _send(self, url: str, params: dict[str, object], body: bytes) -> bool:
        try:
            status, _ = _post(url, "/replica/push", params, body, token=self.token, tls=self.tls)
        except OSError as exc:
            log.warning("push.copy_failed", peer=url, error=str(exc))
            return False
        return status == 200

    def recover(self) -> list[RecoveredBatch]:
        """Every copy of the pipeline's shard: this node's and each peer's that answers
        within REQUEST_TIMEOUT_S, asked at once (fences raised to this term's epoch). None
        without a writer bound to the shard: no push was ever answered there."""
        if not self.has_writers():
            return []
        found = {(b.partition, b.sequence): b for b in self._gathered()}
        return [
            RecoveredBatch(b.partition, b.sequence, pa.ipc.open_stream(b.body).read_next_batch())
            for b in sorted(found.values(), key=lambda b: (b.partition, b.sequence))
        ]

    def _gathered(self) -> list[StoredBatch]:
        batches = self.store.gather(self.pipeline, self.shard, self.epoch)
        asked = {url: self.pool.submit(self._fetch, url) for url in self.peers()}
        for url, answer in asked.items():
            try:
                batches += answer.result(REQUEST_TIMEOUT_S + 1.0)
            except (OSError, ValueError, TimeoutError) as exc:
                # Gone, or not answering: the copies it holds (if any) are not seen; a batch
                # answered with copies only there is lost with it (push_acks says how many).
                log.warning("push.peer_not_gathered", peer=url, error=str(exc))
        return batches

    def _fetch(self, url: str) -> list[StoredBatch]:
        params = {"pipeline": self.pipeline, "shard": self.shard, "epoch": self.epoch}
        status, raw = _post(url, "/replica/fetch", params, b"", token=self.token, tls=self.tls)
        if status != 200:
            raise OSError(f"HTTP {status}: {raw[:200]!r}")
        return decode_batches(raw)


@dataclass
class _Tally:
    """Resolves `done` once `needed` sends succeeded (True) or too many failed (False)."""

    done: Future[bool]
    needed: int
    sent: int
    ok: int = 0
    failed: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def count(self, sent: Future[bool]) -> None:
        with self._lock:
            if not sent.cancelled() and sent.exception() is None and sent.result():
                self.ok += 1
            else:
                self.failed += 1
            outcome = (
                True
                if self.ok >= self.needed
                else False
                if self.sent - self.failed < self.needed
                else None
            )
        if outcome is not None and not self.done.done():
            self.done.set_result(outcome)


@dataclass(frozen=True)
class ReplicaRoutes:
    """`POST /replica/push` and `/replica/fetch` over this node's `store`; `leads(shard)`:
    whether this node leads the shard now; `leader_epoch(shard)`: the epoch of the shard's
    leader as ZooKeeper has it (None: none, or ZooKeeper cannot say)."""

    store: ReplicaStore
    leads: Callable[[int], bool]
    leader_epoch: Callable[[int], int | None]

    def push(self, params: dict[str, str], content_type: str, body: bytes) -> Reply:
        try:
            shard = int(params["shard"])
            batch = StoredBatch(
                int(params["partition"]), int(params["sequence"]), int(params["rows"]), body
            )
            epoch, trim, pipeline = int(params["epoch"]), int(params["trim"]), params["pipeline"]
        except (KeyError, ValueError) as exc:
            return _json(400, {"error": "bad_request", "message": f"parameter {exc}"})
        if self.leads(shard):
            message = f"this node leads shard {shard}: it keeps no copies of it"
            return _json(409, {"error": "leader", "message": message})
        current = self.leader_epoch(shard)
        if current is not None and epoch < current:
            # A leader cut off from ZooKeeper that has not noticed yet: its answer must not
            # rest on a copy the shard's next leader may already have gathered without.
            message = f"a copy from epoch {epoch}; shard {shard}'s leader has epoch {current}"
            return _json(409, {"error": "stale_epoch", "message": message})
        try:
            self.store.store(pipeline, shard, epoch, batch, trim)
        except StaleEpochError as exc:
            return _json(409, {"error": "stale_epoch", "message": str(exc)})
        except ValueError as exc:
            return _json(400, {"error": "bad_request", "message": str(exc)})
        return _json(200, {"stored": True})

    def fetch(self, params: dict[str, str], content_type: str, body: bytes) -> Reply:
        try:
            pipeline, shard, epoch = params["pipeline"], int(params["shard"]), int(params["epoch"])
            batches = self.store.gather(pipeline, shard, epoch)
        except (KeyError, ValueError) as exc:
            return _json(400, {"error": "bad_request", "message": f"parameter {exc}"})
        return Reply(200, "application/octet-stream", encode_batches(batches))


def _json(status: int, body: dict[str, object]) -> Reply:
    return Reply(status, "application/json", json.dumps(body).encode())


def _post(
    url: str,
    route: str,
    params: dict[str, object],
    body: bytes,
    *,
    token: str | None,
    tls: ClientTls | None,
) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/octet-stream"}
    if token is not None:
        headers["Authorization"] = bearer_header(token)
    request = urllib.request.Request(
        f"{url.rstrip('/')}{route}?{urlencode(params)}", data=body, method="POST", headers=headers
    )
    try:
        with open_url(request, tls, REQUEST_TIMEOUT_S) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, bytes(exc.read())
