"""The ``retool-exec`` command: one module per subcommand, found by name.

Each ``retool_exec.cli.cmd_<name>`` module has ``register(subparsers)``, which
adds its parser and sets ``handler`` (a function ``(args) -> int``). A
subcommand whose module is absent is simply not offered.

:func:`main` is the one place that turns retool_exec's errors into one line on
stderr and an exit status (``_common.EXIT_STATUS_HELP``); handlers raise them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from retool_exec._errors import BackendUnavailableError, ConfigError, RetoolExecError
from retool_exec.cli._common import (
    EXIT_INTERRUPTED,
    EXIT_PIPE,
    EXIT_SOFTWARE,
    EXIT_STATUS_HELP,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    SETTINGS_HELP,
    UsageError,
    backend_list,
)

__all__ = ["main"]

SUBCOMMANDS = ("run", "image", "doctor", "gc", "audit", "bench", "serve", "mcp")

_DESCRIPTION = """\
Run untrusted, model-written Python safely and fast.

Examples:
  retool-exec run -c 'print(2 + 3)'                   # local subprocess (NOT isolated)
  retool-exec run --backend docker -c 'print(2+3)'    # hardened container
  retool-exec run --json --backend docker script.py
  echo 'print(1/0)' | retool-exec run -
"""


def _epilog() -> str:
    return (
        f"Backends (--backend NAME):\n{backend_list()}\n\n{SETTINGS_HELP}\n\n{EXIT_STATUS_HELP}\n"
    )


def build_parser() -> argparse.ArgumentParser:
    """The full parser with every available subcommand."""
    parser = argparse.ArgumentParser(
        prog="retool-exec",
        description=_DESCRIPTION,
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from retool_exec import __version__

    parser.add_argument("--version", action="version", version=f"retool-exec {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"retool_exec.cli.cmd_{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"retool_exec.cli.cmd_{name}":
                continue
            if exc.name is None or exc.name.startswith("retool_exec"):
                raise
            _register_missing(subparsers, name, exc)
            continue
        module.register(subparsers)
    return parser


def _register_missing(subparsers: Any, name: str, missing: ModuleNotFoundError) -> None:
    """A subcommand whose optional extra is not installed: it says so when used.

    Why: ``serve`` imported the server package at the top, so without the ``server``
    extra every command (``run`` too) failed with a traceback."""
    message = str(missing) if "pip install" in str(missing) else f"needs {missing.name}"

    def refuse(_args: argparse.Namespace) -> int:
        raise UsageError(message)

    parser = subparsers.add_parser(
        name, help=f"(not installed: {missing.name})", add_help=False, prefix_chars="\0"
    )
    parser.add_argument("rest", nargs="*")  # whatever was given: the command is missing
    parser.set_defaults(handler=refuse)


def _one_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def _silence_stdout() -> None:
    """After a closed pipe: point stdout at /dev/null so the exit flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # not a real file (a test's capture): nothing to flush
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return EXIT_USAGE
    prefix = f"retool-exec {args.command}"
    try:
        status: int = handler(args)
        sys.stdout.flush()
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_PIPE
    except ConfigError as exc:
        print(f"{prefix}: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except BackendUnavailableError as exc:
        print(f"{prefix}: {_one_line(exc)}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except RetoolExecError as exc:
        print(f"{prefix}: {_one_line(exc)}", file=sys.stderr)
        return EXIT_SOFTWARE
    return status


if __name__ == "__main__":
    sys.exit(main())
