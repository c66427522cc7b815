"""The import rules of docs/ARCHITECTURE.md, checked on the source: a layer imports only the
layers below it, and `domain/` imports nothing that can do I/O."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "service" / "gpufair"

# What each part of the package may import of gpufair (besides itself). A part is a subpackage
# ("domain") or a top-level module ("client"). Keep in step with docs/ARCHITECTURE.md.
ALLOWED: dict[str, set[str]] = {
    "domain": set(),
    "store": {"domain", "tokens"},
    "services": {"domain", "store", "gc_tuning"},
    "jobs": {"domain", "store", "services", "metrics"},
    "api": {"domain", "store", "services", "metrics", "tokens", "v1"},
    "sim": {"domain", "config_file", "render", "api.convert_cluster", "gc_tuning"},
    "integrations": {"client", "v1", "config_file", "render"},
    "client": {"addresses", "v1"},
    "client_aio": {"client", "addresses", "v1"},
    "config_file": {"v1"},
    "metrics": {"domain"},
    "tokens": set(),
    "addresses": set(),
    "render": set(),
    "gc_tuning": set(),
    "v1": set(),
}
# The command line sits on top and may import any part.
TOP = {"cli", "__init__", "__main__"}

# Third-party and standard modules that do I/O or bring a framework: never in the domain.
DOMAIN_FORBIDDEN = {
    "sqlalchemy",
    "psycopg",
    "psycopg_pool",
    "grpc",
    "google",
    "yaml",
    "apscheduler",
    "prometheus_client",
    "matplotlib",
    "os",
    "socket",
    "subprocess",
    "threading",
    "time",
    "pathlib",
    "logging",
}


def _part_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path) -> list[str]:
    """Absolute module names imported by `path` (functions' local imports included)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "gpufair":
                names += [f"gpufair.{alias.name}" for alias in node.names]
            else:
                names.append(node.module)
    return names


def _target(module: str) -> tuple[str, str]:
    """(part, part.submodule) of a gpufair module name."""
    parts = module.split(".")[1:]
    return parts[0], ".".join(parts[:2])


SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if _part_of(p) != "v1")


def test_every_part_has_a_rule() -> None:
    parts = {_part_of(p) for p in SOURCES}
    assert parts - TOP <= ALLOWED.keys(), "a new part of the package needs its rule here"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_follow_the_layers(path: Path) -> None:
    part = _part_of(path)
    if part in TOP:
        return
    wrong = []
    for module in _imports(path):
        if not module.startswith("gpufair."):
            continue
        target, submodule = _target(module)
        if target != part and target not in ALLOWED[part] and submodule not in ALLOWED[part]:
            wrong.append(module)
    assert wrong == [], f"{part} may import only {sorted(ALLOWED[part])}"


@pytest.mark.parametrize(
    "path",
    sorted((PACKAGE / "domain").glob("*.py")),
    ids=lambda p: p.name,
)
def test_the_domain_does_no_io(path: Path) -> None:
    roots = {module.split(".")[0] for module in _imports(path)}
    assert roots & DOMAIN_FORBIDDEN == set()
    # numpy is the one library the domain may use: arrays in memory for the division's demand
    # pass (issue 17 welcomes it; it installs from wheels) and no I/O of the domain's own.
    third_party = roots - {"gpufair", "__future__", "numpy"} - set(sys.stdlib_module_names)
    assert third_party == set()


def test_the_rules_catch_an_upward_import(tmp_path: Path) -> None:
    """The checker itself: a store module importing the API is seen."""
    bad = tmp_path / "bad.py"
    bad.write_text("from gpufair.api import server\nimport gpufair.jobs.runner\n")
    found = [_target(m)[0] for m in _imports(bad) if m.startswith("gpufair.")]
    assert found == ["api", "jobs"]
    assert not {"api", "jobs"} & ALLOWED["store"]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_sql_is_written_only_in_the_store(path: Path) -> None:
    """Outside `store/` nobody composes SQL: no `text`, `select`, `insert`, `update` or `delete`
    from SQLAlchemy, and no `.execute(` call."""
    if _part_of(path) == "store":
        return
    tree = ast.parse(path.read_text(), str(path))
    composed = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sqlalchemy")
        for alias in node.names
    } & {"text", "select", "insert", "update", "delete"}
    executes = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "execute"
    ]
    assert (composed, executes) == (set(), [])
