"""Fixtures shared by the Docker tests of this folder."""

from __future__ import annotations

from collections.abc import Iterator

import docker
import pytest

from tests.conftest import require_docker


@pytest.fixture(scope="module")
def client() -> Iterator[docker.DockerClient]:
    """A client of this host's daemon, with a timeout long enough for an image build."""
    require_docker()
    client = docker.from_env(timeout=900)
    yield client
    client.close()
