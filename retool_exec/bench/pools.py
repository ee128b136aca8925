"""Looking into a Docker backend's warm pool: waiting for it to refill, reading its memory.

The benchmark waits for a pool to be full again after each batch, so a
backend's background container starts never run during another backend's
batch (on two cores they would slow it down and blur the comparison).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from retool_exec._sandbox import Sandbox
from retool_exec.bench.results import ContainerMemory, PoolMemory

if TYPE_CHECKING:
    from retool_exec.backends.docker.backend import PoolStats

__all__ = ["pool_stats", "read_pool_memory", "settle"]

SETTLE_LIMIT = 120.0
"""Seconds to wait for a pool to refill before going on without it (and saying so)."""


def pool_stats(sandbox: Sandbox) -> PoolStats | None:
    """The Docker backend's pool figures (``DockerBackend.pool_stats()``); None for a
    backend without a pool, or one not started."""
    from retool_exec.backends.docker.backend import DockerBackend

    backend = sandbox.backend
    return backend.pool_stats() if isinstance(backend, DockerBackend) else None


async def settle(
    sandbox: Sandbox, limit: float = SETTLE_LIMIT, *, drain_removals: bool = False
) -> float:
    """Wait until every container of the pool is ready; returns the seconds waited.

    For ``reuse`` this also waits for the agents' reset confirmations (a
    container is back in the ready set only after it proved clean). With
    ``drain_removals``, also until the pool's background work is done: used
    containers removed, replacements started, resets confirmed.
    Raises TimeoutError when the pool is not full within ``limit``.
    """
    started = time.perf_counter()
    stats = pool_stats(sandbox)
    if stats is None:
        return 0.0
    while stats is not None and stats.ready < stats.size:
        if time.perf_counter() - started > limit:
            raise TimeoutError(
                f"the {sandbox.backend.name} pool had {stats.ready}/{stats.size} "
                f"containers ready after {limit:.0f}s"
            )
        await asyncio.sleep(0.005)
        stats = pool_stats(sandbox)
    if drain_removals:
        # Used containers are removed in the background; Docker's work on that
        # must not land in the next backend's batch either.
        while stats is not None and stats.pending:
            if time.perf_counter() - started > limit:
                break
            await asyncio.sleep(0.02)
            stats = pool_stats(sandbox)
    return time.perf_counter() - started


def _working_set(memory_stats: dict[str, Any]) -> tuple[int, int] | None:
    usage = memory_stats.get("usage")
    if usage is None:
        return None
    stats = memory_stats.get("stats") or {}
    inactive = stats.get("total_inactive_file", stats.get("inactive_file", 0))
    return int(usage), max(0, int(usage) - int(inactive))


def _cgroup_memory(container_id: str) -> tuple[int, int] | None:
    """Read the container's memory cgroup directly (v1 cgroupfs, or v2 systemd scope)."""
    candidates = [
        (Path("/sys/fs/cgroup/memory/docker") / container_id, "memory.usage_in_bytes"),
        (Path(f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope"), "memory.current"),
        (Path("/sys/fs/cgroup/docker") / container_id, "memory.current"),
    ]
    for folder, usage_file in candidates:
        try:
            usage = int((folder / usage_file).read_text().strip())
            stat = dict(
                (line.split()[0], int(line.split()[1]))
                for line in (folder / "memory.stat").read_text().splitlines()
                if len(line.split()) == 2
            )
        except (OSError, ValueError):
            continue
        inactive = stat.get("total_inactive_file", stat.get("inactive_file", 0))
        return usage, max(0, usage - inactive)
    return None


def read_pool_memory(sandbox: Sandbox, name: str) -> PoolMemory:
    """Memory of every container in the pool (the cgroup files, else docker stats)."""
    from retool_exec.backends.docker.client import connect
    from retool_exec.backends.docker.containers import LABEL_POOL

    stats = pool_stats(sandbox)
    if stats is None:
        return PoolMemory(backend=name, pool_size=0, containers=[], error="no pool")
    docker_host = getattr(getattr(sandbox.backend, "config", None), "docker_host", None)
    readings: list[ContainerMemory] = []
    try:
        client = connect(docker_host)
    except Exception as exc:
        return PoolMemory(
            backend=name, pool_size=stats.size, containers=[], error=f"{type(exc).__name__}: {exc}"
        )
    try:
        listed = client.api.containers(filters={"label": f"{LABEL_POOL}={stats.pool_id}"})
        for info in listed:
            container_id = str(info["Id"])
            # The cgroup files are read in microseconds; docker stats takes ~1 s a container.
            found, source = _cgroup_memory(container_id), "cgroup files"
            if found is None:
                stats = client.api.stats(container_id, stream=False, one_shot=True)
                found, source = _working_set(stats.get("memory_stats") or {}), "docker stats"
            if found is None:
                continue
            readings.append(
                ContainerMemory(
                    id=container_id[:12],
                    usage_bytes=found[0],
                    working_set_bytes=found[1],
                    source=source,
                )
            )
    except Exception as exc:
        return PoolMemory(
            backend=name,
            pool_size=stats.size,
            containers=readings,
            error=f"{type(exc).__name__}: {exc}",
        )
    finally:
        client.close()
    error = None if readings else "no memory figures available for the pool's containers"
    return PoolMemory(backend=name, pool_size=stats.size, containers=readings, error=error)
