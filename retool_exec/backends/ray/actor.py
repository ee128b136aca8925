"""What runs on each Ray node: a DockerBackend against that node's own daemon.

``NodeActor`` is a plain class; the backend wraps it with ``ray.remote`` when
it starts (so this module never imports Ray) and pins one instance to each
node with Ray's node-affinity scheduling. It is an async actor: Ray runs its
methods as coroutines on one event loop, which is what DockerBackend wants.

Everything crossing Ray is the existing data: a RunRequest in, an ExecResult
out, or a plain dict. A session failure comes back as ``{"lost": reason}``
rather than as an exception, so the driver never has to unwrap Ray's error
types to tell a lost session from a lost node.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from typing import Any

from retool_exec._errors import SessionError, SessionLostError
from retool_exec._models import ExecResult
from retool_exec.backends.base import RunRequest, SessionHandle
from retool_exec.backends.config import DockerConfig
from retool_exec.backends.docker.backend import DockerBackend

__all__ = ["NODE_LABEL", "NodeActor"]

log = logging.getLogger(__name__)

NODE_LABEL = "io.ray.node-id"
"""Container label naming the Ray node whose actor made the container (``docker ps
--filter label=io.ray.node-id=...`` on a shared daemon)."""


class NodeActor:
    """One node's sandbox: a warm Docker pool, calls and sessions run on it.

    Constructed again by Ray if its process dies (``max_restarts``): the new
    instance's DockerBackend removes, when it starts, the containers whose
    owner process is gone, its predecessor's included (as ``retool-exec gc``
    does), before it starts a pool of its own.
    """

    def __init__(self, config: dict[str, Any], node_id: str) -> None:
        self.config = DockerConfig.model_validate(config)
        self.node_id = node_id
        self.backend = DockerBackend(self.config)
        self.sessions: dict[int, SessionHandle] = {}
        self._sids = itertools.count(1)
        self.running = 0
        self.calls = 0

    async def start(self) -> dict[str, Any]:
        """Warm the pool; report what the driver routes by (capacity) and who we are."""
        await self.backend.start()
        return {
            "node_id": self.node_id,
            "capacity": self.backend.capacity,
            "pid": os.getpid(),
            "startup_seconds": self.backend.startup_seconds,
        }

    async def load(self) -> dict[str, Any]:
        """Calls running now, sessions open, calls served: the node's load as it sees it."""
        return {
            "node_id": self.node_id,
            "capacity": self.backend.capacity,
            "running": self.running,
            "sessions": len(self.sessions),
            "calls": self.calls,
            "pid": os.getpid(),
        }

    async def run(self, request: RunRequest) -> ExecResult:
        self.running += 1
        try:
            return await self.backend.run(request)
        finally:
            self.running -= 1
            self.calls += 1

    # -- sessions: kept here by number, since a SessionHandle cannot cross Ray -------------

    async def open_session(self, memory_mb: int | None) -> dict[str, Any]:
        try:
            handle = await self.backend.open_session(memory_mb=memory_mb)
        except SessionError as exc:
            return {"lost": str(exc)}
        return {"sid": self._keep(handle)}

    async def session_run(self, sid: int, code: str, timeout: float) -> dict[str, Any]:
        """``{"result": ExecResult, "lost": why or None}`` (the cell may end the session),
        or ``{"lost": why}`` alone when the session was already gone."""
        handle = self.sessions.get(sid)
        if handle is None:
            return {"lost": "the session is not on this node (its actor was restarted)"}
        try:
            result = await handle.run(code, timeout)
        except SessionLostError as exc:
            return {"lost": str(exc)}
        return {"result": result, "lost": handle.lost}

    async def session_fork(self, sid: int) -> dict[str, Any]:
        handle = self.sessions.get(sid)
        if handle is None:
            return {"lost": "the session is not on this node (its actor was restarted)"}
        try:
            child = await handle.fork()
        except SessionLostError as exc:
            return {"lost": str(exc)}
        except SessionError as exc:  # the copy failed; the parent lives on
            return {"error": str(exc)}
        return {"sid": self._keep(child)}

    async def session_close(self, sid: int) -> None:
        handle = self.sessions.pop(sid, None)
        if handle is not None:
            await handle.close()

    def _keep(self, handle: SessionHandle) -> int:
        sid = next(self._sids)
        self.sessions[sid] = handle
        return sid

    # -- housekeeping ------------------------------------------------------------------------

    async def sweep_orphans(self) -> int:
        """Remove this daemon's containers whose owner process is gone (a dead peer's, when
        several nodes share one daemon); returns how many were removed."""
        return await asyncio.to_thread(_sweep, self.config.docker_host)

    async def close(self) -> None:
        for sid in list(self.sessions):
            await self.session_close(sid)
        await self.backend.close()


def _sweep(docker_host: str | None) -> int:
    import docker.errors

    from retool_exec.backends.docker.client import connect
    from retool_exec.backends.docker.containers import find_orphans, remove_container

    client = connect(docker_host)
    removed = 0
    try:
        for orphan in find_orphans(client):
            try:
                remove_container(client, orphan.id)
                removed += 1
            except docker.errors.APIError as exc:
                log.warning("could not remove orphaned container %s: %s", orphan.short_id, exc)
    finally:
        client.close()
    return removed
