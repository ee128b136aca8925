"""Backends by name: the built-ins plus any installed through an entry point.

Third-party packages register a config class in the ``retool_exec.backends``
entry-point group (``name = "package.module:MyConfig"``); the class must
subclass ``BackendConfigBase`` and implement ``build()``.
"""

from __future__ import annotations

import threading
from importlib.metadata import entry_points

from retool_exec._errors import BackendNotFoundError, ConfigError
from retool_exec.backends.base import Backend
from retool_exec.backends.config import BackendConfigBase, DockerConfig, FakeConfig, LocalConfig

__all__ = ["ENTRY_POINT_GROUP", "available_backends", "register_backend", "resolve_backend"]

ENTRY_POINT_GROUP = "retool_exec.backends"

_lock = threading.Lock()
_registry: dict[str, type[BackendConfigBase]] = {
    "local": LocalConfig,
    "docker": DockerConfig,
    "fake": FakeConfig,
}


def register_backend(name: str, config_class: type[BackendConfigBase]) -> None:
    """Make ``Sandbox(backend=name)`` build ``config_class()``."""
    if not isinstance(config_class, type) or not issubclass(config_class, BackendConfigBase):
        raise ConfigError(f"{config_class!r} is not a BackendConfigBase subclass")
    with _lock:
        _registry[name] = config_class


def available_backends() -> list[str]:
    """Names usable as ``Sandbox(backend=...)``: built-ins and entry points."""
    with _lock:
        names = set(_registry)
    names.update(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
    return sorted(names)


def _config_class(name: str) -> type[BackendConfigBase]:
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
            return loaded  # type: ignore[no-any-return]
    raise BackendNotFoundError(
        f"no backend named {name!r}; available: {', '.join(available_backends())}. "
        f"Third-party backends register in the {ENTRY_POINT_GROUP!r} entry-point group."
    )


def resolve_backend(
    spec: str | BackendConfigBase | Backend, *, timeout: float | None = None
) -> tuple[Backend, float]:
    """Turn a name, a config or a ready Backend into (backend, its default timeout)."""
    if isinstance(spec, Backend):
        config = getattr(spec, "config", None)
        default = config.timeout if isinstance(config, BackendConfigBase) else 30.0
        return spec, default if timeout is None else timeout
    if isinstance(spec, str):
        config_class = _config_class(spec)
        config = config_class() if timeout is None else config_class(timeout=timeout)
    elif isinstance(spec, BackendConfigBase):
        config = spec
    else:
        raise ConfigError(
            f"backend must be a name, a backend config or a Backend, not {type(spec).__name__}"
        )
    return config.build(), config.timeout if timeout is None else timeout
