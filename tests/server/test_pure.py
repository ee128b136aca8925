"""The server's pure parts: status derivation, stream cuts, paths, records, tokens, adapters."""

from __future__ import annotations

import base64
import inspect
import json

import pytest

from retool_exec import ExecResult, FakeBackend, Outcome, Sandbox
from retool_exec.adapters import make_async_code_interpreter, make_code_interpreter
from retool_exec.server.files import RequestRejected, check_files, normalize_path
from retool_exec.server.guards import token_matches
from retool_exec.server.programs import build_program, extract_records
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
    [("a.txt", "a.txt"), ("./a//b/./c", "a/b/c"), ("dir/", "dir"), ("..a/b..", "..a/b..")],
)
def test_paths_are_normalized(path: str, normal: str) -> None:
    assert normalize_path(path) == normal


@pytest.mark.parametrize("path", ["/abs", "../x", "a/../../x", "a\x00", "", ".", "//", "a/.."])
def test_unconfined_paths_are_refused(path: str) -> None:
    with pytest.raises(RequestRejected):
        normalize_path(path)


def test_check_files_caps_and_leniency() -> None:
    settings = ServerSettings(max_file_bytes=10, max_files_total_bytes=15, max_files=2)
    wrapped = base64.encodebytes(b"123456789").decode()  # with a newline
    spec = check_files({"a": wrapped, "b": None}, ["./a"], settings)
    assert spec.uploads == {"a": wrapped.strip()}
    assert spec.fetch == [("./a", "a")]
    with pytest.raises(RequestRejected, match="limit is 10"):
        check_files({"a": base64.b64encode(b"x" * 11).decode()}, [], settings)
    six = base64.b64encode(b"x" * 9).decode()
    with pytest.raises(RequestRejected, match="total"):
        check_files({"a": six, "b": six}, [], settings)
    with pytest.raises(RequestRejected, match="at most 2"):
        check_files({}, ["a", "b", "c"], settings)


def test_records_are_split_from_user_text() -> None:
    nonce = "n0"
    record = '<<retool-exec:n0>>{"kind":"files","files":{}}<<end:n0>>'
    found = extract_records("before " + record + " after", nonce)
    assert found.text == "before  after"
    assert found.of_kind("files") == [{"kind": "files", "files": {}}]
    assert not found.lost
    cut = extract_records('s":{}}<<end:n0>>visible', nonce)  # the tail cap cut a record
    assert (cut.text, cut.records, cut.lost) == ("visible", [], True)
    forged = extract_records("<<retool-exec:n0>>not json<<end:n0>>x", nonce)
    assert (forged.text, forged.records, forged.lost) == ("x", [], True)
    other = extract_records("<<retool-exec:zz>>{}<<end:zz>>", nonce)
    assert other.text == "<<retool-exec:zz>>{}<<end:zz>>"


def test_program_is_one_statement_of_literals() -> None:
    spec = {"code": "print('x')\n", "files": {}, "fetch": [], "marker": "m"}
    program = build_program("run", spec)
    assert program.count("\n") == 1
    compile(program, "<test>", "exec")
    with pytest.raises(ValueError, match="entry"):
        build_program("os.system", spec)


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
