"""The seed's local executor: a fresh ``python -B`` process per call.

**This is NOT a security boundary.** The code runs as the host user, sees the
host's environment (secrets included), files and network, and can use all
memory. It exists to compare against and for trusted code; use the Docker
backend for anything a model wrote.

It keeps the seed's behaviour for ordinary code (RLIMIT_CPU = int(timeout)+5,
wall-clock timeout, new session, ``<sandbox>`` filename, ``__main__``
namespace, tail-capped output, the four thread variables) and fixes what the
seed gets wrong:

- the whole process group is SIGKILLed on every path (normal exit, error,
  timeout, cancellation), not only on timeout;
- output is drained from pipes while it is produced and only a bounded tail
  is kept, so a flood can neither block the child, fill the disk nor grow the
  host's memory (the seed wrote it to temporary files of unbounded size);
- the code travels over stdin, not argv, so 10 MB of code does not hit the
  kernel's argument-size limit (the seed raised ``OSError: E2BIG``);
- a background process that keeps the pipes open cannot hold the call open.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

from retool_exec._models import ExecResult, classify_exit
from retool_exec._output import TailBuffer, read_cap_bytes
from retool_exec.backends.base import Backend, RunRequest
from retool_exec.backends.config import LocalConfig

__all__ = ["CHILD_ENV_OVERRIDES", "LocalSubprocessBackend"]

CHILD_ENV_OVERRIDES = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "VECLIB_MAXIMUM_THREADS": "1",
}
"""The seed's four variables: one numeric-library thread per sandboxed process."""

# Runs in the child. The code arrives on stdin (never in argv or a shell);
# stdin is then pointed at /dev/null, and the helper removes itself from
# __main__ before the code runs, so the namespace is as clean as the seed's.
# Errors are printed without this bootstrap's own frame, so a traceback
# starts at File "<sandbox>" exactly as in the Docker backend.
_BOOTSTRAP = (
    "def _retool_boot():\n"
    "    import os, resource, sys\n"
    "    resource.setrlimit(resource.RLIMIT_CPU, ({cpu}, {cpu}))\n"
    "    source = sys.stdin.buffer.read()\n"
    "    fd = os.open(os.devnull, os.O_RDONLY)\n"
    "    os.dup2(fd, 0)\n"
    "    os.close(fd)\n"
    "    try:\n"
    "        return compile(source.decode('utf-8', 'surrogatepass'), '<sandbox>', 'exec')\n"
    "    except Exception as exc:\n"
    "        sys.excepthook(type(exc), exc.with_traceback(None), None)\n"
    "        raise SystemExit(1) from None\n"
    "try:\n"
    "    exec(globals().pop('_retool_boot')())\n"
    "except SystemExit:\n"
    "    raise\n"
    "except BaseException as _retool_exc:\n"
    "    _retool_exc.with_traceback(_retool_exc.__traceback__.tb_next)\n"
    "    __import__('sys').excepthook(type(_retool_exc), _retool_exc, _retool_exc.__traceback__)\n"
    "    raise SystemExit(1) from None\n"
)

_PIPE_GRACE = 0.25
"""Seconds to collect output still in the pipes after the process group is gone."""


class LocalSubprocessBackend(Backend):
    """A fresh local Python subprocess per call. NOT a security boundary."""

    name = "local"

    def __init__(self, config: LocalConfig | None = None) -> None:
        self.config = config or LocalConfig()

    def _child_env(self) -> dict[str, str]:
        base = dict(os.environ) if self.config.inherit_env else {"PATH": os.defpath}
        return {**base, **CHILD_ENV_OVERRIDES}

    async def run(self, request: RunRequest) -> ExecResult:
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        capture = _Capture(loop, read_cap_bytes(self.config.max_output_chars))
        try:
            transport, _ = await loop.subprocess_exec(
                lambda: capture,
                self.config.python,
                "-B",
                "-c",
                _BOOTSTRAP.format(cpu=request.cpu_seconds),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._child_env(),
                start_new_session=True,
            )
        except OSError as exc:
            return _failure(f"could not start {self.config.python!r}: {exc}", started)

        timed_out = False
        try:
            stdin = transport.get_pipe_transport(0)
            if stdin is not None:
                stdin.write(request.code.encode("utf-8", errors="surrogatepass"))  # type: ignore[attr-defined]
                stdin.close()
            try:
                await asyncio.wait_for(asyncio.shield(capture.exited), request.timeout)
            except TimeoutError:
                timed_out = True
        finally:
            _kill_group(transport.get_pid())
            try:
                await asyncio.shield(capture.exited)
                # Output still in the pipes arrives at once; a stray process that
                # escaped the group and holds the pipes open gets a short grace only.
                await asyncio.wait([capture.pipes_closed], timeout=_PIPE_GRACE)
            finally:
                transport.close()

        limit = self.config.max_output_chars
        out_text, out_dropped = capture.stdout.finish(limit)
        err_text, err_dropped = capture.stderr.finish(limit)
        returncode = None if timed_out else transport.get_returncode()
        return ExecResult(
            ok=not timed_out and returncode == 0,
            stdout=out_text,
            stderr=err_text,
            returncode=returncode,
            timed_out=timed_out,
            latency=time.perf_counter() - started,
            outcome=classify_exit(returncode, timed_out=timed_out),
            stdout_dropped_chars=out_dropped,
            stderr_dropped_chars=err_dropped,
            backend=self.name,
        )


class _Capture(asyncio.SubprocessProtocol):
    """Feeds both pipes into tail buffers as data arrives; notes exit and pipe closure.

    ``process_exited`` fires when the process ends, independently of whether
    something else still holds its pipes (``Process.wait()`` would wait for both).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, cap_bytes: int) -> None:
        self.stdout = TailBuffer(cap_bytes)
        self.stderr = TailBuffer(cap_bytes)
        self.exited: asyncio.Future[None] = loop.create_future()
        self.pipes_closed: asyncio.Future[None] = loop.create_future()
        self._open_pipes = {1, 2}

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        chunk = data.encode() if isinstance(data, str) else data
        (self.stdout if fd == 1 else self.stderr).feed(chunk)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self._open_pipes.discard(fd)
        if not self._open_pipes and not self.pipes_closed.done():
            self.pipes_closed.set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _failure(detail: str, started: float) -> ExecResult:
    return ExecResult.sandbox_failure(
        detail, backend=LocalSubprocessBackend.name, latency=time.perf_counter() - started
    )
