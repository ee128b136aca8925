"""``retool-exec serve``: the SandboxFusion-compatible HTTP server.

Needs the ``[server]`` extra (FastAPI, uvicorn); this module imports them only
when the command runs, so ``retool-exec --help`` works without them.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import socket
import sys
from typing import Any

from pydantic import SecretStr, ValidationError

from retool_exec._errors import BackendUnavailableError, ConfigError
from retool_exec._sandbox import DEFAULT_MAX_SESSIONS
from retool_exec.backends.config import BackendConfigBase, LocalConfig, RayConfig
from retool_exec.backends.registry import backend_spec
from retool_exec.cli._common import (
    EXIT_STATUS_HELP,
    SETTINGS_HELP,
    UsageError,
    add_settings_options,
    backend_list,
    build_configs,
    sigterm_stops_quietly,
)
from retool_exec.server.descriptors import (
    DEFAULT_MAX_CONNECTIONS,
    ListeningSocket,
    descriptor_reserve,
    fit_max_connections,
    open_descriptors,
    raise_descriptor_limit,
)
from retool_exec.server.guards import is_loopback
from retool_exec.server.settings import ServerSettings

__all__ = [
    "SHUTDOWN_GRACE",
    "TOKEN_ENV",
    "bind_socket",
    "build_config",
    "check_limits",
    "is_loopback",
    "max_connections",
    "register",
]

TOKEN_ENV = "RETOOL_EXEC_TOKEN"  # noqa: S105 - the variable's name, not a secret

SHUTDOWN_GRACE = 10
"""Seconds running calls have to finish once the server is told to stop (SIGTERM,
Ctrl-C), unless ``--shutdown-grace`` says otherwise; queued and new requests are
answered 504 at once (``server/shutdown.py``)."""

MAX_SHUTDOWN_GRACE = 3600
"""The longest ``--shutdown-grace``: an hour, past any call's sensible timeout."""

_EPILOG = """\
Point a SandboxFusion client at it, e.g. verl's tool config:
  sandbox_fusion_url: http://127.0.0.1:8080/run_code

Endpoints: POST /run_code, POST /run_jupyter, GET /v1/ping (SandboxFusion's),
POST /v1/exec, GET /v1/metrics (retool_exec's). With --root-path P they are
also served under P (e.g. /faas/sandbox/run_code).

The token may also come from ${token_env}. Clients send it as
'Authorization: Bearer <token>', or as the password in the URL
(http://user:<token>@host:8080/run_code). /v1/ping never needs it.

The local backend is NOT isolated: it runs code as you, on this machine.
It is refused on a non-loopback address unless --allow-remote-local is given.
See docs/server.md.

Backends (--backend NAME, default docker):
{backends}

{settings}
The pool size defaults to --max-concurrency, the per-call timeout to
min(30, --max-run-timeout).

--backend ray serves over every Docker node of a Ray cluster (docs/scaling.md):
it joins the cluster this host is part of (or --ray-address), --max-concurrency
is then the calls in flight over the whole fleet, and each node's pool keeps
pool_size containers (--set pool_size=N). Several servers may stand behind one
load balancer: each has its own node actors and pools, and any of them can
take any request (calls are stateless; only /v1 sessions, if used, need
sticky routing).

The backend starts before the server listens: a backend that cannot start,
or an address that cannot be bound, stops the command with one line.

On SIGTERM or Ctrl-C it stops listening, answers queued requests 504 at once
(verl retries a 504), gives running calls --shutdown-grace seconds to finish
(default {grace}), then answers those still running 504 too, and closes the
sandbox.

Open connections are bounded (--max-connections, default {max_connections}); the
server raises its soft RLIMIT_NOFILE to the hard limit and keeps descriptors for
the backend. A given bound that does not fit is refused at startup; the default
is lowered to fit, with a warning.
{exit_status}
"""


def register(subparsers: Any) -> None:
    """Add the ``serve`` subcommand."""
    parser = subparsers.add_parser(
        "serve",
        help="serve a SandboxFusion-compatible HTTP API",
        description="Serve SandboxFusion's /run_code API over retool_exec's sandbox.",
        epilog=_EPILOG.format(
            token_env=TOKEN_ENV,
            backends=backend_list(),
            settings=SETTINGS_HELP,
            exit_status=EXIT_STATUS_HELP,
            grace=SHUTDOWN_GRACE,
            max_connections=DEFAULT_MAX_CONNECTIONS,
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--backend", default="docker", metavar="NAME", help="backend (docker)")
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
    parser.add_argument(
        "--max-connections",
        type=int,
        default=None,
        metavar="N",
        help=f"connections open at once, else 504 ({DEFAULT_MAX_CONNECTIONS}, lowered to fit "
        "the file-descriptor limit; a given N that does not fit is an error)",
    )
    parser.add_argument(
        "--shutdown-grace",
        type=_grace_seconds,
        default=SHUTDOWN_GRACE,
        metavar="S",
        help=f"seconds running calls get to finish once told to stop ({SHUTDOWN_GRACE}; "
        "give the supervisor more than this)",
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
        "--policy", choices=("reuse", "fresh"), default=None, help="docker policy (reuse)"
    )
    parser.add_argument(
        "--max-body-mb",
        dest="max_body_bytes",
        type=_mebibytes,
        default=ServerSettings.model_fields["max_body_bytes"].default,
        metavar="M",
        help="largest request body in MiB, else 413 (8; verl's JSON spends up to 6 bytes "
        "on a character of stdin)",
    )
    parser.add_argument("--runtime", default=None, help="docker OCI runtime, e.g. runsc")
    parser.add_argument(
        "--docker-host", default=None, metavar="URL", help="docker: daemon address (DOCKER_HOST)"
    )
    parser.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="ray: the cluster to join (default: this host's, RAY_ADDRESS, or 'local')",
    )
    parser.add_argument("--log-level", default="info", help="uvicorn log level (info)")
    parser.add_argument(
        "--allow-remote-local",
        action="store_true",
        help="allow the NOT isolated local backend on a non-loopback address",
    )
    add_settings_options(parser)
    parser.set_defaults(handler=_handle)


def _mebibytes(text: str) -> int:
    """``--max-body-mb``'s value in bytes: a finite number of MiB, 1 KiB at least."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 1 / 1024 <= value <= 1 << 20):
        raise argparse.ArgumentTypeError(
            f"expected MiB from 0.001 (1 KiB) to 1048576, got {text!r}"
        )
    return int(value * (1 << 20))


def _grace_seconds(text: str) -> float:
    """``--shutdown-grace``'s value: finite seconds from 0 to ``MAX_SHUTDOWN_GRACE``."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 <= value <= MAX_SHUTDOWN_GRACE):
        raise argparse.ArgumentTypeError(
            f"expected seconds from 0 to {MAX_SHUTDOWN_GRACE}, got {text!r}"
        )
    return value


def _workers(args: argparse.Namespace) -> int:
    if args.max_concurrency is not None:
        return int(args.max_concurrency)
    return max(1, os.cpu_count() or 1)


def check_limits(args: argparse.Namespace) -> None:
    """Refuse a limit flag out of range in one line naming it, before anything starts
    (``--max-concurrency 0`` was the CPU count; the others, pydantic's error on a field)."""
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise UsageError(f"--max-concurrency must be at least 1, got {args.max_concurrency}")
    if args.max_queue < 0:
        raise UsageError(f"--max-queue must be at least 0, got {args.max_queue}")
    if not (math.isfinite(args.queue_timeout) and args.queue_timeout > 0):
        raise UsageError(
            f"--queue-timeout must be a finite number of seconds above 0, got {args.queue_timeout}"
        )


def build_config(args: argparse.Namespace) -> BackendConfigBase:
    """The backend config the command's arguments describe."""
    spec = backend_spec(args.backend)
    defaults: dict[str, Any] = {"timeout": min(30.0, args.max_run_timeout)}
    if issubclass(spec.config_class, RayConfig):
        # The fleet's calls in flight; each node's pool keeps its own pool_size.
        defaults["max_in_flight"] = min(_workers(args), 65536)
    else:
        defaults["pool_size"] = min(_workers(args), 256)
    flags = {
        key: (value, flag)
        for key, value, flag in (
            ("policy", args.policy, "--policy"),
            ("runtime", args.runtime, "--runtime"),
            ("docker_host", args.docker_host, "--docker-host"),
            ("memory_mb", args.max_memory_mb, "--max-memory-mb"),
            ("address", getattr(args, "ray_address", None), "--ray-address"),
        )
        # --max-memory-mb clamps requests on every backend; it is a container limit
        # only where the backend has one.
        if value is not None and (key != "memory_mb" or spec.accepts(key))
    }
    return build_configs([args.backend], args, defaults=defaults, flags=flags)[args.backend]


def max_connections(args: argparse.Namespace) -> int:
    """The connection bound to serve with, within the process's file-descriptor limit.

    Raises the soft ``RLIMIT_NOFILE`` to the hard one first; then a ``--max-connections``
    that does not fit beside the backend's reserve is a ``ConfigError`` (one line at
    startup), and the default is lowered to fit, with one warning (``descriptors.py``).
    """
    if args.max_connections is not None and args.max_connections < 1:
        raise UsageError(f"--max-connections must be at least 1, got {args.max_connections}")
    soft, _ = raise_descriptor_limit()
    reserve = descriptor_reserve(
        run_slots=_workers(args), sessions=DEFAULT_MAX_SESSIONS, open_now=open_descriptors()
    )
    bound, warning = fit_max_connections(args.max_connections, limit=soft, reserve=reserve)
    if warning is not None:
        print(f"retool-exec serve: warning: {warning}", file=sys.stderr)
    return bound


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening-ready socket bound to ``host:port`` (one-line errors, before any start)."""
    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be between 0 and 65535, got {port}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UsageError(f"--host {host!r}: {exc.strerror or exc}") from exc
    family, kind, proto, _, address = infos[0]
    sock = ListeningSocket(family, kind, proto)  # a bounded burst of accepts (descriptors.py)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise BackendUnavailableError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}"
        ) from exc
    sock.set_inheritable(True)
    return sock


def _handle(args: argparse.Namespace) -> int:
    check_limits(args)
    try:
        import uvicorn

        from retool_exec._sandbox import Sandbox
        from retool_exec.server import ServerSettings, create_app, uvicorn_config
    except ModuleNotFoundError as exc:
        raise UsageError(
            f"{exc.name} is missing; install the server extra: pip install 'retool_exec[server]'"
        ) from exc
    token = args.token or os.environ.get(TOKEN_ENV) or None
    config = build_config(args)
    if (
        isinstance(config, LocalConfig)
        and not is_loopback(args.host)
        and not args.allow_remote_local
    ):
        raise UsageError(
            f"refusing to expose the local backend on {args.host}: it runs "
            "code on this machine without isolation (use --backend docker, or "
            "--allow-remote-local if you really mean it)"
        )
    if not is_loopback(args.host) and token is None:
        print(
            f"retool-exec serve: warning: listening on {args.host} without a token; "
            f"anyone who can reach it can run code (set --token or ${TOKEN_ENV})",
            file=sys.stderr,
        )
    connections = max_connections(args)
    try:
        settings = ServerSettings(
            max_concurrency=_workers(args),
            max_queue=args.max_queue,
            queue_timeout=args.queue_timeout,
            token=SecretStr(token) if token else None,
            prefix=args.root_path,
            loopback_only=is_loopback(args.host),
            max_run_timeout=args.max_run_timeout,
            max_memory_mb=args.max_memory_mb,
            max_body_bytes=args.max_body_bytes,
            max_connections=connections,
        )
    except ValidationError as exc:
        raise ConfigError(f"server settings: {exc}") from exc
    if config.max_output_chars < settings.sandbox_output_chars:
        # As the server does for a sandbox it builds: keep the tail its answers are cut from.
        config = config.model_copy(update={"max_output_chars": settings.sandbox_output_chars})
    sock = bind_socket(args.host, args.port)
    try:
        # Start the backend here, not in the server's lifespan, so that a daemon that is
        # down or a runtime that is unknown is one line (see cli.main), not a traceback.
        # A supervisor's stop closes the sandbox too, even while it starts.
        with (
            sigterm_stops_quietly() as closing,
            Sandbox(config, max_workers=settings.max_concurrency) as sandbox,
        ):
            try:
                sandbox.start()
                app = create_app(sandbox, settings=settings)
                server = uvicorn.Server(
                    uvicorn_config(  # headers within header_timeout; max_connections open
                        app,
                        host=args.host,
                        port=args.port,
                        log_level=args.log_level,
                        lifespan="on",
                        server_header=False,
                        timeout_graceful_shutdown=args.shutdown_grace,
                    )
                )
                server.run(sockets=[sock])
                if signal.SIGINT in getattr(server, "_captured_signals", ()):
                    # uvicorn raises a Ctrl-C it stopped for again as it returns, but
                    # asyncio drops it when the server's task ends first: the status
                    # was 0 once in a CI run, not 130.
                    raise KeyboardInterrupt
                started: bool = server.started
            finally:
                closing()  # the sandbox closes now: no later SIGTERM cuts that short
    finally:
        sock.close()
    return 0 if started else 1
