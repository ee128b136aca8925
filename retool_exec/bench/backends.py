"""Benchmark backend names and the configs behind them.

The names are the backend table's (``retool_exec.backends.registry``), so one
run can compare the local subprocess with every Docker policy side by side.
``docker`` stands for ``docker-reuse`` (the default policy), so the headline
``--backends local,docker`` reads the way users write it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from retool_exec._errors import ConfigError
from retool_exec.backends.config import BackendConfigBase, DockerConfig
from retool_exec.backends.registry import available_backends, backend_spec

__all__ = ["LOCAL", "OWNED_SETTINGS", "bench_config", "is_docker", "parse_backends"]

LOCAL = "local"
"""The baseline every ratio is taken against."""

OWNED_SETTINGS: Mapping[str, str] = {
    "pool_size": "--pool-size",
    "timeout": "--timeout",
    "python": "--local-python",
}
"""Settings the benchmark sets from its own flags (``--set`` may not set them)."""


def parse_backends(text: str) -> tuple[str, ...]:
    """``"local,docker"`` -> ``("local", "docker")``; unknown or repeated names are errors."""
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if not names:
        raise ConfigError("--backends needs at least one backend name")
    known = set(available_backends())
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(
            f"unknown backend(s) {', '.join(unknown)}; choose from {', '.join(sorted(known))}"
        )
    if len(set(names)) != len(names):
        raise ConfigError(f"--backends names a backend twice: {text}")
    canonical = [backend_spec(n).alias_of or n for n in names]
    for name in set(canonical):
        same = [n for n, c in zip(names, canonical, strict=True) if c == name]
        if len(same) > 1:
            raise ConfigError(f"{' and '.join(same)} are the same backend; name one of them")
    return names


def is_docker(name: str) -> bool:
    """Whether the named backend runs in Docker."""
    return issubclass(backend_spec(name).config_class, DockerConfig)


def bench_config(
    name: str,
    *,
    timeout: float,
    pool_size: int,
    labels: Mapping[str, str] | None = None,
    local_python: str | None = None,
    settings: Mapping[str, Any] | None = None,
) -> BackendConfigBase:
    """The config the benchmark uses for ``name``: the table's, the user's ``settings``
    (where this backend has them), then the benchmark's own flags."""
    spec = backend_spec(name)
    for key, flag in OWNED_SETTINGS.items():
        if key in (settings or {}):
            raise ConfigError(f"the benchmark sets {key!r} from {flag}; use that flag")
    data = {k: v for k, v in (settings or {}).items() if spec.accepts(k)}
    owned: dict[str, Any] = {"timeout": timeout, "pool_size": pool_size}
    if local_python:
        owned["python"] = local_python
    if labels:
        given = data.get("labels")
        owned["labels"] = {**(given if isinstance(given, dict) else {}), **labels}
    data.update({k: v for k, v in owned.items() if spec.accepts(k)})
    return spec.config(data)
