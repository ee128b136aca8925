"""What a warm reuse container's memory is: its cgroup's anonymous and file pages, and each
agent process's private memory.

    python benchmarks/memory_breakdown.py --pool-size 8
    python benchmarks/memory_breakdown.py --preload numpy

Starts a docker-reuse pool, runs two calls per container, and prints per
container the working set (the cgroup's usage minus inactive file cache, as
``docker stats`` and the benchmark count it) split into anonymous memory and
page cache, then for one container the resident anonymous memory of the
supervisor, the zygotes (told apart by uid) and the spare child forked for
the next call, with how much of it sits in 2 MiB pages. Linux, cgroup v1 or
v2, run as root (it reads the agents' ``/proc`` entries).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import docker

from retool_exec import Sandbox
from retool_exec.backends.config import DockerConfig
from retool_exec.backends.docker.hardening import agent_role

LABELS = {"org.retool_exec.test": "memory-breakdown"}
MIB = 1024 * 1024


def cgroup_memory(container_id: str) -> dict[str, int]:
    """usage, working set, anon and file bytes of a container's memory cgroup."""
    for folder, usage_file in (
        (Path("/sys/fs/cgroup/memory/docker") / container_id, "memory.usage_in_bytes"),
        (Path(f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope"), "memory.current"),
    ):
        if not folder.exists():
            continue
        stat = {}
        for line in (folder / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            stat[key] = int(value)
        usage = int((folder / usage_file).read_text())
        inactive = stat.get("total_inactive_file", stat.get("inactive_file", 0))
        return {
            "usage": usage,
            "working set": usage - inactive,
            "anon": stat.get("total_rss", stat.get("anon", 0)),
            "file": stat.get("total_cache", stat.get("file", 0)),
        }
    raise FileNotFoundError(f"no memory cgroup found for {container_id[:12]}")


def agent_processes(container_pid: int) -> list[tuple[str, dict[str, int]]]:
    """(role, kB figures) of the agent's processes: PID 1 of the container and its children."""
    found = []
    for pid in [container_pid, *_children(container_pid)]:
        status = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        )
        uid = int(status["Uid"].split()[0])
        rollup = dict(
            line.split(":", 1)
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]
        )
        figures = {
            "anon kB": int(status["RssAnon"].split()[0]),
            "in 2 MiB pages kB": int(rollup["AnonHugePages"].split()[0]),
            "page tables kB": int(status["VmPTE"].split()[0]),
        }
        found.append((agent_role(uid) or f"spare child (uid {uid})", figures))
    return found


def _children(pid: int) -> list[int]:
    result = []
    for task in os.listdir(f"/proc/{pid}/task"):
        text = Path(f"/proc/{pid}/task/{task}/children").read_text().split()
        for child in map(int, text):
            result += [child, *_children(child)]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool-size", type=int, default=8)
    parser.add_argument("--preload", help="comma list (default: the image's preload)")
    args = parser.parse_args()
    settings: dict[str, object] = {"policy": "reuse", "pool_size": args.pool_size}
    if args.preload is not None:
        settings["preload"] = tuple(filter(None, args.preload.split(",")))
    config = DockerConfig(labels=LABELS, **settings)  # type: ignore[arg-type]
    client = docker.from_env()
    with Sandbox(config, max_workers=args.pool_size) as sandbox:
        sandbox.run_many(["print(1)"] * (2 * args.pool_size))
        label = "=".join(next(iter(LABELS.items())))
        listed = client.api.containers(filters={"label": label})
        for info in listed:
            figures = cgroup_memory(info["Id"])
            print(
                f"{info['Id'][:12]}  "
                + "  ".join(f"{name} {value / MIB:5.1f} MiB" for name, value in figures.items())
            )
        pid = int(client.api.inspect_container(listed[0]["Id"])["State"]["Pid"])
        print(f"agent processes of {listed[0]['Id'][:12]}:")
        for role, figures in agent_processes(pid):
            print(f"  {role:28}" + "  ".join(f"{k} {v:6d}" for k, v in figures.items()))
    client.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
