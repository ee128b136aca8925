"""Benchmark backend names and the configs behind them.

The names are what ``--backends`` takes; each maps to one ``Sandbox`` config,
so one run can compare the local subprocess with every Docker policy side by
side. ``docker`` is an alias of ``docker-reuse`` (the default policy), so the
headline ``--backends local,docker`` reads the way users write it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Literal

from retool_exec.backends.config import DockerConfig, LocalConfig

__all__ = ["BACKEND_NAMES", "LOCAL", "bench_config", "is_docker", "parse_backends"]

LOCAL = "local"
BACKEND_NAMES = ("local", "docker", "docker-reuse", "docker-fresh", "docker-runsc")
"""Accepted by ``--backends``: the local subprocess and the Docker policies."""


def parse_backends(text: str) -> tuple[str, ...]:
    """``"local,docker"`` -> ``("local", "docker")``; unknown or repeated names are errors."""
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if not names:
        raise ValueError("--backends needs at least one backend name")
    unknown = [n for n in names if n not in BACKEND_NAMES]
    if unknown:
        raise ValueError(
            f"unknown backend(s) {', '.join(unknown)}; choose from {', '.join(BACKEND_NAMES)}"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"--backends names a backend twice: {text}")
    if {"docker", "docker-reuse"} <= set(names):
        raise ValueError("docker and docker-reuse are the same backend; name one of them")
    return names


def is_docker(name: str) -> bool:
    """Whether the named backend runs in Docker."""
    return name != LOCAL


def bench_config(
    name: str,
    *,
    timeout: float,
    pool_size: int,
    labels: Mapping[str, str] | None = None,
    local_python: str | None = None,
) -> LocalConfig | DockerConfig:
    """The config the benchmark uses for ``name`` (every other setting is the default)."""
    if name == LOCAL:
        return LocalConfig(timeout=timeout, python=local_python or sys.executable)
    policy: Literal["fresh", "reuse"] = "fresh" if name == "docker-fresh" else "reuse"
    runtime = "runsc" if name == "docker-runsc" else None
    return DockerConfig(
        timeout=timeout,
        policy=policy,
        pool_size=pool_size,
        runtime=runtime,
        labels=dict(labels or {}),
    )
