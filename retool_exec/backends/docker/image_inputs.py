"""What a sandbox image is made of, and its content-addressed tag: pure, no Docker needed.

The tag ``retool-exec-sandbox:<16 hex>`` is a sha256 over the resolved package
list, the PyPI requirements, the build script, every member of the agent
zipapp and the image configuration, so an unchanged image is found and not
rebuilt, and a changed agent can never run under an old tag. ``image.py``
builds and finds images by these tags; this module also decides how an image
of any origin gets this host's agent (``image_choice``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from retool_exec._errors import ImageError
from retool_exec.backends.docker.agent import wire
from retool_exec.backends.docker.image_spec import ImageSpec

__all__ = [
    "AGENT_LABEL",
    "AGENT_LAYER_INPUTS",
    "AGENT_PATH_IN_IMAGE",
    "COMPILE_AGENT",
    "ENTRYPOINT",
    "FORMAT_VERSION",
    "IMAGE_LABEL",
    "IMAGE_REPOSITORY",
    "PIP_LABEL",
    "SANDBOX_USER",
    "SPEC_LABEL",
    "TAG_LABEL",
    "ImageBuildError",
    "ImageChoice",
    "agent_digest",
    "agent_source_paths",
    "agent_zipapp",
    "build_flags",
    "build_inputs",
    "config_changes",
    "content_hash",
    "image_choice",
    "image_files_dir",
    "image_tag",
    "spec_label",
]

IMAGE_REPOSITORY = "retool-exec-sandbox"
IMAGE_LABEL = "org.retool_exec.image"
"""Label (value ``1``) on every image this module builds; ``list_images`` filters on it."""
TAG_LABEL = "org.retool_exec.tag"
"""Label holding the content hash (the tag without the repository)."""
SPEC_LABEL = "org.retool_exec.spec"
"""Label holding the image spec it was built from (JSON, without ``preload``)."""
PIP_LABEL = "org.retool_exec.pip"
"""Label holding the PyPI packages the build installed, ``name==version`` comma-separated."""
AGENT_LABEL = "org.retool_exec.agent"
"""Label holding the digest of the agent inside (``agent_digest()``): a host whose agent
differs sends its own in at start instead of running this one."""
AGENT_PATH_IN_IMAGE = wire.AGENT_PATH
SANDBOX_USER = wire.DEFAULT_SANDBOX_USER
"""nobody:nogroup, the image's default user."""
AGENT_LAUNCHER = (
    "import sys\n"
    "own = frozenset(sys.modules)\n"
    f"sys.path.insert(0, {AGENT_PATH_IN_IMAGE!r})\n"
    f"from {wire.AGENT_PACKAGE}.supervisor import main\n"
    "sys.exit(main(sys.path[:1] + sys.argv[1:], own))\n"
)
"""The container's PID 1: the agent package imported from its archive, after noting the
modules python3 had (``zygote.Setup.pythons_own``: a call's upload of any other name
wins over the zygote's module).

Why not ``python3 agent.pyz``: starting a zipapp runs ``runpy``, which imports
``collections``, ``functools``, ``types``, ``warnings`` and a dozen more that ``python3
-c`` or ``python3 SCRIPT`` never has at start, so a call's own ``types.py`` or
``collections/`` was ignored for the zygote's module (thirty-third red-team round)."""
ENTRYPOINT = ("/usr/bin/python3", "-I", "-B", "-c", AGENT_LAUNCHER)
"""No ``-S``: numpy & co. live in dist-packages, which ``site`` puts on the path."""

FORMAT_VERSION = "1"
"""Bump when the image changes in a way the hashed inputs do not show."""

_HERE = Path(__file__).resolve().parent


class ImageBuildError(ImageError):
    """The sandbox image could not be built or imported (a RuntimeError)."""


def image_files_dir() -> Path:
    """Folder of the build inputs shipped inside the package (preset lists, build-rootfs.sh)."""
    return _HERE / "image_files"


_ZIPAPP_MAIN = (
    f"import sys\nfrom {wire.AGENT_PACKAGE}.supervisor import main\nsys.exit(main(sys.argv))\n"
).encode()
"""The archive's own entry (``python3 agent.pyz``, by hand): not the container's, which
is ``AGENT_LAUNCHER``. Started so, python3's modules are not known, and no module the
zygote holds gives way to a call's upload (``zygote.Setup.pythons_own``)."""


def agent_source_paths() -> list[Path]:
    """The agent package's modules, in a stable order: each becomes a zipapp member."""
    return sorted((_HERE / "agent").glob("*.py"))


def agent_zipapp() -> bytes:
    """The agent package as one zipapp, byte-for-byte reproducible (fixed times, sorted)."""
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        members = [("__main__.py", _ZIPAPP_MAIN)]
        members += [
            (f"{wire.AGENT_PACKAGE}/{path.name}", path.read_bytes())
            for path in agent_source_paths()
        ]
        for name, data in members:
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    return buffer.getvalue()


COMPILE_AGENT = """\
import importlib._bootstrap_external as external, importlib.util, sys, zipfile
path = sys.argv[1]
with zipfile.ZipFile(path) as archive:
    members = [(info, archive.read(info)) for info in archive.infolist()]
names = {info.filename for info, _ in members}
with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
    for info, data in members:
        archive.writestr(info, data)
        if info.filename.endswith(".py") and info.filename + "c" not in names:
            code = compile(data, path + "/" + info.filename, "exec", dont_inherit=True)
            pyc = external._code_to_hash_pyc(code, importlib.util.source_hash(data), False)
            compiled = zipfile.ZipInfo(info.filename + "c", date_time=info.date_time)
            compiled.external_attr = info.external_attr
            archive.writestr(compiled, bytes(pyc), zipfile.ZIP_DEFLATED)
"""
"""Run by the image's python3 on the zipapp: adds ``name.pyc`` beside every ``name.py``."""

AGENT_LAYER_INPUTS = ("agent.pyz", "agent-compile.py")
"""The inputs of the agent's own layer; the base image is hashed over all the others."""


def agent_digest() -> str:
    """First 16 hex of the agent zipapp's sha256: which agent an image holds."""
    return hashlib.sha256(agent_zipapp()).hexdigest()[:16]


def build_inputs(spec: ImageSpec | None = None) -> dict[str, bytes]:
    """Name -> content of every file the image is built from (the agent's members included).

    ``packages.txt`` and ``requirements.txt`` are written from the spec (the
    preset's lists plus its extras), so the tag follows what is installed, not
    how the spec was spelled.
    """
    spec = spec if spec is not None else ImageSpec()
    script = image_files_dir() / "build-rootfs.sh"
    try:
        contents = {"build-rootfs.sh": script.read_bytes()}
        packages = [*spec.packages, *(["python3-pip"] if spec.pip else [])]
    except OSError as exc:
        raise ImageBuildError(f"sandbox image input missing: {exc}") from exc
    contents["packages.txt"] = "".join(f"{name}\n" for name in packages).encode()
    if spec.pip:
        contents["requirements.txt"] = "".join(f"{line}\n" for line in spec.pip).encode()
    try:
        contents["agent.pyz"] = agent_zipapp()
    except OSError as exc:
        raise ImageBuildError(f"cannot pack the agent: {exc}") from exc
    contents["agent-compile.py"] = COMPILE_AGENT.encode()
    return contents


def spec_label(spec: ImageSpec) -> str:
    return spec.model_dump_json(exclude={"preload"})


def config_changes(spec: ImageSpec) -> list[str]:
    """Dockerfile instructions applied at import, except the tag label (it names the hash)."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", **spec.env}
    return [
        f"USER {SANDBOX_USER}",
        "WORKDIR /tmp",
        "ENV " + " ".join(f"{name}={value}" for name, value in env.items()),
        f"ENTRYPOINT {json.dumps(list(ENTRYPOINT))}",
        f"LABEL {IMAGE_LABEL}=1",
        f"LABEL {SPEC_LABEL}={json.dumps(spec_label(spec))}",
    ]


def content_hash(inputs: Mapping[str, bytes], spec: ImageSpec) -> str:
    digest = hashlib.sha256()

    def feed(data: bytes) -> None:
        # Length-prefixed, so no two different input sets hash alike.
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)

    feed(f"retool-exec-sandbox-image/{FORMAT_VERSION}".encode())
    feed("\n".join(config_changes(spec)).encode())
    for name in sorted(inputs):
        feed(name.encode())
        feed(inputs[name])
    return digest.hexdigest()


def image_tag(spec: ImageSpec | None = None) -> str:
    """``retool-exec-sandbox:<first 16 hex of the content hash>``; pure, no Docker needed."""
    spec = spec if spec is not None else ImageSpec()
    return f"{IMAGE_REPOSITORY}:{content_hash(build_inputs(spec), spec)[:16]}"


def build_flags(spec: ImageSpec) -> str:
    """The ``retool-exec image build`` flags that build ``spec`` (empty for the default)."""
    import shlex

    flags = [] if spec.preset == "math" else ["--preset", spec.preset]
    flags += [word for name in spec.apt for word in ("--apt", name)]
    flags += [word for requirement in spec.pip for word in ("--pip", requirement)]
    return "".join(f" {shlex.quote(word)}" for word in flags)


@dataclasses.dataclass(frozen=True, slots=True)
class ImageChoice:
    """The image a backend runs, and how its agent gets in."""

    tag: str
    send_agent: bytes | None = None
    """The zipapp to send at start when the image does not hold this agent (else None)."""
    image_path: str | None = None
    """The image's own ``PATH``, where the bootstrap looks for ``python3``."""


def image_choice(tag: str, attrs: Mapping[str, Any]) -> ImageChoice:
    """How to run the image ``tag`` (``attrs``: its inspect data) with this host's agent."""
    from retool_exec.backends.docker.bootstrap import needs_bootstrap

    config = attrs.get("Config") or {}
    if config.get("Volumes"):
        # Docker would mount an anonymous volume there: storage the calls could write,
        # outside the read-only root and the tmpfs the reset checks.
        raise ImageError(
            f"image {tag!r} declares VOLUME {', '.join(sorted(config['Volumes']))}; a sandbox "
            "image must not (calls could leave files there for the next call): build it "
            "without VOLUME"
        )
    zipapp = agent_zipapp()
    if not needs_bootstrap(attrs, hashlib.sha256(zipapp).hexdigest()[:16]):
        return ImageChoice(tag)
    env = config.get("Env") or []
    path = next((item[5:] for item in env if item.startswith("PATH=")), None)
    return ImageChoice(tag, send_agent=zipapp, image_path=path)
