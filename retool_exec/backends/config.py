"""One pydantic config model per backend, told apart by ``kind``.

Configs are plain data: validated, JSON-serialisable, ``extra="forbid"`` so a
typo is an error, not a silently ignored option. ``build()`` imports the
backend module only when asked, so ``import retool_exec`` never imports
docker-py's machinery for a user of the local backend.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from retool_exec._formatting import DEFAULT_TIMEOUT, MAX_OUTPUT_CHARS
from retool_exec.backends.docker.image_spec import PRESETS, ImageSpec

if TYPE_CHECKING:
    from retool_exec.backends.base import Backend

__all__ = [
    "AnyBackendConfig",
    "BackendConfigBase",
    "DockerConfig",
    "FakeConfig",
    "LocalConfig",
    "RayConfig",
]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Names the sandbox sets itself; a user-supplied value must not override them.
_RESERVED_ENV = frozenset({"PATH", "HOME", "LANG", "PYTHONDONTWRITEBYTECODE", "HOSTNAME"})


def is_gvisor(runtime: str | None) -> bool:
    """Whether ``runtime`` names gVisor (``runsc``, ``runsc-ptrace``, ...)."""
    return bool(runtime) and str(runtime).startswith("runsc")


class BackendConfigBase(BaseModel):
    """Fields every backend understands."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout: float = Field(default=DEFAULT_TIMEOUT, gt=0, le=24 * 3600)
    """Default wall-clock seconds per call (a Sandbox's own ``timeout`` wins)."""
    max_output_chars: int = Field(default=MAX_OUTPUT_CHARS, ge=0, le=1 << 20)
    """Characters of each stream's tail kept in a result."""

    def build(self) -> Backend:
        """Create the backend this config describes."""
        raise NotImplementedError


class LocalConfig(BackendConfigBase):
    """The seed's local subprocess executor. NOT a security boundary."""

    kind: Literal["local"] = "local"
    python: str = Field(default=sys.executable, min_length=1)
    """Interpreter to run, as in the seed (``sys.executable`` by default)."""
    inherit_env: bool = True
    """Copy the host environment into the child, as the seed does (secrets included)."""

    def build(self) -> Backend:
        from retool_exec.backends.local import LocalSubprocessBackend

        return LocalSubprocessBackend(self)


class FakeConfig(BackendConfigBase):
    """A backend that runs nothing and answers with fixed values: for your own tests."""

    kind: Literal["fake"] = "fake"
    stdout: str = ""
    stderr: str = ""
    returncode: int | None = 0
    timed_out: bool = False
    delay: float = Field(default=0.0, ge=0.0)
    """Seconds each call takes (``asyncio.sleep``), to exercise concurrency."""

    def build(self) -> Backend:
        from retool_exec.backends.fake import FakeBackend

        return FakeBackend.from_config(self)


REUSE_PRELOAD = ImageSpec().preload_modules


class DockerConfig(BackendConfigBase):
    """Hardened containers with warm pools; see docs/security.md for every setting's reason."""

    kind: Literal["docker"] = "docker"
    policy: Literal["fresh", "reuse"] = "reuse"
    """``fresh``: a container serves one call and is destroyed. ``reuse``: up to
    ``max_calls_per_container`` calls, with a verified reset between calls."""
    pool_size: int = Field(default=4, ge=1, le=256)
    """Warm containers kept ready (and the most that exist at once)."""
    max_calls_per_container: int = Field(default=1000, ge=1)
    """``reuse`` only: calls a container serves before it is retired.

    A bound on a container's life beyond the verified reset after every call
    (which compares with the container's own baseline, so nothing it measures
    accumulates whatever this is). A replacement costs a few hundred ms of CPU
    (the zygote's imports and warm-up, Docker's work): at the former 200 a
    short call under load cost the host ~1.3 ms of CPU more than at 1000, about
    an eighth (docs/performance.md)."""
    runtime: str | None = None
    """OCI runtime, e.g. ``"runsc"`` for gVisor; None uses the daemon's default (runc)."""
    image: str | None = Field(default=None, min_length=1)
    """An image of your own to run (any image with a ``python3`` >= 3.9: the agent is sent
    in at start, see images/README.md); None runs the image built from ``image_spec``."""
    image_spec: ImageSpec | None = None
    """The image to build and run: a preset plus extra Debian and PyPI packages (a preset's
    name or a TOML file's path is accepted too). None: the default image (``ImageSpec()``)."""
    auto_build: bool = True
    """Build the spec's image when it is missing (a minute or two, once per spec)."""
    memory_mb: int = Field(default=1024, ge=32, le=1 << 20)
    """Memory limit; swap is the same number, so there is no swap."""
    pids: int = Field(default=128, ge=8, le=65536)
    """Most processes and threads alive at once in a container. Under gVisor the
    container's cgroup also allows its kernel's host tasks, 8 for each (at least 4096:
    ``hardening.gvisor_pids_limit``), which the host's ``kernel.pid_max`` must hold for
    the whole pool."""
    cpus: float = Field(default=1.0, gt=0, le=256)
    """CPU share (``nano_cpus``)."""
    cpu_seconds: int | None = Field(default=None, ge=1, le=24 * 3600)
    """CPU time (``RLIMIT_CPU``) each call's process may use, ending it as ``cpu_limit``;
    None: the call's timeout + 5 s, the seed's backstop behind the wall clock (which
    only a process running threads on more than one CPU can reach). Not set under
    gVisor, which counts time its tasks wait for the CPU share as CPU time (there the
    timeout bounds the call)."""
    loopback_ip: bool | None = None
    """Whether calls may open IP sockets, TCP and UDP (on their own loopback: there is no
    other network), and netlink ones; a refused one fails with EACCES (a
    ``PermissionError``). None: only under gVisor. Why not under runc: there the host
    kernel keeps figures for all containers at once that these sockets move, which calls
    in different containers used as channels: TCP's source-port table (docs/security.md,
    finding 30), the socket memory counts in ``/proc/net/sockstat`` (finding 36), the
    ARP and route lookup counts netlink requests move (finding 37); gVisor keeps its own. Unix
    sockets and resolving ``localhost`` work everywhere. In ``reuse``, a call that made
    TCP connections retires its container (they leave kernel state behind)."""
    tmpfs_mb: int = Field(default=64, ge=1, le=1 << 16)
    """Size of the writable ``/tmp`` (a RAM-backed tmpfs, counted in the memory limit)."""
    tmpfs_inodes: int = Field(default=8192, ge=16)
    """Most files and directories in ``/tmp``, and in ``/dev/shm`` (gVisor counts none)."""
    shm_mb: int = Field(default=16, ge=1, le=1 << 16)
    """Size of ``/dev/shm``."""
    nofile: int = Field(default=256, ge=32, le=1 << 20)
    """Most open file descriptors per process. At least 32: the agent holds about 20
    itself (the reset's kernel files among them), and at 16 no container started."""
    fsize_mb: int = Field(default=64, ge=1, le=1 << 20)
    """Largest file a call may write."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables; nothing is ever copied from the host."""
    preload: tuple[str, ...] | None = None
    """Modules the in-container zygote imports (and warms up) once, before forking each
    call. None picks by policy: ``reuse`` preloads numpy, sympy, scipy and mpmath (paid
    once per container, saved on every call); ``fresh`` preloads nothing, because a
    container serves one call and a lighter start keeps the pool full."""
    light_zygote: bool = True
    """With modules preloaded (``reuse``): a second zygote, holding only a few standard
    modules, forks the plain calls whose code names no preloaded module and imports only
    the standard library (read from the code's text, erring towards the full zygote).
    Such a call starts ~1 ms sooner and costs ~1 ms less CPU; the container holds ~10 MiB
    more. A wrong choice only costs an import. False: every call forks from one zygote."""
    start_timeout: float = Field(default=60.0, gt=0)
    """Seconds a new container may take to report ready."""
    host_grace: float = Field(default=2.0, gt=0, le=60)
    """Seconds past a call's timeout before the host kills a silent container."""
    docker_host: str | None = None
    """Daemon address; None reads ``DOCKER_HOST`` or uses the default socket."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Extra container labels (e.g. to find a test's containers); ours cannot be overridden."""

    @field_validator("env")
    @classmethod
    def _env_is_clean(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not _ENV_NAME.match(name):
                raise ValueError(f"environment variable name {name!r} is not a valid identifier")
            if name in _RESERVED_ENV:
                raise ValueError(f"environment variable {name!r} is set by the sandbox itself")
            if "\x00" in value:
                raise ValueError(f"environment variable {name!r} contains a NUL byte")
        return env

    @field_validator("labels")
    @classmethod
    def _labels_are_not_ours(cls, labels: dict[str, str]) -> dict[str, str]:
        for key in labels:
            if key.startswith("org.retool_exec.") and key != "org.retool_exec.test":
                raise ValueError(f"label {key!r} is reserved for retool_exec's own bookkeeping")
        return labels

    @field_validator("image_spec", mode="before")
    @classmethod
    def _spec_from_text(cls, value: object) -> object:
        # From --set or a config file: a preset's name, or a TOML file's path.
        if isinstance(value, str):
            if value in PRESETS:
                return {"preset": value}
            if not Path(value).is_file():
                raise ValueError(
                    f"{value!r} is neither a preset ({', '.join(PRESETS)}) "
                    "nor an image spec TOML file"
                )
            return ImageSpec.from_toml(value)
        return value

    @model_validator(mode="after")
    def _one_image(self) -> DockerConfig:
        if self.image is not None and self.image_spec is not None:
            raise ValueError("give either image (your own) or image_spec (built here), not both")
        return self

    @property
    def spec(self) -> ImageSpec:
        """The spec of the image built here (the default when none is given)."""
        return self.image_spec if self.image_spec is not None else ImageSpec()

    @property
    def ip_allowed(self) -> bool:
        """``loopback_ip``, or where it is None, whether the runtime is gVisor."""
        return is_gvisor(self.runtime) if self.loopback_ip is None else self.loopback_ip

    @property
    def preload_modules(self) -> tuple[str, ...]:
        """The modules actually preloaded (``preload``, or the policy's default)."""
        if self.preload is not None:
            return self.preload
        return self.spec.preload_modules if self.policy == "reuse" else ()

    @field_validator("preload")
    @classmethod
    def _preload_are_module_names(cls, modules: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for module in modules or ():
            if not all(part.isidentifier() for part in module.split(".")):
                raise ValueError(f"preload entry {module!r} is not a module name")
        return modules

    def build(self) -> Backend:
        from retool_exec.backends.docker.backend import DockerBackend

        return DockerBackend(self)


class RayConfig(DockerConfig):
    """Docker containers on every node of a Ray cluster: one Sandbox over a fleet of hosts.

    Every Docker setting above applies to each node's own pool (``pool_size`` is
    the calls one node runs at once); the fields below say where the fleet is
    and how calls move in it. See docs/scaling.md for every decision's reason.
    """

    kind: Literal["ray"] = "ray"  # type: ignore[assignment]  # a DockerConfig per node, plus the fleet
    address: str | None = None
    """The Ray cluster. None or ``"auto"``: join the one this process is already in (the
    training job's ``ray.init``, ``RAY_ADDRESS``, or a ``ray start`` on this host); no
    cluster is an error, never a new cluster started behind the job's back. ``"local"``:
    start a private single-node Ray here (a laptop). Anything else: ``ray.init(address)``."""
    node_resource: str | None = None
    """Only nodes offering this custom Ray resource run sandboxes (mark Docker hosts with
    ``ray start --resources='{"docker": 1}'``); None: every alive node."""
    max_in_flight: int = Field(default=256, ge=1, le=65536)
    """Calls this driver keeps in the fleet at once (the capacity a Sandbox sees). The fleet's
    own capacity changes as nodes come and go; calls beyond its free slots wait in the router."""
    rerun_budget: float = Field(default=30.0, ge=0)
    """A call whose node was lost is run again on another node if it has taken at most this
    many seconds so far; else it ends as a ``sandbox_error``. 0: never run a call twice."""
    node_wait: float = Field(default=60.0, gt=0)
    """Seconds a call waits while no node at all can take it before it is a ``sandbox_error``."""
    refresh_interval: float = Field(default=1.0, gt=0, le=60)
    """Seconds between looks at Ray's node table (nodes joining and leaving)."""

    def build(self) -> Backend:
        from retool_exec.backends.ray.backend import RayBackend

        return RayBackend(self)


AnyBackendConfig = Annotated[
    LocalConfig | DockerConfig | FakeConfig | RayConfig, Field(discriminator="kind")
]
"""Any built-in backend config, chosen by its ``kind`` field when parsed from data."""
