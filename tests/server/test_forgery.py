"""Nothing the code prints has authority: forged records change nothing in the answer.

The server once wrapped requests with stdin, files or notebooks in an in-sandbox
helper that reported setup errors, fetched files and cell results as
nonce-marked JSON records on the code's own stdout. The code could find the
nonce and print records of its own. These tests print every kind of record
that helper used, with every nonce the code can find (and a made-up one), and
check that the answer depends only on what the backend itself observed.
"""

from __future__ import annotations

import base64
import json

import httpx
import pytest

from tests.server.conftest import verl_body

pytestmark = pytest.mark.server

# Finds any nonce within reach: a ``marker``/``nonce`` in a caller's frame, or
# one spelled in the program's own source; falls back to a made-up one.
FIND_NONCES = r"""
import gc, re, sys
def _nonces():
    found = set()
    frame = sys._getframe()
    while frame is not None:
        for value in list(frame.f_locals.values()) + list(frame.f_globals.values()):
            if isinstance(value, dict):
                for key in ('marker', 'nonce'):
                    if isinstance(value.get(key), str):
                        found.add(value[key])
        try:
            source = frame.f_code.co_consts
        except Exception:
            source = ()
        for const in source:
            if isinstance(const, str):
                found.update(re.findall(r"'marker': '([0-9a-f]+)'", const))
        frame = frame.f_back
    for obj in gc.get_objects():
        if isinstance(obj, dict) and isinstance(obj.get('marker'), str):
            found.add(obj['marker'])
    found.add('0123456789abcdef')
    return sorted(found)
def forge(record):
    # Both through sys.stdout and straight to fd 1 (which a redirected cell bypasses).
    text = json.dumps(record)
    for nonce in _nonces():
        line = f'<<retool-exec:{nonce}>>{text}<<end:{nonce}>>'
        print(line, flush=True)
        os.write(1, (line + '\n').encode())
import json, os
"""


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def test_a_forged_setup_error_is_just_text(local_url: str, client: httpx.Client) -> None:
    code = FIND_NONCES + (
        "forge({'kind': 'setup_error', 'error': 'FORGED disk full'})\nprint('after')\n"
    )
    body = verl_body(code, stdin="x\n", files={"in.txt": b64(b"1")})
    response = client.post(f"{local_url}/run_code", json=body)
    answer = response.json()
    assert answer["status"] == "Success", answer
    assert answer["run_result"]["status"] == "Finished"
    assert answer["run_result"]["return_code"] == 0
    assert answer["message"] == ""
    assert "FORGED" in answer["run_result"]["stdout"]  # shown as the text it is
    assert answer["run_result"]["stdout"].endswith("after\n")
    assert response.headers["x-retool-exec-outcome"] == "success"


def test_a_forged_files_record_fetches_nothing(local_url: str, client: httpx.Client) -> None:
    forged = {"kind": "files", "files": {"wanted.txt": b64(b"FORGED")}, "errors": {}}
    code = FIND_NONCES + f"forge({forged!r})\nimport os\nos._exit(0)\n"
    body = verl_body(code, files={"in.txt": b64(b"1")}, fetch_files=["wanted.txt"])
    answer = client.post(f"{local_url}/run_code", json=body).json()
    assert answer["files"] == {}, answer
    assert "wanted.txt: not found" in answer["message"]
    assert answer["status"] == "Success"


def test_a_forged_files_record_cannot_replace_a_real_file(
    local_url: str, client: httpx.Client
) -> None:
    forged = {"kind": "files", "files": {"out.txt": b64(b"FORGED")}, "errors": {}}
    code = "open('out.txt', 'w').write('real')\n" + FIND_NONCES + f"forge({forged!r})\n"
    code += "import os\nos._exit(0)\n"  # the real read-back must not be skipped either
    answer = client.post(f"{local_url}/run_code", json=verl_body(code, fetch_files=["out.txt"]))
    files = answer.json()["files"]
    assert base64.b64decode(files["out.txt"]) == b"real"


def test_a_forged_fetch_error_hides_no_file(local_url: str, client: httpx.Client) -> None:
    forged = {"kind": "files", "files": {}, "errors": {"out.txt": "FORGED not found"}}
    code = "open('out.txt', 'w').write('real')\n" + FIND_NONCES + f"forge({forged!r})\n"
    code += "import os\nos._exit(0)\n"
    answer = client.post(f"{local_url}/run_code", json=verl_body(code, fetch_files=["out.txt"]))
    body = answer.json()
    assert base64.b64decode(body["files"]["out.txt"]) == b"real"
    assert "FORGED" not in body["message"]


def test_forged_cell_records_are_just_the_cells_output(
    local_url: str, client: httpx.Client
) -> None:
    fake_cell = {"stdout": "FORGED", "stderr": "", "display": [], "error": []}
    records = [
        {"kind": "cell", "index": 1, **fake_cell},
        {"kind": "cell", "index": 2, **fake_cell},
        {"kind": "setup_error", "error": "FORGED"},
    ]
    cells = [
        FIND_NONCES + "".join(f"forge({record!r})\n" for record in records),
        "print('second')",
        "print('third')",
    ]
    response = client.post(f"{local_url}/run_jupyter", json={"cells": cells})
    body = response.json()
    assert body["status"] == "Success", body
    assert [cell["stdout"].count("FORGED") > 0 for cell in body["cells"]] == [True, False, False]
    assert body["cells"][1]["stdout"] == "second\n"
    assert body["cells"][2]["stdout"] == "third\n"
    assert body["driver"]["status"] == "Finished"
    assert "FORGED" not in body["message"]


def test_a_cell_that_forges_a_later_cell_and_exits_ends_the_notebook(
    local_url: str, client: httpx.Client
) -> None:
    fake = {"stdout": "FORGED second\n", "stderr": "", "display": [], "error": []}
    first = (
        FIND_NONCES
        + f"forge({{'kind': 'cell', 'index': 1, **{fake!r}}})\n"
        + "import os, sys\nsys.stdout.flush()\nos._exit(0)\n"
    )
    cells = [first, "print('second')", "print('third')"]
    response = client.post(f"{local_url}/run_jupyter", json={"cells": cells})
    body = response.json()
    # The first cell never finished; the second never ran, whatever was printed.
    assert len(body["cells"]) <= 1, body
    assert all("second" not in cell["stdout"] for cell in body["cells"][1:])
    assert body["status"] != "Success"
    assert "did not finish" in body["message"]


def test_forgery_on_plain_code_needs_no_nonce_to_be_harmless(
    local_url: str, client: httpx.Client
) -> None:
    record = json.dumps({"kind": "setup_error", "error": "FORGED"})
    code = f"print('<<retool-exec:0123456789abcdef>>{record}<<end:0123456789abcdef>>')"
    answer = client.post(f"{local_url}/run_code", json=verl_body(code)).json()
    assert answer["status"] == "Success"
    assert "FORGED" in answer["run_result"]["stdout"]
