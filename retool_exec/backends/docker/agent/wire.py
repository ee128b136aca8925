"""The one typed boundary between the host and the in-container agent. Standard library only.

Everything both sides must agree on is written here once: the frame codec,
the message shapes, the size limits, the identities (uids) and capabilities,
the paths inside the container, and the rules for the files a call may
upload or fetch. The agent (inside the container) imports it as part of its
zipapp; the host (``protocol.py``, ``hardening.py``, ``backend.py``, the
other backends) imports it as ``retool_exec.backends.docker.agent.wire``.

Frames: a 4-byte big-endian length, then that many bytes of ASCII JSON (an
object with a string ``type``). Binary payloads (stdin, files) travel as
base64 strings. Inside the container the supervisor writes to a call's
process in ``marshal`` instead (``encode_for_call``); nothing else does.

    host  -> agent  RunFrame       one call
    agent -> host   ReadyFrame     once, at start (or FatalFrame, then exit)
    agent -> host   ResultFrame    the call's result, carrying the call's nonce
    agent -> host   ResetFrame     after a reset, if the RunFrame asked for one
    host  -> agent  {"type": "ping"}  ->  {"type": "pong"}

Only the agent's supervisor (PID 1) ever writes to the attach stream, and no
process a call can reach ever holds a nonce, so a frame carrying the current
nonce is the agent's.
"""

from __future__ import annotations

import base64
import errno
import json
import marshal
import struct
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:  # (not imported as the agent starts: what it imports, a call may shadow)
    from collections.abc import Iterable

# -- frames ----------------------------------------------------------------------

MAX_FRAME = 64 * 1024 * 1024
"""Largest frame either side accepts (the call's code, files and output fit in it)."""
FRAME_HEADER = struct.Struct(">I")
EVENT_FRAME_LIMIT = 1 << 20
"""Largest frame the supervisor reads from a call's events pipe (a cell's end): one
over it breaks the stream, so the call's process cuts what it sends to fit."""


class WireError(ValueError):
    """A frame that breaks the protocol: too large, not JSON, not a typed object."""


class FrameTooLargeError(WireError):
    """A message whose frame would exceed ``MAX_FRAME``."""


def encode_frame(message: dict[str, Any]) -> bytes:
    """A length-prefixed ASCII JSON frame (lone surrogates survive as escapes)."""
    payload = encode_payload(message)
    if len(payload) > MAX_FRAME:
        raise FrameTooLargeError(f"frame of {len(payload)} bytes exceeds {MAX_FRAME}")
    return FRAME_HEADER.pack(len(payload)) + payload


def encode_payload(message: object) -> bytes:
    """The JSON text of a frame (or of any part of one: its size is what it adds)."""
    return json.dumps(message, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def decode_payload(payload: bytes) -> dict[str, Any]:
    """The message in one frame's payload, checked to be a typed JSON object."""
    try:
        message = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        # RecursionError: nesting deeper than the decoder's stack (``[[[[...``), which a
        # call can send on its events pipe; it must be the call's garbage like any other.
        raise WireError(f"frame is not JSON: {type(exc).__name__}: {exc}") from exc
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise WireError("frame is not a typed JSON object")
    return message


def encode_for_call(message: dict[str, Any]) -> bytes:
    """A frame from the supervisor to a call's process: ``marshal``, which C parses.

    Why not JSON: ``json.loads`` runs Python code, and in a fresh fork of the
    zygote that copied ~45 more of its pages per call (measured in the image).
    Only this direction: the supervisor writes these frames and its own
    child reads them (one interpreter, one ``marshal`` version). Frames from
    a call's process are its code's to forge, so they stay JSON: ``marshal``
    is not safe on hostile input.
    """
    payload = marshal.dumps(message)
    if len(payload) > MAX_FRAME:
        raise WireError(f"frame of {len(payload)} bytes exceeds {MAX_FRAME}")
    return FRAME_HEADER.pack(len(payload)) + payload


def decode_for_call(payload: bytes) -> dict[str, Any]:
    """The message of an ``encode_for_call`` frame, checked to be a typed object."""
    try:
        message = marshal.loads(payload)  # noqa: S302 - written by the supervisor (see above)
    except (EOFError, ValueError, TypeError) as exc:
        raise WireError(f"frame is not marshal data: {exc}") from exc
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise WireError("frame is not a typed object")
    return message


class FrameDecoder:
    """Incremental decoder: feed bytes, get whole messages back."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self._max = max_frame

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buf += data
        messages = []
        while len(self._buf) >= FRAME_HEADER.size:
            (size,) = FRAME_HEADER.unpack_from(self._buf)
            if size > self._max:
                raise WireError(f"frame of {size} bytes exceeds {self._max}")
            end = FRAME_HEADER.size + size
            if len(self._buf) < end:
                break
            messages.append(decode_payload(bytes(self._buf[FRAME_HEADER.size : end])))
            del self._buf[:end]
        return messages


def b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def b64decode(text: object) -> bytes:
    if not isinstance(text, str):
        raise WireError(f"expected a base64 string, got {type(text).__name__}")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError) as exc:
        raise WireError(f"bad base64 payload: {exc}") from exc


# -- a cell's value and error texts -----------------------------------------------

VALUE_CHARS = 1 << 16
"""Most characters of a cell's value (its ``repr``) a call's process sends: with the
error's, well under ``EVENT_FRAME_LIMIT`` even as six-byte JSON escapes."""
ERROR_CHARS = 1 << 14
"""Most characters of a cell's exception value, and of its traceback's kept lines."""
CUT_MARK_ROOM = 40
"""What the seed's marker adds to a text cut to its cap: a text within cap + this was
cut already (or needs no cut)."""


def text_caps(message: dict[str, Any]) -> tuple[int, int]:
    """The characters a cell's value and its error's texts keep: the host's ``text_cap``
    (the caller's output cap, as the local backend cuts them) within the event's bounds."""
    cap = message.get("text_cap")
    cap = cap if type(cap) is int and cap >= 0 else VALUE_CHARS
    return min(cap, VALUE_CHARS), min(cap, ERROR_CHARS)


def cut_tail(text: str, cap: int) -> str:
    """The last ``cap`` characters of ``text``, after the seed's ``[... truncated N chars
    ...]`` marker when any were cut: the rule of ``_formatting.truncate_tail`` and of the
    local backend's notebook driver, so a cell's value reads the same on every backend
    (its end is what a value's or a traceback's reader needs; N is exact)."""
    if len(text) <= cap:
        return text
    kept = text[-cap:] if cap > 0 else ""
    return f"[... truncated {len(text) - cap} chars ...]\n{kept}"


def bounded(text: str, cap: int) -> str:
    """``text`` as a cell's text within ``cap``: unchanged if ``cut_tail`` made it (or it
    is short), else cut so (the events pipe is the call's to write)."""
    return text if len(text) <= cap + CUT_MARK_ROOM else cut_tail(text, cap)


def traceback_tail(lines: list[str], cap: int) -> list[str]:
    """A traceback's lines as the local backend keeps them: the exception's own line,
    then the newest lines that fit in ``cap`` characters, each cut by ``cut_tail``, and
    the ``Traceback`` header with a count of the lines left out. (The local backend's
    drivers hold their own copy: they run in the caller's python, without this package;
    the contract tests compare the two.)"""
    lines = [cut_tail(line, cap) for line in lines[-200:]]
    kept, total = lines[-1:], 0
    for line in reversed(lines[:-1]):
        if total + len(line) > cap:
            break
        kept.append(line)
        total += len(line)
    left = len(lines) - len(kept)
    header = left > 0 and lines[0].startswith("Traceback")
    if left > header:
        kept.append(f"  [... {left - header} more lines of the traceback ...]\n")
    if header:
        kept.append(lines[0])
    return kept[::-1]


# -- messages ----------------------------------------------------------------------


DEFAULT_CPU_SECONDS = 35
"""A call's CPU-time limit (``RLIMIT_CPU``) when its request names none."""


class RunFrame(TypedDict, total=False):
    type: str  # "run"
    id: int
    nonce: str
    code: str
    timeout: float
    cpu_seconds: int
    memory_mb: int
    stack_mb: int
    read_cap: int
    reset: bool
    stdin: str | None  # base64
    files: list[list[str]]  # [[path, base64 content], ...]
    fetch: list[str]
    fetch_cap: int


class ResultFrame(TypedDict, total=False):
    type: str  # "result"
    id: int
    nonce: str
    returncode: int | None
    timed_out: bool
    oom: bool
    oom_kills: int | None  # the container's OOM kills so far: the host then awaits Docker's events
    stdout: str
    stdout_dropped: int
    stderr: str
    stderr_dropped: int
    duration: float
    started: bool  # the child reported its code started; False: the sandbox failed, not the code
    setup_error: str  # files could not be written: the code never ran
    files: dict[str, str]  # path -> base64 content, for each fetched file found
    fetch_errors: dict[str, str]  # path -> why it was not fetched


class ResetFrame(TypedDict, total=False):
    type: str  # "reset"
    id: int
    nonce: str
    clean: bool
    reason: str


# -- identities and capabilities ---------------------------------------------------

CONTAINER_USER = "0:0"
"""Only the supervisor's first instructions run as root: it drops at once."""
AGENT_USER = "65533:65533"
"""The supervisor's uid (PID 1): holds call data, so no call's uid may reach it. Only
where the host allocates no uids (image checks); see ``agent_users``."""
ZYGOTE_USER = "65532:65532"
"""The zygote's uid: it forks the calls and never sees their data (likewise)."""
DEFAULT_SANDBOX_USER = "65534:65534"
"""nobody: the calls' uid when the host does not allocate one per container."""
SANDBOX_UID_RANGE = (200_000, 999_999)
"""Per-container call uids are drawn from here, so no two live containers on a
host share one, and per-uid kernel limits (inotify, pending signals, pipe
pages, message queues, RLIMIT_NPROC) are never shared between containers."""
AGENT_UID_OFFSET, ZYGOTE_UID_OFFSET = 1_000_000, 2_000_000
"""A container whose calls run as ``u`` runs its supervisor as ``u + AGENT_UID_OFFSET``
and its zygotes as ``u + ZYGOTE_UID_OFFSET``: three ranges that cannot meet, each uid
unique on the host while its container lives. Why: the kernel charges some objects a
call makes the agent hold to the agent's uid: descriptors in flight to the
supervisor's sends (checked against RLIMIT_NOFILE, finding 38) and pages of the pipes
it makes (``pipe-user-pages-soft``, finding 39). With one agent uid for every
container, a call exhausted them for every other container on the host."""


def agent_users(sandbox_uid: int) -> tuple[str, str]:
    """The supervisor's and the zygotes' ``uid:gid`` for a container whose calls run as
    ``sandbox_uid`` (one from ``SANDBOX_UID_RANGE``)."""
    agent, zygote = sandbox_uid + AGENT_UID_OFFSET, sandbox_uid + ZYGOTE_UID_OFFSET
    return f"{agent}:{agent}", f"{zygote}:{zygote}"


CAP_SETGID, CAP_SETUID, CAP_SETPCAP = 6, 7, 8
CAPABILITY_NAMES = {CAP_SETGID: "SETGID", CAP_SETUID: "SETUID", CAP_SETPCAP: "SETPCAP"}
SUPERVISOR_CAPABILITIES = (CAP_SETGID, CAP_SETUID)
"""Act as the calls' uid (to kill their processes and empty what they left)."""
ZYGOTE_SERVING_CAPABILITIES = (CAP_SETGID, CAP_SETUID)
"""Make each child the calls' uid: all a zygote holds once it serves forks."""
ZYGOTE_CAPABILITIES = (*ZYGOTE_SERVING_CAPABILITIES, CAP_SETPCAP)
"""A zygote at start: CAP_SETPCAP empties its bounding set, which every child inherits."""
CONTAINER_CAPABILITIES = tuple(
    CAPABILITY_NAMES[c] for c in sorted(set(SUPERVISOR_CAPABILITIES) | set(ZYGOTE_CAPABILITIES))
)
"""All a container is given (Docker's ``cap_add``, after ``cap_drop ALL``). No CAP_KILL:
the supervisor kills a call's processes as their own uid, which spares the zygote."""

# -- paths inside the container -------------------------------------------------------

AGENT_DIR = "/opt/retool_exec"
AGENT_PATH = f"{AGENT_DIR}/agent.pyz"
"""The agent zipapp in the image (run with ``python3 -I -B``)."""
AGENT_PACKAGE = "_retool_exec_agent"
"""The agent's package name inside its zipapp. Why not ``agent`` (the source folder's
name): the zygote holds the package, so a call's own ``agent.py``, a common name in
tool-use code, lost to it (``from agent import solve``: ImportError) and ``import
agent`` gave the agent's modules where python3 says there is none (thirty-seventh
round). A call's code is not expected to use this name."""
WORKDIR = "/tmp"
"""Every call's working directory; uploaded files land here, fetched ones are read here."""
SCRATCH_DIRS = ("/tmp", "/dev/shm")
"""Writable places a call can leave data in (both tmpfs, emptied and checked by the reset)."""
MQUEUE_DIR = "/dev/mqueue"
PTY_MASTER = "/dev/pts/ptmx"

# -- request limits -------------------------------------------------------------------

MAX_FILES = 1000
"""Files one call may upload, and paths it may fetch."""
MAX_PATH_CHARS = 1024
MAX_UPLOAD_BYTES = 32 * 1024 * 1024
"""Total bytes one call may upload (they travel base64 inside one frame)."""
MAX_FETCH_BYTES = 32 * 1024 * 1024
"""Default total bytes one call may fetch back."""
MAX_STDIN_BYTES = 16 * 1024 * 1024
STARTED_DELAY = 0.05
"""Seconds the "started" frame waits: a call that ends sooner says it in its result frame,
so the host gets one frame per call instead of two (the host only needs "started" to know,
within its 5 s grace, that a slow call must not be run again elsewhere). The host reads
the code's start as this much before the frame (``DockerBackend._call``)."""


def check_relative_path(path: object) -> str:
    """``path`` as a normalised relative POSIX path inside the working directory, or ValueError.

    Refused: non-strings, empty paths, absolute paths, ``..`` components, NUL
    and other control characters, over-long paths, and paths ending in ``/`` or
    ``/.`` (a directory's: ``y/`` had fetched the file ``y``). ``.`` components and
    repeated slashes are dropped.
    """
    if not isinstance(path, str):
        raise ValueError(f"a file path must be a string, not {type(path).__name__}")
    path = str.__str__(path)  # its own text: no method of a subclass decides (``..``)
    if len(path) > MAX_PATH_CHARS:
        raise ValueError(f"file path longer than {MAX_PATH_CHARS} characters")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in path):
        raise ValueError(f"file path {path!r} contains a control character")
    if path.startswith("/"):
        raise ValueError(f"file path {path!r} is absolute; give it relative to the working dir")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if not parts:
        raise ValueError(f"file path {path!r} names no file")
    if path.rpartition("/")[2] in ("", "."):  # ``out/``: a directory, as to open()
        raise ValueError(f"file path {path!r} names a directory (it ends in '/' or '/.')")
    if ".." in parts:
        raise ValueError(f"file path {path!r} leaves the working directory")
    if any(len(part.encode("utf-8", "surrogateescape")) > 255 for part in parts):
        raise ValueError(f"file path {path!r} has a component longer than 255 bytes")
    return "/".join(parts)


def check_uploads(files: dict[str, bytes]) -> dict[str, bytes]:
    """Validated uploads (normalised paths), or ValueError naming what is wrong."""
    if len(files) > MAX_FILES:
        raise ValueError(f"{len(files)} files uploaded; at most {MAX_FILES}")
    checked: dict[str, bytes] = {}
    total = 0
    for raw_path, content in files.items():
        path = check_relative_path(raw_path)
        if not isinstance(content, bytes | bytearray | memoryview):
            raise ValueError(f"content of {path!r} must be bytes, not {type(content).__name__}")
        if path in checked:
            raise ValueError(f"file {path!r} is given twice")
        if type(content) is bytes:
            checked[path] = content  # (not copied)
        else:
            with memoryview(content) as view:  # its content, never a subclass's __len__
                checked[path] = view.tobytes()
        total += len(checked[path])
    if total > MAX_UPLOAD_BYTES:
        raise ValueError(f"{total} bytes of files uploaded; at most {MAX_UPLOAD_BYTES}")
    clash = file_and_directory(checked)
    if clash is not None:
        raise ValueError(f"{clash!r} is both a file and a directory")
    return checked


def file_and_directory(paths: Iterable[str]) -> str | None:
    """A path among ``paths`` (normalised, ``check_relative_path``) that another of them
    has as a directory, if any: the first in sorted order."""
    names = set(paths)
    parents = {"/".join(p.split("/")[:i]) for p in names for i in range(1, p.count("/") + 1)}
    clash = parents & names
    return min(clash) if clash else None


def check_fetch(paths: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Validated, de-duplicated fetch paths in order, or ValueError."""
    if len(paths) > MAX_FILES:
        raise ValueError(f"{len(paths)} files to fetch; at most {MAX_FILES}")
    return tuple(dict.fromkeys(check_relative_path(path) for path in paths))


class FetchRefused:
    """Why a fetched file is not returned, in the same words on every backend (the
    server's ``fetch_files`` message and the trainer's ``fetch_errors`` show them; the
    two backends had worded each in their own way)."""

    NOT_FOUND = "not found"
    NOT_REGULAR = "not a regular file"
    LINK_IN_THE_WAY = "a symbolic link or non-directory is in the way; not followed"
    LINK_ERRNOS = (errno.ELOOP, errno.ENOTDIR, errno.EMLINK)
    """What opening without following links fails with where a link or a file is."""

    @staticmethod
    def too_large(size: int, budget: int) -> str:
        return f"{size} bytes; {budget} bytes of fetch budget left"

    @staticmethod
    def grew(budget: int) -> str:
        return f"more than the {budget} bytes of fetch budget left"

    @classmethod
    def cannot_open(cls, exc: OSError) -> str:
        if isinstance(exc, FileNotFoundError):
            return cls.NOT_FOUND
        if exc.errno in cls.LINK_ERRNOS:
            return cls.LINK_IN_THE_WAY
        return f"cannot open: {exc.strerror}"

    @staticmethod
    def cannot_read(exc: OSError) -> str:
        return f"cannot read: {exc.strerror}"
