"""``POST /run_code`` in SandboxFusion's exact shape, as verl calls it (local backend)."""

from __future__ import annotations

import httpx
import pytest

from retool_exec import LocalConfig
from retool_exec.server import OUTCOME_HEADER, create_app
from tests.server.conftest import PREFIX, serve, verl_body

pytestmark = pytest.mark.server

RESPONSE_KEYS = {
    "status",
    "message",
    "compile_result",
    "run_result",
    "executor_pod_name",
    "files",
}
RESULT_KEYS = {"status", "execution_time", "return_code", "stdout", "stderr"}


def test_verl_body_success_has_the_exact_shape(local_url: str, client: httpx.Client) -> None:
    response = client.post(f"{local_url}/run_code", json=verl_body("print(2 + 3)"))
    assert response.status_code == 200
    body = response.json()
    assert set(body) == RESPONSE_KEYS
    assert body["status"] == "Success"
    assert body["message"] == ""
    assert body["compile_result"] is None
    assert body["executor_pod_name"] is None
    assert body["files"] == {}
    run = body["run_result"]
    assert set(run) == RESULT_KEYS
    assert run["status"] == "Finished"
    assert run["return_code"] == 0
    assert run["stdout"] == "5\n"
    assert run["stderr"] == ""
    assert 0 < run["execution_time"] < 30
    assert response.headers[OUTCOME_HEADER] == "success"


def test_error_is_failed_with_the_traceback(local_url: str, client: httpx.Client) -> None:
    response = client.post(f"{local_url}/run_code", json=verl_body("x = 1\n1 / 0"))
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "Failed"
    assert body["run_result"]["status"] == "Finished"
    assert body["run_result"]["return_code"] == 1
    stderr = body["run_result"]["stderr"]
    assert stderr.startswith("Traceback (most recent call last):\n")
    assert 'File "<sandbox>", line 2, in <module>\n' in stderr
    assert stderr.endswith("ZeroDivisionError: division by zero\n")


def test_timeout_is_time_limit_exceeded_with_partial_output(
    local_url: str, client: httpx.Client
) -> None:
    code = "import time\nprint('started', flush=True)\ntime.sleep(30)"
    response = client.post(f"{local_url}/run_code", json=verl_body(code, run_timeout=1))
    assert response.status_code == 200
    body = response.json()
    run = body["run_result"]
    assert run["status"] == "TimeLimitExceeded"
    assert run["return_code"] is None
    assert run["stdout"] == "started\n"
    assert body["status"] == "Failed"
    assert 1.0 <= run["execution_time"] < 10
    assert response.headers[OUTCOME_HEADER] == "timeout"


def test_tutorial_body_with_code_only(local_url: str, client: httpx.Client) -> None:
    response = client.post(f"{local_url}/run_code", json={"code": "print('hi')"})
    assert response.status_code == 200
    assert response.json()["run_result"]["stdout"] == "hi\n"


def test_nulls_and_unknown_fields_are_tolerated(local_url: str, client: httpx.Client) -> None:
    body = {
        "code": "print('ok')",
        "language": None,
        "run_timeout": None,
        "files": None,
        "fetch_files": None,
        "memory_limit_MB": None,
        "some_future_field": {"nested": [1, 2]},
        "kernel": "whatever",
    }
    response = client.post(f"{local_url}/run_code", json=body)
    assert response.status_code == 200
    assert response.json()["status"] == "Success"


def test_request_id_is_echoed_only_when_sent(local_url: str, client: httpx.Client) -> None:
    echoed = client.post(
        f"{local_url}/run_code", json={"code": "print(1)", "request_id": "req-42"}
    ).json()
    assert echoed["request_id"] == "req-42"
    plain = client.post(f"{local_url}/run_code", json={"code": "print(1)"}).json()
    assert "request_id" not in plain


def test_stdin_is_readable_and_verl_none_string_is_harmless(
    local_url: str, client: httpx.Client
) -> None:
    code = "import sys\nprint(input())\nprint(sys.stdin.read().split())"
    body = client.post(f"{local_url}/run_code", json=verl_body(code, stdin="a\nb c\n")).json()
    assert body["run_result"]["stdout"] == "a\n['b', 'c']\n"
    # verl sends str(None) == "None" as stdin; code that ignores stdin is unaffected,
    # and tracebacks keep the user's own line numbers.
    body = client.post(f"{local_url}/run_code", json=verl_body("\n\n1/0", stdin="None")).json()
    assert 'File "<sandbox>", line 3, in <module>' in body["run_result"]["stderr"]
    assert "retool" not in body["run_result"]["stderr"]


def test_sys_exit_status_is_kept(local_url: str, client: httpx.Client) -> None:
    body = client.post(f"{local_url}/run_code", json=verl_body("import sys; sys.exit(3)")).json()
    assert body["status"] == "Failed"
    assert body["run_result"]["return_code"] == 3


def test_long_answers_come_back_whole(local_url: str, client: httpx.Client) -> None:
    """Reward code compares stdout: a 200,000-character answer must not be cut (issue 12.1)."""
    code = "print('x' * 200000, end=''); print('y' * 100, file=__import__('sys').stderr, end='')"
    result = client.post(f"{local_url}/run_code", json={"code": code}).json()["run_result"]
    assert result["stdout"] == "x" * 200000
    assert result["stderr"] == "y" * 100


def test_past_the_cap_the_tail_is_kept_with_the_seed_marker() -> None:
    from retool_exec.server.settings import ServerSettings

    app = create_app(LocalConfig(timeout=10.0), settings=ServerSettings(output_chars=4096))
    with serve(app) as url, httpx.Client(timeout=30) as client:
        code = "print('x' * 10000, end='')"
        stdout = client.post(f"{url}/run_code", json={"code": code}).json()["run_result"]["stdout"]
    assert stdout == "[... truncated 5904 chars ...]\n" + "x" * 4096


def test_ping(local_url: str, client: httpx.Client) -> None:
    response = client.get(f"{local_url}/v1/ping")
    assert response.status_code == 200
    assert response.json() == "pong"


def test_prefix_mounting(local_url: str, client: httpx.Client) -> None:
    response = client.post(f"{local_url}{PREFIX}/run_code", json={"code": "print(7)"})
    assert response.status_code == 200
    assert response.json()["run_result"]["stdout"] == "7\n"
    assert client.get(f"{local_url}{PREFIX}/v1/ping").json() == "pong"
    assert client.post(f"{local_url}/elsewhere/run_code", json={"code": "1"}).status_code == 404


def test_unsupported_language_is_a_clear_400(local_url: str, client: httpx.Client) -> None:
    response = client.post(f"{local_url}/run_code", json=verl_body("int main(){}", language="cpp"))
    assert response.status_code == 400
    assert "Python only" in response.json()["detail"]


def test_v1_exec_returns_an_exec_result(local_url: str, client: httpx.Client) -> None:
    response = client.post(f"{local_url}/v1/exec", json={"code": "print(2 + 3)", "timeout": 5})
    assert response.status_code == 200
    result = response.json()
    assert result["ok"] is True
    assert result["stdout"] == "5\n"
    assert result["outcome"] == "success"
    assert result["backend"] == "local"
    typo = client.post(f"{local_url}/v1/exec", json={"code": "1", "timeuot": 5})
    assert typo.status_code == 422
    assert "timeuot" in typo.json()["detail"]


def test_metrics_expose_the_sandbox_and_the_queue(local_url: str, client: httpx.Client) -> None:
    metrics = client.get(f"{local_url}/v1/metrics").json()
    assert metrics["server/max_concurrency"] == 4
    assert "sandbox/success_rate" in metrics


def test_openapi_documents_the_bodies(local_url: str, client: httpx.Client) -> None:
    schema = client.get(f"{local_url}/openapi.json").json()
    assert {"/run_code", "/run_jupyter", "/v1/exec", "/v1/ping"} <= set(schema["paths"])
    body = schema["paths"]["/run_code"]["post"]["requestBody"]["content"]["application/json"]
    assert "memory_limit_MB" in body["schema"]["properties"]


def test_code_runs_as_a_script_like_sandboxfusion(local_url: str, client: httpx.Client) -> None:
    """SandboxFusion runs ``python FILE``: ``__file__`` and ``sys.argv[0]`` name a real file."""
    code = "import os, sys\nprint(os.path.basename(__file__), sys.argv[0] == __file__)"
    body = client.post(f"{local_url}/run_code", json={"code": code}).json()
    assert body["run_result"]["stdout"] == "main.py True\n", body
