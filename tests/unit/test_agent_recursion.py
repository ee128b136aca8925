"""The agent's recursion budget: the code's module frame at depth one wherever it runs
from, as under ``python3 -c`` (in this interpreter: the agent's module is pure Python)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

from retool_exec.backends.docker.agent import recursion
from retool_exec.backends.docker.agent.zygote import _run_probe as _run

DEEPEST = compile(recursion.PROBE, "<probe>", "exec")


def _from_depth(frames: int, then: Callable[[], Any]) -> Any:
    return then() if frames == 0 else _from_depth(frames - 1, then)


def _reached(counter: recursion.Counter | None) -> int:
    namespace: dict[str, Any] = {}
    if counter is None:
        exec(DEEPEST, namespace)
    else:
        _run(counter, DEEPEST, namespace)
    return int(namespace["reached"])


@pytest.mark.parametrize("depth", [0, 25])
def test_the_code_recurses_as_deep_as_under_python3_from_any_depth(depth: int) -> None:
    counter = _from_depth(7, lambda: recursion.find(_run))
    assert counter is not None
    limit = sys.getrecursionlimit()
    assert _from_depth(depth, lambda: _reached(None)) < limit - 1 - depth  # as before
    assert _from_depth(depth, lambda: _reached(counter)) == limit - 1
    assert _from_depth(depth, lambda: _reached(None)) < limit - 1 - depth  # put back


def test_a_count_that_cannot_be_found_leaves_the_interpreter_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(recursion, "SCANNED_INTS", 0)
    assert recursion.find(_run) is None
