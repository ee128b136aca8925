"""Where the numbers were measured: machine, kernel, Docker, image and package versions.

Benchmark figures without their environment cannot be compared or
reproduced; every run records this next to its raw data. Each probe is
best-effort: a missing piece is recorded as an error string, never fatal.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["collect_environment", "local_python_modules", "missing_modules"]

_PACKAGES = ("retool_exec", "docker", "pydantic", "tenacity", "matplotlib")
_HOST_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS", "DOCKER_HOST")
_PROBE_MODULES = ("numpy", "sympy", "scipy", "mpmath")

# Installed distributions' metadata, not imports: importing sympy and scipy
# would cost seconds of CPU just before the backends' start-up is timed.
_MODULE_PROBE = """\
import importlib.metadata, json, sys
found = {}
for name in sys.argv[1:]:
    try:
        found[name] = importlib.metadata.version(name)
    except Exception:
        found[name] = None
print(json.dumps({"python": sys.version.split()[0], "modules": found}))
"""


def _package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def local_python_modules(python: str) -> dict[str, Any]:
    """The local backend's interpreter: its version and the math modules it can import."""
    try:
        completed = subprocess.run(
            [python, "-c", _MODULE_PROBE, *_PROBE_MODULES],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        info: dict[str, Any] = json.loads(completed.stdout)
    except (OSError, subprocess.SubprocessError, json.JSONDecodeError) as exc:
        return {"path": python, "error": f"{type(exc).__name__}: {exc}"}
    info["path"] = python
    return info


def missing_modules(local_info: dict[str, Any], needed: tuple[str, ...]) -> list[str]:
    """Which of ``needed`` the local interpreter could not import."""
    modules = local_info.get("modules") or {}
    return [name for name in needed if not modules.get(name)]


def _git_commit() -> dict[str, Any]:
    root = Path(__file__).resolve().parents[2]
    git = shutil.which("git")
    if git is None:
        return {"error": "git not found"}
    try:
        commit = subprocess.run(
            [git, "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            [git, "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"commit": commit, "dirty": bool(dirty)}


def _docker_info(docker_host: str | None) -> dict[str, Any]:
    try:
        from retool_exec.backends.docker.client import connect
        from retool_exec.backends.docker.image_inputs import image_tag

        client = connect(docker_host)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    try:
        info = client.info()
        version = client.version()
        tag = image_tag()
        image: dict[str, Any] = {"tag": tag}
        try:
            attrs = client.images.get(tag).attrs
            image.update(
                id=attrs.get("Id"), created=attrs.get("Created"), size_bytes=attrs.get("Size")
            )
        except Exception as exc:
            image["error"] = f"{type(exc).__name__}: {exc}"
        return {
            "server_version": info.get("ServerVersion"),
            "api_version": version.get("ApiVersion"),
            "runtimes": sorted(info.get("Runtimes", {})),
            "default_runtime": info.get("DefaultRuntime"),
            "cgroup_driver": info.get("CgroupDriver"),
            "cgroup_version": info.get("CgroupVersion"),
            "storage_driver": info.get("Driver"),
            "operating_system": info.get("OperatingSystem"),
            "kernel": info.get("KernelVersion"),
            "ncpu": info.get("NCPU"),
            "mem_total_bytes": info.get("MemTotal"),
            "image": image,
        }
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        client.close()


def collect_environment(
    *, local_python: str, docker: bool, docker_host: str | None = None
) -> dict[str, Any]:
    """Everything about the machine and software a reader needs to judge the numbers."""
    try:
        affinity: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    try:
        load: list[float] | None = list(os.getloadavg())
    except OSError:
        load = None
    env: dict[str, Any] = {
        "collected_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "cpu_model": _cpu_model(),
        "memory_total_bytes": _memory_total(),
        "load_average_at_start": load,
        "kernel": platform.release(),
        "platform": platform.platform(),
        "python_implementation": platform.python_implementation(),
        "python_executable": sys.executable,
        "packages": _package_versions(),
        "host_env": {name: os.environ.get(name) for name in _HOST_ENV},
        "source": _git_commit(),
        "local_python": local_python_modules(local_python),
    }
    if docker:
        env["docker"] = _docker_info(docker_host)
    return env


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def _memory_total() -> int | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
