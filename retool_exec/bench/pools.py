"""Looking into a Docker backend's warm pool: waiting for it to refill, reading its memory.

The benchmark waits for a pool to be full again after each batch, so a
backend's background container starts never run during another backend's
batch (on two cores they would slow it down and blur the comparison).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from retool_exec._sandbox import Sandbox
from retool_exec.bench.results import ContainerMemory, PoolMemory

__all__ = ["pool_of", "read_pool_memory", "settle"]

SETTLE_LIMIT = 120.0
"""Seconds to wait for a pool to refill before going on without it (and saying so)."""


def pool_of(sandbox: Sandbox) -> Any | None:
    """The backend's warm pool (``DockerBackend.pool``), or None for a pool-less backend."""
    return getattr(sandbox.backend, "pool", None)


async def settle(
    sandbox: Sandbox, limit: float = SETTLE_LIMIT, *, drain_removals: bool = False
) -> float:
    """Wait until every container of the pool is ready; returns the seconds waited.

    For ``reuse`` this also waits for the agents' reset confirmations (a
    container is back in the ready set only after it proved clean). With
    ``drain_removals``, also until Docker has removed the used containers.
    Raises TimeoutError when the pool is not full within ``limit``.
    """
    pool = pool_of(sandbox)
    started = time.perf_counter()
    if pool is None:
        return 0.0
    while pool.ready_count < pool.size:
        if time.perf_counter() - started > limit:
            raise TimeoutError(
                f"the {sandbox.backend.name} pool had {pool.ready_count}/{pool.size} "
                f"containers ready after {limit:.0f}s"
            )
        await asyncio.sleep(0.005)
    if drain_removals:
        # Used containers are removed in the background; Docker's work on that
        # must not land in the next backend's batch either.
        while await asyncio.to_thread(_pool_container_count, pool) > pool.size:
            if time.perf_counter() - started > limit:
                break
            await asyncio.sleep(0.02)
    return time.perf_counter() - started


def _pool_container_count(pool: Any) -> int:
    """Containers of the pool that Docker still has, in any state."""
    from retool_exec.backends.docker.containers import LABEL_POOL

    factory = pool.factory
    listed = factory.client.api.containers(
        all=True, filters={"label": f"{LABEL_POOL}={factory.pool_id}"}
    )
    return len(listed)


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

    pool = pool_of(sandbox)
    if pool is None:
        return PoolMemory(backend=name, pool_size=0, containers=[], error="no pool")
    docker_host = getattr(getattr(sandbox.backend, "config", None), "docker_host", None)
    readings: list[ContainerMemory] = []
    try:
        client = connect(docker_host)
    except Exception as exc:
        return PoolMemory(
            backend=name, pool_size=pool.size, containers=[], error=f"{type(exc).__name__}: {exc}"
        )
    try:
        listed = client.api.containers(filters={"label": f"{LABEL_POOL}={pool.factory.pool_id}"})
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
            pool_size=pool.size,
            containers=readings,
            error=f"{type(exc).__name__}: {exc}",
        )
    finally:
        client.close()
    error = None if readings else "no memory figures available for the pool's containers"
    return PoolMemory(backend=name, pool_size=pool.size, containers=readings, error=error)
