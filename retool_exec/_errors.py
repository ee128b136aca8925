"""Exceptions raised by retool_exec. User code failing is never one of these.

A call whose code fails, times out or is killed returns an ExecResult. These
exceptions are for the sandbox itself, raised *before* a call can run (bad
configuration, an unreachable Docker daemon, a missing image) or for misuse
of the API. During a call, a broken sandbox is reported in the result as
``Outcome.SANDBOX_ERROR`` instead, so one bad container never kills a batch.

    RetoolExecError
    ├── ConfigError (ValueError)           invalid or unknown backend configuration
    │   └── BackendNotFoundError (LookupError)
    ├── SandboxClosedError                 the Sandbox or Backend was closed
    └── BackendUnavailableError            the backend cannot start
        ├── DockerUnavailableError (ConnectionError)  daemon not reachable
        └── ImageError                     sandbox image missing or unbuildable
"""

from __future__ import annotations

__all__ = [
    "BackendNotFoundError",
    "BackendUnavailableError",
    "ConfigError",
    "DockerUnavailableError",
    "ImageError",
    "RetoolExecError",
    "SandboxClosedError",
]


class RetoolExecError(Exception):
    """Base class of every exception retool_exec raises on purpose."""


class ConfigError(RetoolExecError, ValueError):
    """A backend or sandbox configuration is invalid."""


class BackendNotFoundError(ConfigError, LookupError):
    """No backend is registered under the requested name."""


class SandboxClosedError(RetoolExecError, RuntimeError):
    """The sandbox was used after ``close()``."""


class SandboxForkedError(SandboxClosedError):
    """The sandbox was used in a child process after ``fork()``: build one in the child.

    Its event loop thread and its containers' streams belong to the parent;
    configs are plain pydantic data and pickle, so pass the config instead.
    """


class BackendUnavailableError(RetoolExecError, RuntimeError):
    """A backend could not start (its daemon, image or runtime is missing)."""


class DockerUnavailableError(BackendUnavailableError, ConnectionError):
    """The Docker daemon could not be reached."""


class ImageError(BackendUnavailableError):
    """The sandbox image is missing and could not be built."""
