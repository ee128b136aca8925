"""Pins the public API: what ``from retool_exec import *`` gives, name by name."""

from __future__ import annotations

import importlib

import retool_exec

EXPECTED_ALL = sorted(
    [
        "AnyBackendConfig",
        "Backend",
        "BackendConfigBase",
        "BackendNotFoundError",
        "BackendUnavailableError",
        "CellResult",
        "ConfigError",
        "DEFAULT_MARKERS",
        "DEFAULT_TIMEOUT",
        "DockerConfig",
        "DockerUnavailableError",
        "ExecResult",
        "FakeBackend",
        "FakeConfig",
        "ImageError",
        "ImageSpec",
        "LocalConfig",
        "LocalPythonSandbox",
        "MAX_OUTPUT_CHARS",
        "Outcome",
        "READ_CAP_BYTES",
        "RayConfig",
        "RetoolExecError",
        "RunRequest",
        "Sandbox",
        "SandboxClosedError",
        "SandboxForkedError",
        "SandboxStats",
        "Session",
        "SessionError",
        "SessionHandle",
        "SessionLimitError",
        "SessionLostError",
        "SessionsUnsupportedError",
        "__version__",
        "add_auto_print",
        "available_backends",
        "format_tool_content",
        "register_backend",
        "sanitize_tool_content",
        "truncate_tail",
    ]
)


def test_all_is_exactly_the_pinned_list() -> None:
    assert sorted(retool_exec.__all__) == EXPECTED_ALL


def test_all_has_no_duplicates() -> None:
    assert len(retool_exec.__all__) == len(set(retool_exec.__all__))


def test_every_exported_name_is_importable() -> None:
    module = importlib.import_module("retool_exec")
    for name in EXPECTED_ALL:
        assert getattr(module, name, None) is not None, name


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from retool_exec import *", namespace)
    namespace.pop("__builtins__", None)
    assert sorted(namespace) == EXPECTED_ALL


def test_no_private_names_exported_except_version() -> None:
    private = [name for name in retool_exec.__all__ if name.startswith("_")]
    assert private == ["__version__"]


def test_version_is_a_string() -> None:
    assert isinstance(retool_exec.__version__, str)
    assert retool_exec.__version__
