"""Text helpers shared by every surface (CLI, security scorecard): no I/O here."""

from __future__ import annotations

import re

__all__ = ["escape_controls", "utf8_safe"]

# C0 controls except tab and newline, DEL, and C1 controls (ESC starts every
# terminal escape sequence; C1 CSI 0x9b is a one-character one).
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def escape_controls(text: str) -> str:
    """Show control characters as ``\\xNN`` so they are data, not terminal commands."""
    return _CONTROLS.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


def utf8_safe(value: object) -> object:
    """``value`` with every lone surrogate in its strings (inside lists and dicts too)
    replaced by ``?``: Python's ``repr`` and JSON allow them, UTF-8 does not, and a
    tokenizer, a JSON encoder or a UTF-8 stream fails on them."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "replace").decode("utf-8")
        return value
    if isinstance(value, list):
        return [utf8_safe(item) for item in value]
    if isinstance(value, dict):
        return {utf8_safe(key): utf8_safe(item) for key, item in value.items()}
    return value
