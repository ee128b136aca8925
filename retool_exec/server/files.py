"""Checking ``files`` and ``fetch_files`` before anything runs, and the files coming back.

Files never touch the server's disk: the server decodes them and hands them to
the backend in the ``RunRequest``, and the backend writes them into the
call's fresh working directory before the code starts and reads the fetched
ones back after it ended, outside the code's process (so nothing the code
prints can add, change or hide a file). Here the server only refuses what it
must not pass on: paths that are absolute, climb out with ``..``, contain a
control character or are empty; contents that are not base64; and sizes past
the configured caps. Each refusal is a ``RequestRejected`` that the app turns
into HTTP 4xx with the reason.

As SandboxFusion does, an entry of ``files`` whose content is null or whose
name contains ``IGNORE_THIS_FILE`` is skipped, not written (its path is not
checked either).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from retool_exec._models import ExecResult, not_returned
from retool_exec.backends.docker.agent import wire
from retool_exec.server.settings import ServerSettings

__all__ = [
    "IGNORED_MARKER",
    "FileSpec",
    "RequestRejected",
    "check_files",
    "fetched_files",
    "normalize_path",
]

IGNORED_MARKER = "IGNORE_THIS_FILE"
"""An upload whose name contains this is skipped (SandboxFusion's convention)."""


class RequestRejected(ValueError):
    """The request cannot be served as given; ``status`` is the HTTP status to answer
    (``headers`` go with it, e.g. ``Retry-After``)."""

    def __init__(
        self, message: str, *, status: int = 400, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


@dataclass(frozen=True, slots=True)
class FileSpec:
    """Validated file traffic for one request, ready for a ``RunRequest``."""

    uploads: dict[str, bytes]
    """Normalized relative path → decoded content."""
    fetch: list[tuple[str, str]]
    """(path as the client wrote it, normalized relative path), in request order."""

    @property
    def fetch_paths(self) -> tuple[str, ...]:
        """The normalized paths to fetch, each once, in request order."""
        return tuple(dict.fromkeys(path for _, path in self.fetch))


def normalize_path(path: object) -> str:
    """The confined relative form of a client's path, or ``RequestRejected``.

    ``./a//b.txt`` becomes ``a/b.txt`` and ``/tmp/a.txt`` (absolute inside the
    working directory) ``a.txt``; other absolute paths, ``..``, control
    characters, and paths that name the working directory itself are refused
    (``wire.check_relative_path``, the rule every backend applies).
    """
    if not isinstance(path, str):
        raise RequestRejected(f"file path {path!r} is not a string", status=422)
    if not path:
        raise RequestRejected("file path is empty")  # 400, as docs/server.md lists it
    given = path
    if path.startswith(wire.WORKDIR + "/"):
        # Absolute inside the sandbox's working directory (where a call starts): as
        # SandboxFusion writes absolute paths where the code can read them by that name.
        path = path[len(wire.WORKDIR) + 1 :]
    try:
        return wire.check_relative_path(path)
    except ValueError as exc:
        reason = str(exc)
        if given != path:  # name what the client sent, not what was left of it
            reason = f"file path {given[:80]!r}: {reason}"
        elif path.startswith("/"):
            reason = (
                f"file path {path[:80]!r} is absolute outside {wire.WORKDIR}/; give it "
                f"relative to the sandbox's working directory, or under {wire.WORKDIR}/"
            )
        raise RequestRejected(reason) from exc


def check_files(
    files: Mapping[str, str | None], fetch_files: Sequence[str], settings: ServerSettings
) -> FileSpec:
    """Validate a request's files against the settings; raise ``RequestRejected`` if not."""
    if len(files) > settings.max_files:
        raise RequestRejected(
            f"{len(files)} files given; the server accepts at most {settings.max_files}", status=413
        )
    if len(fetch_files) > settings.max_files:
        raise RequestRejected(
            f"{len(fetch_files)} fetch_files given; the server returns at most "
            f"{settings.max_files}",
            status=413,
        )
    uploads: dict[str, bytes] = {}
    total = 0
    for path, given in files.items():
        if given is None or IGNORED_MARKER in path:  # skipped, as SandboxFusion does
            continue
        normalized = normalize_path(path)
        data = _decode(path, "".join(given.split()))  # wrapped base64 (``base64 -w76``) is fine
        if len(data) > settings.max_file_bytes:
            raise RequestRejected(
                f"file {path[:80]!r} is {len(data)} bytes; the limit is {settings.max_file_bytes}",
                status=413,
            )
        total += len(data)
        if total > settings.max_files_total_bytes:
            raise RequestRejected(
                f"files total more than {settings.max_files_total_bytes} bytes", status=413
            )
        if normalized in uploads:
            raise RequestRejected(f"file path {path[:80]!r} is given twice")
        uploads[normalized] = data
    for normalized in uploads:
        parent = normalized.rpartition("/")[0]
        while parent:
            if parent in uploads:
                raise RequestRejected(f"file path {parent!r} is both a file and a directory")
            parent = parent.rpartition("/")[0]
    fetch = [(path, normalize_path(path)) for path in fetch_files]
    return FileSpec(uploads=uploads, fetch=fetch)


def fetched_files(result: ExecResult, spec: FileSpec, budget: int) -> tuple[dict[str, str], str]:
    """The fetched files (client name → base64) within ``budget`` bytes, and a note on the rest.

    Everything comes from the backend's own read-back (``ExecResult.files`` and
    ``fetch_errors``), never from what the code printed. A file that is missing
    or refused is left out of the answer and named in the note, as is one past
    the budget.
    """
    files: dict[str, str] = {}
    problems: list[str] = []
    for name, path in dict.fromkeys(spec.fetch):  # a name asked twice is answered once
        data = result.files.get(path)
        if data is None:
            reason = result.fetch_errors.get(path) or not_returned(result)
            problems.append(f"{name}: {reason}")
        elif len(data) > budget:
            problems.append(f"{name}: {len(data)} bytes; {budget} bytes of fetch budget left")
        else:
            budget -= len(data)
            files[name] = base64.b64encode(data).decode("ascii")
    return files, ("fetch_files: " + "; ".join(problems)) if problems else ""


def _decode(path: str, content: str) -> bytes:
    try:
        return base64.b64decode(content.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error) as exc:
        raise RequestRejected(f"file {path[:80]!r}: content is not valid base64 ({exc})") from exc
