"""Bounded capture of a stream's tail, so an output flood costs the host nothing.

Only the last ``cap_bytes`` are ever held; what falls off the front is counted
(in characters, without decoding) so a result can say how much was lost.
"""

from __future__ import annotations

from retool_exec._formatting import (
    MAX_OUTPUT_CHARS,
    READ_CAP_BYTES,
    count_utf8_chars,
    truncate_tail,
)

__all__ = ["TailBuffer", "finish_stream", "read_cap_bytes"]


def read_cap_bytes(max_chars: int) -> int:
    """Bytes of a stream's tail to keep for ``max_chars`` characters (the seed's 4x)."""
    return 4 * max_chars


class TailBuffer:
    """Keeps the last ``cap_bytes`` bytes fed to it and counts the characters dropped."""

    def __init__(self, cap_bytes: int = READ_CAP_BYTES) -> None:
        if cap_bytes < 0:
            raise ValueError(f"cap_bytes must be >= 0, got {cap_bytes}")
        self._cap = cap_bytes
        self._buf = bytearray()
        self.dropped_chars = 0

    def feed(self, data: bytes) -> None:
        """Append ``data``, dropping from the front whatever exceeds the cap."""
        if len(data) >= self._cap:
            self.dropped_chars += count_utf8_chars(bytes(self._buf))
            head = len(data) - self._cap
            self.dropped_chars += count_utf8_chars(data[:head])
            self._buf = bytearray(data[head:])
            return
        self._buf += data
        excess = len(self._buf) - self._cap
        if excess > 0:
            self.dropped_chars += count_utf8_chars(bytes(self._buf[:excess]))
            del self._buf[:excess]

    @property
    def raw(self) -> bytes:
        """The bytes kept so far."""
        return bytes(self._buf)

    def finish(self, limit: int = MAX_OUTPUT_CHARS) -> tuple[str, int]:
        """The seed-formatted text and the total characters dropped from the stream."""
        return finish_stream(self.raw, self.dropped_chars, limit)


def finish_stream(
    tail: bytes | str, dropped_before: int, limit: int = MAX_OUTPUT_CHARS
) -> tuple[str, int]:
    """Decode a kept tail like the seed (UTF-8, errors replaced) and cut it to ``limit`` chars.

    Returns the text (with the seed's truncation marker when cut) and the total
    characters dropped: those never decoded plus those the cut removed.
    """
    text = tail.decode("utf-8", errors="replace") if isinstance(tail, bytes) else tail
    return truncate_tail(text, limit), dropped_before + max(0, len(text) - limit)
