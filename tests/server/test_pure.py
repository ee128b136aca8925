"""The server's pure parts: statuses, stream cuts, paths, files, cells, tokens, adapters."""

from __future__ import annotations

import base64
import inspect
import json

import pytest

from retool_exec import ExecResult, FakeBackend, Outcome, Sandbox
from retool_exec._models import CellResult
from retool_exec.adapters import make_async_code_interpreter, make_code_interpreter
from retool_exec.server.files import RequestRejected, check_files, fetched_files, normalize_path
from retool_exec.server.guards import token_matches
from retool_exec.server.jupyter import notebook_cells
from retool_exec.server.results import command_result, cut_stream, run_status
from retool_exec.server.schemas import CommandRunResult, CommandRunStatus, RunStatus
from retool_exec.server.settings import ServerSettings, normalize_prefix

pytestmark = pytest.mark.server


def result(outcome: Outcome, returncode: int | None, *, timed_out: bool = False) -> ExecResult:
    return ExecResult(
        ok=outcome is Outcome.SUCCESS,
        stdout="",
        stderr="",
        returncode=returncode,
        timed_out=timed_out,
        latency=0.5,
        outcome=outcome,
    )


@pytest.mark.parametrize(
    ("outcome", "returncode", "expected"),
    [
        (Outcome.SUCCESS, 0, ("Finished", 0, "Success")),
        (Outcome.ERROR, 1, ("Finished", 1, "Failed")),
        (Outcome.SIGNAL, -11, ("Finished", -11, "Failed")),
        (Outcome.OOM, -9, ("Finished", -9, "Failed")),
        (Outcome.OOM, None, ("Finished", -9, "Failed")),
        (Outcome.TIMEOUT, None, ("TimeLimitExceeded", None, "Failed")),
        (Outcome.CPU_LIMIT, -24, ("TimeLimitExceeded", None, "Failed")),
        (Outcome.SANDBOX_ERROR, None, ("Error", None, "SandboxError")),
        (Outcome.REJECTED, None, ("Error", None, "SandboxError")),
    ],
)
def test_status_derivation(
    outcome: Outcome, returncode: int | None, expected: tuple[str, int | None, str]
) -> None:
    timed_out = outcome is Outcome.TIMEOUT
    run = command_result(result(outcome, returncode, timed_out=timed_out), stdout="", stderr="")
    assert (run.status.value, run.return_code, run_status(run).value) == expected
    assert run.execution_time == 0.5


def test_run_status_follows_sandbox_fusions_order() -> None:
    error = CommandRunResult(status=CommandRunStatus.ERROR)
    tle = CommandRunResult(status=CommandRunStatus.TIME_LIMIT_EXCEEDED)
    ok = CommandRunResult(status=CommandRunStatus.FINISHED, return_code=0)
    assert run_status(tle, error) is RunStatus.SANDBOX_ERROR
    assert run_status(ok, tle) is RunStatus.FAILED
    assert run_status(None, ok) is RunStatus.SUCCESS


def test_cut_stream_counts_every_dropped_char() -> None:
    assert cut_stream("abc", 0, 10) == ("abc", 0)
    assert cut_stream("abcdef", 0, 4) == ("[... truncated 2 chars ...]\ncdef", 2)
    already = "[... truncated 100 chars ...]\n" + "x" * 8
    assert cut_stream(already, 100, 4) == ("[... truncated 104 chars ...]\nxxxx", 104)
    assert cut_stream("tail", 7, 10) == ("[... truncated 7 chars ...]\ntail", 7)


@pytest.mark.parametrize(
    ("path", "normal"),
    [("a.txt", "a.txt"), ("./a//b/./c", "a/b/c"), ("..a/b..", "..a/b..")],
)
def test_paths_are_normalized(path: str, normal: str) -> None:
    assert normalize_path(path) == normal


@pytest.mark.parametrize(
    "path", ["/abs", "../x", "a/../../x", "a\x00", "", ".", "//", "a/..", "dir/", "dir/."]
)
def test_unconfined_paths_are_refused(path: str) -> None:
    with pytest.raises(RequestRejected):
        normalize_path(path)


def test_check_files_caps_and_leniency() -> None:
    settings = ServerSettings(max_file_bytes=10, max_files_total_bytes=15, max_files=2)
    wrapped = base64.encodebytes(b"123456789").decode()  # with a newline
    spec = check_files({"a": wrapped, "b": None}, ["./a", "a"], settings)
    assert spec.uploads == {"a": b"123456789"}
    assert spec.fetch == [("./a", "a"), ("a", "a")]
    assert spec.fetch_paths == ("a",)
    with pytest.raises(RequestRejected, match="limit is 10"):
        check_files({"a": base64.b64encode(b"x" * 11).decode()}, [], settings)
    six = base64.b64encode(b"x" * 9).decode()
    with pytest.raises(RequestRejected, match="total"):
        check_files({"a": six, "b": six}, [], settings)
    with pytest.raises(RequestRejected, match="at most 2"):
        check_files({}, ["a", "b", "c"], settings)


def test_null_and_ignored_uploads_are_skipped_unchecked() -> None:
    # SandboxFusion writes neither; their paths are not even looked at.
    files = {"/abs/IGNORE_THIS_FILE": "x", "../IGNORE_THIS_FILE.txt": "@@", "../n": None}
    assert check_files(files, [], ServerSettings()).uploads == {}
    with pytest.raises(RequestRejected, match="absolute"):
        check_files({"/abs/file": "eA=="}, [], ServerSettings())


def test_fetched_files_come_from_the_result_only() -> None:
    spec = check_files({}, ["./a", "b", "c", "d"], ServerSettings())
    found = ExecResult(
        True,
        "<<retool-exec:x>>{}<<end:x>>",
        "",
        0,
        False,
        0.1,
        files={"a": b"aaaa", "c": b"c" * 10},
        fetch_errors={"b": "not found"},
    )
    files, note = fetched_files(found, spec, budget=8)
    assert files == {"./a": base64.b64encode(b"aaaa").decode()}
    assert note == (
        "fetch_files: b: not found; c: 10 bytes; 4 bytes of fetch budget left; "
        "d: not returned by the sandbox"
    )
    assert fetched_files(found, check_files({}, [], ServerSettings()), budget=8) == ({}, "")


def test_notebook_cells_follow_the_backends_record() -> None:
    cells = [
        CellResult(
            stdout="x" * 300, stdout_dropped_chars=5, display=[{"text/plain": "1"}], finished=True
        ),
        CellResult(
            error=[{"ename": "KeyboardInterrupt", "evalue": "", "traceback": ["tb\n"]}],
            finished=True,
            timed_out=True,
        ),
        CellResult(stdout="partial", finished=False),
    ]
    died = ExecResult(True, "", "", 0, False, 0.1, cells=cells)
    out, finished, note = notebook_cells(
        died, 4, cell_chars=128, cell_timeout=0.5, total_timeout=10
    )
    assert finished == 2
    assert note == "2 of 4 cell(s) did not finish"
    assert out[0].stdout == "[... truncated 177 chars ...]\n" + "x" * 128
    assert out[0].display == [{"text/plain": "1"}]
    assert out[1].error == [
        {
            "ename": "TimeoutError",
            "evalue": "the cell ran longer than its 0.5 s limit",
            "traceback": ["tb\n"],
        }
    ]
    assert out[2].stdout == "partial"
    assert [e["ename"] for e in out[2].error] == ["DeadKernelError"]
    assert "exit status 0" in out[2].error[0]["evalue"]
    timed = died.model_copy(update={"timed_out": True, "returncode": None})
    assert (
        notebook_cells(timed, 4, cell_chars=128, cell_timeout=0, total_timeout=10)[0][2].error[0][
            "evalue"
        ]
        == "the notebook ran longer than its 10 s limit"
    )


def test_token_matching() -> None:
    basic = base64.b64encode(b"anyone:s3cret").decode()
    assert token_matches("Bearer s3cret", "s3cret")
    assert token_matches("bearer   s3cret ", "s3cret")
    assert token_matches(f"Basic {basic}", "s3cret")
    assert not token_matches("Bearer s3cre", "s3cret")
    assert not token_matches("Token s3cret", "s3cret")
    assert not token_matches("Basic !!!", "s3cret")
    assert not token_matches(None, "s3cret")


def test_prefix_normalization() -> None:
    assert normalize_prefix("faas/sandbox/") == "/faas/sandbox"
    assert normalize_prefix("/") == ""
    assert ServerSettings(prefix="/faas/sandbox/").prefix == "/faas/sandbox"
    with pytest.raises(ValueError, match="plain path"):
        ServerSettings(prefix="/a/../b")
    assert "sekrit" not in repr(ServerSettings(token="sekrit"))


def test_trl_tool_has_what_trl_reads() -> None:
    sandbox = Sandbox(FakeBackend(lambda request: f"ran {len(request.code)}\n"))
    try:
        tool = make_code_interpreter(sandbox)
        assert tool.__name__ == "code_interpreter"
        assert inspect.get_annotations(tool, eval_str=True) == {"code": str, "return": str}
        doc = inspect.getdoc(tool) or ""
        assert "\nArgs:\n    code: " in doc
        assert "\nReturns:\n" in doc
        assert tool("print(1)") == "ran 8\n"
        async_tool = make_async_code_interpreter(sandbox)
        assert inspect.iscoroutinefunction(async_tool)
        assert inspect.getdoc(async_tool) == doc
    finally:
        sandbox.close()


def test_response_json_is_exactly_sandbox_fusions() -> None:
    from retool_exec.server.schemas import RunCodeResponse

    body = RunCodeResponse(status=RunStatus.SUCCESS, message="").model_dump(mode="json")
    body.pop("request_id")
    assert json.loads(json.dumps(body)) == {
        "status": "Success",
        "message": "",
        "compile_result": None,
        "run_result": None,
        "executor_pod_name": None,
        "files": {},
    }


def test_an_endpoint_named_twice_gets_a_404_that_says_so() -> None:
    # SkyRL-agent adds /run_code to its SANDBOX_FUSION_URL: given the endpoint's URL,
    # it posts to /run_code/run_code and tells the model "no stdout here" on a bare 404.
    from fastapi.testclient import TestClient

    from retool_exec.server import create_app

    settings = ServerSettings(prefix="/faas/sandbox", token="s3cret")
    app = create_app(FakeBackend(lambda _request: "ok\n"), settings=settings)
    auth = {"Authorization": "Bearer s3cret"}
    with TestClient(app) as client:
        for path, base in [
            ("/run_code/run_code", "/"),
            ("/faas/sandbox/run_code/run_code", "/faas/sandbox"),
            ("/run_jupyter/run_jupyter/", "/"),
            ("/v1/exec/v1/exec", "/"),
        ]:
            # The token is checked first: without it, no hint (and no routing) at all.
            assert client.post(path, json={"code": "1"}).status_code == 401
            answer = client.post(path, json={"code": "1"}, headers=auth)
            assert answer.status_code == 404
            detail = answer.json()["detail"]
            assert "twice" in detail
            assert f"whose path is {base} (it adds " in detail
            assert "testserver" not in detail  # not the Host header's name
        # Every other 404 is FastAPI's own, unchanged.
        for path in ["/nope", "/run_code/run_jupyter", "/run_code/x", "/faas/run_code"]:
            answer = client.post(path, json={"code": "1"}, headers=auth)
            assert (answer.status_code, answer.json()) == (404, {"detail": "Not Found"})
        assert client.post("/run_code", json={"code": "1"}, headers=auth).status_code == 200
