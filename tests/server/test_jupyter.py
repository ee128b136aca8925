"""``POST /run_jupyter``: cells in order, one namespace, per-cell output (local backend)."""

from __future__ import annotations

import base64

import httpx
import pytest

from retool_exec.server import OUTCOME_HEADER

pytestmark = pytest.mark.server


def run_cells(url: str, client: httpx.Client, **body: object) -> dict[str, object]:
    response = client.post(f"{url}/run_jupyter", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, object] = response.json()
    return result


def test_sandbox_fusions_example_cells(local_url: str, client: httpx.Client) -> None:
    cells = [
        "a = 123",
        "a",
        "print(a)",
        'import sys; sys.stderr.write("stderr message")',
        'raise RuntimeError("error message")',
        "a + 1",
    ]
    body = run_cells(local_url, client, cells=cells)
    assert set(body) == {"status", "message", "driver", "cells", "executor_pod_name", "files"}
    assert body["status"] == "Success"
    driver = body["driver"]
    assert isinstance(driver, dict)
    assert driver["status"] == "Finished"
    assert driver["return_code"] == 0
    out = body["cells"]
    assert isinstance(out, list)
    assert len(out) == 6
    assert out[0] == {"stdout": "", "stderr": "", "display": [], "error": []}
    assert out[1]["display"] == [{"text/plain": "123"}]
    assert out[2]["stdout"] == "123\n"
    assert out[3]["stderr"] == "stderr message"
    error = out[4]["error"][0]
    assert error["ename"] == "RuntimeError"
    assert error["evalue"] == "error message"
    assert 'File "<cell 5>", line 1' in "".join(error["traceback"])
    assert out[5]["display"] == [{"text/plain": "124"}]  # later cells still run


def test_cell_timeout_interrupts_one_cell(local_url: str, client: httpx.Client) -> None:
    cells = ["import time", "time.sleep(30)", "print('after')"]
    body = run_cells(local_url, client, cells=cells, cell_timeout=0.5, total_timeout=15)
    out = body["cells"]
    assert isinstance(out, list)
    assert out[1]["error"][0]["ename"] == "TimeoutError"
    assert out[1]["error"][0]["evalue"] == "the cell ran longer than its 0.5 s limit"
    assert 'File "<cell 2>"' in "".join(out[1]["error"][0]["traceback"])
    assert out[2]["stdout"] == "after\n"
    assert body["status"] == "Success"


def test_total_timeout_keeps_the_finished_cells(local_url: str, client: httpx.Client) -> None:
    cells = ["print('first')", "import time; print('second'); time.sleep(30)", "print('never')"]
    body = run_cells(local_url, client, cells=cells, total_timeout=1)
    assert body["status"] == "Failed"
    driver = body["driver"]
    assert isinstance(driver, dict)
    assert driver["status"] == "TimeLimitExceeded"
    assert driver["return_code"] is None
    out = body["cells"]
    assert isinstance(out, list)
    assert [cell["stdout"] for cell in out] == ["first\n", "second\n"]
    assert out[1]["error"][0]["ename"] == "TimeoutError"
    assert "2 of 3 cell(s) did not finish" in str(body["message"])


def test_a_cell_that_ignores_the_interrupt_is_killed(local_url: str, client: httpx.Client) -> None:
    cells = [
        "print('first')",
        "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(30)",
        "print('never')",
    ]
    body = run_cells(local_url, client, cells=cells, cell_timeout=0.5, total_timeout=15)
    assert body["status"] == "Failed"
    out = body["cells"]
    assert isinstance(out, list)
    assert len(out) == 2
    assert out[1]["error"] == [
        {
            "ename": "TimeoutError",
            "evalue": "the cell ran longer than its 0.5 s limit and was killed",
            "traceback": [],
        }
    ]
    assert "2 of 3 cell(s) did not finish" in str(body["message"])


def test_output_of_a_subprocess_belongs_to_its_cell(local_url: str, client: httpx.Client) -> None:
    cells = [
        "import subprocess, sys",
        "subprocess.run([sys.executable, '-c', 'print(42)'])",
        "print('next')",
    ]
    out = run_cells(local_url, client, cells=cells)["cells"]
    assert isinstance(out, list)
    assert [cell["stdout"] for cell in out] == ["", "42\n", "next\n"]


def test_cells_share_files(local_url: str, client: httpx.Client) -> None:
    cells = ["text = open('in.txt').read()", "open('out.txt', 'w').write(text * 2)"]
    body = run_cells(
        local_url,
        client,
        cells=cells,
        files={"in.txt": base64.b64encode(b"ab").decode()},
        fetch_files=["out.txt"],
    )
    files = body["files"]
    assert isinstance(files, dict)
    assert base64.b64decode(files["out.txt"]) == b"abab"


def test_bad_kernel_and_too_many_cells_are_4xx(local_url: str, client: httpx.Client) -> None:
    kernel = client.post(f"{local_url}/run_jupyter", json={"cells": ["1"], "kernel": "ir"})
    assert kernel.status_code == 400
    many = client.post(f"{local_url}/run_jupyter", json={"cells": ["1"] * 129})
    assert many.status_code == 413
    missing = client.post(f"{local_url}/run_jupyter", json={"cell": ["1"]})
    assert missing.status_code == 422


def test_an_interpreter_that_exits_zero_mid_notebook_is_no_success_in_the_header(
    local_url: str, client: httpx.Client
) -> None:
    """The body said ``Failed`` (a cell did not finish), the header ``success`` (red team
    B, the thirty-sixth round): a client reading one or the other scored it differently."""
    cells = ["print('a')", "import os; os._exit(0)", "print('never')"]
    response = client.post(f"{local_url}/run_jupyter", json={"cells": cells})
    assert response.json()["status"] == "Failed"
    assert response.headers[OUTCOME_HEADER] == "error"
