"""What the repository's Python files import, read from their source (AST): for the tests
of package boundaries and layers. Function-local and TYPE_CHECKING imports count too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def source_files(*tops: str) -> list[Path]:
    return sorted(path for top in tops for path in (ROOT / top).rglob("*.py"))


def module_of(path: Path) -> str:
    """`hakafka/pipeline/leader.py` -> `hakafka.pipeline.leader`; a package is its name."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    """Whether `name` is a module or package of this repository."""
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in `path`, wherever it stands. `from a import b` counts
    as importing `a.b` when that is a module, else `a`; relative imports are resolved."""
    package = module_of(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                child = f"{module}.{alias.name}"
                found.append((node.lineno, child if is_module(child) else module))
    return sorted(set(found))


def within(module: str, part: str) -> bool:
    return module == part or module.startswith(part + ".")
