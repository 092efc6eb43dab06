"""`/insert` and Flight puts (`daemon/insert_route.py`): each outcome of a push as the
status and JSON a writer's client acts on, over stand-in shard runners."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, cast

import pyarrow as pa

from hakafka.daemon.insert_route import InsertRoute
from hakafka.daemon.shard import ShardRunner
from hakafka.pipeline.push import (
    PushError,
    PushOutOfOrderError,
    PushRefusedError,
    PushResult,
)


@dataclass
class Named:
    name: str


@dataclass
class StandInPipeline:
    """What the route uses of a `PipelineLeader`: answers each push with `outcome`."""

    outcome: PushResult | Exception
    shard: int = 0
    config: Named = field(default_factory=lambda: Named("events"))
    seen: list[tuple[str, int, int]] = field(default_factory=list)

    def push(self, writer: str, sequence: int, table: pa.Table, timeout: float) -> PushResult:
        self.seen.append((writer, sequence, table.num_rows))
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome


@dataclass
class StandInRunner:
    shard: int
    leading: bool
    pipelines: list[StandInPipeline]


def route(pipeline: StandInPipeline) -> InsertRoute:
    runners = [StandInRunner(0, True, [pipeline]), StandInRunner(1, False, [])]
    return InsertRoute(
        runners=lambda: cast(list[ShardRunner], runners),
        leader_of=lambda shard: ("n2", "http://127.0.0.1:9", "grpc://127.0.0.1:10"),
        configured=lambda: frozenset({"events"}),
        shard_count=lambda: 2,
    )


def answer(
    outcome: PushResult | Exception, shard: str = "0", sequence: str = "3"
) -> tuple[int, dict[str, Any], float | None]:
    params = {"pipeline": "events", "shard": shard, "writer": "w", "sequence": sequence}
    body = b'{"id": 1}\n{"id": 2}\n'
    reply = route(StandInPipeline(outcome))(params, "application/x-ndjson", body)
    return reply.status, json.loads(reply.body), reply.retry_after_s


def test_each_outcome_of_a_push_is_the_status_a_writer_acts_on() -> None:
    status, body, _ = answer(PushResult(2, False))
    assert status == 200
    assert (body["writer"], body["sequence"], body["rows"], body["duplicate"]) == ("w", 3, 2, False)
    status, body, _ = answer(PushError("column 'kind', row 1: null in a required column"))
    assert (status, body["error"]) == (400, "bad_batch")
    assert body["message"] == "column 'kind', row 1: null in a required column"
    # Pushed after a higher sequence of the writer: refused for good (no Retry-After).
    late = PushOutOfOrderError("sequence 3 of this writer is below where it is")
    status, body, retry_after = answer(late)
    assert (status, body["error"], retry_after) == (409, "out_of_order", None)
    assert body["message"] == "sequence 3 of this writer is below where it is"
    status, body, retry_after = answer(PushRefusedError("full", status=429, retry_after_s=1.0))
    assert (status, body["error"], retry_after) == (429, "buffer_full", 1.0)
    status, body, _ = answer(TimeoutError())
    assert (status, body["error"]) == (504, "timeout")
    assert "push the same batch again" in body["message"]


def test_a_push_for_another_shard_names_its_leader_and_bad_parameters_are_400() -> None:
    status, body, _ = answer(PushResult(2, False), shard="1")
    assert (status, body["error"], body["leader"]) == (421, "not_leader", "n2")
    assert (body["http"], body["flight"]) == ("http://127.0.0.1:9", "grpc://127.0.0.1:10")
    status, body, _ = answer(PushResult(2, False), shard="7")
    assert (status, body["message"]) == (400, "no shard 7: the cluster has 2")
    status, body, _ = answer(PushResult(2, False), sequence="-1")
    assert (status, body["message"]) == (400, "parameter sequence must be a number >= 0, got '-1'")
