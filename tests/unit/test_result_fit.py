"""The agent's result always fits one frame: cut output and dropped files, never a failure."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from retool_exec.backends.docker.agent import result_fit, wire

LIMIT = 4096
"""A small frame limit: the same arithmetic as 64 MiB, at a size hypothesis can explore."""

# Control characters and replacement characters are what JSON writes six bytes for.
stream_text = st.text(alphabet=st.sampled_from('a\x01\ufffd\n"\\é'), max_size=3000)


def _result(stdout: str, stderr: str, files: dict[str, str], cells: list[dict[str, Any]]) -> dict:
    message: dict[str, Any] = {
        "type": "result",
        "id": "call",
        "returncode": 1,
        "stdout": stdout,
        "stdout_dropped": 3,
        "stderr": stderr,
        "stderr_dropped": 0,
        "files": files,
        "fetch_errors": {},
    }
    if cells:
        message["cells"] = cells
    return message


value_text = st.text(alphabet=st.sampled_from("b\x01😀\u00e9"), max_size=800)
cell_streams = st.fixed_dictionaries(
    {
        "stdout": stream_text,
        "stdout_dropped": st.just(0),
        "stderr": stream_text,
        "stderr_dropped": st.just(0),
        "display": st.lists(st.fixed_dictionaries({"text/plain": value_text}), max_size=1),
        "error": st.lists(
            st.fixed_dictionaries(
                {"ename": st.just("E"), "evalue": value_text,
                 "traceback": st.lists(value_text, max_size=3)}
            ),
            max_size=1,
        ),
        "finished": st.booleans(),
    }
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    stdout=stream_text,
    stderr=stream_text,
    files=st.dictionaries(
        st.sampled_from(["a.bin", "b.bin", "c.bin"]), st.text(alphabet="AB=", max_size=3000)
    ),
    cells=st.lists(cell_streams, max_size=3),
)
def test_a_cut_result_fits_and_says_what_it_cut(
    stdout: str, stderr: str, files: dict[str, str], cells: list[dict[str, Any]]
) -> None:
    message = _result(stdout, stderr, files, cells)
    fitted = fit_small(message)
    assert len(wire.encode_payload(fitted)) <= LIMIT
    # Streams are kept as tails and what was cut is counted as dropped.
    for before, after in zip([message, *cells], [fitted, *fitted.get("cells", [])], strict=True):
        for key, dropped in result_fit.STREAMS:
            assert before[key].endswith(after[key])
            cut = len(before[key]) - len(after[key])
            assert after[dropped] == before[dropped] + cut
    # A cell's value and traceback texts are whole, or their head marked as cut.
    for before, after in zip(cells, fitted.get("cells", []), strict=True):
        for kind, keys in (("display", ("text/plain",)), ("error", ("evalue",))):
            for item_before, item_after in zip(before[kind], after[kind], strict=True):
                for key in keys:
                    assert _whole_or_cut(item_before[key], item_after[key])
        for item_before, item_after in zip(before["error"], after["error"], strict=True):
            for line_before, line_after in zip(
                item_before["traceback"], item_after["traceback"], strict=True
            ):
                assert _whole_or_cut(line_before, line_after)
        assert after["finished"] == before["finished"]
    # A file is either delivered whole or named as left out, never silently lost.
    for path, data in files.items():
        if path in fitted["files"]:
            assert fitted["files"][path] == data
        else:
            assert fitted["fetch_errors"][path] == result_fit.TOO_LARGE
    assert message == _result(stdout, stderr, files, cells)  # the input is not changed


def fit_small(message: dict[str, Any]) -> dict[str, Any]:
    return result_fit.fit(message, LIMIT, headroom=256)


def test_a_result_that_fits_is_not_cut() -> None:
    message = _result("out", "err", {"a.bin": "QUI="}, [])
    assert result_fit.fit(message) == message


def test_files_go_before_output() -> None:
    message = _result("x" * 500, "", {"big.bin": "A" * 5000}, [])
    fitted = fit_small(message)
    assert fitted["stdout"] == "x" * 500
    assert fitted["files"] == {}
    assert json.dumps(fitted["fetch_errors"]) == json.dumps({"big.bin": result_fit.TOO_LARGE})


def _whole_or_cut(before: str, after: str) -> bool:
    if after == before:
        return True
    return after.endswith(result_fit.CUT_MARK) and before.startswith(
        after.removesuffix(result_fit.CUT_MARK)
    )


def test_many_cells_of_large_values_are_cut_in_a_few_rounds() -> None:
    """Ninety cells of a 70,000-emoji value (12 bytes each as JSON): 76 MB, at the real
    limit; the cut is planned from the fields' sizes, not re-measured after each."""
    value = "\U0001f600" * 70_000
    cell = {"stdout": "", "stdout_dropped": 0, "stderr": "", "stderr_dropped": 0,
            "display": [{"text/plain": value}], "error": [], "finished": True}  # fmt: skip
    message = _result("", "", {}, [dict(cell) for _ in range(90)])
    assert len(wire.encode_payload(message)) > wire.MAX_FRAME
    fitted = result_fit.fit(message)
    assert len(wire.encode_frame(fitted)) <= wire.MAX_FRAME + wire.FRAME_HEADER.size
    assert len(fitted["cells"]) == 90 and all(c["finished"] for c in fitted["cells"])
