"""``retool-exec serve``: the SandboxFusion-compatible HTTP server.

Needs the ``[server]`` extra (FastAPI, uvicorn); this module imports them only
when the command runs, so ``retool-exec --help`` works without them.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from typing import Any

from pydantic import SecretStr

from retool_exec._errors import RetoolExecError
from retool_exec.backends.config import BackendConfigBase, DockerConfig, LocalConfig

__all__ = ["TOKEN_ENV", "build_config", "is_loopback", "register"]

TOKEN_ENV = "RETOOL_EXEC_TOKEN"  # noqa: S105 - the variable's name, not a secret

_EPILOG = f"""\
Point a SandboxFusion client at it, e.g. verl's tool config:
  sandbox_fusion_url: http://127.0.0.1:8080/run_code

Endpoints: POST /run_code, POST /run_jupyter, GET /v1/ping (SandboxFusion's),
POST /v1/exec, GET /v1/metrics (retool_exec's). With --root-path P they are
also served under P (e.g. /faas/sandbox/run_code).

The token may also come from ${TOKEN_ENV}. Clients send it as
'Authorization: Bearer <token>', or as the password in the URL
(http://user:<token>@host:8080/run_code). /v1/ping never needs it.

The local backend is NOT isolated: it runs code as you, on this machine.
It is refused on a non-loopback address unless --allow-remote-local is given.
See docs/server.md.
"""


def register(subparsers: Any) -> None:
    """Add the ``serve`` subcommand."""
    parser = subparsers.add_parser(
        "serve",
        help="serve a SandboxFusion-compatible HTTP API",
        description="Serve SandboxFusion's /run_code API over retool_exec's sandbox.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--backend", choices=("docker", "local"), default="docker")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="TCP port (8080)")
    parser.add_argument(
        "--max-concurrency",
        type=int,
        default=None,
        metavar="N",
        help="requests running at once, and the Docker pool size (default: CPU count)",
    )
    parser.add_argument(
        "--max-queue", type=int, default=256, metavar="N", help="requests waiting (256)"
    )
    parser.add_argument(
        "--queue-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds a request may wait for a slot before a 504 (30)",
    )
    parser.add_argument("--token", default=None, help=f"bearer token (or ${TOKEN_ENV})")
    parser.add_argument("--root-path", default="", metavar="P", help="also serve under P")
    parser.add_argument(
        "--max-run-timeout", type=float, default=120.0, metavar="S", help="clamp (120)"
    )
    parser.add_argument(
        "--max-memory-mb",
        type=int,
        default=None,
        metavar="M",
        help="clamp memory_limit_MB; for docker also the container limit (1024)",
    )
    parser.add_argument(
        "--policy", choices=("reuse", "fresh"), default="reuse", help="docker policy (reuse)"
    )
    parser.add_argument("--runtime", default=None, help="docker OCI runtime, e.g. runsc")
    parser.add_argument("--log-level", default="info", help="uvicorn log level (info)")
    parser.add_argument(
        "--allow-remote-local",
        action="store_true",
        help="allow the NOT isolated local backend on a non-loopback address",
    )
    parser.set_defaults(handler=_handle)


def is_loopback(host: str) -> bool:
    """Whether ``host`` binds only to this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_config(args: argparse.Namespace) -> BackendConfigBase:
    """The backend config the command's arguments describe."""
    workers = args.max_concurrency or max(1, os.cpu_count() or 1)
    timeout = min(30.0, args.max_run_timeout)
    if args.backend == "local":
        return LocalConfig(timeout=timeout)
    return DockerConfig(
        timeout=timeout,
        policy=args.policy,
        pool_size=min(workers, 256),
        runtime=args.runtime,
        memory_mb=args.max_memory_mb or 1024,
    )


def _handle(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from retool_exec.server import ServerSettings, create_app
    except ModuleNotFoundError as exc:
        print(
            f"retool-exec serve: {exc.name} is missing; install the server extra: "
            "pip install 'retool_exec[server]'",
            file=sys.stderr,
        )
        return 2
    token = args.token or os.environ.get(TOKEN_ENV) or None
    if args.backend == "local" and not is_loopback(args.host) and not args.allow_remote_local:
        print(
            f"retool-exec serve: refusing to expose the local backend on {args.host}: it runs "
            "code on this machine without isolation (use --backend docker, or "
            "--allow-remote-local if you really mean it)",
            file=sys.stderr,
        )
        return 2
    if not is_loopback(args.host) and token is None:
        print(
            f"retool-exec serve: warning: listening on {args.host} without a token; "
            f"anyone who can reach it can run code (set --token or ${TOKEN_ENV})",
            file=sys.stderr,
        )
    try:
        workers = args.max_concurrency or max(1, os.cpu_count() or 1)
        settings = ServerSettings(
            max_concurrency=workers,
            max_queue=args.max_queue,
            queue_timeout=args.queue_timeout,
            token=SecretStr(token) if token else None,
            prefix=args.root_path,
            max_run_timeout=args.max_run_timeout,
            max_memory_mb=args.max_memory_mb,
        )
        app = create_app(build_config(args), settings=settings)
    except (RetoolExecError, ValueError) as exc:
        print(f"retool-exec serve: {exc}", file=sys.stderr)
        return 2
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        lifespan="on",
        server_header=False,
        timeout_graceful_shutdown=10,
    )
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else 1
