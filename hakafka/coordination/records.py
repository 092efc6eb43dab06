"""The JSON records stored in znodes, as dataclasses with strict decoding.

Fields are read with `hakafka.typed_reader` (`_Fields`); decoding errors raise
`CorruptZnodeError` naming the znode and what is wrong.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, NoReturn, Self, TypeVar, get_type_hints

from hakafka.coordination.errors import CorruptZnodeError
from hakafka.typed_reader import Check, TypedReader

T = TypeVar("T")

Checkpoint = dict[str, dict[int, int]]
"""{topic: {partition: next_offset}}: the next offset to consume per partition."""

OffsetRanges = dict[str, dict[int, tuple[int, int]]]
"""{topic: {partition: (first_offset, end_offset)}}: end is exclusive (the next offset)."""


def _load(path: str, raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptZnodeError(f"znode {path}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise CorruptZnodeError(f"znode {path}: expected a JSON object, got {type(value).__name__}")
    return value


class _Fields(TypedReader):
    """The fields of one record (or of an object inside it), named in problems by the znode's
    path. hakafka wrote the record, so its first bad field means the znode is corrupt: it
    raises `CorruptZnodeError`. Fields a record does not know are left alone."""

    def problem(self, name: str, text: str) -> NoReturn:
        raise CorruptZnodeError(f"znode {self.path}: {text}")

    def missing(self, name: str) -> str:
        return f"missing field {name!r}"

    def wrong_type(self, name: str, value: Any, kinds: tuple[type, ...], secret: bool) -> str:
        return f"field {name!r} has the wrong type ({value!r})"

    def required(self, name: str, kind: type[T], *, check: Check | None = None) -> T:
        """The value of field `name`, of `kind` (an integer read as a float where one is
        wanted) and passing `check`."""
        return self.get(name, kind, required=True, check=check)


def _fields(path: str, raw: bytes) -> _Fields:
    """The fields of the JSON object stored in znode `path`."""
    return _Fields(_load(path, raw), path)


RESHARD_DEADLINE_S = 600.0


def _dump(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")


class _Record:
    """A record (a dataclass) stored as the JSON object of its fields. `decode` reads each
    field, in declaration order, as required and of its annotated type, but those named in
    `OPTIONAL`: absent or null, they read as their default. A record with fields of other
    shapes decodes itself."""

    __dataclass_fields__: ClassVar[dict[str, Any]]
    OPTIONAL: ClassVar[frozenset[str]] = frozenset()

    def encode(self) -> bytes:
        return _dump(asdict(self))

    @classmethod
    def read(cls, v: _Fields) -> Self:
        """The record whose fields `v` holds (`CorruptZnodeError` at its first bad field)."""
        kinds = get_type_hints(cls)
        return cls(
            **{
                f.name: v.optional(f.name, kinds[f.name], f.default)
                if f.name in cls.OPTIONAL
                else v.required(f.name, kinds[f.name])
                for f in fields(cls)
            }
        )

    @classmethod
    def decode(cls, path: str, raw: bytes) -> Self:
        """The record stored in znode `path` (`CorruptZnodeError` if it is not one)."""
        return cls.read(_fields(path, raw))


@dataclass(frozen=True)
class NodeInfo(_Record):
    """A daemon's endpoints, published in `nodes/<node>` while it runs."""

    host: str
    http: str
    flight: str
    pid: int
    version: str
    started: float = field(default_factory=time.time)


@dataclass(frozen=True)
class ReplacingInfo(_Record):
    """Why and since when a node is under replacement (`replacing/<node>`)."""

    since: float
    by: str
    reason: str


@dataclass(frozen=True)
class LeaderInfo(_Record):
    """The shard's current leader (`shards/<s>/leader`); `status` is set by the daemon."""

    node: str
    epoch: int
    since: float
    status: str = "elected"


@dataclass(frozen=True)
class PinRecord(_Record):
    """An ops hold on a shard's leadership (`shards/<s>/pin`): the balancer does not move the
    shard off `node` before `until` (Unix time)."""

    node: str
    until: float
    by: str
    at: float


@dataclass(frozen=True)
class FailoverRequest(_Record):
    """An ops request to move a shard's leadership (`shards/<s>/failover`).

    `to` is the target node or None for "any other node"; `deadline` (Unix time) ends the
    other candidates' stepping aside when the target has not taken over by then.
    """

    by: str
    to: str | None
    at: float
    deadline: float

    @classmethod
    def decode(cls, path: str, raw: bytes) -> FailoverRequest:
        v = _fields(path, raw)
        to = v.optional("to", str, None, type_problem="field 'to' must be a node name or null")
        return cls(
            by=v.required("by", str),
            to=to,
            at=v.required("at", float),
            deadline=v.required("deadline", float),
        )


@dataclass(frozen=True)
class HeldBy(_Record):
    """The leader that stopped a paused pipeline, in the term of fencing `token`."""

    node: str
    epoch: int
    token: int


@dataclass(frozen=True)
class PauseRecord(_Record):
    """An ops pause of one shard's pipeline (`shards/<s>/paused/<pipeline>`).

    `held` is set by the shard's leader once the pipeline stopped in its term (None until
    then, and again for a new term's leader to set): while it names the current term, nothing
    of the pipeline runs, so its checkpoint and pending intent may be changed by ops.
    """

    by: str
    at: float
    reason: str
    held: HeldBy | None = None
    deadline: float | None = None
    """Unix time past which the shard's leader resumes the pipeline: set by the commands
    that pause it for their own duration (`offsets set`, `pending drop`), so one killed
    half-way leaves no pause behind. None for `pipeline pause`: an ops decision."""

    @classmethod
    def decode(cls, path: str, raw: bytes) -> PauseRecord:
        v = _fields(path, raw)
        held = v.optional("held", dict, None, type_problem="field 'held' must be an object or null")
        return cls(
            by=v.required("by", str),
            at=v.required("at", float),
            reason=v.required("reason", str),
            deadline=v.optional("deadline", float, None),
            held=None if held is None else HeldBy.read(_Fields(held, path)),
        )


@dataclass(frozen=True)
class TaskRecord:
    """One flush task of a pending block: the offsets it holds (`spans`, each
    ``(partition, first, end)`` with end exclusive), how many rows and dead letters they
    decoded to, and a digest of which ones (see `spark_bridge.plan.offsets_digest`)."""

    key: str
    spans: tuple[tuple[int, int, int], ...]
    rows: int
    dead: int
    digest: str

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "spans": [list(s) for s in self.spans],
            "rows": self.rows,
            "dead": self.dead,
            "digest": self.digest,
        }

    @classmethod
    def from_json(cls, path: str, value: Any) -> TaskRecord:
        if not isinstance(value, dict):
            raise CorruptZnodeError(f"znode {path}: a task must be an object, got {value!r}")
        try:
            spans = tuple((int(p), int(f), int(e)) for p, f, e in value.get("spans", ()))
        except (TypeError, ValueError) as exc:
            raise CorruptZnodeError(f"znode {path}: bad task 'spans' ({exc})") from None
        v = _Fields(value, path)
        return cls(
            key=v.required("key", str),
            spans=spans,
            rows=v.required("rows", int),
            dead=v.required("dead", int),
            digest=v.required("digest", str),
        )


@dataclass(frozen=True)
class PendingIntent:
    """A flush intent (`pipelines/<p>/pending`): the exact offset ranges of the block in
    flight, written before the block goes to ClickHouse, with the plan a re-flush follows:
    its `tasks` and the `settings` that decided its rows (format, on_error, transform,
    columns), and the `pushed` batches it holds, each ``(partition, sequence, rows)``: what
    a leader whose WAL lacks them awaits from the writers' retries. An intent written by a
    version before plans has none of these (empty)."""

    block_id: str
    ranges: OffsetRanges
    epoch: int
    tasks: tuple[TaskRecord, ...] = ()
    settings: tuple[tuple[str, str], ...] = ()
    pushed: tuple[tuple[int, int, int], ...] = ()

    def encode(self) -> bytes:
        ranges = {
            topic: {str(p): [first, end] for p, (first, end) in parts.items()}
            for topic, parts in self.ranges.items()
        }
        value: dict[str, Any] = {"block_id": self.block_id, "ranges": ranges, "epoch": self.epoch}
        if self.tasks:
            value["tasks"] = [task.to_json() for task in self.tasks]
            value["settings"] = dict(self.settings)
        if self.pushed:
            value["pushed"] = [list(b) for b in self.pushed]
        return _dump(value)

    @classmethod
    def decode(cls, path: str, raw: bytes) -> PendingIntent:
        v = _fields(path, raw)
        raw_ranges = v.required("ranges", dict)
        ranges: OffsetRanges = {}
        try:
            for topic, parts in raw_ranges.items():
                ranges[topic] = {int(p): (int(r[0]), int(r[1])) for p, r in parts.items()}
        except (AttributeError, TypeError, ValueError, IndexError) as exc:
            raise CorruptZnodeError(f"znode {path}: bad 'ranges' ({exc})") from None
        # Absent from an intent written before plans; null would be corrupt.
        not_a_plan = "'tasks' must be a list, 'settings' an object"
        tasks = v.get("tasks", list, [], type_problem=not_a_plan)
        settings = v.get("settings", dict, {}, type_problem=not_a_plan)
        try:
            pushed = tuple((int(p), int(s), int(n)) for p, s, n in v.get("pushed", list, []))
        except (TypeError, ValueError) as exc:
            raise CorruptZnodeError(f"znode {path}: bad 'pushed' ({exc})") from None
        return cls(
            block_id=v.required("block_id", str),
            ranges=ranges,
            epoch=v.required("epoch", int),
            tasks=tuple(TaskRecord.from_json(path, t) for t in tasks),
            settings=tuple(sorted((str(k), str(val)) for k, val in settings.items())),
            pushed=pushed,
        )


@dataclass(frozen=True)
class ReshardRequest(_Record):
    """A reshard in progress (`/reshard`), made against `/settings` at `settings_version`:
    every leader drains (commits all it holds, consumes nothing) and reports it. Past
    `deadline` (Unix time) a reshard that did not complete is aborted by the leaders: the
    command that drove it died. A record without one (older versions) has `at` + 600 s."""

    by: str
    at: float
    settings_version: int
    shard_count: int
    deadline: float = 0.0

    OPTIONAL = frozenset({"deadline"})

    def __post_init__(self) -> None:
        if not self.deadline:
            object.__setattr__(self, "deadline", self.at + RESHARD_DEADLINE_S)


@dataclass(frozen=True)
class DrainedInfo(_Record):
    """`/reshard/<shard>`: the shard's leader, in the term of fencing `token`, committed
    everything it held and consumes nothing until the reshard ends."""

    node: str
    epoch: int
    token: int


def encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    return _dump({t: {str(p): o for p, o in parts.items()} for t, parts in checkpoint.items()})


def decode_checkpoint(path: str, raw: bytes) -> Checkpoint:
    v = _load(path, raw)
    try:
        return {t: {int(p): int(o) for p, o in parts.items()} for t, parts in v.items()}
    except (AttributeError, TypeError, ValueError) as exc:
        raise CorruptZnodeError(f"znode {path}: bad checkpoint ({exc})") from None


def encode_epoch(epoch: int) -> bytes:
    return str(epoch).encode("ascii")


def decode_epoch(path: str, raw: bytes) -> int:
    try:
        return int(raw.decode("ascii") or "0")
    except (UnicodeDecodeError, ValueError):
        raise CorruptZnodeError(f"znode {path}: epoch is not an integer ({raw[:40]!r})") from None


def _every_item(ok: Callable[[Any], bool], problem: str) -> Check:
    """A check that every item of a list passes `ok`, else `problem`."""
    return lambda items: None if all(ok(item) for item in items) else problem


def _shard_lists(ok: Callable[[Any], bool], problem: str) -> Check:
    """A check of an object that maps shard numbers to lists whose items all pass `ok`."""
    return lambda value: (
        None
        if all(
            shard.isdigit() and isinstance(items, list) and all(ok(item) for item in items)
            for shard, items in value.items()
        )
        else problem
    )


_COLUMNS = _every_item(
    lambda c: isinstance(c, list) and len(c) == 2 and all(isinstance(x, str) for x in c),
    "'columns' must be [name, type] pairs",
)
_META_COLUMNS = _every_item(lambda m: isinstance(m, str), "'meta_columns' must be names")
_PARTITIONS = _shard_lists(lambda p: type(p) is int, "'partitions' must map shards to partitions")
_ENDPOINTS = _shard_lists(
    lambda e: isinstance(e, str), "'endpoints' must map shards to host:port lists"
)


def _objects(pipelines: dict[str, Any]) -> str | None:
    """A check that every pipeline of the settings is an object."""
    for name, p in pipelines.items():
        if not isinstance(p, dict):
            return f"pipeline {name!r} is not an object"
    return None


@dataclass(frozen=True)
class PipelineSettings:
    """The settings of one pipeline that every node must share: what it reads, how it decodes
    and what rows it writes where. `columns` are (name, ClickHouse type) pairs in config order;
    `partitions` holds the explicit partition lists per shard ({} = `partition % shard_count`)."""

    topic: str
    table: str
    columns: tuple[tuple[str, str], ...]
    meta_columns: tuple[str, ...]
    format: str
    on_error: str
    max_message_bytes: int
    transform: str
    partitions: dict[int, tuple[int, ...]]

    def encoded(self) -> dict[str, Any]:
        value = asdict(self)
        value["columns"] = [list(c) for c in self.columns]
        value["partitions"] = {str(s): list(p) for s, p in self.partitions.items()}
        return value

    @classmethod
    def decoded(cls, path: str, name: str, v: dict[str, Any]) -> PipelineSettings:
        fields = _Fields(v, f"{path} pipeline {name!r}")
        columns = fields.required("columns", list, check=_COLUMNS)
        partitions = fields.required("partitions", dict, check=_PARTITIONS)
        meta = fields.required("meta_columns", list, check=_META_COLUMNS)
        return cls(
            topic=fields.required("topic", str),
            table=fields.required("table", str),
            columns=tuple((c[0], c[1]) for c in columns),
            meta_columns=tuple(meta),
            format=fields.required("format", str),
            on_error=fields.required("on_error", str),
            max_message_bytes=fields.required("max_message_bytes", int),
            transform=fields.required("transform", str),
            partitions={int(s): tuple(p) for s, p in partitions.items()},
        )


@dataclass(frozen=True)
class ClusterSettings:
    """The shard-wide settings of the cluster (`/settings`): every node standing for election
    must agree with them (see `hakafka/drift.py`).

    `endpoints` is the union of the ClickHouse endpoints (`host:port`) per shard that the nodes
    know from their configs: each node adds its own before it stands, so a MergeTree shard
    with several servers is seen across the cluster, not only within one node's config.
    """

    shard_count: int
    engine: str
    endpoints: dict[int, tuple[str, ...]]
    pipelines: dict[str, PipelineSettings]

    def with_endpoints(self, endpoints: dict[int, tuple[str, ...]]) -> ClusterSettings:
        """These settings with `endpoints` added to the recorded ones (sorted, distinct)."""
        merged = {
            shard: tuple(sorted({*self.endpoints.get(shard, ()), *endpoints.get(shard, ())}))
            for shard in sorted({*self.endpoints, *endpoints})
        }
        return ClusterSettings(self.shard_count, self.engine, merged, self.pipelines)

    def encode(self) -> bytes:
        return _dump(
            {
                "shard_count": self.shard_count,
                "engine": self.engine,
                "endpoints": {str(s): list(e) for s, e in self.endpoints.items()},
                "pipelines": {name: p.encoded() for name, p in self.pipelines.items()},
            }
        )

    @classmethod
    def decode(cls, path: str, raw: bytes) -> ClusterSettings:
        v = _fields(path, raw)
        endpoints = v.required("endpoints", dict, check=_ENDPOINTS)
        pipelines = v.required("pipelines", dict, check=_objects)
        return cls(
            shard_count=v.required("shard_count", int),
            engine=v.required("engine", str),
            endpoints={int(s): tuple(e) for s, e in endpoints.items()},
            pipelines={
                name: PipelineSettings.decoded(path, name, p) for name, p in pipelines.items()
            },
        )
