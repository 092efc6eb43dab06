"""`ConfigReader`: the typed reader (`hakafka.typed_reader`) with what the config adds: numbers
> 0, secrets from the environment or a file, `host:port` endpoints (`parse_endpoint`), and
whole sections read from their dataclass's declarations (`sections.py`)."""

from __future__ import annotations

import dataclasses
import os
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from hakafka.config.sections import Endpoint, Secret
from hakafka.config.value_checks import positive_problem
from hakafka.typed_reader import TypedReader

T = TypeVar("T")
C = TypeVar("C")


class ConfigReader(TypedReader):
    """Reads one table of the config, recording problems with full key paths."""

    def positive(self, name: str, kind: type[T], default: T) -> T:
        return self.get(name, kind, default, check=positive_problem)

    def env(self, name: str, env_var: str) -> str | None:
        """The environment variable `env_var` (overriding key `name`), None if unset; set but
        empty is a problem (it would silently override a `*_file` and turn auth off)."""
        value = os.environ.get(env_var)
        if value == "":
            self.problem(name, f"the environment variable {env_var} is set but empty; unset it")
        return value

    def secret(self, name: str, env_var: str) -> Secret:
        """A secret from `<name>` (inline), `<name>_file` (a file) or the environment."""
        inline = self.get(name, str, "", secret=True)
        file_name = self.get(f"{name}_file", str, "")
        if (from_env := self.env(name, env_var)) is not None:
            return Secret(from_env)
        if file_name:
            try:
                if value := Path(file_name).read_text().strip():
                    return Secret(value)
                self.problem(f"{name}_file", f"{file_name} is empty")
            except OSError as exc:
                self.problem(f"{name}_file", f"cannot read {file_name}: {exc.strerror}")
        return Secret(inline)

    def endpoint(self, name: str, default: Endpoint) -> Endpoint:
        """`host:port` at key `name`, or `default` with a problem recorded."""
        raw = self.get(name, str, str(default))
        return parse_endpoint(raw, self.key(name), self.problems) or default

    def section(self, kind: type[C], **given: Any) -> C:
        """The config dataclass `kind` read from this table: each field with a default by its
        name, as the default's kind (numbers must be > 0; enums one of their values; secrets
        from the environment, `<key>_file` or `<key>`; endpoints `host:port`), with the
        field's own `check` if it has one. `given` holds the fields read some other way. Any
        other key of the table is a problem (`finish`)."""
        values = dict(given)
        for f in dataclasses.fields(kind):  # type: ignore[arg-type]
            if f.name not in values:
                values[f.name] = self._field(f)
        self.finish()
        return kind(**values)

    def _field(self, f: dataclasses.Field[Any]) -> Any:
        name, default, check = f.name, f.default, f.metadata.get("check")
        if isinstance(default, Secret):
            return self.secret(name, f.metadata["env"])
        if isinstance(default, Endpoint):
            return self.endpoint(name, default)
        if isinstance(default, StrEnum):
            return self.choice(name, type(default), default)
        if isinstance(default, bool | str):
            return self.get(name, type(default), default, check=check)
        if isinstance(default, int | float):
            return self.get(name, type(default), default, check=check or positive_problem)
        raise TypeError(f"config field {name} has no default to read it by")


def parse_endpoint(raw: str, key: str, problems: list[str]) -> Endpoint | None:
    """`host:port` (an `http://` prefix is accepted) or None with a problem recorded."""
    text = raw.removeprefix("http://").removeprefix("https://").rstrip("/")
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        problems.append(f"{key}: must be host:port, got {raw!r}")
        return None
    return Endpoint(host, int(port))
