"""The image's top layer: the agent zipapp, byte-compiled by the image's own interpreter.

Why compiled: every container starts the agent from ``agent.pyz``, and from
source that is a compile of ~3,000 lines at each start: 70-95 ms of CPU
measured in the image, against 22-33 ms with the compiled modules in the
archive (``zipimport`` takes ``name.pyc`` before ``name.py``). A fresh
container pays it per call, a reuse pool per container it starts. The
bytecode is made by the image's python3 (its own magic number), as
unchecked hash-based pycs (PEP 552: nothing to compare with a modification
time), with the file names ``zipimport`` would give the source, so
tracebacks of the agent read as before. The image's agent label stays the
digest of the source zipapp, which is what says which agent an image holds.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import tarfile
from pathlib import Path

import docker
import docker.errors
import requests.exceptions

from retool_exec.backends.docker.image_inputs import (
    AGENT_LABEL,
    AGENT_PATH_IN_IMAGE,
    COMPILE_AGENT,
    TAG_LABEL,
    ImageBuildError,
    config_changes,
)
from retool_exec.backends.docker.image_spec import ImageSpec

__all__ = ["add_agent"]

COMPILE_TIMEOUT_S = 120


def _docker_errors() -> tuple[type[Exception], ...]:
    return (docker.errors.DockerException, requests.exceptions.RequestException)


def add_agent(
    client: docker.DockerClient, base: str, tag: str, zipapp: bytes, spec: ImageSpec
) -> None:
    """``base`` plus this agent, compiled in it and committed as ``tag`` (no builder,
    no registry)."""
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        member = tarfile.TarInfo(Path(AGENT_PATH_IN_IMAGE).name)
        member.size, member.mode, member.mtime = len(zipapp), 0o644, 0
        tar.addfile(member, io.BytesIO(zipapp))
    repository, _, tag_part = tag.partition(":")
    digest = hashlib.sha256(zipapp).hexdigest()[:16]
    changes = [
        *config_changes(spec),
        f"LABEL {TAG_LABEL}={tag_part}",
        f"LABEL {AGENT_LABEL}={digest}",
    ]
    container_id = None
    try:
        container_id = client.api.create_container(
            base,
            entrypoint=["/usr/bin/python3", "-I", "-B", "-c", COMPILE_AGENT, AGENT_PATH_IN_IMAGE],
            user="0",
            network_disabled=True,
            host_config=client.api.create_host_config(network_mode="none"),
        )["Id"]
        if not client.api.put_archive(
            container_id, str(Path(AGENT_PATH_IN_IMAGE).parent), archive.getvalue()
        ):
            raise ImageBuildError(f"could not copy the agent into {base}")
        client.api.start(container_id)
        status = client.api.wait(container_id, timeout=COMPILE_TIMEOUT_S)
        if status.get("StatusCode") != 0:
            logs = client.api.logs(container_id).decode(errors="replace")[-2000:]
            raise ImageBuildError(f"compiling the agent in {base} failed: {logs.strip()}")
        client.api.commit(container_id, repository=repository, tag=tag_part, changes=changes)
    except _docker_errors() as exc:
        raise ImageBuildError(f"could not add the agent to {base}: {exc}") from exc
    finally:
        if container_id is not None:
            with contextlib.suppress(*_docker_errors()):
                client.api.remove_container(container_id, force=True)
