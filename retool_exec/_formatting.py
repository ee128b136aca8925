"""Turning results into the text a model sees. Pure functions, strings to the character.

These strings are the seed's interface (``contract.md``): trainers and reward
code already match on them, so they are reproduced exactly, including the
``{timeout:.0f}`` rounding and the order of the four formatting rules.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from retool_exec._errors import ConfigError
from retool_exec._models import ExecResult, Outcome

__all__ = [
    "CHATML_MARKERS",
    "DEFAULT_MARKERS",
    "DEFAULT_TIMEOUT",
    "LLAMA3_MARKERS",
    "MARKER_PRESETS",
    "MAX_OUTPUT_CHARS",
    "READ_CAP_BYTES",
    "Markers",
    "count_utf8_chars",
    "format_tool_content",
    "neutral_spelling",
    "resolve_markers",
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

CHATML_MARKERS: tuple[str, ...] = (
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
"""ChatML as Qwen (2.5, 3, QwQ) uses it: message delimiters, end of text, tool calls
and responses, and reasoning blocks."""
LLAMA3_MARKERS: tuple[str, ...] = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
)
"""Llama 3 (3.1, 3.2, 3.3): text and header delimiters, end of turn/message, tool calls."""
MARKER_PRESETS: Mapping[str, tuple[str, ...]] = {
    "chatml": CHATML_MARKERS,
    "qwen": CHATML_MARKERS,
    "llama3": LLAMA3_MARKERS,
}
"""Marker sets by chat template, for ``markers=`` (each is merged with the seed's four)."""

Markers = Mapping[str, str] | Iterable[str] | str
"""What ``markers=`` takes; see ``resolve_markers``."""

_PIPE_TOKEN = re.compile(r"<\|([^<>|]+)\|>")
_CLOSING_TAG = re.compile(r"</([^<>]+)>")
_OPENING_TAG = re.compile(r"<([^</>][^<>]*)>")

_UTF8_CONTINUATION = bytes(range(0x80, 0xC0))


def truncate_tail(text: str, limit: int = MAX_OUTPUT_CHARS) -> str:
    """Keep the last ``limit`` characters, prefixed by how many were cut (the seed's rule)."""
    if len(text) <= limit:
        return text
    omitted = len(text) - limit
    kept = text[-limit:] if limit > 0 else ""
    return f"[... truncated {omitted} chars ...]\n{kept}"


MARK_ROOM = 40
"""What ``truncate_tail``'s marker adds to a text it cut (``[... truncated N chars ...]``
and a newline, N below 10**13)."""


def within(text: str, limit: int) -> str:
    """``text`` cut by ``truncate_tail`` unless it is within ``limit`` and a marker's room:
    a backend's cell texts arrive already cut (marker included), and cutting them again
    would count only the second cut."""
    return text if len(text) <= limit + MARK_ROOM else truncate_tail(text, limit)


def neutral_spelling(marker: str) -> str:
    """The seed's way of defusing a marker: ``<|x|>`` → ``< x >``, ``<x>`` → ``< x >``,
    ``</x>`` → ``< /x>``; any other marker gets a space after its first character.

    Raises ``ConfigError`` when that spelling would still contain the marker.
    """
    if marker in DEFAULT_MARKERS:
        return DEFAULT_MARKERS[marker]
    if match := _PIPE_TOKEN.fullmatch(marker):
        spelling = f"< {match.group(1)} >"
    elif match := _CLOSING_TAG.fullmatch(marker):
        spelling = f"< /{match.group(1)}>"
    elif match := _OPENING_TAG.fullmatch(marker):
        spelling = f"< {match.group(1)} >"
    else:
        spelling = f"{marker[:1]} {marker[1:]}"
    if marker in spelling:
        raise ConfigError(
            f"marker {marker!r} has no neutral spelling without itself; "
            "give it one in a mapping ({marker: replacement})"
        )
    return spelling


def resolve_markers(markers: Markers | None) -> dict[str, str]:
    """The marker → replacement mapping that ``markers=`` stands for.

    The API (``sanitize_tool_content``, ``format_tool_content`` and
    ``Sandbox(markers=...)`` all take it):

    - ``None``: exactly the seed's four (``DEFAULT_MARKERS``), the contract.
    - any iterable of strings (list, tuple, set, generator; e.g.
      ``LLAMA3_MARKERS``): **merged** with the seed's four, which come first; each
      added marker gets its ``neutral_spelling``.
    - one string: the name of a preset in ``MARKER_PRESETS`` (``"chatml"``,
      ``"qwen"``, ``"llama3"``), merged the same way. (A single marker is a
      list of one: ``["<|eot_id|>"]``.)
    - a mapping marker → replacement: **replaces** the seed's four; exactly these
      are sanitized, with these spellings (``{}`` sanitizes nothing). An empty
      marker in it is ignored.

    Every marker and replacement must be a ``str`` (else ``TypeError``); a marker
    in a list must not be empty, and no replacement may contain its own marker
    (else ``ConfigError``, a ``ValueError``).
    """
    if markers is None:
        return dict(DEFAULT_MARKERS)
    if isinstance(markers, Mapping):
        resolved: dict[str, str] = {}
        for marker, replacement in markers.items():
            if not isinstance(marker, str) or not isinstance(replacement, str):
                raise TypeError(f"markers must map str to str, got {marker!r}: {replacement!r}")
            if marker and marker in replacement:
                raise ConfigError(
                    f"the replacement {replacement!r} still contains its marker {marker!r}"
                )
            resolved[marker] = replacement
        return resolved
    if isinstance(markers, str):
        preset = MARKER_PRESETS.get(markers)
        if preset is None:
            raise ConfigError(
                f"markers={markers!r}: one string names a preset "
                f"({', '.join(sorted(MARKER_PRESETS))}); to add one marker pass a list, "
                f"e.g. markers=[{markers!r}]"
            )
        markers = preset
    if not isinstance(markers, Iterable):
        raise TypeError(
            f"markers must be an iterable of str, a mapping or a preset name, got {markers!r}"
        )
    resolved = dict(DEFAULT_MARKERS)
    for marker in markers:
        if not isinstance(marker, str):
            raise TypeError(f"every marker must be a str, got {marker!r}")
        if not marker:
            raise ConfigError("a marker must not be empty")
        if marker not in resolved:
            resolved[marker] = neutral_spelling(marker)
    return resolved


def sanitize_tool_content(text: str, markers: Markers | None = None) -> str:
    """Replace chat-template markers so tool output cannot open or close a message.

    ``markers`` is read by ``resolve_markers``: None is exactly the seed's four;
    a list (or any iterable of strings, or a preset name) adds to them; a mapping
    marker → replacement replaces them. Replacements are applied in order.
    """
    resolved = DEFAULT_MARKERS if markers is None else resolve_markers(markers)
    for marker, replacement in resolved.items():
        if marker:
            text = text.replace(marker, replacement)
    return text


def format_tool_content(
    result: ExecResult,
    *,
    timeout: float | None = None,
    markers: Markers | None = None,
) -> str:
    """The observation a model sees for ``result``, by the seed's four rules in order.

    ``timeout`` is the limit to name in a timeout message (rounded with
    ``:.0f``, as the seed does); when not given, the limit the call really ran
    under (``result.timeout``), else the seed's default. A sandbox failure says
    so instead of pretending to be an exit code: the seed could not fail that
    way, so no seed string changes.

    The text is the model's to see, not a verdict: the code can print any of
    these strings itself. A reward reads ``result.outcome``, ``timed_out``,
    ``truncated`` and ``infrastructure_failure`` (docs/security.md, threat model).
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
