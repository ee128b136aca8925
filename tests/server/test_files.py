"""``files`` in, ``fetch_files`` out: by the backend, confined, links never followed."""

from __future__ import annotations

import base64

import httpx
import pytest

from retool_exec import ExecResult, FakeBackend, RunRequest
from retool_exec.server import create_app
from tests.server.conftest import serve, verl_body

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
    assert stdout == "['main.py', 'only.txt']\n"  # the code's own file, as SandboxFusion's


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
    assert response.status_code == 400  # as docs/server.md lists them (the empty one was 422)
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


def test_fetch_budget_is_enforced(local_url: str, client: httpx.Client) -> None:
    # The test server returns at most 4096 bytes of files per request.
    code = "open('small', 'wb').write(b'a' * 1000)\nopen('big', 'wb').write(b'b' * 5000)"
    body = verl_body(code, fetch_files=["small", "big"])
    response = client.post(f"{local_url}/run_code", json=body).json()
    assert base64.b64decode(response["files"]["small"]) == b"a" * 1000
    assert "big" not in response["files"]
    assert "big: 5000 bytes; 3096 bytes of fetch budget left" in response["message"]


def test_a_name_asked_twice_is_answered_once(local_url: str, client: httpx.Client) -> None:
    """It was returned and also named over the budget it had itself used up
    (twenty-eighth red-team round)."""
    code = "open('a', 'wb').write(b'a' * 3000)"
    body = verl_body(code, fetch_files=["a", "./a", "a"])
    response = client.post(f"{local_url}/run_code", json=body).json()
    assert base64.b64decode(response["files"]["a"]) == b"a" * 3000
    assert response["message"] == "fetch_files: ./a: 3000 bytes; 1096 bytes of fetch budget left"


def test_an_upload_in_a_folder_named_like_the_script_moves_the_script(
    local_url: str, client: httpx.Client
) -> None:
    """``main.py/data.txt`` was the sandbox's failure: the script was written over the
    folder (thirty-third red-team round). The script takes the next free name."""
    code = "import os\nprint(open('main.py/data.txt').read(), os.path.basename(__file__))"
    body = verl_body(code, files={"main.py/data.txt": b64(b"x")})
    response = client.post(f"{local_url}/run_code", json=body).json()
    assert response["status"] == "Success", response
    assert response["run_result"]["stdout"] == "x _retool_main.py\n"


def test_an_output_flood_does_not_lose_the_fetched_files(
    local_url: str, client: httpx.Client
) -> None:
    code = "print('y' * 3_000_000)\nopen('f', 'w').write('kept')"
    response = client.post(f"{local_url}/run_code", json=verl_body(code, fetch_files=["f"])).json()
    assert base64.b64decode(response["files"]["f"]) == b"kept"
    stdout = response["run_result"]["stdout"]
    assert stdout.startswith("[... truncated ")
    assert stdout.endswith("y" * 100 + "\n")
    assert len(stdout) < (1 << 20) + 100  # the server's 1 MiB cap


def test_a_sandbox_that_cannot_write_the_files_is_a_sandbox_error(client: httpx.Client) -> None:
    def cannot_write(request: RunRequest) -> ExecResult:
        assert request.files == {"a.txt": b"x"}
        return ExecResult.sandbox_failure(
            "could not write the call's files: disk full", backend="fake", latency=0.01
        )

    with serve(create_app(FakeBackend(cannot_write))) as url:
        body = verl_body("print(1)", files={"a.txt": b64(b"x")}, fetch_files=["a.txt"])
        response = client.post(f"{url}/run_code", json=body)
    answer = response.json()
    assert answer["status"] == "SandboxError"
    assert answer["run_result"]["status"] == "Error"
    assert answer["files"] == {}
    assert "disk full" in answer["message"]
    assert "a.txt: not read back: the sandbox failed" in answer["message"]
    assert response.headers["x-retool-exec-outcome"] == "sandbox_error"


def test_request_fields_reach_the_backend_as_run_request_fields(client: httpx.Client) -> None:
    seen: list[RunRequest] = []

    def record(request: RunRequest) -> ExecResult:
        seen.append(request)
        return ExecResult(
            True,
            "",
            "",
            0,
            False,
            0.01,
            files={"out/r.bin": b"\x00\xff", "x": b"y"},
            fetch_errors={"gone": "not found"},
        )

    with serve(create_app(FakeBackend(record))) as url:
        body = verl_body(
            "print(1)",
            stdin="héllo\n",
            files={
                "./in//a.txt": b64(b"A"),
                "skip/IGNORE_THIS_FILE": b64(b"no"),
                "/abs/IGNORE_THIS_FILE.txt": b64(b"no"),
                "null.txt": None,
            },
            fetch_files=["out/r.bin", "./x", "gone"],
        )
        answer = client.post(f"{url}/run_code", json=body).json()
    [request] = seen
    assert request.code == "print(1)"
    assert request.stdin == "héllo\n".encode()
    assert dict(request.files) == {"in/a.txt": b"A"}
    assert request.fetch == ("out/r.bin", "x", "gone")
    assert answer["files"] == {"out/r.bin": b64(b"\x00\xff"), "./x": b64(b"y")}
    assert answer["message"] == "fetch_files: gone: not found"
    assert answer["status"] == "Success"


def test_absent_stdin_stays_absent(client: httpx.Client) -> None:
    backend = FakeBackend(lambda _request: "")
    with serve(create_app(backend)) as url:
        client.post(f"{url}/run_code", json=verl_body("1"))
        client.post(f"{url}/run_code", json=verl_body("1", stdin=""))
    assert [request.stdin for request in backend.requests] == [None, b""]


def test_absolute_paths_inside_the_working_directory_are_accepted() -> None:
    """As SandboxFusion accepts them; anything else absolute is refused with the reason."""
    from retool_exec.server.files import RequestRejected, normalize_path

    assert normalize_path("/tmp/data/a.txt") == "data/a.txt"
    for outside in ("/etc/passwd", "/tmp/../etc/passwd", "/tmp/"):
        with pytest.raises(RequestRejected) as refused:
            normalize_path(outside)
        assert repr(outside) in str(refused.value)  # the client's path, not what was left of it
        assert refused.value.status == 400
