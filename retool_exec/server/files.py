"""Checking ``files`` and ``fetch_files`` before anything runs.

Files never touch the server's disk: their contents travel inside the program
sent to the sandbox, which writes them under its own fresh working directory
(see ``_inbox.py``). Here the server only refuses what it must not pass on:
paths that are absolute, climb out with ``..``, contain NUL or are empty;
contents that are not base64; and sizes past the configured caps. Each refusal
is a ``RequestRejected`` that the app turns into HTTP 4xx with the reason.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from retool_exec.server.settings import ServerSettings

__all__ = ["FileSpec", "RequestRejected", "check_files", "normalize_path"]

_MAX_PATH_CHARS = 1024
_MAX_COMPONENT_CHARS = 255


class RequestRejected(ValueError):
    """The request cannot be served as given; ``status`` is the HTTP status to answer."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class FileSpec:
    """Validated file traffic for one request, ready to embed in the sandbox program."""

    uploads: dict[str, str]
    """Normalized relative path → base64 content."""
    fetch: list[tuple[str, str]]
    """(path as the client wrote it, normalized relative path), in request order."""

    @property
    def empty(self) -> bool:
        """Whether the request moves no files at all."""
        return not self.uploads and not self.fetch


def normalize_path(path: object) -> str:
    """The confined relative form of a client's path, or ``RequestRejected``.

    ``./a//b.txt`` becomes ``a/b.txt``; absolute paths, ``..``, NUL, and paths
    that name the working directory itself are refused.
    """
    if not isinstance(path, str):
        raise RequestRejected(f"file path {path!r} is not a string", status=422)
    shown = repr(path[:80])
    if not path:
        raise RequestRejected("file path is empty", status=422)
    if len(path) > _MAX_PATH_CHARS:
        raise RequestRejected(f"file path {shown} is longer than {_MAX_PATH_CHARS} characters")
    if "\x00" in path:
        raise RequestRejected(f"file path {shown} contains a NUL character")
    if path.startswith("/"):
        raise RequestRejected(f"file path {shown} is absolute; paths are relative to the sandbox")
    parts = [part for part in path.split("/") if part not in {"", "."}]
    if ".." in parts:
        raise RequestRejected(f"file path {shown} contains '..'; paths must stay inside")
    if not parts:
        raise RequestRejected(f"file path {shown} names the working directory, not a file")
    for part in parts:
        if len(part.encode("utf-8", "surrogatepass")) > _MAX_COMPONENT_CHARS:
            raise RequestRejected(f"file path {shown} has a component longer than 255 bytes")
    return "/".join(parts)


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
    uploads: dict[str, str] = {}
    total = 0
    for path, given in files.items():
        normalized = normalize_path(path)
        if given is None:  # SandboxFusion skips entries without content
            continue
        content = "".join(given.split())  # wrapped base64 (``base64 -w76``) is fine
        size = _decoded_size(path, content)
        if size > settings.max_file_bytes:
            raise RequestRejected(
                f"file {path[:80]!r} is {size} bytes; the limit is {settings.max_file_bytes}",
                status=413,
            )
        total += size
        if total > settings.max_files_total_bytes:
            raise RequestRejected(
                f"files total more than {settings.max_files_total_bytes} bytes", status=413
            )
        if normalized in uploads:
            raise RequestRejected(f"file path {path[:80]!r} is given twice")
        uploads[normalized] = content
    for normalized in uploads:
        parent = normalized.rpartition("/")[0]
        while parent:
            if parent in uploads:
                raise RequestRejected(f"file path {parent!r} is both a file and a directory")
            parent = parent.rpartition("/")[0]
    fetch = [(path, normalize_path(path)) for path in fetch_files]
    return FileSpec(uploads=uploads, fetch=fetch)


def _decoded_size(path: str, content: str) -> int:
    try:
        data = base64.b64decode(content.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error) as exc:
        raise RequestRejected(f"file {path[:80]!r}: content is not valid base64 ({exc})") from exc
    return len(data)
