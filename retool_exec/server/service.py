"""The server's work, without HTTP: limits, the sandbox call, the answer.

``SandboxService`` turns a parsed request into a response model. It clamps
the client's limits to the server's, checks the files, waits for a slot in
the bounded queue, runs the call on the ``Sandbox`` and maps the
``ExecResult`` onto SandboxFusion's shape. The app (``app.py``) only parses
bodies and serialises answers.

Nothing the code prints has any authority: ``stdin``, ``files`` and
``fetch_files`` travel in the ``RunRequest`` and are handled by the backend
outside the code's process, and a notebook's cells are run and captured apart
by the backend itself. The answer's status, message, files and cells are
derived from the ``ExecResult``'s fields alone; the code's output is only
ever copied into ``stdout``/``stderr`` as text.

A failure of the sandbox itself never becomes an HTTP error: it is an answer
with ``status: "SandboxError"`` and a message, as SandboxFusion gives, so a
trainer drops the sample instead of scoring the model for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping

from retool_exec._errors import ConfigError
from retool_exec._models import ExecResult, Outcome
from retool_exec._sandbox import Sandbox
from retool_exec.backends.base import MAX_STACK_MB, RunRequest
from retool_exec.server.admission import Admission, Overloaded
from retool_exec.server.files import RequestRejected, check_files, fetched_files
from retool_exec.server.jupyter import notebook_cells
from retool_exec.server.results import command_result, cut_stream, outcome_message, run_status
from retool_exec.server.schemas import (
    CommandRunResult,
    ExecRequest,
    RunCodeRequest,
    RunCodeResponse,
    RunJupyterRequest,
    RunJupyterResponse,
    RunStatus,
)
from retool_exec.server.sessions import SessionService
from retool_exec.server.settings import ServerSettings

__all__ = ["PYTHON_LANGUAGES", "SandboxService"]

log = logging.getLogger("retool_exec.server")

Disconnected = Callable[[], Awaitable[bool]]
"""Tells whether the request's client has gone (Starlette's ``request.is_disconnected``)."""

PYTHON_LANGUAGES = frozenset({"python", "python3", "py"})
"""``language`` values served; SandboxFusion's other languages are refused with 400."""


WAIT_TOLERANCE = 0.05
"""Seconds past its ``free_wait`` a request may have spent before its run and still run
its whole ``run_timeout`` (taking a free slot takes a moment); its answer may then come
that much after ``compile_timeout + run_timeout``, well within any client's slack."""


class SandboxService:
    """Runs requests on one Sandbox within the server's limits."""

    def __init__(self, sandbox: Sandbox, settings: ServerSettings, *, owned: bool) -> None:
        self.sandbox = sandbox
        self.settings = settings
        self.owned = owned
        self.admission = Admission(
            max_concurrency=_run_slots(sandbox, settings),
            max_queue=settings.max_queue,
            queue_timeout=settings.queue_timeout,
        )
        self.sessions = SessionService(self)
        """``/sessions``: stateful interpreters for HTTP clients (``sessions.py``)."""

    async def start(self) -> None:
        """Warm the backend before the first request arrives."""
        self.admission.reopen()
        await self.sandbox.astart()

    def begin_shutdown(self) -> None:
        """The server has begun to shut down: queued and new requests are refused at once
        (504, ``ShuttingDown``); running ones go on for the grace period (``shutdown.py``).
        Idempotent; called from the event loop."""
        if not self.admission.closing:
            log.info(
                "shutting down: %d running call(s) may finish; %d queued refused",
                self.admission.running,
                self.admission.waiting,
            )
        self.admission.close()

    @property
    def stopping(self) -> bool:
        """Whether ``begin_shutdown`` was called (since the last ``start``)."""
        return self.admission.closing

    async def close(self) -> None:
        """Close the sessions the server opened, and the sandbox if the server built it
        (a caller's sandbox stays open)."""
        try:
            await self.sessions.close()
        finally:
            if self.owned:
                await self.sandbox.aclose()

    # -- POST /run_code ----------------------------------------------------------

    async def run_code(
        self, request: RunCodeRequest, *, gone: Disconnected | None = None
    ) -> tuple[RunCodeResponse, Outcome]:
        """Run one SandboxFusion request; also returns retool_exec's finer outcome.

        It waits for a slot at most its ``free_wait`` and half its run time more, and
        not at all once ``gone`` says the client left; a wait past its ``free_wait``
        runs the code with what is left (``_run_in_time``).
        """
        _check_language(request.language)
        files = check_files(request.files, request.fetch_files, self.settings)
        _check_seconds("run_timeout", request.run_timeout)
        _check_seconds("compile_timeout", request.compile_timeout, zero_ok=True)
        timeout = self.clamp_timeout(request.run_timeout)
        memory = self.clamp_memory(request.memory_limit_MB)
        stdin = None if request.stdin is None else request.stdin.encode("utf-8", "replace")
        self._check_size(request.code)
        script = script_name(files.uploads)
        with _bad_input():  # checked here, so a bad input is a 400 and never queues
            call = RunRequest(
                code=request.code,
                timeout=timeout,
                memory_mb=memory,
                # SandboxFusion's runner sets the stack limit to memory_limit_MB when one
                # is given: deep recursion through C frames (lru_cache) passes there.
                # (Bounded as ``RunRequest`` bounds it: a memory limit above that is a
                # 400 otherwise, where the server clamps memory limits.)
                stack_mb=(
                    min(memory, MAX_STACK_MB)
                    if memory is not None and request.memory_limit_MB > 0
                    else None
                ),
                stdin=stdin,
                files=files.uploads,
                fetch=files.fetch_paths,
                fetch_budget=self.settings.max_fetch_bytes,  # read no more than is returned
                script=script,
                auto_print=self.sandbox.auto_print,
            )
        # Only a compile_timeout the client sent is time it allows: SkyRL's coder1 sends
        # none and reads for run_timeout + 2 s, so the default's 10 s of waiting had its
        # correct answers arrive after it gave up (thirty-third red-team round).
        allowed = request.compile_timeout if "compile_timeout" in request.model_fields_set else 0
        free = self.free_wait(allowed, request.run_timeout, timeout)
        queued = time.monotonic()
        result = await self._run(
            lambda: self._run_in_time(call, excess=time.monotonic() - queued - free),
            wait=free + timeout / 2,
            gone=gone,
            passthrough=(Overloaded,),
        )
        run_result = self._command(result)
        fetched, fetch_note = fetched_files(result, files, self.settings.max_fetch_bytes)
        notes = [outcome_message(result), fetch_note]
        response = RunCodeResponse(
            status=run_status(run_result),
            message="; ".join(note for note in notes if note),
            compile_result=None,
            run_result=run_result,
            executor_pod_name=None,
            files=fetched,
            request_id=request.request_id,
        )
        return response, result.outcome

    # -- POST /run_jupyter -------------------------------------------------------

    async def run_jupyter(
        self, request: RunJupyterRequest, *, gone: Disconnected | None = None
    ) -> tuple[RunJupyterResponse, Outcome]:
        """Run notebook cells in order in one sandbox; also returns the call's outcome.

        It waits for a slot at most ``queue_timeout`` seconds (a notebook request
        has no time of its own to spare), and not at all once ``gone``.
        """
        if request.kernel.lower() not in {"python3", "python"}:
            raise RequestRejected(f"kernel {request.kernel[:40]!r} is not served; use 'python3'")
        count = len(request.cells)
        if count > self.settings.max_cells:
            raise RequestRejected(
                f"{count} cells given; the server runs at most {self.settings.max_cells}",
                status=413,
            )
        files = check_files(request.files, request.fetch_files, self.settings)
        _check_seconds("total_timeout", request.total_timeout)
        _check_seconds("cell_timeout", request.cell_timeout, zero_ok=True)
        total = self.clamp_timeout(request.total_timeout)
        cell_timeout = min(request.cell_timeout, total)
        self._check_size("".join(request.cells))
        cell_chars = max(128, self.settings.jupyter_output_chars // max(1, count))
        with _bad_input():
            call = RunRequest(
                code="",
                cells=tuple(request.cells),
                cell_timeout=cell_timeout or None,
                cell_output_chars=cell_chars,  # cut where captured: no more is returned
                timeout=total,
                memory_mb=self.clamp_memory(None),
                files=files.uploads,
                fetch=files.fetch_paths,
                fetch_budget=self.settings.max_fetch_bytes,
            )
        if count:
            result = await self._run(lambda: self._run_request(call), gone=gone)
        else:
            result = _no_cells()
        driver = self._command(result)
        cells, finished, cells_note = notebook_cells(
            result,
            count,
            cell_chars=cell_chars,
            cell_timeout=cell_timeout,
            total_timeout=total,
        )
        fetched, fetch_note = fetched_files(result, files, self.settings.max_fetch_bytes)
        status, outcome = run_status(driver), result.outcome
        if status is RunStatus.SUCCESS and finished < count:
            # The interpreter ended before every cell had run (``os._exit(0)`` in a cell):
            # the header says what the body says (it said success; red team B).
            status, outcome = RunStatus.FAILED, Outcome.ERROR
        notes = [outcome_message(result), cells_note, fetch_note]
        response = RunJupyterResponse(
            status=status,
            message="; ".join(note for note in notes if note),
            driver=driver,
            cells=cells,
            executor_pod_name=None,
            files=fetched,
            request_id=request.request_id,
        )
        return response, outcome

    # -- POST /v1/exec -------------------------------------------------------------

    async def exec(self, request: ExecRequest, *, gone: Disconnected | None = None) -> ExecResult:
        """retool_exec's own call: an ExecResult, streams cut to ``output_chars``.

        It waits for a slot at most ``queue_timeout`` seconds, and not at all once ``gone``.
        """
        self._check_size(request.code)
        timeout = self.clamp_timeout(request.timeout)
        memory = self.clamp_memory(request.memory_mb)
        result = await self._run(
            lambda: self.sandbox.arun_code(request.code, timeout=timeout, memory_mb=memory),
            gone=gone,
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
        return {
            **self.sandbox.stats.metrics(),
            **self.admission.metrics(),
            **self.sessions.metrics(),
        }

    # -- limits ----------------------------------------------------------------------

    def clamp_timeout(self, requested: float | None) -> float:
        """The wall-clock limit for a call: the default when absent (or not a positive
        number, which a request is refused for before it gets here), never above the
        server's maximum."""
        settings = self.settings
        if requested is None or not math.isfinite(requested) or requested <= 0:
            requested = settings.default_run_timeout
        return min(requested, settings.max_run_timeout)

    def free_wait(
        self, compile_timeout: float, run_timeout: float | None, applied_timeout: float
    ) -> float:
        """Seconds a ``/run_code`` request may wait for a slot and still run its whole
        ``run_timeout``; it may wait half its run time more (``run_code``), then runs
        with what is left (``_run_in_time``).

        A SandboxFusion client allows a request ``compile_timeout + run_timeout``
        seconds and more (verl: ``+ 10`` s), since SandboxFusion may spend that
        long compiling and running it; its runner bounds the run by wall time, so
        under load a program there runs slower within the same limit. Python
        compiles nothing, so the request may wait ``compile_timeout``, plus the part
        of ``run_timeout`` the server clamped away: waiting and running together take
        no longer than SandboxFusion could have, and the answer reaches the client
        before its read timeout. Why half its run time more: a client that does not
        retry a 504 (Reasoning360's coder1) lost a third of its correct answers to a
        10 s bound under a burst, while its programs needed under a second.
        ``Admission`` caps the whole wait at ``queue_timeout``.
        """
        asked = self.settings.default_run_timeout if run_timeout is None else run_timeout
        return compile_timeout + max(0.0, asked - applied_timeout)

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
                f"the code to run is {len(program)} characters; the sandbox accepts at most "
                f"{self.sandbox.max_code_chars}",
                status=413,
            )

    async def _run(
        self,
        call: Callable[[], Awaitable[ExecResult]],
        *,
        wait: float | None = None,
        gone: Disconnected | None = None,
        passthrough: tuple[type[Exception], ...] = (),
    ) -> ExecResult:
        """Run ``call`` in a slot; its exceptions become a sandbox-failure answer, but for
        ``ConfigError`` (a 400) and ``passthrough`` (raised as they are)."""
        async with self.admission.slot(wait=wait, gone=gone):
            started = time.perf_counter()
            try:
                return await call()
            except passthrough:
                raise
            except ConfigError as exc:  # checked before; kept as a 400 should it happen
                raise RequestRejected(str(exc)) from exc
            except Exception as exc:  # the sandbox broke: an answer, not an HTTP error
                log.exception("the sandbox failed to run a request")
                return ExecResult.sandbox_failure(
                    f"{type(exc).__name__}: {exc}",
                    backend=self.sandbox.backend.name,
                    latency=time.perf_counter() - started,
                )

    async def _run_in_time(self, request: RunRequest, *, excess: float) -> ExecResult:
        """Run ``request`` with its time less ``excess``, the seconds it waited for a slot
        past its ``free_wait``.

        Should it then be stopped at that shorter limit, the server, not the code, took
        its time: the answer is 504 (verl retries it), never a TimeLimitExceeded the code
        did not earn. A request that did not wait past its ``free_wait`` (give or take
        ``WAIT_TOLERANCE``) runs its whole time: with ``compile_timeout: 0`` the
        moments spent parsing it and taking a free slot made every program that ran to
        its limit a 504 (twenty-fourth outside check).
        """
        if excess <= WAIT_TOLERANCE:
            return await self._run_request(request)
        left = request.timeout - excess
        busy = (
            f"the server was busy: the code waited for a run slot and then had "
            f"{max(left, 0):.1f} s of its {request.timeout:g} s"
        )
        if left <= 0:
            raise self.admission.refuse(f"{busy}; retry later")
        result = await self._run_request(dataclasses.replace(request, timeout=left))
        if result.outcome in (Outcome.TIMEOUT, Outcome.CPU_LIMIT):
            raise self.admission.refuse(f"{busy}, and used them; retry later")
        return result

    async def _run_request(self, request: RunRequest) -> ExecResult:
        """Run a prepared request through the sandbox: its slots, stats and event loop.

        ``Sandbox.arun_code`` takes no ``cells=`` and no budgets, so a notebook (and a
        ``/run_code`` call, with its fetch budget) goes in as a ``RunRequest`` by the same
        path ``arun_code`` uses once it has built one.
        """
        sandbox, submitted = self.sandbox, time.perf_counter()
        if sandbox._runs_here():  # as ``arun_code``: on this loop, no hop to the sandbox's
            return await sandbox._run(request, submitted)
        return await sandbox._acall_in_loop(sandbox._run(request, submitted))

    def _command(self, result: ExecResult) -> CommandRunResult:
        limit = self.settings.output_chars
        stdout, _ = cut_stream(result.stdout, result.stdout_dropped_chars, limit)
        stderr, _ = cut_stream(result.stderr, result.stderr_dropped_chars, limit)
        if result.outcome is Outcome.SANDBOX_ERROR:
            log.warning("sandbox error: %s", result.detail)
        return command_result(result, stdout=stdout, stderr=stderr)


def _run_slots(sandbox: Sandbox, settings: ServerSettings) -> int:
    """Requests the server runs at once: never more than the sandbox runs at once.

    Any more would wait in the Sandbox's own queue, where no deadline of the
    server's applies and ``/v1/metrics`` does not see them.
    """
    slots = sandbox.concurrency
    wanted = settings.max_concurrency
    if wanted is not None and wanted > slots:
        log.warning(
            "max_concurrency=%d is more than the sandbox runs at once (%d: its max_workers "
            "or the backend's capacity, e.g. a Docker pool_size); the server runs %d at once",
            wanted,
            slots,
            slots,
        )
    return slots if wanted is None else min(wanted, slots)


def _check_seconds(field: str, value: float | None, *, zero_ok: bool = False) -> None:
    """Refuse (400) a limit that is not a finite number of seconds above zero (or zero).

    A silent default would run the code under a limit the client never asked for.
    """
    if value is None or (math.isfinite(value) and (value > 0 or (zero_ok and value == 0))):
        return
    wanted = "zero or more" if zero_ok else "more than zero"
    raise RequestRejected(f"{field} must be a finite number of seconds, {wanted}; got {value!r}")


def _check_language(language: str) -> None:
    if language.lower() not in PYTHON_LANGUAGES:
        raise RequestRejected(
            f"language {language[:40]!r} is not served: retool_exec runs Python only (use 'python')"
        )


@contextlib.contextmanager
def _bad_input() -> Iterator[None]:
    """Turn ``RunRequest``'s refusal of an input into a 400 that says which."""
    try:
        yield
    except ValueError as exc:
        raise RequestRejected(f"bad request: {exc}") from exc


def _no_cells() -> ExecResult:
    """The result of a notebook without cells: nothing ran, nothing failed."""
    return ExecResult(True, "", "", 0, False, 0.0)


SCRIPT_NAMES = ("main.py", "_retool_main.py", "_retool_main_.py")
"""What ``/run_code`` calls the code's file: SandboxFusion runs ``python FILE``, so code may
read ``__file__`` or ``sys.argv[0]``. The first name no uploaded file takes."""


def script_name(uploads: Mapping[str, bytes]) -> str | None:
    """The script's file name for a request with these (normalised) uploads: the first of
    ``SCRIPT_NAMES`` no upload takes, as a file or as a folder (``main.py/data.txt`` was
    the sandbox's failure: thirty-third red-team round). None: all taken."""
    taken = {path.partition("/")[0] for path in uploads}
    return next((name for name in SCRIPT_NAMES if name not in taken), None)
