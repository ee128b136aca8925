"""The sandbox image, built without any container registry.

Why: no registry is reachable on the machines this project is built and tested
on, and many training clusters are air-gapped too; a Debian mirror (or a local
copy of one) is all they have. So the image is not pulled ``FROM`` anything:
``image_files/build-rootfs.sh`` runs ``mmdebstrap --variant=essential`` to
build a root filesystem from Debian's packages (python3 and the math stack:
numpy, scipy, sympy, mpmath), installs the agent (the stdlib-only package
``backends/docker/agent/``, packed as one zipapp, byte-compiled in the image:
``agent_layer``) as ``/opt/retool_exec/agent.pyz``, strips every setuid/setgid bit, and writes a
tarball, which ``docker import`` (the API's ``/images/create?fromSrc=-``)
turns into an image with the sandbox's user, working directory, environment
and entry point. Takes about a minute; the image is about 270 MB.

What goes in and the content-addressed tag are ``image_inputs`` (pure, no
Docker); this module builds, imports, finds and lists images by those tags.

Where a registry *is* reachable, ``images/Dockerfile.slim`` at the repository
root documents a ``FROM python:3.11-slim`` build; it is not used or tested here.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime as dt
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import docker
import docker.errors
import docker.models.images
import requests.exceptions

from retool_exec.backends.docker.agent_layer import add_agent
from retool_exec.backends.docker.image_inputs import (
    AGENT_LAYER_INPUTS,
    ENTRYPOINT,
    IMAGE_LABEL,
    IMAGE_REPOSITORY,
    PIP_LABEL,
    SANDBOX_USER,
    SPEC_LABEL,
    TAG_LABEL,
    ImageBuildError,
    build_inputs,
    config_changes,
    content_hash,
    image_tag,
    spec_label,
)
from retool_exec.backends.docker.image_spec import ImageSpec

__all__ = ["ImageInfo", "build_image", "ensure_image", "find_image", "is_current", "list_images"]
"""The Docker side; what goes into an image and its tag are ``image_inputs``'s."""

_BUILD_TIMEOUT_S = 1800.0
_TERM_GRACE_S = 30.0
_TAIL_LINES = 30
# Lines of the build log worth showing as progress (the rest is only kept for errors).
_PROGRESS_LINE = re.compile(r"^(I: |W: |E: |build-rootfs: |\+ mmdebstrap )")


@dataclasses.dataclass(frozen=True, slots=True)
class ImageInfo:
    """A sandbox image present in the Docker daemon."""

    tag: str
    """``retool-exec-sandbox:<hash>``; empty when the image lost its tag (replaced by a rebuild)."""
    id: str
    """Image id (``sha256:...``)."""
    size_bytes: int
    """Unpacked size as Docker reports it."""
    created: dt.datetime
    """When the image was imported (UTC)."""
    built: bool
    """True when this call built it; False when it was already there."""
    spec: str = ""
    """What it holds (``ImageSpec.describe()``); empty for an image built before specs."""
    pip: tuple[str, ...] = ()
    """PyPI packages its build installed (``name==version``)."""
    spec_json: str = ""
    """The spec label as stored (JSON), when it is a valid spec."""


# ---------------------------------------------------------------------------
# Docker side


def _docker_errors() -> tuple[type[Exception], ...]:
    return (docker.errors.DockerException, requests.exceptions.RequestException)


def _parse_created(value: str) -> dt.datetime:
    """Docker's RFC 3339 time with nanoseconds -> aware datetime (microseconds)."""
    match = re.fullmatch(r"(.+?)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", value)
    if match is None:
        return dt.datetime.fromtimestamp(0, dt.UTC)
    base, fraction, zone = match.groups()
    text = base + (f".{(fraction or '0')[:6]:0<6}") + ("+00:00" if zone == "Z" else zone)
    try:
        return dt.datetime.fromisoformat(text).astimezone(dt.UTC)
    except ValueError:
        return dt.datetime.fromtimestamp(0, dt.UTC)


def _info(image: docker.models.images.Image, *, built: bool, tag: str | None = None) -> ImageInfo:
    attrs: dict[str, Any] = image.attrs
    if tag is None:
        ours = [t for t in image.tags if t.startswith(f"{IMAGE_REPOSITORY}:")]
        tag = sorted(ours)[0] if ours else ""
    labels = (attrs.get("Config") or {}).get("Labels") or {}
    spec_json = labels.get(SPEC_LABEL, "")
    described = _describespec_label(spec_json)
    return ImageInfo(
        tag=tag,
        id=str(attrs.get("Id", image.id)),
        size_bytes=int(attrs.get("Size") or 0),
        created=_parse_created(str(attrs.get("Created", ""))),
        built=built,
        spec=described,
        spec_json=spec_json if described else "",
        pip=tuple(name for name in labels.get(PIP_LABEL, "").split(",") if name),
    )


def is_current(info: ImageInfo) -> bool:
    """Whether ``info`` is its spec's image as this version builds it (agent and script)."""
    return bool(info.spec_json) and info.tag == image_tag(
        ImageSpec.model_validate_json(info.spec_json)
    )


def find_image(client: docker.DockerClient, tag: str) -> ImageInfo | None:
    """The image ``tag`` if the daemon has it."""
    return _find(client, tag)


def _describespec_label(text: str) -> str:
    try:
        return ImageSpec.model_validate_json(text).describe()
    except ValueError:
        return ""


def _find(client: docker.DockerClient, tag: str) -> ImageInfo | None:
    try:
        image = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None
    except _docker_errors() as exc:
        raise ImageBuildError(f"cannot look up image {tag}: {exc}") from exc
    return _info(image, built=False, tag=tag)


def list_images(client: docker.DockerClient) -> list[ImageInfo]:
    """Every image labelled ``org.retool_exec.image=1``, newest first."""
    try:
        images = client.images.list(filters={"label": f"{IMAGE_LABEL}=1"})
    except _docker_errors() as exc:
        raise ImageBuildError(f"cannot list sandbox images: {exc}") from exc
    infos = [_info(image, built=False) for image in images]
    return sorted(infos, key=lambda info: info.created, reverse=True)


def ensure_image(
    client: docker.DockerClient,
    spec: ImageSpec | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    install_tools: bool = False,
) -> ImageInfo:
    """The spec's sandbox image (the default one when None): found if present, built otherwise."""
    return build_image(client, spec, force=False, progress=progress, install_tools=install_tools)


def build_image(
    client: docker.DockerClient,
    spec: ImageSpec | None = None,
    *,
    force: bool = False,
    progress: Callable[[str], None] | None = None,
    install_tools: bool = False,
) -> ImageInfo:
    """Build the spec's sandbox image from Debian's packages (and PyPI) and import it.

    Skips the build when the content-addressed tag already exists, unless
    ``force``. Needs ``mmdebstrap`` on the host (Debian/Ubuntu); with
    ``install_tools`` it is installed with apt-get when missing. Concurrent
    builds on one host are serialized by a lock file, and the second one finds
    the first one's image. Raises ``ImageBuildError`` (cause attached) on failure.
    """
    say = progress if progress is not None else _quiet
    spec = spec if spec is not None else ImageSpec()
    inputs = build_inputs(spec)
    tag = f"{IMAGE_REPOSITORY}:{content_hash(inputs, spec)[:16]}"
    if not force and (found := _find(client, tag)) is not None:
        say(f"image {tag} is present ({found.size_bytes / 1e6:.0f} MB)")
        return found

    with _build_lock(say):
        if not force and (found := _find(client, tag)) is not None:
            say(f"image {tag} was built meanwhile by another process")
            return found
        started = time.monotonic()
        base = _base_tag(inputs, spec)
        if force or _find(client, base) is None:
            say(f"building the {spec.describe()} image")
            _build_base(client, base, inputs, spec, install_tools=install_tools, say=say)
        say(f"adding the agent to {base} as {tag}...")
        add_agent(client, base, tag, inputs["agent.pyz"], spec)
        _check_config(client, tag, spec)
        info = _find(client, tag)
        if info is None:
            raise ImageBuildError(f"image {tag} is missing right after it was made")
        say(
            f"image {tag} ready in {time.monotonic() - started:.0f} s "
            f"({info.size_bytes / 1e6:.0f} MB)"
        )
        return dataclasses.replace(info, built=True)


def _base_tag(inputs: Mapping[str, bytes], spec: ImageSpec) -> str:
    """The root filesystem's own tag: hashed over everything but the agent.

    The agent changes far more often than the packages; a new agent is one
    small layer on the same base (seconds), not a new mmdebstrap run (minutes).
    """
    rest = {name: data for name, data in inputs.items() if name not in AGENT_LAYER_INPUTS}
    return f"{IMAGE_REPOSITORY}-base:{content_hash(rest, spec)[:16]}"


def _build_base(
    client: docker.DockerClient,
    base: str,
    inputs: Mapping[str, bytes],
    spec: ImageSpec,
    *,
    install_tools: bool,
    say: Callable[[str], None],
) -> None:
    _ensure_mmdebstrap(install_tools=install_tools, say=say)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="retool-exec-image-") as tmp:
        work = Path(tmp)
        # mmdebstrap's unshare mode (non-root) reads these as another uid.
        work.chmod(0o755)
        staged = _stage_inputs(work, inputs)
        tarball = work / "rootfs.tar"
        say("building root filesystem with mmdebstrap...")
        _run_build_script(staged, tarball, say)
        say(
            f"root filesystem built in {time.monotonic() - started:.0f} s "
            f"({tarball.stat().st_size / 1e6:.0f} MB tarball)"
        )
        installed = _pip_installed(tarball, spec)
        if installed:
            say(f"installed from PyPI: {', '.join(installed)}")
        say(f"importing into Docker as {base}...")
        _import(client, tarball, base, spec, installed)


def _pip_installed(tarball: Path, spec: ImageSpec) -> list[str]:
    """``name==version`` of what the build's pip installed (the script writes them beside)."""
    if not spec.pip:
        return []
    frozen = tarball.with_name(tarball.name + ".pip-freeze")
    try:
        lines = frozen.read_text().splitlines()
    except OSError as exc:
        raise ImageBuildError(f"the build did not record what pip installed: {exc}") from exc
    return sorted(line.strip() for line in lines if "==" in line)


def _quiet(_line: str) -> None:
    pass


@contextlib.contextmanager
def _build_lock(say: Callable[[str], None]) -> Iterator[None]:
    """One build at a time per host (flock is per open file, so threads serialize too)."""
    path = Path(tempfile.gettempdir()) / "retool-exec-image-build.lock"
    try:
        handle = path.open("a")
    except OSError:
        yield  # a lock file we cannot open is no reason not to build
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say("waiting for another build of the sandbox image to finish...")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _ensure_mmdebstrap(*, install_tools: bool, say: Callable[[str], None]) -> None:
    if shutil.which("mmdebstrap") is not None:
        return
    if not install_tools:
        raise ImageBuildError(
            "mmdebstrap is not installed; it builds the sandbox image from Debian's "
            "packages. Install the Debian package 'mmdebstrap' (apt-get install -y "
            "mmdebstrap), or pass install_tools=True to let retool_exec do it."
        )
    if shutil.which("apt-get") is None:
        raise ImageBuildError(
            "mmdebstrap is not installed and there is no apt-get to install it: "
            "the sandbox image is built on a Debian or Ubuntu host"
        )
    say("installing mmdebstrap with apt-get...")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update"], ["apt-get", "install", "-y", "mmdebstrap"]):
        try:
            subprocess.run(command, env=env, check=True, capture_output=True, text=True)
        except subprocess.CalledProcessError as exc:
            tail = _tail_text((exc.stderr or "") + (exc.stdout or ""))
            raise ImageBuildError(
                f"`{' '.join(command)}` failed with exit code {exc.returncode} "
                f"(installing mmdebstrap needs root):\n{tail}"
            ) from exc
        except OSError as exc:
            raise ImageBuildError(f"cannot run `{' '.join(command)}`: {exc}") from exc
    if shutil.which("mmdebstrap") is None:
        raise ImageBuildError("apt-get installed mmdebstrap, but it is not on PATH")


def _stage_inputs(work: Path, inputs: Mapping[str, bytes]) -> dict[str, Path]:
    """Write the exact bytes that were hashed, so the tag always matches the content."""
    staged: dict[str, Path] = {}
    for name, data in inputs.items():
        path = work / name
        path.write_bytes(data)
        path.chmod(0o755 if name.endswith(".sh") else 0o644)
        staged[name] = path
    return staged


def _tail_text(text: str, lines: int = _TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _run_build_script(
    staged: Mapping[str, Path], tarball: Path, say: Callable[[str], None]
) -> None:
    command = [
        "bash",
        str(staged["build-rootfs.sh"]),
        str(tarball),
        str(staged["agent.pyz"]),
        str(staged["packages.txt"]),
    ]
    if "requirements.txt" in staged:
        command.append(str(staged["requirements.txt"]))
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C.UTF-8"}
    tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
    try:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except OSError as exc:
        raise ImageBuildError(f"cannot run the image build script: {exc}") from exc

    timed_out = threading.Event()

    def stop() -> None:
        # SIGTERM first: mmdebstrap then unmounts /proc etc. from its chroot.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(_TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

    def on_timeout() -> None:
        timed_out.set()
        stop()

    watchdog = threading.Timer(_BUILD_TIMEOUT_S, on_timeout)
    watchdog.daemon = True
    with proc:  # closes the pipe and reaps the process, whatever happens
        watchdog.start()
        try:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.rstrip("\n")
                tail.append(line)
                if _PROGRESS_LINE.match(line):
                    say(line)
            returncode = proc.wait()
        finally:
            watchdog.cancel()
            if proc.poll() is None:  # interrupted (KeyboardInterrupt...): leave nothing behind
                stop()
    if timed_out.is_set():
        raise ImageBuildError(
            f"the image build took longer than {_BUILD_TIMEOUT_S:.0f} s and was stopped; "
            "last lines:\n" + "\n".join(tail)
        )
    if returncode != 0:
        raise ImageBuildError(
            f"mmdebstrap failed (exit code {returncode}); last lines:\n" + "\n".join(tail)
        )
    if not tarball.is_file() or tarball.stat().st_size == 0:
        raise ImageBuildError(f"the image build wrote no root filesystem at {tarball}")


def _import(
    client: docker.DockerClient, tarball: Path, tag: str, spec: ImageSpec, installed: list[str]
) -> None:
    repository, _, tag_part = tag.partition(":")
    changes = [*config_changes(spec), f"LABEL {TAG_LABEL}={tag_part}"]
    changes = [c for c in changes if not c.startswith(f"LABEL {IMAGE_LABEL}=")]
    if installed:
        changes.append(f"LABEL {PIP_LABEL}={json.dumps(','.join(installed))}")
    try:
        # src as a path: docker-py streams the file (no timeout on the upload).
        response = client.api.import_image(
            src=str(tarball), repository=repository, tag=tag_part, changes=changes
        )
    except _docker_errors() as exc:
        raise ImageBuildError(f"docker import of {tag} failed: {exc}") from exc
    for line in str(response).splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, dict) and message.get("error"):
            raise ImageBuildError(f"docker import of {tag} failed: {message['error']}")
    _check_config(client, tag, spec, listed=False)


def _check_config(
    client: docker.DockerClient, tag: str, spec: ImageSpec, *, listed: bool = True
) -> None:
    """The daemon applied every change (an old one might drop e.g. LABEL)."""
    try:
        config: dict[str, Any] = client.images.get(tag).attrs.get("Config") or {}
    except _docker_errors() as exc:
        raise ImageBuildError(f"cannot inspect the imported image {tag}: {exc}") from exc
    labels = config.get("Labels") or {}
    problems = []
    if config.get("User") != SANDBOX_USER:
        problems.append(f"User={config.get('User')!r}")
    if list(config.get("Entrypoint") or []) != list(ENTRYPOINT):
        problems.append(f"Entrypoint={config.get('Entrypoint')!r}")
    if (
        labels.get(IMAGE_LABEL) != ("1" if listed else None)
        or labels.get(TAG_LABEL) != tag.partition(":")[2]
        or labels.get(SPEC_LABEL) != spec_label(spec)
    ):
        problems.append(f"Labels={labels!r}")
    if problems:
        with contextlib.suppress(*_docker_errors()):
            client.images.remove(tag, force=True)
        raise ImageBuildError(
            f"the Docker daemon did not apply the image configuration to {tag}: "
            + ", ".join(problems)
        )
