"""Surfaces import only downward: the library never imports the CLI or the server, nothing
outside the registry uses its private helpers, and the benchmark reads pools through
``DockerBackend.pool_stats()``, not private attributes."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import retool_exec

PACKAGE = Path(retool_exec.__file__).parent

PENDING_CLI_IMPORTS: set[str] = set()
"""Modules (owned elsewhere) that still import ``escape_controls`` from ``retool_exec.cli``;
it now lives in ``retool_exec._text``. This set may only shrink."""

PENDING_PRIVATE_REGISTRY: set[str] = set()
"""Modules that still import ``_config_class`` (use ``backend_config``). May only shrink."""


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(encoding="utf-8"))


def _imports(tree: ast.Module) -> Iterator[tuple[str, list[str]]]:
    """(module, names) for every import, lazy ones included."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, [alias.name for alias in node.names]


def _importers(prefix: str, *, outside: str) -> set[str]:
    return {
        name
        for name, tree in _modules()
        if not name.startswith(outside)
        for module, _ in _imports(tree)
        if module == prefix or module.startswith(prefix + ".")
    }


def test_only_the_cli_imports_the_cli() -> None:
    offenders = _importers("retool_exec.cli", outside="cli/")
    assert offenders <= PENDING_CLI_IMPORTS, offenders - PENDING_CLI_IMPORTS


def test_only_the_cli_imports_the_server() -> None:
    offenders = _importers("retool_exec.server", outside="server/") - {"cli/cmd_serve.py"}
    assert not offenders


def test_only_the_cli_imports_the_mcp_server_and_only_it_the_sdk() -> None:
    """``import retool_exec`` works without the ``[mcp]`` extra."""
    assert _importers("retool_exec.mcp_server", outside="cli/") == set()
    assert _importers("mcp", outside="mcp_server.py") <= {"cli/cmd_mcp.py"}  # type-only there


def test_no_library_module_imports_the_benchmark() -> None:
    offenders = _importers("retool_exec.bench", outside="bench/") - {"cli/cmd_bench.py"}
    assert not offenders


def test_private_registry_helpers_stay_in_the_registry() -> None:
    offenders = {
        name
        for name, tree in _modules()
        if name != "backends/registry.py"
        for module, names in _imports(tree)
        if module == "retool_exec.backends.registry" and any(n.startswith("_") for n in names)
    }
    assert offenders <= PENDING_PRIVATE_REGISTRY, offenders - PENDING_PRIVATE_REGISTRY


def test_the_benchmark_reads_pools_through_pool_stats() -> None:
    for name, tree in _modules():
        if not name.startswith("bench/"):
            continue
        attributes = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        assert not attributes & {"pool", "_pool", "factory", "_factory", "_tasks"}, name


def test_escape_controls_is_defined_in_the_library() -> None:
    from retool_exec._text import escape_controls
    from retool_exec.cli._terminal import escape_controls as reexported

    assert escape_controls is reexported
    assert escape_controls.__module__ == "retool_exec._text"


def test_no_eval_on_container_output_outside_the_agent() -> None:
    """``eval`` appears only where running code is the point (the agent's and the local
    backend's notebook cells); nothing on the host evaluates what a container printed."""
    allowed = {"backends/docker/agent/zygote.py", "backends/local.py"}
    users = {
        name
        for name, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "eval"
    }
    assert users <= allowed, users - allowed
