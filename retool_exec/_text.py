"""Text helpers shared by every surface (CLI, security scorecard): no I/O here."""

from __future__ import annotations

import re

__all__ = ["escape_controls"]

# C0 controls except tab and newline, DEL, and C1 controls (ESC starts every
# terminal escape sequence; C1 CSI 0x9b is a one-character one).
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def escape_controls(text: str) -> str:
    """Show control characters as ``\\xNN`` so they are data, not terminal commands."""
    return _CONTROLS.sub(lambda match: f"\\x{ord(match.group()):02x}", text)
