"""``retool-exec mcp``: an MCP server (stdio, or streamable HTTP on 127.0.0.1) over the sandbox.

Needs the ``[mcp]`` extra (the official ``mcp`` SDK); this module imports it
only when the command runs, so ``retool-exec --help`` works without it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

from retool_exec._sandbox import DEFAULT_SESSION_TTL, Sandbox
from retool_exec.backends.config import BackendConfigBase
from retool_exec.backends.registry import backend_spec
from retool_exec.cli._common import (
    EXIT_INTERRUPTED,
    EXIT_STATUS_HELP,
    SETTINGS_HELP,
    UsageError,
    add_settings_options,
    backend_list,
    build_configs,
    sigterm_stops_quietly,
)

if TYPE_CHECKING:
    import socket

    from mcp.server.mcpserver import MCPServer

__all__ = ["COMMAND_DEFAULTS", "DEFAULT_MAX_SESSIONS", "HOST", "HTTP_PATH", "register"]

HOST = "127.0.0.1"
"""The only address ``--http`` listens on: the server has no authentication and runs code."""
HTTP_PATH = "/mcp"
DEFAULT_MAX_SESSIONS = 16
COMMAND_DEFAULTS: dict[str, Any] = {"pool_size": 2}
"""One agent's calls: two warm containers, not a training pool (``--set pool_size=N`` wins)."""


def _epilog() -> str:
    return f"""\
Serves the tools run_python and session_open/run/fork/close to an MCP client
(a desktop or IDE agent). Over stdio by default: the client starts the command
and talks on its stdin/stdout, e.g. in the client's JSON config:

  "retool-exec": {{"command": "retool-exec", "args": ["mcp"]}}

With --http PORT it serves streamable HTTP at http://{HOST}:PORT{HTTP_PATH}
instead, on {HOST} only (there is no authentication; for a server others
reach, use `retool-exec serve` with a token). See docs/mcp.md.

The sandbox starts on the first tool call, not at launch: a backend that
cannot start (Docker down) is an error in that call's result, and the next
call tries again. It is closed, containers included, when the server stops
(the client closes stdin, or SIGTERM/Ctrl-C).

Backends (--backend NAME, default docker):
{backend_list()}

{SETTINGS_HELP}
The pool size defaults to 2 (one agent's calls).
{EXIT_STATUS_HELP}
"""


def register(subparsers: Any) -> None:
    """Add the ``mcp`` subcommand."""
    parser = subparsers.add_parser(
        "mcp",
        help="serve the sandbox to MCP clients (stdio, or HTTP on 127.0.0.1)",
        description="Serve run_python and session tools over the Model Context Protocol.",
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--backend", default="docker", metavar="NAME", help="backend (docker)")
    parser.add_argument(
        "--http",
        type=int,
        default=None,
        metavar="PORT",
        help=f"serve streamable HTTP on {HOST}:PORT{HTTP_PATH} instead of stdio (0: any free port)",
    )
    parser.add_argument(
        "--host", default=HOST, help=f"with --http: the address, which must be {HOST}"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds a call runs when it does not ask (the backend's timeout: 30)",
    )
    parser.add_argument(
        "--max-timeout",
        type=float,
        default=None,
        metavar="S",
        help="the most a call may ask for (300)",
    )
    parser.add_argument(
        "--max-sessions",
        type=int,
        default=DEFAULT_MAX_SESSIONS,
        metavar="N",
        help=f"sessions open at once, forks included; 0: no session tools ({DEFAULT_MAX_SESSIONS})",
    )
    parser.add_argument(
        "--session-ttl",
        type=float,
        default=DEFAULT_SESSION_TTL,
        metavar="S",
        help=f"seconds a session may stay unused before it is closed ({DEFAULT_SESSION_TTL:g})",
    )
    parser.add_argument(
        "--no-sessions", action="store_true", help="offer run_python only, no session tools"
    )
    parser.add_argument(
        "--auto-print", action="store_true", help="run_python prints a final expression's value"
    )
    parser.add_argument("--runtime", default=None, help="docker: OCI runtime, e.g. runsc")
    parser.add_argument(
        "--docker-host", default=None, metavar="URL", help="docker: daemon address (DOCKER_HOST)"
    )
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=("debug", "info", "warning", "error", "critical"),
        help="what is logged on stderr (warning)",
    )
    add_settings_options(parser)
    parser.set_defaults(handler=_handle)


def build_config(args: argparse.Namespace) -> BackendConfigBase:
    """The backend config the arguments describe."""
    flags = {
        key: (value, flag)
        for key, value, flag in (
            ("runtime", args.runtime, "--runtime"),
            ("docker_host", args.docker_host, "--docker-host"),
        )
        if value is not None
    }
    return build_configs([args.backend], args, defaults=COMMAND_DEFAULTS, flags=flags)[args.backend]


def _check_http(args: argparse.Namespace) -> None:
    if args.host != HOST:
        raise UsageError(
            f"--host {args.host}: the MCP server listens on {HOST} only (it has no "
            "authentication and runs code); to serve other machines use `retool-exec serve` "
            "with a token"
        )
    if args.http is None:
        return
    if not 0 <= args.http <= 65535:
        raise UsageError(f"--http must be a port between 0 and 65535, got {args.http}")


def _handle(args: argparse.Namespace) -> int:
    try:
        from retool_exec.mcp_server import DEFAULT_MAX_TIMEOUT
    except ModuleNotFoundError as exc:
        raise UsageError(
            f"{exc.name} is missing; install the mcp extra: pip install 'retool_exec[mcp]'"
        ) from exc
    _check_http(args)
    if args.max_sessions < 0:
        raise UsageError(f"--max-sessions must be at least 0, got {args.max_sessions}")
    max_timeout = DEFAULT_MAX_TIMEOUT if args.max_timeout is None else args.max_timeout
    if not max_timeout > 0:
        raise UsageError(f"--max-timeout must be positive, got {max_timeout}")
    config = build_config(args)
    # Over HTTP a supervisor's SIGTERM closes the sandbox (stdio handles its own signals).
    stops = sigterm_stops_quietly() if args.http is not None else contextlib.nullcontext(_nothing)
    # Built now (a bad setting is one line at launch); started by the first tool call.
    with (
        stops as closing,
        Sandbox(
            config,
            timeout=args.timeout,
            auto_print=args.auto_print,
            max_sessions=args.max_sessions,
            session_ttl=args.session_ttl,
        ) as sandbox,
    ):
        try:
            return _serve(args, sandbox, max_timeout)
        finally:
            closing()  # the sandbox closes now: no later SIGTERM cuts that short


def _nothing() -> None:
    pass


def _serve(args: argparse.Namespace, sandbox: Sandbox, max_timeout: float) -> int:
    """Serve the sandbox's tools over stdio or HTTP until the client or a signal ends it."""
    from retool_exec.mcp_server import SandboxTools  # (checked importable by ``_handle``)

    if sandbox.timeout > max_timeout:
        raise UsageError(
            f"the default timeout ({sandbox.timeout:g} s) is more than --max-timeout "
            f"({max_timeout:g} s)"
        )
    if not backend_spec(args.backend).isolating:
        print(
            f"retool-exec mcp: warning: the {args.backend} backend does NOT isolate "
            "the code it runs",
            file=sys.stderr,
        )
    tools = SandboxTools(
        sandbox,
        max_timeout=max_timeout,
        sessions=not args.no_sessions and args.max_sessions > 0,
    )
    server = tools.server(log_level=args.log_level)
    if args.http is None:
        return _serve_stdio(server, sandbox)
    return _serve_http(server, args.http, args.log_level)


def _serve_stdio(server: MCPServer, sandbox: Sandbox) -> int:
    """Serve on stdin/stdout until the client closes stdin (then close the sandbox)."""

    stopping: set[asyncio.Task[None]] = set()

    def stop(status: int) -> None:
        stopping.add(asyncio.get_running_loop().create_task(_close_and_exit(sandbox, status)))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop, 0)
        loop.add_signal_handler(signal.SIGINT, stop, EXIT_INTERRUPTED)
        await server.run_stdio_async()

    asyncio.run(main())
    return 0


async def _close_and_exit(sandbox: Sandbox, status: int) -> None:
    """On SIGTERM/SIGINT under stdio: close the sandbox, then exit at once.

    The SDK reads stdin in a worker thread that nothing can cancel, so a graceful
    return would wait for the client to write or close stdin; the sandbox (its
    containers) is what must not be left behind.
    """
    try:
        await asyncio.to_thread(sandbox.close)
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os._exit(status)


def _serve_http(server: MCPServer, port: int, log_level: str) -> int:
    """Serve streamable HTTP on 127.0.0.1 until SIGTERM or Ctrl-C."""
    import uvicorn

    from retool_exec.cli.cmd_serve import bind_socket

    app = server.streamable_http_app(streamable_http_path=HTTP_PATH, host=HOST)
    sock = bind_socket(HOST, port)
    try:
        sock.listen(128)  # clients that connect now wait in the backlog until uvicorn accepts
        print(
            f"retool-exec mcp: streamable HTTP at http://{HOST}:{_port(sock)}{HTTP_PATH}",
            file=sys.stderr,
            flush=True,
        )
        config = uvicorn.Config(
            app,
            log_level=log_level.lower(),
            lifespan="on",
            server_header=False,
            proxy_headers=False,  # the peer is who connected, never what a header claims
            timeout_graceful_shutdown=5,
        )
        http = uvicorn.Server(config)
        asyncio.run(http.serve(sockets=[sock]))
    finally:
        sock.close()
    return 0


def _port(sock: socket.socket) -> int:
    port: int = sock.getsockname()[1]
    return port
