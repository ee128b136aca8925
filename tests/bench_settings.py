"""The smallest BenchSettings a test can build, with only what the test cares about changed."""

from __future__ import annotations

from typing import Any

from retool_exec.bench.results import BenchSettings


def bench_settings(**overrides: Any) -> BenchSettings:
    """One call per cell, one container, no waiting: override what the test is about."""
    values: dict[str, Any] = {
        "backends": ["local", "docker"],
        "workloads": ["print"],
        "concurrency": [1],
        "calls": 1,
        "slow_rounds": 1,
        "warmup": 0,
        "pool_size": 1,
        "timeout": 5.0,
        "quick": True,
        "extras": False,
        "undrained_calls": 1,
        "sustained_calls": 1,
        "sustained_concurrency": 1,
        "sustained_pool_size": 1,
        "cpu_calls": 1,
        "local_python": "python3",
        "command": "retool-exec bench",
    }
    return BenchSettings(**{**values, **overrides})
