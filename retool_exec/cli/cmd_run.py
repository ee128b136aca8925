"""``retool-exec run``: run one program, as ``python`` would, and print what the model would see."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from retool_exec._models import ExecResult, Outcome
from retool_exec._sandbox import Sandbox
from retool_exec.backends.config import BackendConfigBase, FakeConfig, LocalConfig
from retool_exec.cli._common import (
    EXIT_STATUS_HELP,
    SETTINGS_HELP,
    UsageError,
    add_settings_options,
    backend_list,
    build_configs,
)
from retool_exec.cli._terminal import write_untrusted

__all__ = [
    "EXIT_STATUS",
    "ONE_OFF_DEFAULTS",
    "exit_status",
    "read_code",
    "register",
    "script_name",
]

EXIT_STATUS = {
    Outcome.SUCCESS: 0,
    Outcome.ERROR: 1,
    Outcome.TIMEOUT: 124,
    Outcome.OOM: 125,
    Outcome.CPU_LIMIT: 126,
    Outcome.SIGNAL: 128,
    Outcome.REJECTED: 65,
    Outcome.SANDBOX_ERROR: 70,
}

ONE_OFF_DEFAULTS: dict[str, Any] = {"pool_size": 1}
"""One program needs one container, not a warm pool (``--set pool_size=N`` still wins)."""

STARTING = "starting sandbox…"
"""Said on stderr, when it is a terminal, while a container backend starts."""


def _epilog() -> str:
    return f"""\
Like python: FILE is a program (read as UTF-8, a BOM allowed), - reads the
program from standard input, and -c CODE runs CODE. A FILE that does not
exist is an error, never run as code. FILE runs as a copy in the sandbox's
working directory, under its own name: __file__ and sys.argv[0] name that
copy (the files beside FILE are not copied). With - or -c, sys.argv is
['-c'] and there is no __file__.

Backends (--backend NAME, default local):
{backend_list()}

{SETTINGS_HELP}
One run starts one container (pool_size=1).

Exit status: the code's outcome: 0 success, 1 the code failed, 124 timeout,
125 out of memory, 126 CPU-time limit, 128+N killed by signal N, 65 code
rejected (too large), 70 the sandbox itself failed.
{EXIT_STATUS_HELP}

Examples:
  retool-exec run -c 'print(2 + 3)'
  retool-exec run --backend docker --json script.py
  retool-exec run --backend docker-runsc --set memory_mb=512 - < script.py
"""


def register(subparsers: Any) -> None:
    """Add the ``run`` subcommand."""
    parser = subparsers.add_parser(
        "run",
        help="run a program and print what the model would see",
        description="Run a Python program in a sandbox and print the tool observation.",
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "file", metavar="FILE", nargs="?", default=None, help="program file, or - for stdin"
    )
    parser.add_argument("-c", dest="code", metavar="CODE", default=None, help="program text")
    parser.add_argument("--backend", default="local", metavar="NAME", help="backend (local)")
    parser.add_argument("--timeout", type=float, default=None, help="wall-clock seconds (30)")
    parser.add_argument("--json", action="store_true", help="print the full ExecResult as JSON")
    parser.add_argument(
        "--auto-print", action="store_true", help="print the value of a final expression"
    )
    parser.add_argument("--runtime", default=None, help="docker: OCI runtime, e.g. runsc")
    parser.add_argument(
        "--docker-host", default=None, metavar="URL", help="docker: daemon address (DOCKER_HOST)"
    )
    add_settings_options(parser)
    parser.set_defaults(handler=_handle)


def _decode(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{name} is not UTF-8 text (byte {exc.start}: {exc.reason})") from exc


def read_code(file: str | None, code: str | None, stdin: BinaryIO | None = None) -> str:
    """The program: ``-c CODE``, standard input for ``-``, or FILE's UTF-8 text."""
    if code is not None and file is not None:
        raise UsageError("give a FILE or -c CODE, not both")
    if code is not None:
        return code
    if file is None:
        raise UsageError("nothing to run: give a FILE, - for standard input, or -c CODE")
    if file == "-":
        return _decode((stdin or sys.stdin.buffer).read(), "standard input")
    path = Path(file)
    try:
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise UsageError(f"no such file: {file!r} (to run code as text, use -c CODE)") from exc
    except OSError as exc:
        raise UsageError(f"cannot read {file!r}: {exc.strerror or exc}") from exc
    return _decode(data, repr(file))


def script_name(file: str | None) -> str | None:
    """The name a FILE runs under in the sandbox, as ``python FILE`` gives it ``__file__``
    and ``sys.argv[0]``; None for ``-`` and ``-c`` (run as ``python -c``)."""
    if file is None or file == "-":
        return None
    return Path(file).name


def exit_status(result: ExecResult) -> int:
    """The process exit status for a result's outcome (see ``--help``)."""
    status = EXIT_STATUS[result.outcome]
    if result.outcome is Outcome.SIGNAL and result.returncode is not None:
        status = 128 + min(-result.returncode, 127)
    return status


def build_config(args: argparse.Namespace) -> BackendConfigBase:
    """The backend config the arguments describe (one container for a one-off run)."""
    flags = {
        key: (value, flag)
        for key, value, flag in (
            ("runtime", args.runtime, "--runtime"),
            ("docker_host", args.docker_host, "--docker-host"),
        )
        if value is not None
    }
    return build_configs([args.backend], args, defaults=ONE_OFF_DEFAULTS, flags=flags)[args.backend]


def _start(sandbox: Sandbox, config: BackendConfigBase, stderr: TextIO) -> None:
    """Start the backend; say so on a terminal when it is one that takes a while."""
    slow = not isinstance(config, LocalConfig | FakeConfig)
    tell = slow and stderr.isatty()
    if tell:
        stderr.write(STARTING)
        stderr.flush()
    try:
        sandbox.start()
    finally:
        if tell:
            stderr.write("\r\x1b[K")  # erase the line again
            stderr.flush()


def _handle(args: argparse.Namespace) -> int:
    code = read_code(args.file, args.code)
    config = build_config(args)
    with Sandbox(config, timeout=args.timeout, auto_print=args.auto_print) as sandbox:
        _start(sandbox, config, sys.stderr)
        result = sandbox.run_code(code, script=script_name(args.file))
        text = (
            result.model_dump_json(indent=2) if args.json else sandbox.format_tool_content(result)
        )
    write_untrusted(text)
    return exit_status(result)
