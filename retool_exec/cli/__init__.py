"""The ``retool-exec`` command: one module per subcommand, found by name.

Each ``retool_exec.cli.cmd_<name>`` module has ``register(subparsers)``, which
adds its parser and sets ``handler`` (a function ``(args) -> int``). A
subcommand whose module is absent is simply not offered.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main"]

SUBCOMMANDS = ("run", "image", "doctor", "gc", "audit", "bench", "serve")

_DESCRIPTION = """\
Run untrusted, model-written Python safely and fast.

Examples:
  retool-exec run 'print(2 + 3)'                  # local subprocess (NOT isolated)
  retool-exec run --backend docker 'print(2+3)'   # hardened container
  retool-exec run --json --backend docker script.py
  echo 'print(1/0)' | retool-exec run -
"""


def build_parser() -> argparse.ArgumentParser:
    """The full parser with every available subcommand."""
    parser = argparse.ArgumentParser(
        prog="retool-exec",
        description=_DESCRIPTION,
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
            raise
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        status: int = handler(args)
    except KeyboardInterrupt:
        return 130
    return status


if __name__ == "__main__":
    sys.exit(main())
