"""A result that always fits one frame: what a call printed or left is cut, never the frame.

Why: a call chooses its output and its files, and JSON writes a control or an
invalid byte as six characters (``\\u0001``, ``\\ufffd``), so capped tails and a
capped fetch can still make a frame over ``wire.MAX_FRAME``: the agent would
fail, and the call's own doing would read as a sandbox failure. Fetched files
go first, largest first, each named in ``fetch_errors``; then the streams are
cut from the front, as ``Tail`` cuts them, and what was cut is counted as
dropped. Only taken when encoding failed: a result that fits is never measured.
"""

from __future__ import annotations

from typing import Any

from . import wire

STREAMS = (("stdout", "stdout_dropped"), ("stderr", "stderr_dropped"))
"""The text fields of a result (and of each of its cells), with their dropped counters."""
HEADROOM = 1 << 16
"""Bytes kept free under the limit for the fields around the streams (and the nonce)."""
TOO_LARGE = "left out: the result would not fit one frame of the agent's protocol"


def fit(
    message: dict[str, Any], limit: int = wire.MAX_FRAME, headroom: int = HEADROOM
) -> dict[str, Any]:
    """``message`` (a result or a session reply) cut until its frame is under ``limit``."""
    message = dict(message)
    message["cells"] = [dict(cell) for cell in message.get("cells") or []]
    if not message["cells"]:
        del message["cells"]
    budget = limit - headroom
    excess = len(wire.encode_payload(message)) - budget
    files = dict(message.get("files") or {})
    if excess > 0 and files:
        errors = dict(message.get("fetch_errors") or {})
        for path in sorted(files, key=lambda name: len(files[name]), reverse=True):
            if excess <= 0:
                break
            excess -= len(wire.encode_payload(files.pop(path)))
            errors[path] = TOO_LARGE
        message["files"], message["fetch_errors"] = files, errors
    while excess > 0:
        streams = _streams(message)
        if not streams:
            break  # nothing left to cut: encoding says so
        holder, key, dropped_key, size = max(streams, key=lambda found: found[3])
        text: str = holder[key]
        keep = int(len(text) * max(0.0, (size - excess) / size) * 0.95)
        holder[key] = text[len(text) - keep :] if keep else ""
        holder[dropped_key] = int(holder.get(dropped_key) or 0) + len(text) - keep
        excess = len(wire.encode_payload(message)) - budget
    return message


def _streams(message: dict[str, Any]) -> list[tuple[dict[str, Any], str, str, int]]:
    found = []
    for holder in [message, *message.get("cells", [])]:
        for key, dropped_key in STREAMS:
            text = holder.get(key)
            if isinstance(text, str) and text:
                found.append((holder, key, dropped_key, len(wire.encode_payload(text))))
    return found
