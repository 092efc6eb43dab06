"""`POST /insert?pipeline=P&writer=W&sequence=N[&shard=S]`, and Flight `do_put` with the path
descriptor `[P, S, W, N]`: a batch pushed into a pipeline's buffer on this node, which must
lead the shard (`PipelineLeader.push`, `pipeline/push.py`).

The HTTP body is an Arrow IPC stream (`Content-Type: application/vnd.apache.arrow.stream`)
or JSONEachRow (`application/x-ndjson`, one object per line). Answers are JSON (over Flight:
the put's metadata, or an error's extra info, `buffer.flight`):
- 200 `{"rows": n, "duplicate": false}` once a checkpoint covers the batch (`duplicate`
  true, rows 0: a retry of a batch applied before);
- 400 a parameter or a batch that does not fit, naming the column, the row and why;
- 421 this node does not lead the shard (it may not even serve it: any node of the cluster
  takes pushes for any shard this way): the answer names the leader and its HTTP and
  Flight addresses;
- 409 a batch below the writer's position that was never applied: the writer pushed a
  higher sequence before it (two pushers with one writer id), so it cannot be applied;
- 429 / 503 not now (the buffer at its limit; the pipeline not consuming), with Retry-After;
- 504 not answered within the timeout: push the same batch again, it is applied once.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.json as pa_json

from buffer.http import Reply
from hakafka.coordination import CoordinationError
from hakafka.daemon.shard import ShardRunner
from hakafka.pipeline import PipelineLeader
from hakafka.pipeline.push import PushError, PushOutOfOrderError, PushRefusedError

ARROW_STREAM = "application/vnd.apache.arrow.stream"
JSON_EACH_ROW = ("application/x-ndjson", "application/json")
PUSH_TIMEOUT_S = 60.0  # a batch waits for its flush (seconds: the buffer's min_age)
PUT_PATH = ("pipeline", "shard", "writer", "sequence")  # a Flight put's descriptor path
_DIGITS = re.compile(r"[0-9]{1,19}")


class _BadRequestError(ValueError):
    """A parameter or body that is not a push (400)."""


@dataclass(frozen=True)
class InsertRoute:
    """The `buffer.http.PostRoute` handler of `/insert` (and, `put`, the Flight server's)
    over this node's shard `runners`; `leader_of(shard)` names the shard's leader and its
    HTTP and Flight addresses (None: no leader)."""

    runners: Callable[[], Sequence[ShardRunner]]
    leader_of: Callable[[int], tuple[str, str, str] | None]
    configured: Callable[[], frozenset[str]]  # the pipelines of this node's config
    shard_count: Callable[[], int]  # the cluster's, as this node's config says
    timeout_s: float = PUSH_TIMEOUT_S

    def __call__(self, params: dict[str, str], content_type: str, body: bytes) -> Reply:
        return self._push(params, lambda: _table(content_type, body))

    def put(self, path: list[str], table: pa.Table) -> Reply:
        """A Flight put whose descriptor path is `[pipeline, shard, writer, sequence]`."""
        if len(path) != len(PUT_PATH):
            message = f"a put's descriptor path is {list(PUT_PATH)}, got {path}"
            return _answer(400, {"error": "bad_request", "message": message})
        return self._push(dict(zip(PUT_PATH, path, strict=True)), lambda: table)

    def _push(self, params: dict[str, str], rows: Callable[[], pa.Table]) -> Reply:
        try:
            name, writer = _text(params, "pipeline"), _text(params, "writer")
            sequence = _number(params, "sequence")
            shard = _number(params, "shard") if "shard" in params else None
            target = self._pipeline(name, shard)
            if isinstance(target, Reply):
                return target
            table = rows()
        except _BadRequestError as exc:
            return _answer(400, {"error": "bad_request", "message": str(exc)})
        try:
            result = target.push(writer, sequence, table, self.timeout_s)
        except PushError as exc:
            return _answer(400, {"error": "bad_batch", "message": str(exc)})
        except PushOutOfOrderError as exc:
            return _answer(409, {"error": "out_of_order", "message": str(exc)})
        except PushRefusedError as exc:
            kind = "buffer_full" if exc.status == 429 else "unavailable"
            return _answer(exc.status, {"error": kind, "message": str(exc)}, exc.retry_after_s)
        except CoordinationError as exc:  # FencedError included: the term ended
            return _answer(503, {"error": "unavailable", "message": str(exc)}, 1.0)
        except TimeoutError:
            message = (
                f"not flushed within {self.timeout_s:.0f} s; push the same batch again "
                "(it is applied once)"
            )
            return _answer(504, {"error": "timeout", "message": message})
        return _answer(
            200,
            {
                "pipeline": name,
                "shard": target.shard,
                "writer": writer,
                "sequence": sequence,
                "rows": result.rows,
                "duplicate": result.duplicate,
            },
        )

    def _pipeline(self, name: str, shard: int | None) -> PipelineLeader | Reply:
        """The leading pipeline `name` of `shard` here (of the one shard this node leads for
        it, when none is named), or the reply that says where to push instead."""
        if name not in self.configured():
            known = ", ".join(sorted(self.configured()))
            raise _BadRequestError(f"no pipeline {name!r} here (pipelines: {known})")
        runners = self.runners()
        led = {
            r.shard: p for r in runners if r.leading for p in r.pipelines if p.config.name == name
        }
        if shard is None:
            if len(led) == 1:
                return next(iter(led.values()))
            raise _BadRequestError(
                f"name the shard (&shard=N): this node leads pipeline {name!r} for shards "
                f"{sorted(led) or 'none'}"
            )
        if shard in led:
            return led[shard]
        if shard >= self.shard_count():
            raise _BadRequestError(f"no shard {shard}: the cluster has {self.shard_count()}")
        if any(r.shard == shard and r.leading for r in runners):
            # Led here, but the pipeline is not running: paused by ops, or its term starting.
            message = f"pipeline {name!r} of shard {shard} is not running here now"
            return _answer(503, {"error": "unavailable", "message": message}, 1.0)
        leader = self.leader_of(shard)
        body = {
            "error": "not_leader",
            "message": f"this node does not lead shard {shard} of pipeline {name!r}",
            "leader": None if leader is None else leader[0],
            "http": None if leader is None else leader[1],
            "flight": None if leader is None else leader[2],
        }
        return _answer(421, body, None if leader is not None else 1.0)


def _text(params: Mapping[str, str], key: str) -> str:
    value = params.get(key, "")
    if not value:
        raise _BadRequestError(f"parameter {key} is required")
    return value


def _number(params: Mapping[str, str], key: str) -> int:
    value = params.get(key, "")
    if not _DIGITS.fullmatch(value):
        raise _BadRequestError(f"parameter {key} must be a number >= 0, got {value!r}")
    return int(value)


def _table(content_type: str, body: bytes) -> pa.Table:
    """The pushed rows, from an Arrow IPC stream or JSONEachRow body."""
    kind = content_type.split(";", maxsplit=1)[0].strip().lower()
    try:
        if kind == ARROW_STREAM:
            return pa.ipc.open_stream(body).read_all()
        if kind in JSON_EACH_ROW:
            return pa_json.read_json(io.BytesIO(body))
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
        raise _BadRequestError(f"body is not a valid {kind} batch: {exc}") from None
    wanted = f"send {ARROW_STREAM} or {JSON_EACH_ROW[0]}"
    raise _BadRequestError(f"Content-Type {content_type!r}: {wanted}")


def _answer(status: int, body: Mapping[str, object], retry_after_s: float | None = None) -> Reply:
    return Reply(status, "application/json", json.dumps(body).encode(), retry_after_s)
