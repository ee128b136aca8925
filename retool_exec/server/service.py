"""The server's work, without HTTP: limits, programs, the sandbox call, the answer.

``SandboxService`` turns a parsed request into a response model. It clamps
the client's limits to the server's, builds the program (the code itself, or
the code wrapped by the inbox when stdin or files are involved), waits for a
slot in the bounded queue, runs the program on the ``Sandbox`` and maps the
``ExecResult`` onto SandboxFusion's shape. The app (``app.py``) only parses
bodies and serialises answers.

A failure of the sandbox itself never becomes an HTTP error: it is an answer
with ``status: "SandboxError"`` and a message, as SandboxFusion gives, so a
trainer drops the sample instead of scoring the model for it.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from retool_exec._models import ExecResult, Outcome
from retool_exec._sandbox import Sandbox
from retool_exec.server.admission import Admission
from retool_exec.server.files import FileSpec, RequestRejected, check_files
from retool_exec.server.jupyter import cells_from_records, cells_spec
from retool_exec.server.programs import (
    Records,
    build_program,
    code_spec,
    extract_records,
    new_nonce,
)
from retool_exec.server.results import command_result, cut_stream, outcome_message, run_status
from retool_exec.server.schemas import (
    CommandRunResult,
    CommandRunStatus,
    ExecRequest,
    RunCodeRequest,
    RunCodeResponse,
    RunJupyterRequest,
    RunJupyterResponse,
)
from retool_exec.server.settings import ServerSettings

__all__ = ["PYTHON_LANGUAGES", "SandboxService"]

log = logging.getLogger("retool_exec.server")

PYTHON_LANGUAGES = frozenset({"python", "python3", "py"})
"""``language`` values served; SandboxFusion's other languages are refused with 400."""


class SandboxService:
    """Runs requests on one Sandbox within the server's limits."""

    def __init__(self, sandbox: Sandbox, settings: ServerSettings, *, owned: bool) -> None:
        self.sandbox = sandbox
        self.settings = settings
        self.owned = owned
        self.admission = Admission(
            max_concurrency=settings.max_concurrency or sandbox.max_workers,
            max_queue=settings.max_queue,
            queue_timeout=settings.queue_timeout,
        )

    async def start(self) -> None:
        """Warm the backend before the first request arrives."""
        await self.sandbox.astart()

    async def close(self) -> None:
        """Close the sandbox if the server built it (a caller's sandbox stays open)."""
        if self.owned:
            await self.sandbox.aclose()

    # -- POST /run_code ----------------------------------------------------------

    async def run_code(self, request: RunCodeRequest) -> tuple[RunCodeResponse, Outcome]:
        """Run one SandboxFusion request; also returns retool_exec's finer outcome."""
        _check_language(request.language)
        files = check_files(request.files, request.fetch_files, self.settings)
        timeout = self.clamp_timeout(request.run_timeout)
        memory = self.clamp_memory(request.memory_limit_MB)
        nonce: str | None = None
        program = request.code
        if not files.empty or request.stdin:
            nonce = new_nonce()
            spec = code_spec(
                request.code,
                files=files,
                stdin=request.stdin or None,
                nonce=nonce,
                fetch_budget=self.settings.max_fetch_bytes,
            )
            program = build_program("run", spec)
        self._check_size(program)
        result = await self._run(program, timeout, memory)
        records = extract_records(result.stdout, nonce) if nonce else Records(text=result.stdout)
        run_result = self._command(result, records)
        notes = [outcome_message(result)]
        setup = records.of_kind("setup_error")
        if setup:
            run_result = run_result.model_copy(
                update={"status": CommandRunStatus.ERROR, "return_code": None}
            )
            notes.append(f"sandbox error: {setup[-1].get('error', 'could not write the files')}")
        fetched, fetch_note = _fetched_files(records, files, result)
        notes.append(fetch_note)
        response = RunCodeResponse(
            status=run_status(run_result),
            message="; ".join(note for note in notes if note),
            compile_result=None,
            run_result=run_result,
            executor_pod_name=None,
            files=fetched,
            request_id=request.request_id,
        )
        return response, Outcome.SANDBOX_ERROR if setup else result.outcome

    # -- POST /run_jupyter -------------------------------------------------------

    async def run_jupyter(self, request: RunJupyterRequest) -> tuple[RunJupyterResponse, Outcome]:
        """Run notebook cells in order in one sandbox; also returns the driver's outcome."""
        if request.kernel.lower() not in {"python3", "python"}:
            raise RequestRejected(f"kernel {request.kernel[:40]!r} is not served; use 'python3'")
        if len(request.cells) > self.settings.max_cells:
            raise RequestRejected(
                f"{len(request.cells)} cells given; the server runs at most "
                f"{self.settings.max_cells}",
                status=413,
            )
        files = check_files(request.files, request.fetch_files, self.settings)
        total = self.clamp_timeout(request.total_timeout)
        cell_timeout = request.cell_timeout
        cell_timeout = min(cell_timeout, total) if math.isfinite(cell_timeout) else 0.0
        nonce = new_nonce()
        spec = cells_spec(
            request.cells,
            cell_timeout=max(0.0, cell_timeout),
            cell_chars=max(128, self.settings.jupyter_output_chars // max(1, len(request.cells))),
            files=files,
            nonce=nonce,
            fetch_budget=self.settings.max_fetch_bytes,
        )
        program = build_program("run_cells", spec)
        self._check_size(program)
        result = await self._run(program, total, self.clamp_memory(None))
        records = extract_records(result.stdout, nonce)
        driver = self._command(result, records)
        notes = [outcome_message(result)]
        setup = records.of_kind("setup_error")
        if setup:
            driver = driver.model_copy(
                update={"status": CommandRunStatus.ERROR, "return_code": None}
            )
            notes.append(f"sandbox error: {setup[-1].get('error', 'could not write the files')}")
        cells, cells_note = cells_from_records(records, len(request.cells))
        notes.append(cells_note)
        fetched, fetch_note = _fetched_files(records, files, result)
        notes.append(fetch_note)
        response = RunJupyterResponse(
            status=run_status(driver),
            message="; ".join(note for note in notes if note),
            driver=driver,
            cells=cells,
            executor_pod_name=None,
            files=fetched,
            request_id=request.request_id,
        )
        return response, Outcome.SANDBOX_ERROR if setup else result.outcome

    # -- POST /v1/exec -------------------------------------------------------------

    async def exec(self, request: ExecRequest) -> ExecResult:
        """retool_exec's own call: an ExecResult, streams cut to ``output_chars``."""
        self._check_size(request.code)
        result = await self._run(
            request.code, self.clamp_timeout(request.timeout), self.clamp_memory(request.memory_mb)
        )
        limit = self.settings.output_chars
        stdout, stdout_dropped = cut_stream(result.stdout, result.stdout_dropped_chars, limit)
        stderr, stderr_dropped = cut_stream(result.stderr, result.stderr_dropped_chars, limit)
        return result.model_copy(
            update={
                "stdout": stdout,
                "stderr": stderr,
                "stdout_dropped_chars": stdout_dropped,
                "stderr_dropped_chars": stderr_dropped,
            }
        )

    def metrics(self) -> dict[str, float]:
        """The sandbox's metrics plus the queue's."""
        return {**self.sandbox.stats.metrics(), **self.admission.metrics()}

    # -- limits ----------------------------------------------------------------------

    def clamp_timeout(self, requested: float | None) -> float:
        """The wall-clock limit for a call: the default when absent or not positive,
        never above the server's maximum."""
        settings = self.settings
        if requested is None or not math.isfinite(requested) or requested <= 0:
            requested = settings.default_run_timeout
        return min(requested, settings.max_run_timeout)

    def clamp_memory(self, requested: int | None) -> int | None:
        """The memory cap for a call: below 1 (SandboxFusion's -1) means the server's cap."""
        ceiling = self.settings.max_memory_mb
        if requested is None or requested < 1:
            return ceiling
        return requested if ceiling is None else min(requested, ceiling)

    # -- internals ---------------------------------------------------------------------

    def _check_size(self, program: str) -> None:
        if len(program) > self.sandbox.max_code_chars:
            raise RequestRejected(
                f"the program to run is {len(program)} characters; the sandbox accepts at most "
                f"{self.sandbox.max_code_chars}",
                status=413,
            )

    async def _run(self, program: str, timeout: float, memory: int | None) -> ExecResult:
        async with self.admission.slot():
            started = time.perf_counter()
            try:
                return await self.sandbox.arun_code(program, timeout=timeout, memory_mb=memory)
            except Exception as exc:  # the sandbox broke: an answer, not an HTTP error
                log.exception("the sandbox failed to run a request")
                return ExecResult.sandbox_failure(
                    f"{type(exc).__name__}: {exc}",
                    backend=self.sandbox.backend.name,
                    latency=time.perf_counter() - started,
                )

    def _command(self, result: ExecResult, records: Records) -> CommandRunResult:
        limit = self.settings.output_chars
        stdout, _ = cut_stream(records.text, result.stdout_dropped_chars, limit)
        stderr, _ = cut_stream(result.stderr, result.stderr_dropped_chars, limit)
        if result.outcome is Outcome.SANDBOX_ERROR:
            log.warning("sandbox error: %s", result.detail)
        return command_result(result, stdout=stdout, stderr=stderr)


def _check_language(language: str) -> None:
    if language.lower() not in PYTHON_LANGUAGES:
        raise RequestRejected(
            f"language {language[:40]!r} is not served: retool_exec runs Python only (use 'python')"
        )


def _fetched_files(
    records: Records, files: FileSpec, result: ExecResult
) -> tuple[dict[str, str], str]:
    """The fetched files and a note on the ones that could not be returned."""
    if not files.fetch:
        return {}, ""
    found = records.of_kind("files")
    if not found:
        why = (
            "the files record was cut by the output cap; fetch less or print less"
            if records.lost
            else "the program ended before its files could be read "
            f"({result.outcome.value}; os._exit or a kill skips the read-back)"
        )
        return {}, f"fetch_files: nothing returned: {why}"
    record: dict[str, Any] = found[-1]
    raw_files = record.get("files")
    raw_errors = record.get("errors")
    wanted = {name for name, _ in files.fetch}
    fetched = {
        name: content
        for name, content in (raw_files.items() if isinstance(raw_files, dict) else ())
        if name in wanted and isinstance(content, str)
    }
    problems = [
        f"{name}: {reason}"
        for name, reason in (raw_errors.items() if isinstance(raw_errors, dict) else ())
        if name in wanted
    ]
    return fetched, ("fetch_files: " + "; ".join(problems)) if problems else ""
