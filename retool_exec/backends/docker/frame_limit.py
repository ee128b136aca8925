"""Whether a call's request fits one frame to the agent, checked before any container.

Why: the frame is ASCII JSON, so a character outside ASCII costs six bytes
(``\\u00e9``) and one outside the BMP twelve: code of 12 million ``é`` is under
the character limit but 72 MB on the wire, over ``wire.MAX_FRAME``. Found out
while sending, that was a failed container (retired, the call retried on
another one, then a ``sandbox_error``); checked here, it is the call's own
``rejected`` outcome and no container is touched. A cheap upper bound decides
for nearly every call; only a request that could be too large is encoded to
measure it.
"""

from __future__ import annotations

from typing import Any

from retool_exec._models import ExecResult, Outcome
from retool_exec.backends.base import RunRequest
from retool_exec.backends.docker.agent import wire

__all__ = ["encoded_size_if_too_large", "rejected", "upper_bound"]

ASCII_JSON_BYTES_PER_CHAR = 12
"""The most one character can take in ASCII JSON: a surrogate pair of ``\\uXXXX``."""
FIELD_OVERHEAD = 64
"""Bytes of JSON punctuation and names around each field, file, path or cell (bounded)."""


def upper_bound(request: RunRequest) -> int:
    """Bytes the request's frame can take at most, without encoding it."""
    text = (
        len(request.code)
        + sum(map(len, request.cells))
        + sum(map(len, request.fetch))
        + sum(map(len, request.files))
        + len(request.script or "")
    )
    data = len(request.stdin or b"") + sum(map(len, request.files.values()))
    if request.script is not None:
        data += ASCII_JSON_BYTES_PER_CHAR * len(request.code)  # the code again, as the file
    pieces = 16 + len(request.cells) + len(request.fetch) + len(request.files)
    return ASCII_JSON_BYTES_PER_CHAR * text + (4 * data) // 3 + 4 + FIELD_OVERHEAD * pieces


def encoded_size_if_too_large(frame: dict[str, Any], bound: int) -> int | None:
    """The size of ``frame`` when it exceeds ``wire.MAX_FRAME``; ``bound`` is what it can
    take at most (``upper_bound``), which spares encoding it when that is small enough."""
    if bound <= wire.MAX_FRAME:
        return None
    size = len(wire.encode_payload(frame))
    return size if size > wire.MAX_FRAME else None


def rejected(size: int, backend: str, latency: float) -> ExecResult:
    """The call's own outcome: its code and inputs do not fit one frame."""
    return ExecResult(
        ok=False,
        stdout="",
        stderr=(
            f"Error: the code and its inputs take {size} bytes as sent to the sandbox; "
            f"the limit is {wire.MAX_FRAME} (a character outside ASCII counts 6 to 12)."
        ),
        returncode=None,
        timed_out=False,
        latency=latency,
        outcome=Outcome.REJECTED,
        backend=backend,
        detail="request too large",
    )
