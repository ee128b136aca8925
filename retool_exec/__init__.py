"""retool_exec: run untrusted, model-written Python for LLM tool use and RL training.

The seed's contract (``ExecResult``, ``format_tool_content``,
``SandboxStats.metrics()``, ``run_code``/``arun_code``) behind pluggable
backends: ``"local"`` (the seed's subprocess, NOT a security boundary) and
``"docker"`` (hardened, warm containers, optionally under gVisor).
"""

from retool_exec._autoprint import add_auto_print
from retool_exec._errors import (
    BackendNotFoundError,
    BackendUnavailableError,
    ConfigError,
    DockerUnavailableError,
    ImageError,
    RetoolExecError,
    SandboxClosedError,
    SandboxForkedError,
    SessionError,
    SessionLimitError,
    SessionLostError,
    SessionsUnsupportedError,
)
from retool_exec._formatting import (
    DEFAULT_MARKERS,
    DEFAULT_TIMEOUT,
    MAX_OUTPUT_CHARS,
    READ_CAP_BYTES,
    format_tool_content,
    sanitize_tool_content,
    truncate_tail,
)
from retool_exec._models import CellResult, ExecResult, Outcome
from retool_exec._sandbox import LocalPythonSandbox, Sandbox
from retool_exec._session import Session
from retool_exec._stats import SandboxStats
from retool_exec.backends.base import Backend, RunRequest, SessionHandle
from retool_exec.backends.config import (
    AnyBackendConfig,
    BackendConfigBase,
    DockerConfig,
    FakeConfig,
    LocalConfig,
    RayConfig,
)
from retool_exec.backends.docker.image_spec import ImageSpec
from retool_exec.backends.fake import FakeBackend
from retool_exec.backends.registry import available_backends, register_backend

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MARKERS",
    "DEFAULT_TIMEOUT",
    "MAX_OUTPUT_CHARS",
    "READ_CAP_BYTES",
    "AnyBackendConfig",
    "Backend",
    "BackendConfigBase",
    "BackendNotFoundError",
    "BackendUnavailableError",
    "CellResult",
    "ConfigError",
    "DockerConfig",
    "DockerUnavailableError",
    "ExecResult",
    "FakeBackend",
    "FakeConfig",
    "ImageError",
    "ImageSpec",
    "LocalConfig",
    "LocalPythonSandbox",
    "Outcome",
    "RayConfig",
    "RetoolExecError",
    "RunRequest",
    "Sandbox",
    "SandboxClosedError",
    "SandboxForkedError",
    "SandboxStats",
    "Session",
    "SessionError",
    "SessionHandle",
    "SessionLimitError",
    "SessionLostError",
    "SessionsUnsupportedError",
    "__version__",
    "add_auto_print",
    "available_backends",
    "format_tool_content",
    "register_backend",
    "sanitize_tool_content",
    "truncate_tail",
]
