"""The server's limits and switches, in one validated model.

Every limit a client can ask for (``run_timeout``, ``memory_limit_MB``) is
clamped to a maximum here, so a client cannot book the server for an hour or
ask for more memory than the operator allows. Sizes are bounded before any
work is done: the body, each uploaded file, all files together, and what
``fetch_files`` may bring back.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from retool_exec.backends.docker.agent import wire

__all__ = ["DEFAULT_SANDBOX_TAIL_CHARS", "ServerSettings", "normalize_prefix"]

DEFAULT_SANDBOX_TAIL_CHARS = 1 << 20
"""Characters of each stream a sandbox the server builds keeps: 1 MiB, so reward code that
compares stdout sees whole answers, as with SandboxFusion (which returns streams whole)."""
"""Characters of each stream (and of each notebook cell's) a server-built
sandbox keeps; responses are cut to ``output_chars`` (cells to their share of
``jupyter_output_chars``) from that tail."""


def normalize_prefix(prefix: str) -> str:
    """``"faas/sandbox/"`` → ``"/faas/sandbox"``; ``""`` and ``"/"`` → ``""``."""
    cleaned = "/" + prefix.strip().strip("/")
    return "" if cleaned == "/" else cleaned


class ServerSettings(BaseModel):
    """How the SandboxFusion-compatible server admits, limits and answers requests."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_concurrency: int | None = Field(default=None, ge=1, le=4096)
    """Requests running at once; None: as many as the sandbox runs at once (its
    ``concurrency``: ``max_workers``, or a Docker pool's ``pool_size`` if smaller),
    which is also the most this may be (a larger value is lowered, with a warning)."""
    max_queue: int = Field(default=256, ge=0, le=1 << 20)
    """Requests that may wait for a slot; one more is refused at once with HTTP 504."""
    queue_timeout: float | None = Field(default=30.0, gt=0)
    """The most seconds any request waits for a slot before it is refused with HTTP
    504 (clients such as verl retry on 504); None: no cap. A ``/run_code`` request
    waits less when its own timeouts say so: at most its ``compile_timeout``, the
    part of its ``run_timeout`` clamped away and half the time it runs for
    (``SandboxService.free_wait``), so its answer reaches the client before its
    read timeout."""
    header_timeout: float = Field(default=5.0, gt=0, le=300)
    """Seconds a connection has to send a request's headers (from when it opened, or
    from the first byte of a later request on it); past that it gets 408 and is
    closed before the app or the token check sees anything (``connections.py``).
    Applies when served through ``uvicorn_config`` (as ``retool-exec serve`` does)."""
    body_timeout: float = Field(default=30.0, gt=0, le=3600)
    """Seconds a request's body has to arrive once its headers are in; past that the
    connection gets 408 and is closed (``connections.py``). Applies when served through
    ``uvicorn_config``."""
    send_timeout: float = Field(default=30.0, gt=0, le=3600)
    """Seconds an answer the client holds back (anything of it buffered) may go without
    shrinking; past that the connection is dropped with what it holds
    (``connections.py``). Applies when served through ``uvicorn_config``."""
    max_connections: int | None = Field(default=1024, ge=1)
    """Most connections open at once; a new one past it gets 504 and is closed at once.
    Keep it above ``max_concurrency + max_queue``, or clients get closed connections
    where they would have got a place in the queue. None: no bound. Each connection
    holds a file descriptor: ``retool-exec serve`` fits this bound to its
    ``RLIMIT_NOFILE`` beside a reserve for the backend (``descriptors.py``); an app
    served otherwise keeps it as given."""
    token: SecretStr | None = None
    """When set, every endpoint except ``/v1/ping`` needs ``Authorization: Bearer
    <token>`` (or HTTP Basic auth with the token as the password)."""
    prefix: str = ""
    """Path prefix the API is served under as well as at the root (e.g. ``/faas/sandbox``)."""
    loopback_only: bool = False
    """Refuse a request whose ``Host`` is not loopback (DNS rebinding); ``retool-exec
    serve`` sets it when it listens on a loopback address. A request with a foreign
    ``Origin`` (a web page) is refused always (``guards.BrowserGuardMiddleware``)."""
    default_run_timeout: float = Field(default=10.0, gt=0)
    """Seconds for a request that does not say (SandboxFusion's default)."""
    max_run_timeout: float = Field(default=120.0, gt=0, le=24 * 3600)
    """Upper bound on ``run_timeout`` / ``total_timeout``; larger requests are clamped."""
    max_memory_mb: int | None = Field(default=None, ge=16)
    """Upper bound on ``memory_limit_MB`` (also used when a request gives none);
    None leaves it to the backend (the container's own limit stays the hard cap)."""
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    """Largest request body; larger ones get HTTP 413 before they are parsed."""
    max_files: int = Field(default=64, ge=0)
    """Most entries in ``files`` and in ``fetch_files``, each."""
    max_file_bytes: int = Field(default=1024 * 1024, ge=0)
    """Largest decoded file in ``files``."""
    max_files_total_bytes: int = Field(default=4 * 1024 * 1024, ge=0)
    """Largest total of decoded ``files``."""
    max_fetch_bytes: int = Field(default=4 * 1024 * 1024, ge=0, le=wire.MAX_FETCH_BYTES)
    """Most bytes ``fetch_files`` returns per request, all files together (files past
    it are left out and named in ``message``). The backend reads them back itself,
    outside the code's process, and no more than this (``RunRequest.fetch_budget``; at
    most ``wire.MAX_FETCH_BYTES``, 32 MiB)."""
    output_chars: int = Field(default=1 << 20, ge=0, le=1 << 20)
    """Characters of stdout/stderr returned by ``/run_code`` (default 1 MiB, whole for any
    ordinary answer). Past it the *tail* is kept, with the seed's ``[... truncated N
    chars ...]`` marker in front. Independent of the 4096-character tail that
    ``format_tool_content`` shows a model."""
    max_cells: int = Field(default=128, ge=1)
    """Most cells in one ``/run_jupyter`` request."""
    jupyter_output_chars: int = Field(default=4096, ge=256)
    """Output budget shared by a notebook's cells: each cell keeps the tail of its
    stdout, stderr, display and traceback up to ``max(128, this // cells)`` chars each."""
    sandbox_output_chars: int = Field(default=DEFAULT_SANDBOX_TAIL_CHARS, ge=1024, le=1 << 20)
    """``max_output_chars`` given to a sandbox the server builds from a config."""
    max_sessions_per_client: int = Field(default=16, ge=0, le=1 << 16)
    """Sessions (``POST /sessions``, forks included) one client may hold open at once; one
    more is refused with HTTP 429. The client is the token it sent when the server has one
    (so every holder of the one token is one client), else its IP address. 0 turns the
    session endpoints off (403). The sandbox's own ``max_sessions`` bounds all clients
    together (HTTP 503), and its ``session_ttl`` closes idle sessions."""

    @field_validator("prefix")
    @classmethod
    def _prefix_is_a_path(cls, prefix: str) -> str:
        cleaned = normalize_prefix(prefix)
        if any(part in {".", ".."} for part in cleaned.split("/")) or "?" in cleaned:
            raise ValueError(f"prefix {prefix!r} is not a plain path")
        return cleaned
