"""Tail truncation: truncate_tail, TailBuffer, finish_stream, count_utf8_chars."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retool_exec._formatting import (
    MARK_ROOM,
    MAX_OUTPUT_CHARS,
    READ_CAP_BYTES,
    count_utf8_chars,
    truncate_tail,
    within,
)
from retool_exec._output import TailBuffer, finish_stream
from retool_exec.backends.docker.agent import wire

_MARKER = re.compile(r"\A\[\.\.\. truncated (\d+) chars \.\.\.\]\n")

no_surrogates = st.text(alphabet=st.characters(exclude_categories=["Cs"]))


@st.composite
def chunkings(draw: st.DrawFn, data: st.SearchStrategy[bytes]) -> tuple[bytes, list[bytes]]:
    """A bytes value and the same value split at arbitrary points."""
    whole = draw(data)
    cuts = sorted(draw(st.lists(st.integers(min_value=0, max_value=len(whole)), max_size=12)))
    bounds = [0, *cuts, len(whole)]
    return whole, [whole[a:b] for a, b in itertools.pairwise(bounds)]


# --- truncate_tail -----------------------------------------------------------


@settings(max_examples=200)
@given(st.text(), st.integers(min_value=0, max_value=64))
def test_short_text_is_unchanged(text: str, extra: int) -> None:
    assert truncate_tail(text, len(text) + extra) == text


@settings(max_examples=200)
@given(st.text(min_size=1), st.integers(min_value=0, max_value=64))
def test_long_text_keeps_tail_and_counts_the_rest(text: str, limit: int) -> None:
    if len(text) <= limit:
        limit = len(text) - 1
    out = truncate_tail(text, limit)
    match = _MARKER.match(out)
    assert match is not None
    assert int(match.group(1)) + limit == len(text)
    assert out[match.end() :] == text[len(text) - limit :]


def test_limit_zero_keeps_nothing() -> None:
    assert truncate_tail("abc", 0) == "[... truncated 3 chars ...]\n"


def test_default_limit_is_4096() -> None:
    text = "z" * (MAX_OUTPUT_CHARS + 10)
    assert truncate_tail(text) == "[... truncated 10 chars ...]\n" + "z" * MAX_OUTPUT_CHARS


# --- count_utf8_chars --------------------------------------------------------


@settings(max_examples=300)
@given(no_surrogates)
def test_count_utf8_chars_equals_len_of_decoded(text: str) -> None:
    assert count_utf8_chars(text.encode("utf-8")) == len(text)


def test_count_utf8_chars_examples() -> None:
    assert count_utf8_chars(b"") == 0
    assert count_utf8_chars("aé€😀".encode()) == 4


# --- TailBuffer --------------------------------------------------------------


def test_tail_buffer_rejects_negative_cap() -> None:
    with pytest.raises(ValueError, match="cap_bytes"):
        TailBuffer(-1)


def test_tail_buffer_default_cap_is_read_cap() -> None:
    buf = TailBuffer()
    buf.feed(b"a" * (READ_CAP_BYTES + 5))
    assert len(buf.raw) == READ_CAP_BYTES
    assert buf.dropped_chars == 5


@settings(max_examples=300)
@given(chunkings(st.binary(max_size=300)), st.integers(min_value=0, max_value=64))
def test_chunked_feeding_keeps_the_same_tail_as_one_feed(
    split: tuple[bytes, list[bytes]], cap: int
) -> None:
    whole, chunks = split
    at_once = TailBuffer(cap)
    at_once.feed(whole)
    chunked = TailBuffer(cap)
    for chunk in chunks:
        chunked.feed(chunk)
    assert chunked.raw == at_once.raw == whole[len(whole) - min(cap, len(whole)) :]
    assert chunked.dropped_chars == at_once.dropped_chars


@settings(max_examples=200)
@given(chunkings(st.binary(max_size=300)), st.integers(min_value=0, max_value=64))
def test_tail_buffer_never_holds_more_than_cap(split: tuple[bytes, list[bytes]], cap: int) -> None:
    _, chunks = split
    buf = TailBuffer(cap)
    for chunk in chunks:
        buf.feed(chunk)
        assert len(buf.raw) <= cap


@settings(max_examples=300)
@given(
    chunkings(no_surrogates.map(lambda s: s.encode("utf-8"))),
    st.integers(min_value=0, max_value=64),
)
def test_dropped_plus_kept_chars_is_all_chars(split: tuple[bytes, list[bytes]], cap: int) -> None:
    whole, chunks = split
    buf = TailBuffer(cap)
    for chunk in chunks:
        buf.feed(chunk)
    assert buf.dropped_chars + count_utf8_chars(buf.raw) == count_utf8_chars(whole)
    assert count_utf8_chars(whole) == len(whole.decode("utf-8"))


@settings(max_examples=300)
@given(chunkings(st.binary(max_size=200)), st.integers(min_value=0, max_value=64))
def test_finish_never_raises_on_invalid_utf8(split: tuple[bytes, list[bytes]], cap: int) -> None:
    _, chunks = split
    buf = TailBuffer(cap)
    for chunk in chunks:
        buf.feed(chunk)
    text, dropped = buf.finish(limit=16)
    assert isinstance(text, str)
    assert dropped >= buf.dropped_chars
    text.encode("utf-8")  # decoded with replacement: never a lone surrogate


def test_finish_replaces_invalid_bytes() -> None:
    buf = TailBuffer(16)
    buf.feed(b"ok\xff\xfe")
    assert buf.finish() == ("ok\ufffd\ufffd", 0)


def test_finish_when_cut_mid_character_replaces_the_fragment() -> None:
    buf = TailBuffer(3)
    buf.feed("a€".encode())  # 1 + 3 bytes; the 'a' falls off
    assert buf.finish() == ("€", 1)
    buf = TailBuffer(2)
    buf.feed("a€".encode())  # a continuation-byte fragment is kept
    text, dropped = buf.finish()
    assert text == "\ufffd\ufffd"
    assert dropped == 2


def test_finish_applies_the_seed_truncation() -> None:
    buf = TailBuffer(100)
    buf.feed(b"0123456789" * 3)
    assert buf.finish(limit=10) == ("[... truncated 20 chars ...]\n0123456789", 20)


def test_finish_stream_adds_dropped_before_to_cut_chars() -> None:
    assert finish_stream(b"abcdef", 7, limit=4) == ("[... truncated 2 chars ...]\ncdef", 9)
    assert finish_stream("abc", 7, limit=4) == ("abc", 7)


# --- a cell's value and error texts: the agent's copy of the rule ---------------------


@settings(max_examples=300)
@given(st.text(max_size=300), st.integers(min_value=0, max_value=320))
def test_the_agents_cut_is_the_seeds(text: str, cap: int) -> None:
    """The in-container agent cannot import the host's ``truncate_tail``: its copy must
    cut as it does, and leave a text it cut (or a short one) as it is."""
    assert wire.cut_tail(text, cap) == truncate_tail(text, cap)
    assert wire.bounded(wire.cut_tail(text, cap), cap) == wire.cut_tail(text, cap)
    assert within(wire.cut_tail(text, cap), cap) == wire.cut_tail(text, cap)
    assert wire.bounded(text, cap) == within(text, cap)


def test_the_marker_room_holds_the_longest_count() -> None:
    assert len(f"[... truncated {10**13 - 1} chars ...]\n") <= MARK_ROOM  # ~10 TB cut
    assert wire.CUT_MARK_ROOM == MARK_ROOM


def test_a_traceback_keeps_its_exception_line_and_newest_frames() -> None:
    frames = [f'  File "<cell 1>", line {n}, in f\n' for n in range(150)]
    lines = ["Traceback (most recent call last):\n", *frames, "ValueError: " + "v" * 500 + "\n"]
    kept = wire.traceback_tail(lines, 200)
    assert kept[0] == lines[0]
    assert re.fullmatch(r"  \[\.\.\. \d+ more lines of the traceback \.\.\.\]\n", kept[1])
    assert kept[2:-1] == frames[-len(kept) + 3 :]
    assert sum(map(len, kept[2:-1])) <= 200
    assert kept[-1] == truncate_tail(lines[-1], 200)
    assert wire.traceback_tail(lines[:3] + lines[-1:], 10_000) == lines[:3] + lines[-1:]
