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


cell_streams = st.fixed_dictionaries(
    {"stdout": stream_text, "stdout_dropped": st.just(0), "stderr": stream_text,
     "stderr_dropped": st.just(0)}
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
