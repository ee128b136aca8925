"""Printing untrusted text to a terminal without letting it drive the terminal."""

from __future__ import annotations

import sys
from typing import TextIO

from retool_exec._text import escape_controls

__all__ = ["escape_controls", "write_untrusted"]


def write_untrusted(text: str, stream: TextIO | None = None) -> None:
    """Write sandbox output: escaped when the stream is a terminal, raw when piped."""
    stream = stream or sys.stdout
    if stream.isatty():
        text = escape_controls(text)
    stream.write(text.encode("utf-8", errors="backslashreplace").decode("utf-8"))
    if text and not text.endswith("\n"):
        stream.write("\n")
    stream.flush()
