"""From an ``ExecResult`` to SandboxFusion's result shape. Pure functions.

SandboxFusion's request status, from its commands (``ecosystem.md``):
any command ``Error`` → ``SandboxError``; else a ``TimeLimitExceeded``
command or a non-zero return code → ``Failed``; else ``Success``.

How retool_exec's outcomes map onto its three command statuses:

=================  ===================  ===========================
Outcome            run_result.status    return_code
=================  ===================  ===========================
success, error     Finished             the exit status
signal             Finished             minus the signal (``-11``)
oom                Finished             ``-9`` (killed by SIGKILL)
timeout            TimeLimitExceeded    null
cpu_limit          TimeLimitExceeded    null (a time limit, on CPU)
sandbox_error      Error                null
rejected           Error                null
=================  ===================  ===========================

Return codes follow Python's ``subprocess`` convention, as SandboxFusion's
default runner reports them (``-9``, not the shell's ``137``). An OOM inside
the per-call limit usually surfaces earlier, as a ``MemoryError`` traceback
with return code 1; only a kill by the container's own limit reaches ``-9``.
"""

from __future__ import annotations

import re

from retool_exec._models import ExecResult, Outcome
from retool_exec.server.schemas import CommandRunResult, CommandRunStatus, RunStatus

__all__ = ["command_result", "cut_stream", "outcome_message", "run_status"]

_MARKER = re.compile(r"\A\[\.\.\. truncated \d+ chars \.\.\.\]\n")
_OOM_RETURN_CODE = -9


def cut_stream(text: str, dropped: int, limit: int) -> tuple[str, int]:
    """Re-cut a stream to ``limit`` characters, counting what the backend already dropped.

    Returns the text, with the seed's ``[... truncated N chars ...]`` marker
    whenever anything was dropped, and N, the whole count.
    """
    if dropped:
        text = _MARKER.sub("", text, count=1)
    extra = max(0, len(text) - limit)
    if extra:
        text = text[-limit:] if limit > 0 else ""
    total = dropped + extra
    return (f"[... truncated {total} chars ...]\n{text}" if total else text), total


def command_result(result: ExecResult, *, stdout: str, stderr: str) -> CommandRunResult:
    """The ``run_result`` for ``result``, with its (already extracted and cut) streams."""
    outcome = result.outcome
    status = CommandRunStatus.FINISHED
    return_code = result.returncode
    if outcome in (Outcome.TIMEOUT, Outcome.CPU_LIMIT):
        status, return_code = CommandRunStatus.TIME_LIMIT_EXCEEDED, None
    elif outcome in (Outcome.SANDBOX_ERROR, Outcome.REJECTED):
        status, return_code = CommandRunStatus.ERROR, None
    elif outcome is Outcome.OOM and (return_code is None or return_code == 0):
        return_code = _OOM_RETURN_CODE
    elif return_code is None:  # not reachable by the built-in backends' classification
        status = CommandRunStatus.ERROR
    return CommandRunResult(
        status=status,
        execution_time=result.latency,
        return_code=return_code,
        stdout=stdout,
        stderr=stderr,
    )


def run_status(*commands: CommandRunResult | None) -> RunStatus:
    """SandboxFusion's rule for a request's status from its commands."""
    present = [command for command in commands if command is not None]
    if any(command.status is CommandRunStatus.ERROR for command in present):
        return RunStatus.SANDBOX_ERROR
    for command in present:
        if command.status is CommandRunStatus.TIME_LIMIT_EXCEEDED:
            return RunStatus.FAILED
        if command.return_code not in (0, None):
            return RunStatus.FAILED
    return RunStatus.SUCCESS


def outcome_message(result: ExecResult) -> str:
    """The ``message`` for a result: empty unless there is something to explain."""
    outcome = result.outcome
    if outcome is Outcome.SANDBOX_ERROR:
        return f"sandbox error: {result.detail or 'the sandbox failed while running the code'}"
    if outcome is Outcome.REJECTED:
        return f"rejected: {result.detail or result.stderr}"
    if outcome is Outcome.OOM:
        return "out of memory: a process of the code was killed at its memory limit"
    if outcome is Outcome.CPU_LIMIT:
        return "CPU time limit exceeded: the code used its CPU time and was killed by SIGXCPU"
    if outcome is Outcome.SIGNAL:
        return f"killed by signal {-(result.returncode or 0)}"
    return ""
