"""docker-py access: connecting, translating its errors, and retrying what is safe to retry.

Like httpx's ``map_httpcore_exceptions``, this is the one place where
``docker.errors`` and ``requests`` exceptions become ours, always with the
cause kept. Only idempotent calls are retried (inspect, start, kill, remove,
create under a unique name); user code is never retried.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Callable
from typing import TypeVar

import docker
import docker.errors
import requests.exceptions
from tenacity import (
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from retool_exec._errors import DockerUnavailableError

__all__ = ["connect", "daemon_address", "is_transient", "retry_docker"]

T = TypeVar("T")

_HOW_TO_START = (
    "Start Docker (e.g. `sudo systemctl start docker`; on a bare Debian machine "
    "`make docker-up` (images/docker-up.sh in the repository) installs and starts it), "
    "or point DOCKER_HOST at a running daemon."
)


def daemon_address(docker_host: str | None = None) -> str:
    """The daemon address that will be used, for error messages."""
    return docker_host or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


PING_TIMEOUT = 5
"""Seconds a daemon has to answer the first ping: one that accepts connections but never
answers must not hold a caller for the API timeout (120 s)."""


def connect(docker_host: str | None = None, *, timeout: int = 120) -> docker.DockerClient:
    """A client whose daemon answered a ping within PING_TIMEOUT; a clear error otherwise.

    ``timeout`` then applies to every later API request (image imports can be slow).
    """
    address = daemon_address(docker_host)
    if address.startswith("unix://"):
        _check_accepts(address)
    try:
        client = (
            docker.DockerClient(base_url=docker_host, timeout=PING_TIMEOUT)
            if docker_host
            else docker.from_env(timeout=PING_TIMEOUT)
        )
        try:
            client.ping()
        except BaseException:
            client.close()
            raise
        client.api.timeout = timeout
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        raise DockerUnavailableError(
            f"cannot reach the Docker daemon at {address}: {exc}. {_HOW_TO_START}"
        ) from exc
    return client


def _check_accepts(address: str) -> None:
    """Connect to a unix socket once ourselves: docker-py leaks the socket of a failed
    unix connect (a ResourceWarning later, at some garbage collection), so a missing socket
    or a dead daemon's stale one is found here, with our own socket closed."""
    socket_path = address.removeprefix("unix://")
    if not os.path.exists(socket_path):
        missing = FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), socket_path)
        raise DockerUnavailableError(
            f"cannot reach the Docker daemon at {address}: no such socket. {_HOW_TO_START}"
        ) from missing
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(PING_TIMEOUT)
        try:
            probe.connect(socket_path)
        except OSError as exc:
            raise DockerUnavailableError(
                f"cannot reach the Docker daemon at {address}: {exc}. {_HOW_TO_START}"
            ) from exc


def is_transient(exc: BaseException) -> bool:
    """Errors worth another try: the daemon was busy or the connection dropped."""
    if isinstance(exc, docker.errors.NotFound):
        return False
    if isinstance(exc, docker.errors.APIError):
        status = exc.status_code or 0
        return status >= 500 or status == 429
    return isinstance(
        exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout | ConnectionError
    )


RETRY_ATTEMPTS = 4


def retry_docker(func: Callable[[], T]) -> T:
    """Call ``func`` (an idempotent Docker call) with backoff and jitter on transient errors."""
    retrying = Retrying(
        retry=retry_if_exception(is_transient),
        wait=wait_exponential(multiplier=0.1, max=2.0) + wait_random(0, 0.2),
        stop=stop_after_attempt(RETRY_ATTEMPTS),
        reraise=True,
    )
    return retrying(func)
