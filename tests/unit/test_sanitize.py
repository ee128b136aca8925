"""Sanitizing tool output: properties over marker soup and arbitrary results."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from retool_exec import DEFAULT_MARKERS, ExecResult, format_tool_content, sanitize_tool_content
from tests.strategies import exec_results, marker_soup


@settings(max_examples=500)
@given(marker_soup)
@example("<<|im_start|>|im_start|>>")
@example("<</tool_response>tool_response>")
@example("<<tool_response>/tool_response>")
@example("<|im_<|im_end|>start|>")
def test_no_default_marker_survives_sanitizing(text: str) -> None:
    out = sanitize_tool_content(text)
    for marker in DEFAULT_MARKERS:
        assert marker not in out


@settings(max_examples=300)
@given(marker_soup)
def test_sanitizing_is_idempotent(text: str) -> None:
    once = sanitize_tool_content(text)
    assert sanitize_tool_content(once) == once


@settings(max_examples=300)
@given(st.text(alphabet=st.characters(blacklist_characters="<")))
def test_sanitize_is_identity_without_angle_bracket(text: str) -> None:
    assert sanitize_tool_content(text) == text


@settings(max_examples=300)
@given(st.text())
def test_sanitize_never_raises_on_any_text(text: str) -> None:
    assert isinstance(sanitize_tool_content(text), str)


def test_near_misses_are_left_alone() -> None:
    text = "<|im_start> <im_end|> <tool_response <tool_responses> < |im_end|>"
    assert sanitize_tool_content(text) == text


def test_markers_are_case_sensitive() -> None:
    assert sanitize_tool_content("<TOOL_RESPONSE>") == "<TOOL_RESPONSE>"


def test_empty_marker_key_is_ignored() -> None:
    assert sanitize_tool_content("abc", {"": "X"}) == "abc"


@settings(max_examples=300)
@given(exec_results(text=st.text()), st.floats(min_value=0.0, max_value=1e6))
def test_format_tool_content_never_raises(result: ExecResult, timeout: float) -> None:
    assert isinstance(format_tool_content(result, timeout=timeout), str)


@settings(max_examples=200)
@given(exec_results(text=marker_soup))
def test_formatted_output_never_contains_a_default_marker(result: ExecResult) -> None:
    out = format_tool_content(result)
    for marker in DEFAULT_MARKERS:
        assert marker not in out
