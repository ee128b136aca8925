"""Looking into a real Docker pool from a test: which container served each call, and
which containers the pool has running now."""

from __future__ import annotations

from typing import Any

import docker

from retool_exec import Sandbox
from retool_exec.backends.docker.backend import DockerBackend
from retool_exec.backends.docker.containers import SandboxContainer


def record_containers(sandbox: Sandbox) -> list[str]:
    """Patch the backend so every call records the id of the container that served it."""
    backend = sandbox.backend
    assert isinstance(backend, DockerBackend)
    seen: list[str] = []
    original = backend._call

    async def recording(container: SandboxContainer, request: Any, *rest: Any) -> dict[str, Any]:
        seen.append(container.id)
        return await original(container, request, *rest)

    backend._call = recording  # type: ignore[method-assign]
    return seen


def pool_containers(sandbox: Sandbox) -> list[str]:
    """Ids of the running containers labelled with the sandbox's pool."""
    backend = sandbox.backend
    assert isinstance(backend, DockerBackend) and backend._factory is not None
    client = docker.from_env()
    try:
        label = f"org.retool_exec.pool={backend._factory.pool_id}"
        return [c["Id"] for c in client.api.containers(filters={"label": label})]
    finally:
        client.close()
