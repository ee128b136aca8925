"""The timeout message names the limit the call really ran under (a per-call ``timeout=``)."""

from __future__ import annotations

from retool_exec import ExecResult, Sandbox
from retool_exec._formatting import format_tool_content
from retool_exec.backends.base import RunRequest
from retool_exec.backends.fake import FakeBackend


def _timed_out(_request: RunRequest) -> ExecResult:
    return ExecResult(False, "", "", None, True, 0.0)


def test_a_per_call_timeout_is_the_one_shown_to_the_model() -> None:
    with Sandbox(FakeBackend(_timed_out), timeout=30) as sandbox:
        result = sandbox.run_code("while True: pass", timeout=3)
        assert result.timeout == 3
        assert sandbox.format_tool_content(result) == "Error: execution timed out after 3 seconds."
        default = sandbox.run_code("while True: pass")
        assert sandbox.format_tool_content(default) == (
            "Error: execution timed out after 30 seconds."
        )


def test_the_seed_call_with_an_explicit_timeout_is_unchanged() -> None:
    result = ExecResult(False, "", "", None, True, 0.0, timeout=3.0)
    assert format_tool_content(result, timeout=30) == "Error: execution timed out after 30 seconds."
    assert format_tool_content(ExecResult(False, "", "", None, True, 0.0)) == (
        "Error: execution timed out after 30 seconds."
    )
