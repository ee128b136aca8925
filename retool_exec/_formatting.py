"""Turning results into the text a model sees. Pure functions, strings to the character.

These strings are the seed's interface (``contract.md``): trainers and reward
code already match on them, so they are reproduced exactly, including the
``{timeout:.0f}`` rounding and the order of the four formatting rules.
"""

from __future__ import annotations

from collections.abc import Mapping

from retool_exec._models import ExecResult, Outcome

__all__ = [
    "DEFAULT_MARKERS",
    "DEFAULT_TIMEOUT",
    "MAX_OUTPUT_CHARS",
    "READ_CAP_BYTES",
    "count_utf8_chars",
    "format_tool_content",
    "sanitize_tool_content",
    "truncate_tail",
]

DEFAULT_TIMEOUT = 30.0
"""Seconds of wall-clock time a call may take."""
MAX_OUTPUT_CHARS = 4096
"""Characters of each stream's tail that a result keeps."""
READ_CAP_BYTES = MAX_OUTPUT_CHARS * 4
"""Bytes of each stream's tail that are decoded (room for 4-byte UTF-8)."""

DEFAULT_MARKERS: Mapping[str, str] = {
    "<|im_start|>": "< im_start >",
    "<|im_end|>": "< im_end >",
    "<tool_response>": "< tool_response >",
    "</tool_response>": "< /tool_response>",
}
"""The seed's chat-template markers (Qwen/ChatML) and their neutral spellings."""

_UTF8_CONTINUATION = bytes(range(0x80, 0xC0))


def truncate_tail(text: str, limit: int = MAX_OUTPUT_CHARS) -> str:
    """Keep the last ``limit`` characters, prefixed by how many were cut (the seed's rule)."""
    if len(text) <= limit:
        return text
    omitted = len(text) - limit
    kept = text[-limit:] if limit > 0 else ""
    return f"[... truncated {omitted} chars ...]\n{kept}"


def sanitize_tool_content(text: str, markers: Mapping[str, str] | None = None) -> str:
    """Replace chat-template markers so tool output cannot open or close a message.

    ``markers`` maps each marker to its replacement; the default is exactly the
    seed's four. Replacements are applied in the mapping's order.
    """
    for marker, replacement in (DEFAULT_MARKERS if markers is None else markers).items():
        if marker:
            text = text.replace(marker, replacement)
    return text


def format_tool_content(
    result: ExecResult,
    *,
    timeout: float | None = None,
    markers: Mapping[str, str] | None = None,
) -> str:
    """The observation a model sees for ``result``, by the seed's four rules in order.

    ``timeout`` is the limit to name in a timeout message (rounded with
    ``:.0f``, as the seed does); when not given, the limit the call really ran
    under (``result.timeout``), else the seed's default. A sandbox failure says
    so instead of pretending to be an exit code: the seed could not fail that
    way, so no seed string changes.
    """
    if result.timed_out:
        if timeout is None:
            timeout = result.timeout if result.timeout is not None else DEFAULT_TIMEOUT
        return f"Error: execution timed out after {timeout:.0f} seconds."
    if result.ok:
        return sanitize_tool_content(result.stdout, markers)
    if result.stderr:
        return sanitize_tool_content(result.stderr, markers)
    if result.outcome is Outcome.SANDBOX_ERROR:
        return "Error: the sandbox failed while running this code; it was not your code's fault."
    return f"Error: process exited with code {result.returncode}."


def count_utf8_chars(data: bytes) -> int:
    """Characters in UTF-8 ``data``: every byte that is not a continuation byte.

    Exact for valid UTF-8 and close for invalid input; runs at C speed, so a
    backend can count what an output flood dropped without decoding it.
    """
    return len(data.translate(None, _UTF8_CONTINUATION))
