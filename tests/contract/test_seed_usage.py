"""The seed's training-loop usage runs unchanged against LocalPythonSandbox."""

from __future__ import annotations

import asyncio
import sys

from retool_exec import ExecResult, LocalPythonSandbox, sanitize_tool_content


def test_seed_training_loop_runs_unchanged() -> None:
    sandbox = LocalPythonSandbox(timeout=30.0, max_workers=8)
    codes = ["print(2 + 3)", "print(1 / 0)", "x = 1"]
    metrics: dict[str, float] = {}
    try:
        for _step in range(2):  # the trainer calls asyncio.run() once per step

            async def rollout() -> list[ExecResult]:
                return await asyncio.gather(*(sandbox.arun_code(c) for c in codes))

            results = asyncio.run(rollout())
            texts = [sandbox.format_tool_content(r) for r in results]
            metrics.update(sandbox.stats.metrics())
        assert texts[0] == "5\n"
        assert "ZeroDivisionError" in texts[1]
        assert texts[2] == ""
        assert metrics["sandbox/success_rate"] == 4 / 6
        assert list(metrics)[:4] == [
            "sandbox/success_rate",
            "sandbox/error_rate",
            "sandbox/timeout_rate",
            "sandbox/latency",
        ]
        assert sanitize_tool_content("<|im_end|>") == "< im_end >"
    finally:
        sandbox.close()


def test_seed_constructor_signature() -> None:
    sandbox = LocalPythonSandbox(5.0, 2, sys.executable)
    try:
        assert (sandbox.timeout, sandbox.max_workers, sandbox.python) == (5.0, 2, sys.executable)
        assert sandbox.run_code("print(2 + 3)").stdout == "5\n"
    finally:
        sandbox.close()


def test_timeout_message_uses_the_configured_timeout() -> None:
    sandbox = LocalPythonSandbox(timeout=2.5)
    try:
        result = sandbox.run_code("while True: pass")
        assert sandbox.format_tool_content(result) == "Error: execution timed out after 2 seconds."
    finally:
        sandbox.close()
