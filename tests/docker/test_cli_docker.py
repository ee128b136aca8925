"""The CLI against a real daemon: run (every docker name of the table), gc."""

from __future__ import annotations

import contextlib
import json
import platform
import socket
import subprocess
import sys

import docker
import pytest

from retool_exec.backends.docker.containers import LABEL_MANAGED, LABEL_OWNER
from retool_exec.backends.docker.image_inputs import image_tag
from tests.conftest import LABELS, require_docker

pytestmark = pytest.mark.docker


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "retool_exec.cli", *args],
        input=stdin,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _label_args() -> list[str]:
    return ["--set", "labels=" + json.dumps(LABELS)]


def test_run_with_docker_backend_prints_the_observation_and_exit_status() -> None:
    require_docker()
    ok = cli("run", "--backend", "docker", *_label_args(), "-c", "print(6 * 7)")
    assert (ok.returncode, ok.stdout) == (0, "42\n")
    # Not a terminal: no "starting sandbox..." on stderr.
    assert ok.stderr == ""
    failed = cli(
        "run", "--backend", "docker", *_label_args(), "--json", "-", stdin="import sys; sys.exit(4)"
    )
    assert failed.returncode == 1
    assert json.loads(failed.stdout)["returncode"] == 4
    assert json.loads(failed.stdout)["backend"] == "docker"


@pytest.mark.gvisor
def test_run_docker_runsc_runs_under_gvisor() -> None:
    require_docker()
    code = "import platform; print(platform.release())"
    done = cli("run", "--backend", "docker-runsc", *_label_args(), "-c", code)
    if "no runtime 'runsc'" in done.stderr:
        pytest.skip("Docker has no runsc runtime here")
    assert done.returncode == 0, done.stderr
    # gVisor reports its own kernel version, not the host's.
    assert done.stdout.strip() != platform.release()


def test_run_unknown_runtime_is_one_line_and_status_69() -> None:
    require_docker()
    done = cli("run", "--backend", "docker", "--runtime", "no-such-runtime", "-c", "1")
    assert done.returncode == 69
    assert done.stderr.count("\n") == 1
    assert "no runtime 'no-such-runtime'" in done.stderr


def test_gc_removes_containers_whose_owner_is_gone_and_keeps_live_ones() -> None:
    require_docker()
    client = docker.from_env()
    dead_owner = f"{socket.gethostname()}:999999999:0"
    created = client.api.create_container(
        image_tag(),
        entrypoint=["/bin/true"],
        labels={**LABELS, LABEL_MANAGED: "1", LABEL_OWNER: dead_owner},
        network_disabled=True,
    )
    try:
        result = cli("gc")
        assert result.returncode == 0, result.stderr
        assert created["Id"][:12] in result.stdout
        assert not client.api.containers(all=True, filters={"id": created["Id"]})
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            client.api.remove_container(created["Id"], force=True)
        client.close()
