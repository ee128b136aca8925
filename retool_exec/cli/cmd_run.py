"""``retool-exec run``: run one piece of code and print what the model would see."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from retool_exec._errors import RetoolExecError
from retool_exec._models import ExecResult, Outcome
from retool_exec._sandbox import Sandbox
from retool_exec.backends.registry import available_backends
from retool_exec.cli._terminal import write_untrusted

__all__ = ["EXIT_STATUS", "exit_status", "register"]

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

_EPILOG = """\
SOURCE is code, a file name, or - for standard input (a SOURCE that names an
existing file is read from it; pass --code to force the text to be code).

Exit status: 0 success, 1 the code failed, 124 timeout, 125 out of memory,
126 CPU-time limit, 128 killed by a signal, 65 code rejected (too large),
70 the sandbox itself failed, 2 usage or configuration error.
"""


def register(subparsers: Any) -> None:
    """Add the ``run`` subcommand."""
    parser = subparsers.add_parser(
        "run",
        help="run code and print what the model would see",
        description="Run Python code in a sandbox and print the tool observation.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("source", metavar="SOURCE", help="code, a file, or - for stdin")
    parser.add_argument(
        "--backend",
        default="local",
        help=f"backend name (default: local; available: {', '.join(available_backends())})",
    )
    parser.add_argument("--timeout", type=float, default=None, help="wall-clock seconds (30)")
    parser.add_argument("--json", action="store_true", help="print the full ExecResult as JSON")
    parser.add_argument(
        "--auto-print", action="store_true", help="print the value of a final expression"
    )
    parser.add_argument("--code", action="store_true", help="treat SOURCE as code, never a file")
    parser.set_defaults(handler=_handle)


def read_source(source: str, *, force_code: bool = False) -> str:
    """The code named by SOURCE: stdin for ``-``, a file's text, or SOURCE itself."""
    if force_code:
        return source
    if source == "-":
        return sys.stdin.read()
    path = Path(source)
    if "\n" not in source and len(source) < 4096 and path.is_file():
        return path.read_text(encoding="utf-8", errors="surrogateescape")
    return source


def exit_status(result: ExecResult) -> int:
    """The process exit status for a result's outcome (see ``--help``)."""
    status = EXIT_STATUS[result.outcome]
    if result.outcome is Outcome.SIGNAL and result.returncode is not None:
        status = 128 + min(-result.returncode, 127)
    return status


def _handle(args: argparse.Namespace) -> int:
    try:
        code = read_source(args.source, force_code=args.code)
        with Sandbox(args.backend, timeout=args.timeout, auto_print=args.auto_print) as sandbox:
            result = sandbox.run_code(code)
            text = (
                result.model_dump_json(indent=2)
                if args.json
                else (sandbox.format_tool_content(result))
            )
    except (RetoolExecError, OSError) as exc:
        print(f"retool-exec run: {exc}", file=sys.stderr)
        return 2
    write_untrusted(text)
    return exit_status(result)
