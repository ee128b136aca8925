"""Runs INSIDE the sandbox, around the user's code: files in, stdin, files out, cells.

The server never imports this module. ``programs.py`` embeds its source text in
the program it sends to the sandbox, where it is executed in a private
namespace, so none of these names appear in the user's ``__main__``. It uses
only the standard library and must run on the sandbox image's Python (3.11).

Everything it reports travels back on stdout as delimited JSON records
(``<<retool-exec:NONCE>>{...}<<end:NONCE>>``), written after the user's code
(or after each cell). The backends keep the *tail* of stdout, so the records,
being last, survive an output flood that comes before them.

File access is confined to a fresh working directory: every path component is
opened relative to its parent's descriptor with ``O_NOFOLLOW``, so a symbolic
link planted by the code is never followed, and files are opened
``O_NONBLOCK`` and checked to be regular, so a FIFO cannot stall the read.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from typing import Any

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def run(spec: dict[str, Any], main: dict[str, Any]) -> None:
    """Run ``spec["code"]`` in ``main`` with the request's stdin and files."""
    _set_stdin(spec.get("stdin"))
    workdir = _setup(spec)
    try:
        _exec_user(spec["code"], main)
    finally:
        _finish(spec, workdir)


def run_cells(spec: dict[str, Any], main: dict[str, Any]) -> None:
    """Run notebook cells in order in one namespace, one record per cell."""
    workdir = _setup(spec)
    try:
        for index, cell in enumerate(spec["cells"]):
            result = _run_cell(index, cell, main, float(spec["cell_timeout"]), spec["cell_chars"])
            _emit(spec["marker"], {"kind": "cell", "index": index, **result})
    finally:
        _finish(spec, workdir)


# -- stdin and the user's code ----------------------------------------------


def _set_stdin(text: str | None) -> None:
    if text is None:
        return
    data = text.encode("utf-8", "surrogateescape")
    sys.stdin = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")


def _exec_user(source: str, main: dict[str, Any]) -> None:
    """Like the backends' own runner: ``<sandbox>`` tracebacks, exit status 1 on error."""
    try:
        exec(compile(source, "<sandbox>", "exec"), main)  # noqa: S102 - this module's job
    except SystemExit:
        raise
    except BaseException as exc:
        tb = exc.__traceback__
        tb = tb.tb_next if tb is not None else None  # start at the user's code
        exc.__traceback__ = tb
        with contextlib.suppress(BaseException):
            sys.excepthook(type(exc), exc, tb)
        raise SystemExit(1) from None


# -- notebook cells ---------------------------------------------------------------


class _Tail(io.TextIOBase):
    """A text stream that keeps only the last ``limit`` characters written to it."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self._limit = limit
        self._text = ""
        self.dropped = 0

    @property
    def encoding(self) -> str:  # type: ignore[override]  # read-only, as on a real stream
        return "utf-8"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self._text += text
        if len(self._text) > 2 * self._limit:
            cut = len(self._text) - self._limit
            self.dropped += cut
            self._text = self._text[cut:]
        return len(text)

    def getvalue(self) -> str:
        return _cut(self._text, self._limit, self.dropped)


def _cut(text: str, limit: int, dropped: int = 0) -> str:
    """The seed's tail rule: the last ``limit`` characters, prefixed by what was cut."""
    if len(text) > limit:
        dropped += len(text) - limit
        text = text[-limit:] if limit > 0 else ""
    return f"[... truncated {dropped} chars ...]\n{text}" if dropped else text


class _CellTimeout(Exception):
    pass


def _run_cell(index: int, source: str, main: dict[str, Any], timeout: float, chars: int) -> Any:
    import ast
    import signal
    import traceback

    filename = f"<cell {index + 1}>"
    out, err = _Tail(chars), _Tail(chars)
    display: list[dict[str, str]] = []
    errors: list[dict[str, Any]] = []
    saved = sys.stdout, sys.stderr

    def expired(_signum: int, _frame: object) -> None:
        raise _CellTimeout(f"the cell ran longer than its {timeout:g} s limit")

    alarm = timeout > 0 and hasattr(signal, "setitimer")
    try:
        if alarm:
            signal.signal(signal.SIGALRM, expired)
            signal.setitimer(signal.ITIMER_REAL, timeout)
        sys.stdout, sys.stderr = out, err
        tree = ast.parse(source, filename)
        last = tree.body[-1] if tree.body else None
        if isinstance(last, ast.Expr):
            tree.body.pop()
        exec(compile(tree, filename, "exec"), main)  # noqa: S102 - this module's job
        if isinstance(last, ast.Expr):
            expression = ast.Expression(last.value)
            value = eval(compile(expression, filename, "eval"), main)  # noqa: S307
            if value is not None:
                display.append({"text/plain": _cut(repr(value), chars)})
    except BaseException as exc:
        tb = exc.__traceback__
        tb = tb.tb_next if tb is not None else None
        name = "TimeoutError" if isinstance(exc, _CellTimeout) else type(exc).__name__
        lines = traceback.format_exception(type(exc), exc, tb)
        errors.append(
            {
                "ename": name,
                "evalue": _cut(str(exc), chars),
                "traceback": [_cut("".join(lines), chars)],
            }
        )
    finally:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
        sys.stdout, sys.stderr = saved
    return {"stdout": out.getvalue(), "stderr": err.getvalue(), "display": display, "error": errors}


# -- files --------------------------------------------------------------------------


def _setup(spec: dict[str, Any]) -> str | None:
    """The working directory for a request that moves files (None if it moves none)."""
    if not spec["files"] and not spec["fetch"]:
        return None
    try:
        return _prepare_workdir(spec["files"])
    except OSError as exc:
        record = {"kind": "setup_error", "error": f"could not write the request's files: {exc}"}
        _emit(spec["marker"], record)
        raise SystemExit(70) from None


def _prepare_workdir(files: dict[str, str]) -> str:
    """A fresh working directory holding the request's files; the code runs in it."""
    import base64
    import shutil
    import tempfile

    workdir = tempfile.mkdtemp(prefix="sandbox-")
    try:
        root = os.open(workdir, _DIR_FLAGS)
        try:
            for path, content in files.items():
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
                fd = _open_beneath(root, path, flags, create=True)
                with os.fdopen(fd, "wb") as handle:
                    handle.write(base64.b64decode(content))
        finally:
            os.close(root)
        os.chdir(workdir)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return workdir


def _open_beneath(root: int, path: str, flags: int, *, create: bool = False) -> int:
    """Open ``path`` under the directory ``root`` without following any symbolic link."""
    parts = path.split("/")
    fd = os.dup(root)
    try:
        for part in parts[:-1]:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=fd)
    finally:
        os.close(fd)


def _fetch(workdir: str, wanted: list[list[str]], budget: int) -> dict[str, Any]:
    import base64

    files: dict[str, str] = {}
    errors: dict[str, str] = {}
    try:
        root = os.open(workdir, _DIR_FLAGS)
    except OSError as exc:
        gone = f"the working directory is gone ({exc.strerror})"
        return {"files": {}, "errors": {name: gone for name, _ in wanted}}
    try:
        for name, path in wanted:
            data = _read_one(root, path, budget)
            if isinstance(data, str):
                errors[name] = data
                continue
            budget -= len(data)
            files[name] = base64.b64encode(data).decode("ascii")
    finally:
        os.close(root)
    return {"files": files, "errors": errors}


def _read_one(root: int, path: str, budget: int) -> bytes | str:
    """The file's bytes, or why they cannot be returned."""
    import errno
    import stat

    try:
        fd = _open_beneath(root, path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return "not found"
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            return "a symbolic link or non-directory is in the way; not followed"
        return f"cannot open: {exc.strerror}"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return "not a regular file"
        if info.st_size > budget:
            return f"{info.st_size} bytes; {budget} bytes of fetch budget left"
        chunks: list[bytes] = []
        size = 0
        while size <= budget:
            chunk = os.read(fd, min(1 << 20, budget + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > budget:
            return f"more than the {budget} bytes of fetch budget left"
        return b"".join(chunks)
    except OSError as exc:
        return f"cannot read: {exc.strerror}"
    finally:
        os.close(fd)


def _finish(spec: dict[str, Any], workdir: str | None) -> None:
    if workdir is None:
        return
    import shutil

    try:
        if spec["fetch"]:
            record = _fetch(workdir, spec["fetch"], int(spec["fetch_budget"]))
            _emit(spec["marker"], {"kind": "files", **record})
    finally:
        with contextlib.suppress(OSError):
            os.chdir("/")
        shutil.rmtree(workdir, ignore_errors=True)


# -- the channel back ---------------------------------------------------------------


def _emit(marker: str, record: dict[str, Any]) -> None:
    """Write one record to fd 1 after whatever the code printed."""
    import json

    for stream in (sys.stdout, sys.__stdout__, sys.stderr, sys.__stderr__):
        with contextlib.suppress(BaseException):
            if stream is not None:
                stream.flush()
    text = json.dumps(record, ensure_ascii=True, separators=(",", ":"))
    data = f"<<retool-exec:{marker}>>{text}<<end:{marker}>>".encode("ascii")
    try:
        while data:
            data = data[os.write(1, data) :]
    except OSError:
        pass
