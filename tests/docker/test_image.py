"""The registry-free sandbox image: its content-addressed tag, and the built image itself.

The first tests are pure (no Docker). The ones marked ``docker`` build the
image (or find it) once per module and inspect it through throwaway
containers, every one labelled ``org.retool_exec.test=1`` and removed after.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from retool_exec.backends.docker import image as image_mod
from retool_exec.backends.docker import image_inputs
from retool_exec.backends.docker.agent import wire
from retool_exec.backends.docker.image import ImageInfo
from retool_exec.backends.docker.image_inputs import AGENT_LAUNCHER, ImageBuildError

REQUIRE_DOCKER = os.environ.get("RETOOL_EXEC_REQUIRE_DOCKER") == "1"
TEST_LABELS = {"org.retool_exec.test": "1", "org.retool_exec.test.suite": "test_image"}
MAX_IMAGE_BYTES = 400 * 1000 * 1000


# ---------------------------------------------------------------------------
# Pure: the tag


def test_tag_is_content_addressed_and_stable() -> None:
    tag = image_inputs.image_tag()
    assert re.fullmatch(r"retool-exec-sandbox:[0-9a-f]{16}", tag)
    assert image_inputs.image_tag() == tag
    assert tag.startswith(image_inputs.IMAGE_REPOSITORY + ":")


def test_tag_changes_when_any_input_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    real = image_inputs.build_inputs()
    assert set(real) == {"packages.txt", "build-rootfs.sh", "agent.pyz", "agent-compile.py"}
    base = image_inputs.image_tag()
    seen = {base}
    for name in real:
        changed = {**real, name: real[name] + b"\n# changed\n"}
        monkeypatch.setattr(image_inputs, "build_inputs", lambda _spec, c=changed: c)
        tag = image_inputs.image_tag()
        assert tag not in seen, f"changing {name} did not change the tag"
        seen.add(tag)
    monkeypatch.setattr(image_inputs, "build_inputs", lambda _spec: real)
    assert image_inputs.image_tag() == base


def test_the_agent_zipapp_is_reproducible_and_holds_every_module() -> None:
    import io
    import zipfile

    first, second = image_inputs.agent_zipapp(), image_inputs.agent_zipapp()
    assert first == second
    names = set(zipfile.ZipFile(io.BytesIO(first)).namelist())
    package = wire.AGENT_PACKAGE
    assert {
        "__main__.py",
        *(f"{package}/{name}.py" for name in ("wire", "supervisor", "zygote")),
    } <= names
    assert not any(name.startswith("agent/") for name in names)  # a call's agent.py is its own


def test_tag_changes_with_the_format_version(monkeypatch: pytest.MonkeyPatch) -> None:
    base = image_inputs.image_tag()
    monkeypatch.setattr(image_inputs, "FORMAT_VERSION", image_inputs.FORMAT_VERSION + "-next")
    assert image_inputs.image_tag() != base


def test_build_inputs_ship_inside_the_package() -> None:
    files = image_inputs.image_files_dir()
    assert files.parent == Path(image_mod.__file__).resolve().parent
    packages = {
        line.split("#")[0].strip()
        for line in (files / "preset-math.txt").read_text().splitlines()
        if line.split("#")[0].strip()
    }
    assert {"python3", "python3-numpy", "python3-scipy", "python3-sympy", "python3-mpmath"} <= (
        packages
    )
    assert (files / "build-rootfs.sh").read_text().startswith("#!/usr/bin/env bash")


def test_parse_created_handles_docker_nanoseconds() -> None:
    created = image_mod._parse_created("2025-05-20T10:11:12.123456789Z")
    assert (created.year, created.second, created.microsecond) == (2025, 12, 123456)
    assert created.utcoffset() is not None
    assert image_mod._parse_created("garbage").year == 1970


# ---------------------------------------------------------------------------
# Pure: build errors (a fake client that has no image; no Docker needed)


class _NoImages:
    def get(self, name: str) -> Any:
        raise docker.errors.ImageNotFound(f"no such image: {name}")


class _FakeClient:
    images = _NoImages()


def test_missing_mmdebstrap_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    with pytest.raises(ImageBuildError, match=r"apt-get install -y mmdebstrap"):
        image_mod.build_image(_FakeClient(), install_tools=False)  # type: ignore[arg-type]


def test_failed_build_reports_the_tail_and_keeps_the_exit_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inputs = dict(image_inputs.build_inputs())
    inputs["build-rootfs.sh"] = b"echo 'I: starting'\necho 'E: no such package: nope' >&2\nexit 3\n"
    monkeypatch.setattr(image_mod, "build_inputs", lambda _spec: inputs)  # build_image's
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    lines: list[str] = []
    with pytest.raises(ImageBuildError, match=r"exit code 3") as caught:
        image_mod.build_image(_FakeClient(), progress=lines.append)  # type: ignore[arg-type]
    assert "E: no such package: nope" in str(caught.value)
    assert "I: starting" in lines


# ---------------------------------------------------------------------------
# Docker: the image itself


@pytest.fixture(scope="module")
def client() -> Iterator[docker.DockerClient]:
    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except Exception as exc:
        if REQUIRE_DOCKER:
            pytest.fail(f"RETOOL_EXEC_REQUIRE_DOCKER=1 but no Docker daemon: {exc}")
        pytest.skip(f"no Docker daemon: {exc}")
    yield client
    # Sweep: whatever a failed test left behind (run() removes on success).
    filters: dict[str, str | list[str] | bool] = {
        "label": [f"{k}={v}" for k, v in TEST_LABELS.items()]
    }
    for container in client.containers.list(all=True, filters=filters):
        container.remove(force=True)
    client.close()


@pytest.fixture(scope="module")
def built(client: docker.DockerClient) -> tuple[ImageInfo, float]:
    """The sandbox image (built now, or found) and the seconds that took."""
    started = time.monotonic()
    # In CI (RETOOL_EXEC_REQUIRE_DOCKER=1, root) a missing mmdebstrap gets installed.
    info = image_mod.build_image(client, install_tools=REQUIRE_DOCKER, progress=print)
    return info, time.monotonic() - started


def _run(
    client: docker.DockerClient, tag: str, argv: list[str], *, user: str = "65534:65534"
) -> str:
    output = client.containers.run(
        tag,
        entrypoint=argv,
        user=user,
        remove=True,
        network_mode="none",
        read_only=True,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        labels=TEST_LABELS,
        stdout=True,
        stderr=True,
    )
    assert isinstance(output, bytes)
    return output.decode()


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_build_within_budget(built: tuple[ImageInfo, float]) -> None:
    info, seconds = built
    assert info.tag == image_inputs.image_tag()
    assert 0 < info.size_bytes <= MAX_IMAGE_BYTES, f"{info.size_bytes / 1e6:.0f} MB"
    if info.built:
        assert seconds <= 300, f"build took {seconds:.0f} s"


@pytest.mark.docker
def test_image_configuration(client: docker.DockerClient, built: tuple[ImageInfo, float]) -> None:
    info, _ = built
    config = client.images.get(info.tag).attrs["Config"]
    assert config["User"] == "65534:65534"
    assert config["WorkingDir"] == "/tmp"
    assert config["Entrypoint"] == ["/usr/bin/python3", "-I", "-B", "-c", AGENT_LAUNCHER]
    assert "sys.path.insert(0, '/opt/retool_exec/agent.pyz')" in AGENT_LAUNCHER
    assert "PATH=/usr/local/bin:/usr/bin:/bin" in config["Env"]
    assert "LANG=C.UTF-8" in config["Env"]
    assert config["Labels"] == {
        "org.retool_exec.image": "1",
        "org.retool_exec.tag": info.tag.partition(":")[2],
        "org.retool_exec.spec": '{"preset":"math","apt":[],"pip":[]}',
        "org.retool_exec.agent": image_inputs.agent_digest(),
    }
    assert info.spec == "math"


@pytest.mark.docker
def test_no_setuid_or_setgid_file(
    client: docker.DockerClient, built: tuple[ImageInfo, float]
) -> None:
    # As root (with every capability dropped) so that find can enter 0700
    # directories such as /root: nothing in the image is hidden from the audit.
    out = _run(client, built[0].tag, ["/usr/bin/find", "/", "-xdev", "-perm", "/6000"], user="0:0")
    assert out.strip() == ""


@pytest.mark.docker
def test_math_stack_imports_as_nobody(
    client: docker.DockerClient, built: tuple[ImageInfo, float]
) -> None:
    code = (
        "import os, numpy, sympy, scipy, mpmath\n"
        "import scipy.integrate, scipy.interpolate, scipy.linalg, scipy.optimize, scipy.stats\n"
        "x = sympy.symbols('x')\n"
        "assert sympy.solve(x**2 - 2, x) == [-sympy.sqrt(2), sympy.sqrt(2)]\n"
        "assert abs(scipy.integrate.quad(lambda t: t * t, 0, 3)[0] - 9) < 1e-9\n"
        "assert numpy.allclose(numpy.linalg.solve([[2.0, 0], [0, 4]], [2, 4]), [1, 1])\n"
        # RBFInterpolator is compiled by Pythran: the stub package must not break it.
        "pts = numpy.linspace(0, 1, 5)[:, None]\n"
        "rbf = scipy.interpolate.RBFInterpolator(pts, pts[:, 0] ** 2)\n"
        "assert abs(float(rbf([[0.5]])[0]) - 0.25) < 1e-6\n"
        "assert str(mpmath.mpf(2).sqrt())[:6] == '1.4142'\n"
        "print(os.getuid(), os.getgid(), os.getcwd())\n"
    )
    out = _run(client, built[0].tag, ["/usr/bin/python3", "-I", "-B", "-c", code])
    assert out.split() == ["65534", "65534", "/tmp"]


@pytest.mark.docker
def test_agent_is_the_packaged_one_read_only_to_nobody(
    client: docker.DockerClient, built: tuple[ImageInfo, float]
) -> None:
    """The image's agent holds the packaged sources byte for byte, and the bytecode
    of each, made by the image's own interpreter, which the agent then runs from."""
    code = (
        "import hashlib, importlib.util, json, os, stat, sys, zipfile\n"
        "p = '/opt/retool_exec/agent.pyz'\n"
        "st = os.stat(p)\n"
        "archive = zipfile.ZipFile(p)\n"
        "sources = {n: hashlib.sha256(archive.read(n)).hexdigest()"
        " for n in archive.namelist() if n.endswith('.py')}\n"
        "magic = {n: archive.read(n)[:4] == importlib.util.MAGIC_NUMBER"
        " for n in archive.namelist() if n.endswith('.pyc')}\n"
        "sys.path.insert(0, p)\n"
        f"import {wire.AGENT_PACKAGE}.supervisor as supervisor\n"
        "print(json.dumps([sources, magic, supervisor.__file__,"
        " oct(stat.S_IMODE(st.st_mode)), st.st_uid, st.st_gid, os.access(p, os.W_OK),"
        " os.path.isdir('/tmp')]))\n"
    )
    out = _run(client, built[0].tag, ["/usr/bin/python3", "-I", "-B", "-c", code])
    sources, magic, loaded_from, *rest = json.loads(out)
    import io
    import zipfile

    packaged = zipfile.ZipFile(io.BytesIO(image_inputs.agent_zipapp()))
    assert sources == {
        name: hashlib.sha256(packaged.read(name)).hexdigest() for name in packaged.namelist()
    }
    assert magic == {f"{name}c": True for name in sources}
    assert loaded_from == f"/opt/retool_exec/agent.pyz/{wire.AGENT_PACKAGE}/supervisor.pyc"
    assert rest == ["0o644", 0, 0, False, True]


@pytest.mark.docker
def test_nobody_exists_in_the_image(
    client: docker.DockerClient, built: tuple[ImageInfo, float]
) -> None:
    out = _run(
        client,
        built[0].tag,
        ["/usr/bin/python3", "-I", "-c", "import pwd; print(pwd.getpwuid(65534).pw_name)"],
    )
    assert out.strip() == "nobody"


@pytest.mark.docker
def test_second_build_finds_the_image(
    client: docker.DockerClient, built: tuple[ImageInfo, float]
) -> None:
    started = time.monotonic()
    again = image_mod.build_image(client)
    assert again.built is False
    assert again.id == built[0].id
    assert time.monotonic() - started < 5
    assert image_mod.ensure_image(client).id == built[0].id


@pytest.mark.docker
def test_list_images_shows_it(client: docker.DockerClient, built: tuple[ImageInfo, float]) -> None:
    listed = {info.id: info for info in image_mod.list_images(client)}
    assert built[0].id in listed
    assert listed[built[0].id].tag == built[0].tag
    assert listed[built[0].id].built is False
