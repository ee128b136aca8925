"""``files`` in, ``fetch_files`` out: inside the sandbox only, confined, links never followed."""

from __future__ import annotations

import base64

import httpx
import pytest

from tests.server.conftest import verl_body

pytestmark = pytest.mark.server


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def test_round_trip(local_url: str, client: httpx.Client) -> None:
    code = (
        "import os\n"
        "data = open('in/data.csv').read()\n"
        "print(data.upper(), end='')\n"
        "os.makedirs('out', exist_ok=True)\n"
        "open('out/result.bin', 'wb').write(bytes(range(256)))\n"
    )
    body = verl_body(
        code,
        files={"in/data.csv": b64(b"a,b\n1,2\n"), "./skipped.txt": None},
        fetch_files=["out/result.bin", "./in/data.csv"],
    )
    response = client.post(f"{local_url}/run_code", json=body).json()
    assert response["status"] == "Success", response
    assert response["run_result"]["stdout"] == "A,B\n1,2\n"
    assert response["message"] == ""
    assert base64.b64decode(response["files"]["out/result.bin"]) == bytes(range(256))
    assert base64.b64decode(response["files"]["./in/data.csv"]) == b"a,b\n1,2\n"


def test_code_runs_in_a_fresh_directory_it_can_list(local_url: str, client: httpx.Client) -> None:
    body = verl_body("import os\nprint(sorted(os.listdir('.')))", files={"only.txt": b64(b"1")})
    stdout = client.post(f"{local_url}/run_code", json=body).json()["run_result"]["stdout"]
    assert stdout == "['only.txt']\n"


def test_files_are_fetched_even_after_an_exception(local_url: str, client: httpx.Client) -> None:
    code = "open('partial.txt', 'w').write('so far')\nraise ValueError('late')"
    body = verl_body(code, fetch_files=["partial.txt"])
    response = client.post(f"{local_url}/run_code", json=body).json()
    assert response["status"] == "Failed"
    assert response["run_result"]["return_code"] == 1
    assert response["run_result"]["stderr"].endswith("ValueError: late\n")
    assert 'File "<sandbox>", line 2' in response["run_result"]["stderr"]
    assert base64.b64decode(response["files"]["partial.txt"]) == b"so far"


def test_missing_and_special_files_are_reported(local_url: str, client: httpx.Client) -> None:
    code = "import os\nos.mkfifo('pipe')\nos.mkdir('adir')"
    body = verl_body(code, fetch_files=["nope.txt", "pipe", "adir"])
    response = client.post(f"{local_url}/run_code", json=body).json()
    assert response["status"] == "Success"
    assert response["files"] == {}
    message = response["message"]
    assert "nope.txt: not found" in message
    assert "pipe: not a regular file" in message
    assert "adir: not a regular file" in message


@pytest.mark.parametrize(
    "path",
    ["../escape.txt", "a/../../escape.txt", "/etc/passwd", "a\x00b", "", ".", "./"],
)
def test_unconfined_upload_paths_are_rejected(
    local_url: str, client: httpx.Client, path: str
) -> None:
    body = verl_body("print(1)", files={path: b64(b"x")})
    response = client.post(f"{local_url}/run_code", json=body)
    assert response.status_code in (400, 422)
    assert "path" in response.json()["detail"]


@pytest.mark.parametrize("path", ["../../etc/passwd", "/etc/hostname", "x/../../y"])
def test_unconfined_fetch_paths_are_rejected(
    local_url: str, client: httpx.Client, path: str
) -> None:
    response = client.post(f"{local_url}/run_code", json=verl_body("print(1)", fetch_files=[path]))
    assert response.status_code == 400


def test_invalid_base64_and_file_dir_clash_are_rejected(
    local_url: str, client: httpx.Client
) -> None:
    bad = client.post(f"{local_url}/run_code", json=verl_body("1", files={"a": "@@not b64@@"}))
    assert bad.status_code == 400
    assert "base64" in bad.json()["detail"]
    clash = client.post(
        f"{local_url}/run_code", json=verl_body("1", files={"a": b64(b"1"), "a/b": b64(b"2")})
    )
    assert clash.status_code == 400


def test_symlinks_planted_by_the_code_are_not_followed(
    local_url: str, client: httpx.Client
) -> None:
    code = (
        "import os\n"
        "os.symlink('/etc/passwd', 'leak.txt')\n"
        "os.symlink('/etc', 'etcdir')\n"
        "os.symlink(os.path.abspath('..'), 'up')\n"
    )
    body = verl_body(code, fetch_files=["leak.txt", "etcdir/passwd", "up/x"])
    response = client.post(f"{local_url}/run_code", json=body).json()
    assert response["status"] == "Success"
    assert response["files"] == {}
    assert response["message"].count("not followed") == 3


def test_fetch_budget_is_enforced_inside_the_sandbox(local_url: str, client: httpx.Client) -> None:
    # The test server returns at most 4096 bytes of files per request.
    code = "open('small', 'wb').write(b'a' * 1000)\nopen('big', 'wb').write(b'b' * 5000)"
    body = verl_body(code, fetch_files=["small", "big"])
    response = client.post(f"{local_url}/run_code", json=body).json()
    assert base64.b64decode(response["files"]["small"]) == b"a" * 1000
    assert "big" not in response["files"]
    assert "big: 5000 bytes; 3096 bytes of fetch budget left" in response["message"]


def test_an_output_flood_does_not_lose_the_fetched_files(
    local_url: str, client: httpx.Client
) -> None:
    code = "print('y' * 200_000)\nopen('f', 'w').write('kept')"
    response = client.post(f"{local_url}/run_code", json=verl_body(code, fetch_files=["f"])).json()
    assert base64.b64decode(response["files"]["f"]) == b"kept"
    stdout = response["run_result"]["stdout"]
    assert stdout.startswith("[... truncated ")
    assert stdout.endswith("y" * 100 + "\n")
    assert len(stdout) < 4200


def test_a_file_the_sandbox_cannot_write_is_a_setup_error_record() -> None:
    # The server refuses such a request up front; here the inbox is driven
    # directly, to show it reports (not crashes) when a write fails.
    from retool_exec import LocalConfig, Sandbox
    from retool_exec.server.files import FileSpec
    from retool_exec.server.programs import build_program, code_spec, extract_records

    files = FileSpec(uploads={"a": b64(b"1"), "a/b": b64(b"2")}, fetch=[])
    spec = code_spec("print('ran')", files=files, stdin=None, nonce="n1", fetch_budget=0)
    with Sandbox(LocalConfig(timeout=10.0)) as sandbox:
        result = sandbox.run_code(build_program("run", spec))
    records = extract_records(result.stdout, "n1")
    assert result.returncode == 70
    assert records.text == ""
    [record] = records.of_kind("setup_error")
    assert "could not write the request's files" in record["error"]
