"""A result that always fits one frame: what a call printed or left is cut, never the frame.

Why: a call chooses its output and its files, and JSON writes a control or an
invalid byte as six characters (``\\u0001``, ``\\ufffd``), so capped tails and a
capped fetch can still make a frame over ``wire.MAX_FRAME`` (and so can the
values and tracebacks of a notebook's many cells): the agent would fail, and
the call's own doing would read as a sandbox failure. Fetched files go first,
largest first, each named in ``fetch_errors``; then the largest texts: a
stream is cut from the front, as ``Tail`` cuts it, and what was cut is counted
as dropped; a cell's value or traceback line keeps its head and ends in
``CUT_MARK``. Only taken when encoding failed: a result that fits is never
measured.
"""

from __future__ import annotations

from typing import Any

from . import wire

STREAMS = (("stdout", "stdout_dropped"), ("stderr", "stderr_dropped"))
"""The text fields of a result (and of each of its cells), with their dropped counters."""
HEADROOM = 1 << 16
"""Bytes kept free under the limit for the fields around the streams (and the nonce)."""
TOO_LARGE = "left out: the result would not fit one frame of the agent's protocol"
CUT_MARK = " [cut: the result would not fit one frame]"
"""Ends a cell's value or traceback text that was cut (streams count it as dropped)."""


def fit(
    message: dict[str, Any], limit: int = wire.MAX_FRAME, headroom: int = HEADROOM
) -> dict[str, Any]:
    """``message`` (a result or a session reply) cut until its frame is under ``limit``.

    Sizes are measured once per field and the cuts planned from them (a notebook
    of many cells has hundreds of texts; encoding the whole frame after each cut
    would take minutes), then the frame is measured again, a few rounds at most.
    """
    message = _copy(message)
    budget = limit - headroom
    excess = len(wire.encode_payload(message)) - budget
    files = message.get("files") or {}
    if excess > 0 and files:
        errors = message.setdefault("fetch_errors", {})  # (_copy made it the copy's own)
        for path in sorted(files, key=lambda name: len(files[name]), reverse=True):
            if excess <= 0:
                break
            excess -= len(wire.encode_payload(files.pop(path)))
            errors[path] = TOO_LARGE
    for _round in range(4):
        if excess <= 0:
            return message
        _cut_texts(message, excess)
        excess = len(wire.encode_payload(message)) - budget
    if excess > 0 and message.get("cells"):
        message["cells"] = []  # (only cells of next to nothing each, in their hundreds of
        # thousands, could get here: their records go, the call's own outcome stays)
    return message


def _copy(message: dict[str, Any]) -> dict[str, Any]:
    """Deep enough that every container a cut writes to is the copy's own."""
    copied = dict(message)
    for key in ("files", "fetch_errors"):
        if key in message:
            copied[key] = dict(message[key] or {})
    if "cells" in message:
        copied["cells"] = [_copy_cell(cell) for cell in message["cells"] or []]
    return copied


def _copy_cell(cell: dict[str, Any]) -> dict[str, Any]:
    copied = dict(cell)
    if "display" in cell:
        copied["display"] = [dict(item) for item in cell["display"] or []]
    if "error" in cell:
        copied["error"] = [dict(item) for item in cell["error"] or []]
        for item in copied["error"]:
            if "traceback" in item:
                item["traceback"] = list(item["traceback"] or [])
    return copied


def _cut_texts(message: dict[str, Any], excess: int) -> None:
    """Cut ``excess`` bytes (and a little more) off the largest texts: every text over a
    common size is cut to it, so each cell keeps the head of its value."""
    texts = _texts(message)
    cap = _common_size(sorted((found[0] for found in texts), reverse=True), excess * 1.02 + 64)
    for size, holder, key, dropped_key in texts:
        if size <= cap:
            continue
        text = holder[key]
        keep = int(len(text) * cap / size)
        if dropped_key is None:  # a value's text or a traceback line: its head, marked
            holder[key] = text[:keep] + CUT_MARK if keep else CUT_MARK
        else:  # a stream: its tail, as Tail keeps it, and the cut counted as dropped
            holder[key] = text[len(text) - keep :] if keep else ""
            holder[dropped_key] = int(holder.get(dropped_key) or 0) + len(text) - keep


def _common_size(sizes: list[int], excess: float) -> float:
    """The size every text over it is cut to so that ``excess`` bytes go (``sizes``
    largest first); 0 when even cutting all of them to nothing is not enough."""
    removed = 0.0
    for index, size in enumerate(sizes):
        below = sizes[index + 1] if index + 1 < len(sizes) else 0
        step = (index + 1) * (size - below)  # lowering the cap from this size to the next
        if removed + step >= excess:
            return size - (excess - removed) / (index + 1)
        removed += step
    return 0.0


def _texts(message: dict[str, Any]) -> list[tuple[int, Any, Any, str | None]]:
    """(encoded size, holder, key, dropped counter) of every text a cut may shorten."""
    found: list[tuple[int, Any, Any, str | None]] = []

    def add(holder: Any, key: Any, dropped_key: str | None) -> None:
        text = holder[key]
        if isinstance(text, str) and len(text) > len(CUT_MARK):
            found.append((len(wire.encode_payload(text)), holder, key, dropped_key))

    for holder in [message, *message.get("cells", [])]:
        for key, dropped_key in STREAMS:
            if key in holder:
                add(holder, key, dropped_key)
        for item in holder.get("display") or []:
            if "text/plain" in item:
                add(item, "text/plain", None)
        for item in holder.get("error") or []:
            if "evalue" in item:
                add(item, "evalue", None)
            lines = item.get("traceback") or []
            for index in range(len(lines)):
                add(lines, index, None)
    return found
