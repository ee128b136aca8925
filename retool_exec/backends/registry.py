"""Backends by name: the one table every surface reads.

``Sandbox(backend="docker-runsc")``, ``retool-exec run/serve/bench/audit/doctor
--backend NAME``, the test suite's backend ids and the README's backend list
all come from :data:`BUILTIN_BACKENDS` (plus what is registered at run time).
A name stands for a config class, the settings it presets on top of that
class's defaults, a one-line description and what to install.

Third-party packages register a config class in the ``retool_exec.backends``
entry-point group (``name = "package.module:MyConfig"``); the class must
subclass ``BackendConfigBase`` and implement ``build()``.

This module imports only the config models; a backend's own module is
imported by its config's ``build()``, when a backend is actually made.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Any

from pydantic import ValidationError

from retool_exec._errors import BackendNotFoundError, ConfigError
from retool_exec.backends.base import Backend
from retool_exec.backends.config import (
    BackendConfigBase,
    DockerConfig,
    FakeConfig,
    LocalConfig,
    RayConfig,
)

__all__ = [
    "BUILTIN_BACKENDS",
    "ENTRY_POINT_GROUP",
    "BackendSpec",
    "available_backends",
    "backend_config",
    "backend_spec",
    "backend_specs",
    "canonical_names",
    "describe_validation_error",
    "register_backend",
    "resolve_backend",
]

ENTRY_POINT_GROUP = "retool_exec.backends"


def _frozen(mapping: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """One backend name: its config class, the settings it presets, and what it needs."""

    name: str
    config_class: type[BackendConfigBase]
    description: str
    """One line: what runs where."""
    install: str
    """What must be on the machine for it to start."""
    preset: Mapping[str, Any] = field(default_factory=lambda: _frozen(None))
    """Settings this name sets on top of the config class's defaults."""
    isolating: bool = False
    """Meant to contain untrusted code (the security audit fails it on any exposure)."""
    alias_of: str | None = None
    """Another name for the same configuration (``docker`` is ``docker-reuse``)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "preset", _frozen(self.preset))

    @property
    def settings(self) -> frozenset[str]:
        """Every setting (config field) this backend accepts."""
        return frozenset(self.config_class.model_fields) - {"kind"}

    def accepts(self, key: str) -> bool:
        """Whether ``key`` is one of this backend's settings."""
        return key in self.settings

    def config(
        self,
        settings: Mapping[str, Any] | None = None,
        *,
        sources: Mapping[str, str] | None = None,
    ) -> BackendConfigBase:
        """The config: the class's defaults, then the preset, then ``settings``.

        Raises ``ConfigError`` naming the offending setting (and, from
        ``sources``, where it came from), with pydantic's error as its cause.
        """
        data = {**self.preset, **(settings or {})}
        try:
            return self.config_class.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(describe_validation_error(exc, self, sources)) from exc


_DOCKER_INSTALL = (
    "Docker (`make docker-up` installs and starts it on Debian); the sandbox image is "
    "built on first use (or `retool-exec image build`)"
)

BUILTIN_BACKENDS: tuple[BackendSpec, ...] = (
    BackendSpec(
        "local",
        LocalConfig,
        "a fresh python subprocess on this machine, as the seed does: NOT isolated",
        "nothing",
    ),
    BackendSpec(
        "docker",
        DockerConfig,
        "hardened warm containers with the default policy (reuse)",
        _DOCKER_INSTALL,
        isolating=True,
        alias_of="docker-reuse",
    ),
    BackendSpec(
        "docker-reuse",
        DockerConfig,
        "hardened containers, each serving many calls with a verified reset between them",
        _DOCKER_INSTALL,
        preset={"policy": "reuse"},
        isolating=True,
    ),
    BackendSpec(
        "docker-fresh",
        DockerConfig,
        "hardened containers, a new one for every call",
        _DOCKER_INSTALL,
        preset={"policy": "fresh"},
        isolating=True,
    ),
    BackendSpec(
        "docker-runsc",
        DockerConfig,
        "docker-reuse under gVisor: the code talks to gVisor's kernel, not the host's",
        "Docker with gVisor's runsc registered as the runtime `runsc` "
        "(`make docker-up` does both on Debian); the sandbox image as for docker",
        preset={"policy": "reuse", "runtime": "runsc"},
        isolating=True,
    ),
    BackendSpec(
        "ray",
        RayConfig,
        "docker-reuse pools on every node of a Ray cluster; each call goes to the least-loaded "
        "node and is run again elsewhere if its node is lost",
        "Ray (`pip install 'retool_exec[ray]'`) and a running cluster to join; on each node, "
        "Docker and the sandbox image as for docker (see docs/scaling.md)",
        preset={"policy": "reuse"},
        isolating=True,
    ),
    BackendSpec(
        "fake",
        FakeConfig,
        "runs nothing and answers with fixed values: for testing your own code",
        "nothing",
    ),
)
"""The built-in backend names, in the order help texts and docs list them."""

_lock = threading.Lock()
_registry: dict[str, BackendSpec] = {spec.name: spec for spec in BUILTIN_BACKENDS}


def _summary(config_class: type[BackendConfigBase]) -> str:
    lines = (config_class.__doc__ or "").strip().splitlines()
    return lines[0] if lines else config_class.__name__


def register_backend(
    name: str,
    config_class: type[BackendConfigBase],
    *,
    description: str | None = None,
    install: str = "",
    preset: Mapping[str, Any] | None = None,
    isolating: bool = False,
) -> None:
    """Make ``Sandbox(backend=name)`` (and ``--backend name``) build ``config_class``."""
    if not isinstance(config_class, type) or not issubclass(config_class, BackendConfigBase):
        raise ConfigError(f"{config_class!r} is not a BackendConfigBase subclass")
    spec = BackendSpec(
        name,
        config_class,
        description if description is not None else _summary(config_class),
        install,
        preset=_frozen(preset),
        isolating=isolating,
    )
    with _lock:
        _registry[name] = spec


def available_backends() -> list[str]:
    """Names usable as ``Sandbox(backend=...)``: built-ins, registered ones and entry points."""
    with _lock:
        names = set(_registry)
    names.update(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
    return sorted(names)


def backend_specs() -> list[BackendSpec]:
    """The built-in and registered backends (entry points not loaded yet are not listed)."""
    with _lock:
        return list(_registry.values())


def backend_spec(name: str) -> BackendSpec:
    """The table entry for ``name``; loads an entry point on first use."""
    with _lock:
        if name in _registry:
            return _registry[name]
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            try:
                loaded = ep.load()
            except ImportError as exc:
                raise BackendNotFoundError(
                    f"backend {name!r} is registered by {ep.value!r} but failed to import: "
                    f"{exc}; is the package that provides it installed completely?"
                ) from exc
            register_backend(name, loaded)
            with _lock:
                return _registry[name]
    raise BackendNotFoundError(
        f"no backend named {name!r}; available: {', '.join(available_backends())}. "
        f"Third-party backends register in the {ENTRY_POINT_GROUP!r} entry-point group."
    )


def backend_config(
    name: str,
    settings: Mapping[str, Any] | None = None,
    *,
    sources: Mapping[str, str] | None = None,
) -> BackendConfigBase:
    """The config ``name`` stands for, with ``settings`` on top (see ``BackendSpec.config``)."""
    return backend_spec(name).config(settings, sources=sources)


def _config_class(name: str) -> type[BackendConfigBase]:
    """Deprecated: the config class behind ``name`` (ignores its preset; use backend_config)."""
    return backend_spec(name).config_class


def describe_validation_error(
    exc: ValidationError, spec: BackendSpec, sources: Mapping[str, str] | None = None
) -> str:
    """pydantic's errors in the user's terms: each setting, its value's origin, the problem."""
    sources = sources or {}
    problems: list[str] = []
    for error in exc.errors():
        loc = error.get("loc") or ()
        key = str(loc[0]) if loc else ""
        where = f" (from {sources[key]})" if key in sources else ""
        dotted = ".".join(str(part) for part in loc) or "config"
        if error.get("type") == "extra_forbidden":
            problems.append(
                f"unknown setting {key!r}{where}; {spec.name} takes: "
                + ", ".join(sorted(spec.settings))
            )
        else:
            problems.append(f"setting {dotted}{where}: {error.get('msg', 'invalid')}")
    return f"backend {spec.name!r}: " + "; ".join(problems)


def canonical_names(names: Iterable[str]) -> list[str]:
    """``names`` with each alias replaced by its name (``docker`` -> ``docker-reuse``)."""
    return [backend_spec(name).alias_of or name for name in names]


def resolve_backend(
    spec: str | BackendConfigBase | Backend, *, timeout: float | None = None
) -> tuple[Backend, float]:
    """Turn a name, a config or a ready Backend into (backend, its default timeout)."""
    if isinstance(spec, Backend):
        config = getattr(spec, "config", None)
        default = config.timeout if isinstance(config, BackendConfigBase) else 30.0
        return spec, default if timeout is None else timeout
    if isinstance(spec, str):
        config = backend_config(spec, None if timeout is None else {"timeout": timeout})
    elif isinstance(spec, BackendConfigBase):
        config = spec
    else:
        raise ConfigError(
            f"backend must be a name, a backend config or a Backend, not {type(spec).__name__}"
        )
    return config.build(), config.timeout if timeout is None else timeout
