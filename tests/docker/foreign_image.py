"""A root filesystem unlike ours, as a plain image with no agent: the bring-your-own test subject.

Debian bullseye (Python 3.9, the oldest the agent supports) with ``python3``
alone: no numpy, another libc, another suite. Built with mmdebstrap (about
30 s) and imported with ``docker import`` and no configuration, exactly as a
team's image arrives: no label, entry point or user of ours. Cached in the
daemon by a tag hashed over this recipe, so it is built once per machine.
"""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
from pathlib import Path

import docker
import docker.errors

SUITE = "bullseye"
MIRROR = f"deb http://deb.debian.org/debian {SUITE} main"
REPOSITORY = "retool-exec-test-foreign"
COMMAND = [
    "mmdebstrap",
    "--variant=essential",
    "--include=python3",
    "--format=tar",
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    '--aptopt=Acquire::Check-Valid-Until "false";',
]
# A VOLUME and an ENV secret, as images in the wild have: the first must be refused,
# the second must never reach a call.
CHANGES = ["ENV LEAKY_TOKEN=from-the-image PYTHONPATH=/nonexistent"]


def tag() -> str:
    recipe = "\n".join([*COMMAND, SUITE, MIRROR, *CHANGES]).encode()
    return f"{REPOSITORY}:{hashlib.sha256(recipe).hexdigest()[:12]}"


def ensure(client: docker.DockerClient) -> str:
    """The foreign image's tag, built and imported unless the daemon has it."""
    wanted = tag()
    try:
        client.images.get(wanted)
        return wanted
    except docker.errors.ImageNotFound:
        pass
    with tempfile.TemporaryDirectory(prefix="retool-exec-foreign-") as tmp:
        tarball = Path(tmp) / "rootfs.tar"
        subprocess.run(
            [*COMMAND, SUITE, str(tarball), MIRROR],
            check=True,
            capture_output=True,
            timeout=600,
        )
        repository, _, tag_part = wanted.partition(":")
        client.api.import_image(
            src=str(tarball), repository=repository, tag=tag_part, changes=CHANGES
        )
    client.images.get(wanted)
    return wanted


def with_volume(client: docker.DockerClient, base: str) -> str:
    """``base`` plus a ``VOLUME /data`` (committed from a container that never runs)."""
    wanted = f"{base}-volume"
    try:
        client.images.get(wanted)
        return wanted
    except docker.errors.ImageNotFound:
        pass
    container = client.api.create_container(base, command=["/bin/true"])["Id"]
    try:
        repository, _, tag_part = wanted.partition(":")
        client.api.commit(container, repository=repository, tag=tag_part, changes=["VOLUME /data"])
    finally:
        client.api.remove_container(container, force=True)
    return wanted
