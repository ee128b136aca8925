"""The local driver's cell answers are made by code a cell can reach: whatever JSON they
hold, the host takes only well-formed fields and never raises."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from retool_exec import CellResult
from retool_exec.backends.local import _answer_fields

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
display_items = st.fixed_dictionaries({"text/plain": json_values}) | json_values
error_items = (
    st.fixed_dictionaries({"ename": json_values, "evalue": json_values, "traceback": json_values})
    | json_values
)
answers = st.fixed_dictionaries(
    {},
    optional={
        "display": st.lists(display_items, max_size=3) | json_values,
        "error": st.lists(error_items, max_size=3) | json_values,
    },
)


@given(answers)
def test_any_answer_gives_well_formed_fields(answer: dict[str, Any]) -> None:
    display, error = _answer_fields(answer, limit=50)
    for item in display:
        assert set(item) == {"text/plain"} and isinstance(item["text/plain"], str)
    for item in error:
        assert isinstance(item["ename"], str) and isinstance(item["evalue"], str)
        assert all(isinstance(line, str) for line in item["traceback"])
    CellResult(display=display, error=error)


def test_a_field_of_another_shape_is_empty() -> None:
    for odd in (5, "text", {"text/plain": "x"}, True, 2.5):
        assert _answer_fields({"display": odd, "error": odd}, limit=50) == ([], [])
