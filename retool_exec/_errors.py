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
    │   └── SandboxForkedError             used in a child process after fork()
    ├── SessionError (RuntimeError)        a stateful session cannot be used
    │   ├── SessionLostError               its interpreter ended (killed, OOM, exit, TTL)
    │   ├── SessionLimitError              the Sandbox's session cap is reached
    │   └── SessionsUnsupportedError       the backend has no sessions
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
    "SandboxForkedError",
    "SessionError",
    "SessionLimitError",
    "SessionLostError",
    "SessionsUnsupportedError",
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


class SessionError(RetoolExecError, RuntimeError):
    """A stateful session (``Sandbox.session()``) cannot be used."""


class SessionLostError(SessionError):
    """The session's interpreter is gone (killed after a timeout, OOM, exited, container
    lost, idle past its TTL, or closed); its state is lost. Never silently replaced."""


class SessionLimitError(SessionError):
    """The Sandbox already holds its ``max_sessions`` open sessions."""


class SessionsUnsupportedError(SessionError):
    """The backend cannot keep an interpreter between calls."""


class BackendUnavailableError(RetoolExecError, RuntimeError):
    """A backend could not start (its daemon, image or runtime is missing)."""


class DockerUnavailableError(BackendUnavailableError, ConnectionError):
    """The Docker daemon could not be reached."""


class ImageError(BackendUnavailableError):
    """The sandbox image is missing and could not be built."""
