"""Hypothesis strategies shared by the unit tests (the attrs habit: one place for them)."""

from __future__ import annotations

from hypothesis import strategies as st

from retool_exec import DEFAULT_MARKERS, ExecResult, Outcome

# Lone surrogates (category Cs) are valid in a Python str but cannot be encoded
# as UTF-8; ExecResult and CellResult replace them with "?" (test_models), so a
# round trip of text holding them is not the identity: round trips exclude them.
json_text = st.text(alphabet=st.characters(exclude_categories=["Cs"]))

returncodes = st.none() | st.integers(min_value=-(2**31), max_value=2**31 - 1)
# JSON floats: finite (NaN != NaN would break equality; inf is not JSON).
latencies = st.floats(min_value=0.0, max_value=1e9, allow_nan=False, allow_infinity=False)


@st.composite
def exec_results(draw: st.DrawFn, *, text: st.SearchStrategy[str] = json_text) -> ExecResult:
    """Any ExecResult, consistent or not, with every field drawn."""
    fields = {
        "ok": draw(st.booleans()),
        "stdout": draw(text),
        "stderr": draw(text),
        "returncode": draw(returncodes),
        "timed_out": draw(st.booleans()),
        "latency": draw(latencies),
        "stdout_dropped_chars": draw(st.integers(min_value=0, max_value=2**40)),
        "stderr_dropped_chars": draw(st.integers(min_value=0, max_value=2**40)),
        "backend": draw(st.sampled_from(["", "local", "docker", "fake"]) | json_text),
        "queue_wait": draw(latencies),
        "detail": draw(json_text),
    }
    if draw(st.booleans()):
        fields["outcome"] = draw(st.sampled_from(Outcome))
    return ExecResult(**fields)


# Pieces that chat-template markers are made of, so sanitize sees near-misses,
# nested markers and markers split around other markers.
marker_fragments = st.sampled_from(
    [
        "<",
        ">",
        "|",
        "/",
        " ",
        "<|",
        "|>",
        "</",
        "im_start",
        "im_end",
        "tool_response",
        "< ",
        " >",
        "\n",
        "x",
        *DEFAULT_MARKERS.keys(),
        *DEFAULT_MARKERS.values(),
    ]
)
marker_soup = st.lists(marker_fragments, max_size=30).map("".join)
