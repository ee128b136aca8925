"""Printing untrusted text to a terminal without letting it drive the terminal."""

from __future__ import annotations

import re
import sys
from typing import TextIO

__all__ = ["escape_controls", "write_untrusted"]

# C0 controls except tab and newline, DEL, and C1 controls (ESC starts every
# terminal escape sequence; C1 CSI 0x9b is a one-character one).
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def escape_controls(text: str) -> str:
    """Show control characters as ``\\xNN`` so they are data, not terminal commands."""
    return _CONTROLS.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


def write_untrusted(text: str, stream: TextIO | None = None) -> None:
    """Write sandbox output: escaped when the stream is a terminal, raw when piped."""
    stream = stream or sys.stdout
    if stream.isatty():
        text = escape_controls(text)
    stream.write(text.encode("utf-8", errors="backslashreplace").decode("utf-8"))
    if text and not text.endswith("\n"):
        stream.write("\n")
    stream.flush()
