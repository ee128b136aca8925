"""Shared fixtures: one sandbox per backend configuration, reused across tests.

Docker-backed configurations need a daemon and the sandbox image. Without a
daemon they are skipped on a developer's machine, but with
``RETOOL_EXEC_REQUIRE_DOCKER=1`` (set by CI) a missing daemon is a failure:
a skipped security test proves nothing.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

from retool_exec import BackendConfigBase, DockerConfig, Sandbox
from retool_exec._errors import DockerUnavailableError
from retool_exec.backends.docker.client import connect
from retool_exec.backends.registry import BUILTIN_BACKENDS, backend_spec
from retool_exec.backends.registry import backend_config as table_config

REQUIRE_DOCKER = os.environ.get("RETOOL_EXEC_REQUIRE_DOCKER") == "1"
TEST_LABEL = "org.retool_exec.test"

BACKEND_IDS = [
    spec.name for spec in BUILTIN_BACKENDS if spec.alias_of is None and spec.name != "fake"
]
"""The backends the shared tests run on: every name of the backend table but aliases and
``fake`` (which runs nothing)."""
SESSION_ID = f"{os.getpid()}"
LABELS = {TEST_LABEL: SESSION_ID}
"""Labels for every container a test creates; the value tells this session's apart."""

TEST_SETTINGS: dict[str, dict[str, object]] = {
    "docker-fresh": {"pool_size": 4},
    "docker-reuse": {"pool_size": 2},
    "docker-runsc": {"pool_size": 2},
    "ray": {"pool_size": 2, "node_resource": "docker"},  # the test cluster's two worker nodes
}
"""What the tests change on top of the table's configs (small pools; labelled containers)."""


def backend_config(backend_id: str, *, timeout: float = 10.0) -> BackendConfigBase:
    """The config behind each backend id used to parametrize the shared tests: the table's,
    with a short timeout, a small pool and this session's labels."""
    settings: dict[str, object] = {"timeout": timeout, **TEST_SETTINGS.get(backend_id, {})}
    if backend_spec(backend_id).accepts("labels"):
        settings["labels"] = LABELS
    return table_config(backend_id, settings)


def docker_available() -> str | None:
    """None when a Docker daemon answers, else why not."""
    try:
        connect().close()
    except DockerUnavailableError as exc:
        return f"no Docker daemon: {exc}"
    return None


def require_docker() -> None:
    """Skip (or, in CI, fail) when Docker is unreachable."""
    reason = docker_available()
    if reason is None:
        return
    if REQUIRE_DOCKER:
        pytest.fail(f"RETOOL_EXEC_REQUIRE_DOCKER=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def needs_docker(backend_id: str) -> bool:
    """Whether the backend runs in Docker (its tests carry the ``docker`` marker)."""
    return issubclass(backend_spec(backend_id).config_class, DockerConfig)


def _backend_params() -> list[object]:
    return [
        pytest.param(
            bid,
            id=bid,
            marks=[pytest.mark.docker] * needs_docker(bid) + [pytest.mark.ray] * (bid == "ray"),
        )
        for bid in BACKEND_IDS
    ]


@pytest.fixture(scope="session", params=_backend_params())
def backend_id(request: pytest.FixtureRequest) -> str:
    bid: str = request.param
    if needs_docker(bid):
        require_docker()
    if bid == "ray":
        request.getfixturevalue("ray_cluster")  # joined by the ray backend (address None)
    return bid


@pytest.fixture(scope="session")
def ray_cluster(_sandboxes: dict[str, Sandbox]) -> Iterator[object]:
    """A head and two worker nodes on this machine (tests/ray/cluster.py), Ray joined;
    the shared ray sandbox is closed before the cluster stops, and no process outlives it."""
    require_docker()
    from tests.ray.cluster import LocalCluster

    cluster = LocalCluster()
    try:
        yield cluster
    finally:
        shared = _sandboxes.pop("ray", None)
        if shared is not None:
            shared.close()
        left = cluster.shutdown()
    assert not left, f"Ray processes outlived the cluster and were killed: {left}"


def session_containers() -> list[str]:
    """Ids of this session's test containers (any state)."""
    import docker

    client = docker.from_env()
    try:
        label = f"{TEST_LABEL}={SESSION_ID}"
        return [c["Id"] for c in client.api.containers(all=True, filters={"label": label})]
    finally:
        client.close()


def remove_test_containers() -> None:
    import docker

    client = docker.from_env()
    try:
        for container_id in session_containers():
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                client.api.remove_container(container_id, force=True)
    finally:
        client.close()


@pytest.fixture(scope="session")
def _sandboxes() -> Iterator[dict[str, Sandbox]]:
    sandboxes: dict[str, Sandbox] = {}
    yield sandboxes
    for sandbox in sandboxes.values():
        sandbox.close()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Leave nothing behind: sweep labelled containers, and fail if any were left."""
    if docker_available() is not None:
        return
    leftover = session_containers()
    if leftover:
        remove_test_containers()
        print(f"\nERROR: {len(leftover)} test container(s) were left behind and removed now")
        session.exitstatus = 1


@pytest.fixture()
def sandbox(backend_id: str, _sandboxes: dict[str, Sandbox]) -> Sandbox:
    """A started sandbox (timeout 10 s) for the backend under test, shared per session."""
    if backend_id not in _sandboxes:
        sb = Sandbox(backend_config(backend_id), max_workers=16)
        sb.start()
        _sandboxes[backend_id] = sb
    return _sandboxes[backend_id]
