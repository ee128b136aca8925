"""A real multi-node Ray cluster on this machine, for the ray backend's tests.

``ray.cluster_utils.Cluster`` starts a head and worker nodes as separate
raylets (each with its own processes), so node loss is real: removing a node
kills its raylet and its workers. Every node's actor talks to this host's
Docker daemon; the containers of each carry their node's id as a label.

The head is told to notice a dead node within about 1.5 s (health checks
every 0.5 s, 3 misses) instead of Ray's default 15 s or more, so fault tests
stay short; the code under test does not depend on it (its own deadlines
bound every wait).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

REQUIRE = os.environ.get("RETOOL_EXEC_REQUIRE_DOCKER") == "1"
DOCKER_RESOURCE = "docker"
"""The custom resource the two base worker nodes offer (the contract suite's fleet)."""
OBJECT_STORE = 80 * 1024 * 1024
HEAD_SYSTEM_CONFIG = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_failure_threshold": 3,
    "timeout_ms_task_wait_for_death_info": 2000,
}


def require_ray() -> Any:
    """The ray module; skipped without it, a failure in CI (the Makefile installs it)."""
    try:
        import ray
    except ImportError:
        message = "Ray is not installed (pip install 'retool_exec[ray]')"
        if REQUIRE:
            pytest.fail(f"RETOOL_EXEC_REQUIRE_DOCKER=1 but {message}", pytrace=False)
        pytest.skip(message)
    return ray


class LocalCluster:
    """A head (no sandboxes) and two worker nodes offering ``docker``; add and remove more."""

    def __init__(self) -> None:
        ray = require_ray()
        from ray.cluster_utils import Cluster

        self.ray = ray
        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 1,
                "include_dashboard": False,
                "object_store_memory": OBJECT_STORE,
                "_system_config": HEAD_SYSTEM_CONFIG,
            },
        )
        self.removed: set[tuple[int, str]] = set()
        self.workers = [self.add_node({DOCKER_RESOURCE: 1}) for _ in range(2)]
        ray.init(address=self.cluster.address, log_to_driver=False)

    def add_node(self, resources: dict[str, float]) -> Any:
        return self.cluster.add_node(
            num_cpus=1, resources=resources, object_store_memory=OBJECT_STORE
        )

    def remove_node(self, node: Any) -> None:
        """Kill a node without warning (its raylet and workers), as a host dying would."""
        self.removed |= self.descendants()  # its workers are reparented once the raylet dies
        self.cluster.remove_node(node, allow_graceful=False)

    @staticmethod
    def node_id(node: Any) -> str:
        return str(node.node_id)

    @staticmethod
    def descendants() -> set[tuple[int, str]]:
        """This process's descendants (raylets, GCS, Ray workers), as (pid, start time)."""
        children: dict[int, list[tuple[int, str]]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
                children.setdefault(int(fields[1]), []).append((int(entry.name), fields[19]))
        found: set[tuple[int, str]] = set()
        todo = [os.getpid()]
        while todo:
            for child in children.get(todo.pop(), []):
                found.add(child)
                todo.append(child[0])
        return found

    @staticmethod
    def alive(processes: set[tuple[int, str]]) -> list[int]:
        """Those of ``processes`` still running (the same start time: not a reused pid)."""
        left = []
        for pid, started in processes:
            with contextlib.suppress(OSError, IndexError):
                fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
                if fields[19] == started and fields[0] != "Z":
                    left.append(pid)
        return sorted(left)

    def shutdown(self) -> list[int]:
        """Stop Ray and every node; returns the pids that had to be killed afterwards."""
        processes = self.descendants() | self.removed
        self.ray.shutdown()
        self.cluster.shutdown()
        deadline = time.monotonic() + 15
        while self.alive(processes) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = self.alive(processes)
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return left


def main(argv: list[str]) -> int:
    """``python -m tests.ray.cluster COMMAND...``: run COMMAND with RAY_ADDRESS set to a
    fresh head + two ``docker`` worker nodes on this machine (how docs/scaling.md benches
    two nodes), then stop every process of the cluster."""
    import subprocess

    cluster = LocalCluster()
    try:
        env = {**os.environ, "RAY_ADDRESS": str(cluster.cluster.address)}
        return subprocess.run(argv, env=env, check=False).returncode
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
