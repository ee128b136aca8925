"""The server over the hardened Docker backend: memory limits, files, 128 requests in flight."""

from __future__ import annotations

import asyncio
import base64

import httpx
import pytest

from retool_exec.server import OUTCOME_HEADER
from tests.server.conftest import verl_body

pytestmark = [pytest.mark.server, pytest.mark.docker]


def test_verl_body_runs_in_the_container(docker_url: str, client: httpx.Client) -> None:
    code = "import os, socket\nprint(os.getuid() != 0, socket.gethostname() != '')"
    body = client.post(f"{docker_url}/run_code", json=verl_body(code)).json()
    assert body["status"] == "Success", body
    assert body["run_result"]["stdout"] == "True True\n"


def test_error_traceback_reads_exactly_as_the_library_s(
    docker_url: str, client: httpx.Client
) -> None:
    body = client.post(f"{docker_url}/run_code", json=verl_body("x = 1\n1 / 0")).json()
    assert body["status"] == "Failed"
    assert body["run_result"]["return_code"] == 1
    assert body["run_result"]["stderr"] == (
        'Traceback (most recent call last):\n  File "<sandbox>", line 2, in <module>\n'
        "ZeroDivisionError: division by zero\n"
    )


def test_memory_limit_mb_is_enforced_per_request(docker_url: str, client: httpx.Client) -> None:
    code = "x = bytearray(512 * 1024 * 1024)\nprint('allocated')"
    limited = client.post(f"{docker_url}/run_code", json=verl_body(code, memory_limit_MB=256))
    body = limited.json()
    assert body["status"] == "Failed"
    assert body["run_result"]["status"] == "Finished"
    assert body["run_result"]["return_code"] == 1
    assert body["run_result"]["stderr"].endswith("MemoryError\n")
    roomy = client.post(f"{docker_url}/run_code", json=verl_body(code, memory_limit_MB=1024))
    assert roomy.json()["run_result"]["stdout"] == "allocated\n"


def test_memory_limit_mb_is_also_the_stack_as_on_sandboxfusion(
    docker_url: str, client: httpx.Client
) -> None:
    """SandboxFusion's runner sets the stack limit to ``memory_limit_MB`` (verl sends
    1024): a correct memoized DFS 30,000 deep passes there and segfaulted here."""
    code = (
        "import sys\nfrom functools import lru_cache\nsys.setrecursionlimit(10**6)\n"
        "@lru_cache(None)\ndef f(n):\n    return 0 if n == 0 else f(n - 1) + 1\n"
        "print(f(int(input())))\n"
    )
    body = client.post(f"{docker_url}/run_code", json=verl_body(code, stdin="30000")).json()
    assert (body["status"], body["run_result"]["stdout"]) == ("Success", "30000\n"), body
    unlimited = verl_body(code, stdin="30000", memory_limit_MB=-1)  # SandboxFusion: 8 MiB
    body = client.post(f"{docker_url}/run_code", json=unlimited).json()
    assert (body["status"], body["run_result"]["return_code"]) == ("Failed", -11), body


def test_container_oom_kill_is_finished_minus_9_failed(
    docker_url: str, client: httpx.Client
) -> None:
    # No per-call limit (-1): the container's own 1024 MB limit is the hard cap.
    code = "x = bytearray(3000 * 1024 * 1024)\nprint('allocated')"
    response = client.post(f"{docker_url}/run_code", json=verl_body(code, memory_limit_MB=-1))
    body = response.json()
    assert response.headers[OUTCOME_HEADER] == "oom"
    assert body["status"] == "Failed"
    assert body["run_result"]["status"] == "Finished"
    assert body["run_result"]["return_code"] == -9
    assert body["message"].startswith("out of memory")


def test_timeout_in_the_container(docker_url: str, client: httpx.Client) -> None:
    code = "print('tick', flush=True)\nwhile True: pass"
    body = client.post(f"{docker_url}/run_code", json=verl_body(code, run_timeout=1)).json()
    assert body["run_result"]["status"] == "TimeLimitExceeded"
    assert body["run_result"]["return_code"] is None
    assert body["run_result"]["stdout"] == "tick\n"
    assert body["status"] == "Failed"


def test_files_stay_inside_the_container(docker_url: str, client: httpx.Client) -> None:
    code = (
        "import os\n"
        "print(os.path.isfile('/etc/hostname'), open('in.txt').read())\n"
        "open('out.txt', 'w').write('from the container')\n"
        "os.symlink('/etc/hostname', 'host.txt')\n"
    )
    files = {"in.txt": base64.b64encode(b"hello").decode()}
    body = verl_body(code, files=files, fetch_files=["out.txt", "host.txt"])
    response = client.post(f"{docker_url}/run_code", json=body).json()
    assert response["run_result"]["stdout"] == "True hello\n"
    assert base64.b64decode(response["files"]["out.txt"]) == b"from the container"
    assert "host.txt" not in response["files"]
    assert "not followed" in response["message"]


def test_os_exit_does_not_skip_the_read_back(docker_url: str, client: httpx.Client) -> None:
    # The backend reads the files back itself after the process is gone.
    code = "import os\nopen('f', 'w').write('x')\nos._exit(0)"
    response = client.post(f"{docker_url}/run_code", json=verl_body(code, fetch_files=["f"]))
    body = response.json()
    assert base64.b64decode(body["files"]["f"]) == b"x"
    assert body["message"] == ""


def test_notebook_in_the_container(docker_url: str, client: httpx.Client) -> None:
    cells = ["a = 2", "a * 21", "import os; print('bye', flush=True); os._exit(0)", "print(a)"]
    body = client.post(f"{docker_url}/run_jupyter", json={"cells": cells}).json()
    assert [cell["display"] for cell in body["cells"][:2]] == [[], [{"text/plain": "42"}]]
    assert body["cells"][2]["stdout"] == "bye\n"
    assert len(body["cells"]) == 3
    assert body["status"] == "Failed"


def test_a_notebook_cell_whose_exception_class_answers_for_itself_is_its_error(
    docker_url: str, client: httpx.Client
) -> None:
    """A metaclass whose ``__name__`` raised ended the notebook's interpreter as the agent
    recorded the cell's error: the later cells never ran (a dead kernel; thirty-third
    red-team round). As Jupyter: the cell's error, and the notebook goes on."""
    hostile = (
        "class M(type):\n    @property\n    def __name__(cls):\n        raise RuntimeError\n"
        "class E(Exception, metaclass=M): pass\nraise E('boom')"
    )
    body = client.post(f"{docker_url}/run_jupyter", json={"cells": ["x = 41", hostile, "x + 1"]})
    cells = body.json()["cells"]
    assert [(e["ename"], e["evalue"]) for e in cells[1]["error"]] == [("E", "boom")], cells
    assert cells[2]["display"] == [{"text/plain": "42"}], cells


def test_a_notebooks_long_value_and_error_read_as_on_the_local_backend(
    docker_url: str, local_url: str, client: httpx.Client
) -> None:
    """Each keeps its end, after the seed's marker with the whole count: the agent kept a
    value's head, which this server then cut from the middle and counted wrong (red
    team, the thirty-sixth round)."""
    cells = [
        "list(range(100000))",
        "raise ValueError('A' * 5000 + 'END')",
        # (two functions in turn: python3 folds a frame that repeats the one before)
        "def a(n):\n    return b(n - 1) if n else 1 / 0\ndef b(n):\n    return a(n)\na(150)",
    ]
    shown = {}
    for url in (docker_url, local_url):
        body = client.post(f"{url}/run_jupyter", json={"cells": cells}).json()
        display, (error,), (deep,) = (
            cell.get("display") or cell["error"] for cell in body["cells"]
        )
        shown[url] = (display, error["evalue"], error["traceback"], deep["traceback"])
    value = repr(list(range(100000)))
    chars = len(shown[docker_url][0][0]["text/plain"].split("\n", 1)[1])
    assert shown[docker_url][0] == [
        {"text/plain": f"[... truncated {len(value) - chars} chars ...]\n{value[-chars:]}"}
    ]
    assert shown[docker_url][1].endswith("A" * 100 + "END"), shown[docker_url]
    assert shown[docker_url][3][0].startswith("[... truncated "), shown[docker_url][3][:3]
    assert shown[docker_url] == shown[local_url]


def test_128_concurrent_requests_all_succeed(docker_url: str) -> None:
    async def storm() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=128, max_keepalive_connections=128)
        async with httpx.AsyncClient(timeout=70.0, limits=limits) as client:
            return await asyncio.gather(
                *(
                    client.post(f"{docker_url}/run_code", json=verl_body(f"print({i} * 2)"))
                    for i in range(128)
                )
            )

    responses = asyncio.run(storm())
    assert [response.status_code for response in responses] == [200] * 128
    stdouts = [response.json()["run_result"]["stdout"] for response in responses]
    assert stdouts == [f"{i * 2}\n" for i in range(128)]
    assert {response.json()["status"] for response in responses} == {"Success"}
