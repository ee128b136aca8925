"""Sanitizing tool output: properties over marker soup and arbitrary results."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from retool_exec import (
    DEFAULT_MARKERS,
    ExecResult,
    FakeBackend,
    Sandbox,
    format_tool_content,
    sanitize_tool_content,
)
from retool_exec._formatting import MARKER_PRESETS, resolve_markers
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


# -- markers: lists merge with the seed's four, mappings replace them, presets ------------

CHATML_EXTRA = ["<|endoftext|>", "<tool_call>", "</tool_call>", "<think>", "</think>"]
LLAMA3 = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


def test_a_list_of_markers_is_merged_with_the_seeds_four() -> None:
    text = "<|eot_id|><|im_end|><tool_response>"
    out = sanitize_tool_content(text, ["<|eot_id|>"])
    assert out == "< eot_id >< im_end >< tool_response >"


@pytest.mark.parametrize(
    "markers",
    [
        ("<|eot_id|>",),
        iter(["<|eot_id|>"]),
        {"<|eot_id|>"},
        frozenset({"<|eot_id|>"}),
        (marker for marker in ["<|eot_id|>"]),
    ],
    ids=["tuple", "iterator", "set", "frozenset", "generator"],
)
def test_any_iterable_of_strings_is_accepted(markers: object) -> None:
    out = sanitize_tool_content("<|eot_id|>|<|im_start|>", markers)  # type: ignore[arg-type]
    assert out == "< eot_id >|< im_start >"


def test_a_mapping_replaces_the_defaults_exactly() -> None:
    assert sanitize_tool_content("<|eot_id|><|im_end|>", {"<|eot_id|>": "EOT"}) == "EOT<|im_end|>"


@pytest.mark.parametrize(
    ("markers", "error"),
    [
        ("<|eot_id|>", ValueError),  # one string is a preset name, and this is none
        ("no-such-preset", ValueError),
        ([b"<|eot_id|>"], TypeError),
        ([1], TypeError),
        ([""], ValueError),
        (["x"], ValueError),  # no neutral spelling without the marker itself: give a mapping
        ({"<a>": 1}, TypeError),
        ({"<a>": "<a>!"}, ValueError),  # the replacement would still contain the marker
        (5, TypeError),
    ],
)
def test_bad_markers_are_refused_with_the_reason(markers: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        resolve_markers(markers)  # type: ignore[arg-type]
    with pytest.raises(error):
        sanitize_tool_content("text", markers)  # type: ignore[arg-type]


def test_a_sandbox_takes_a_list_and_refuses_bad_markers() -> None:
    sandbox = Sandbox(FakeBackend(), markers=["<|eot_id|>"])
    try:
        result = ExecResult(True, "<|eot_id|><|im_start|>", "", 0, False, 0.0)
        assert sandbox.format_tool_content(result) == "< eot_id >< im_start >"
    finally:
        sandbox.close()
    with pytest.raises(ValueError, match="preset"):
        Sandbox(FakeBackend(), markers="<|eot_id|>")


@pytest.mark.parametrize(
    ("preset", "markers"),
    [
        ("chatml", ["<|im_start|>", "<|im_end|>", *CHATML_EXTRA]),
        ("qwen", ["<|im_start|>", "<|im_end|>", *CHATML_EXTRA]),
        ("llama3", LLAMA3),
    ],
)
def test_presets_cover_their_chat_templates(preset: str, markers: list[str]) -> None:
    assert set(markers) <= set(MARKER_PRESETS[preset])
    text = "".join(markers) + "".join(DEFAULT_MARKERS)
    for spec in (preset, MARKER_PRESETS[preset]):
        out = sanitize_tool_content(text, spec)
        for marker in [*markers, *DEFAULT_MARKERS]:
            assert marker not in out, (spec, marker)


def test_the_default_stays_exactly_the_seeds_four() -> None:
    assert resolve_markers(None) == dict(DEFAULT_MARKERS)
    assert sanitize_tool_content("<think><|eot_id|>") == "<think><|eot_id|>"


def test_neutral_spellings_follow_the_seeds_style() -> None:
    resolved = resolve_markers(["<|eot_id|>", "<think>", "</think>"])
    assert list(resolved) == [*DEFAULT_MARKERS, "<|eot_id|>", "<think>", "</think>"]
    assert resolved["<|eot_id|>"] == "< eot_id >"  # as the seed's "<|im_end|>" -> "< im_end >"
    assert resolved["<think>"] == "< think >"  # as "<tool_response>"
    assert resolved["</think>"] == "< /think>"  # as "</tool_response>"


@settings(max_examples=300)
@given(st.lists(st.sampled_from([*CHATML_EXTRA, *LLAMA3, *DEFAULT_MARKERS, "<", "|", ">", "x"])))
def test_no_preset_marker_survives_and_sanitizing_is_idempotent(parts: list[str]) -> None:
    text = "".join(parts)
    for preset in MARKER_PRESETS:
        once = sanitize_tool_content(text, preset)
        for marker in resolve_markers(preset):
            assert marker not in once
        assert sanitize_tool_content(once, preset) == once
