"""Bad inputs are the caller's error (ConfigError, TypeError), never the code's outcome."""

from __future__ import annotations

import math

import pytest

from retool_exec import Sandbox
from retool_exec._errors import ConfigError
from retool_exec.backends.fake import FakeBackend


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 0, -1, "5", True])
def test_bad_timeouts_are_refused(value: object) -> None:
    with pytest.raises(ConfigError):
        Sandbox(FakeBackend(), timeout=value)  # type: ignore[arg-type]
    with Sandbox(FakeBackend()) as sandbox, pytest.raises(ConfigError):
        sandbox.run_code("print(1)", timeout=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [math.nan, math.inf, 0, -5, 1.5, "64", True])
def test_bad_memory_limits_are_refused(value: object) -> None:
    with Sandbox(FakeBackend()) as sandbox, pytest.raises(ConfigError):
        sandbox.run_code("print(1)", memory_mb=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [math.nan, 0, 2.5, "8", True])
def test_bad_max_workers_are_refused(value: object) -> None:
    with pytest.raises(ConfigError):
        Sandbox(FakeBackend(), max_workers=value)  # type: ignore[arg-type]


def test_run_many_refuses_one_string_and_takes_limits() -> None:
    backend = FakeBackend(lambda request: f"{request.timeout} {request.memory_mb}\n")
    with Sandbox(backend) as sandbox:
        with pytest.raises(TypeError, match="not one string"):
            sandbox.run_many("print(1)")
        results = sandbox.run_many(["a", "b"], timeout=2, memory_mb=64)
    assert [r.stdout for r in results] == ["2 64\n", "2 64\n"]
