"""A schema registry for the local stack: the REST subset Confluent's clients use.

No registry server installs from the package registries here, so the dev stack serves this
one (tests and the demo reach it only through confluent-kafka's `SchemaRegistryClient` and
its serializers). Routes:

- `POST /subjects/{s}/versions` register (the same schema again keeps its id and version;
  the same schema under another subject shares the id), `POST /subjects/{s}` look up;
- `GET /subjects`, `/subjects/{s}/versions`, `/subjects/{s}/versions/{v|latest}`;
- `GET /schemas/ids/{id}` (404, error code 40403, for an unknown id);
- `POST /compatibility/subjects/{s}/versions/{v|latest}`: Avro BACKWARD (every field the new
  schema reads that the old one lacks has a default), anything else compatible;
- `GET`/`PUT /config` and `/config/{s}` (the compatibility level, kept but not enforced).

Schemas are kept as the client sent them (the Python Protobuf serializer sends base64
FileDescriptorProtos, which is also what `format=serialized` asks for). State lives in
`<data>/registry.json`, rewritten atomically on every change, so a stop and start on the
same data directory keeps every id. Binds 127.0.0.1. With `auth` (user, password; passed
to the process in `AUTH_ENV`, never on its command line) every request needs HTTP basic auth,
else 401 (error code 40101). `SchemaRegistryService` starts it as `python -m
devstack.schema_registry` and stops it by PID.
"""

from __future__ import annotations

import argparse
import base64
import hmac
import json
import os
import re
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from devstack.process import (
    LOOPBACK,
    ManagedProcess,
    ManagedService,
    free_port,
)

SERVER_MODULE = "devstack.schema_registry"
AUTH_ENV = "HAKAFKA_DEVSTACK_REGISTRY_AUTH"  # "user:password" the registry requires, if set
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


@dataclass
class _Entry:
    subject: str
    version: int
    id: int
    schema: str
    schemaType: str  # noqa: N815 - the REST field name
    references: list[dict[str, Any]] = field(default_factory=list)


class _NotFoundError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class RegistryState:
    """Subjects, versions and ids, persisted to one JSON file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self.entries: list[_Entry] = []
        self.config: dict[str, str] = {"": "BACKWARD"}
        if path.exists():
            raw = json.loads(path.read_text())
            self.entries = [_Entry(**e) for e in raw["entries"]]
            self.config = raw["config"]

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps({"entries": [asdict(e) for e in self.entries], "config": self.config})
        )
        tmp.replace(self.path)

    def register(self, subject: str, body: dict[str, Any]) -> _Entry:
        kind, refs = body.get("schemaType", "AVRO"), body.get("references") or []
        with self._lock:
            same = [
                e
                for e in self.entries
                if (e.schema, e.schemaType, e.references) == (body["schema"], kind, refs)
            ]
            for e in same:
                if e.subject == subject:
                    return e
            versions = [e.version for e in self.entries if e.subject == subject]
            schema_id = same[0].id if same else 1 + max((e.id for e in self.entries), default=0)
            entry = _Entry(
                subject, 1 + max(versions, default=0), schema_id, body["schema"], kind, refs
            )
            self.entries.append(entry)
            self._save()
            return entry

    def lookup(self, subject: str, body: dict[str, Any]) -> _Entry:
        kind = body.get("schemaType", "AVRO")
        for e in self.entries:
            if e.subject == subject and (e.schema, e.schemaType) == (body["schema"], kind):
                return e
        raise _NotFoundError(40403, "Schema not found")

    def by_id(self, schema_id: int) -> _Entry:
        for e in self.entries:
            if e.id == schema_id:
                return e
        raise _NotFoundError(40403, f"Schema {schema_id} not found")

    def versions(self, subject: str) -> list[_Entry]:
        found = [e for e in self.entries if e.subject == subject]
        if not found:
            raise _NotFoundError(40401, f"Subject '{subject}' not found.")
        return found

    def version(self, subject: str, version: str) -> _Entry:
        found = self.versions(subject)
        if version in ("latest", "-1"):
            return found[-1]
        for e in found:
            if str(e.version) == version:
                return e
        raise _NotFoundError(40402, f"Version {version} not found.")

    def set_config(self, subject: str, level: str) -> None:
        with self._lock:
            self.config[subject] = level
            self._save()


def avro_backward_compatible(new: str, old: str) -> bool:
    """Whether records written with `old` can be read with `new`: every field of `new` that
    `old` lacks has a default (field types are not compared: the dev stack's simplification)."""
    new_fields = json.loads(new).get("fields", [])
    old_names = {f["name"] for f in json.loads(old).get("fields", [])}
    return all(f["name"] in old_names or "default" in f for f in new_fields)


_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    ("POST", re.compile(r"^/subjects/([^/]+)/versions$"), "register"),
    ("POST", re.compile(r"^/subjects/([^/]+)$"), "lookup"),
    ("GET", re.compile(r"^/subjects$"), "subjects"),
    ("GET", re.compile(r"^/subjects/([^/]+)/versions$"), "versions"),
    ("GET", re.compile(r"^/subjects/([^/]+)/versions/([^/]+)$"), "version"),
    ("GET", re.compile(r"^/schemas/ids/(\d+)$"), "schema"),
    ("POST", re.compile(r"^/compatibility/subjects/([^/]+)/versions/([^/]+)$"), "compatible"),
    ("GET", re.compile(r"^/config(?:/([^/]+))?$"), "get_config"),
    ("PUT", re.compile(r"^/config(?:/([^/]+))?$"), "put_config"),
]


def _handler(state: RegistryState, auth: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            sys.stderr.write(f"schema-registry {self.command} {self.path}\n")

        def _reply(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self) -> None:
            # Matched still quoted: a subject may hold a slash (a Protobuf import's file name).
            path = self.path.split("?", 1)[0].rstrip("/") or "/"
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else {}
            if auth and not self._authorized():
                self._reply(401, {"error_code": 40101, "message": "Unauthorized"})
                return
            for method, pattern, name in _ROUTES:
                found = pattern.match(path)
                if method == self.command and found:
                    try:
                        parts = [urllib.parse.unquote(g) if g else g for g in found.groups()]
                        self._reply(200, getattr(self, name)(body, *parts))
                    except _NotFoundError as exc:
                        self._reply(404, {"error_code": exc.code, "message": str(exc)})
                    return
            self._reply(404, {"error_code": 404, "message": f"no route {self.command} {path}"})

        do_GET = do_POST = do_PUT = _route  # noqa: N815 - http.server's names

        def _authorized(self) -> bool:
            given = self.headers.get("Authorization", "")
            expected = "Basic " + base64.b64encode(auth.encode()).decode()
            return hmac.compare_digest(given.encode(), expected.encode())

        def register(self, body: dict[str, Any], subject: str) -> dict[str, Any]:
            e = state.register(subject, body)
            return {"id": e.id, "version": e.version, "subject": subject, "schema": e.schema}

        def lookup(self, body: dict[str, Any], subject: str) -> dict[str, Any]:
            return asdict(state.lookup(subject, body))

        def subjects(self, body: dict[str, Any]) -> list[str]:
            return sorted({e.subject for e in state.entries})

        def versions(self, body: dict[str, Any], subject: str) -> list[int]:
            return [e.version for e in state.versions(subject)]

        def version(self, body: dict[str, Any], subject: str, version: str) -> dict[str, Any]:
            return asdict(state.version(subject, version))

        def schema(self, body: dict[str, Any], schema_id: str) -> dict[str, Any]:
            e = state.by_id(int(schema_id))
            return {"schema": e.schema, "schemaType": e.schemaType, "references": e.references}

        def compatible(self, body: dict[str, Any], subject: str, version: str) -> dict[str, Any]:
            old = state.version(subject, version)
            kind = body.get("schemaType", "AVRO")
            ok = kind != "AVRO" or avro_backward_compatible(body["schema"], old.schema)
            return {"is_compatible": ok}

        def get_config(self, body: dict[str, Any], subject: str | None = None) -> dict[str, str]:
            level = state.config.get(subject or "", state.config[""])
            return {"compatibilityLevel": level}

        def put_config(self, body: dict[str, Any], subject: str | None = None) -> dict[str, str]:
            state.set_config(subject or "", body["compatibility"])
            return {"compatibility": body["compatibility"]}

    return Handler


class SchemaRegistryService(ManagedService):
    """One registry process on 127.0.0.1; `root` holds its state file and log."""

    def __init__(
        self, root: Path, *, port: int | None = None, auth: tuple[str, str] | None = None
    ) -> None:
        super().__init__()
        self.root = Path(root)
        self.host = LOOPBACK
        self.port = port if port is not None else free_port()
        self._auth = ":".join(auth) if auth else ""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        """Start the registry (same port and state as before, if restarted) and return once
        it answers `GET /subjects`."""
        self._refuse_busy(self.port, self.host, what="schema registry")
        self.root.mkdir(parents=True, exist_ok=True)
        data_arg = f"--data={self.root.resolve()}"
        process = ManagedProcess(
            name=f"schema registry (port {self.port})",
            argv=[sys.executable, "-m", SERVER_MODULE, f"--port={self.port}", data_arg],
            log_path=self.root / "schema_registry.log",
            marker=data_arg,
            env={AUTH_ENV: self._auth},
        )
        self._launch(process, self.healthy, timeout)

    def healthy(self) -> bool:
        return registry_healthy(self.url)


def registry_healthy(url: str) -> bool:
    """True if the registry at `url` answers `GET /subjects` (a 401 counts: it answers)."""
    try:
        with urllib.request.urlopen(f"{url}/subjects", timeout=2.0) as response:
            return bool(response.status == 200)
    except urllib.error.HTTPError as exc:
        return exc.code == 401
    except OSError:
        return False


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--data", type=Path, required=True)
    args = parser.parse_args(argv)
    args.data.mkdir(parents=True, exist_ok=True)
    state = RegistryState(args.data / "registry.json")
    server = ThreadingHTTPServer(
        (LOOPBACK, args.port), _handler(state, os.environ.get(AUTH_ENV, ""))
    )
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
