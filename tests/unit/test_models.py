"""ExecResult: the seed's positional constructor, derived outcome, immutability, JSON."""

from __future__ import annotations

import pydantic
import pytest
from hypothesis import given, settings

from retool_exec import ExecResult, Outcome
from retool_exec._models import CellResult, classify_exit
from tests.strategies import exec_results


def test_canonical_success_constructs_positionally() -> None:
    r = ExecResult(True, "5\n", "", 0, False, 0.03)
    assert (r.ok, r.stdout, r.stderr, r.returncode, r.timed_out, r.latency) == (
        True,
        "5\n",
        "",
        0,
        False,
        0.03,
    )
    assert r.outcome is Outcome.SUCCESS


def test_canonical_runtime_error_constructs_positionally() -> None:
    r = ExecResult(False, "", "Traceback ...", 1, False, 0.03)
    assert (r.ok, r.stdout, r.stderr, r.returncode, r.timed_out, r.latency) == (
        False,
        "",
        "Traceback ...",
        1,
        False,
        0.03,
    )
    assert r.outcome is Outcome.ERROR


def test_canonical_timeout_constructs_positionally() -> None:
    r = ExecResult(False, "", "", None, True, 30.0)
    assert (r.ok, r.stdout, r.stderr, r.returncode, r.timed_out, r.latency) == (
        False,
        "",
        "",
        None,
        True,
        30.0,
    )
    assert r.outcome is Outcome.TIMEOUT


def test_positional_and_keyword_construction_compare_equal() -> None:
    positional = ExecResult(True, "5\n", "", 0, False, 0.03)
    keyword = ExecResult(
        ok=True, stdout="5\n", stderr="", returncode=0, timed_out=False, latency=0.03
    )
    assert positional == keyword


def test_added_fields_have_defaults() -> None:
    r = ExecResult(True, "5\n", "", 0, False, 0.03)
    assert r.stdout_dropped_chars == 0
    assert r.stderr_dropped_chars == 0
    assert r.backend == ""
    assert r.queue_wait == 0.0
    assert r.detail == ""
    assert not r.truncated
    assert not r.infrastructure_failure


def test_sigxcpu_is_cpu_limit() -> None:
    assert ExecResult(False, "", "", -24, False, 1.0).outcome is Outcome.CPU_LIMIT


def test_sigxcpu_without_the_cpu_used_is_a_signal() -> None:
    """A backend that can tell (rusage) says whether the limit was used; SIGXCPU is a
    signal any process can send itself."""
    assert classify_exit(-24, timed_out=False, cpu_limit=False) is Outcome.SIGNAL
    assert classify_exit(-24, timed_out=False, cpu_limit=True) is Outcome.CPU_LIMIT
    assert classify_exit(-24, timed_out=False) is Outcome.CPU_LIMIT  # cannot tell


def test_sigsegv_is_signal() -> None:
    assert ExecResult(False, "", "", -11, False, 1.0).outcome is Outcome.SIGNAL


def test_no_returncode_without_timeout_is_sandbox_error() -> None:
    r = ExecResult(False, "", "", None, False, 1.0)
    assert r.outcome is Outcome.SANDBOX_ERROR
    assert r.infrastructure_failure


def test_timeout_wins_over_returncode() -> None:
    assert ExecResult(False, "", "", -9, True, 30.0).outcome is Outcome.TIMEOUT


def test_explicit_outcome_is_kept() -> None:
    r = ExecResult(False, "", "", -9, False, 1.0, outcome=Outcome.OOM)
    assert r.outcome is Outcome.OOM


def test_classify_exit_oom_flag() -> None:
    assert classify_exit(-9, timed_out=False, oom=True) is Outcome.OOM
    assert classify_exit(-9, timed_out=True, oom=True) is Outcome.TIMEOUT


def test_truncated_property() -> None:
    assert ExecResult(True, "", "", 0, False, 0.1, stdout_dropped_chars=1).truncated
    assert ExecResult(True, "", "", 0, False, 0.1, stderr_dropped_chars=1).truncated


def test_frozen_assignment_raises() -> None:
    r = ExecResult(True, "5\n", "", 0, False, 0.03)
    with pytest.raises(pydantic.ValidationError):
        r.stdout = "changed"
    assert r.stdout == "5\n"


def test_hashable_because_frozen() -> None:
    a = ExecResult(True, "5\n", "", 0, False, 0.03)
    b = ExecResult(True, "5\n", "", 0, False, 0.03)
    assert hash(a) == hash(b)


def test_too_many_positional_arguments_raise_type_error() -> None:
    with pytest.raises(TypeError):
        ExecResult(True, "5\n", "", 0, False, 0.03, Outcome.SUCCESS)


def test_positional_and_keyword_for_same_field_raise_type_error() -> None:
    with pytest.raises(TypeError):
        ExecResult(True, "5\n", "", 0, False, 0.03, ok=True)


def test_extra_fields_are_forbidden() -> None:
    with pytest.raises(pydantic.ValidationError):
        ExecResult(True, "5\n", "", 0, False, 0.03, exit_code=0)


def test_negative_dropped_chars_rejected() -> None:
    with pytest.raises(pydantic.ValidationError):
        ExecResult(True, "", "", 0, False, 0.1, stdout_dropped_chars=-1)


def test_canonical_values_round_trip_through_json() -> None:
    for r in (
        ExecResult(True, "5\n", "", 0, False, 0.03),
        ExecResult(False, "", "Traceback ...", 1, False, 0.03),
        ExecResult(False, "", "", None, True, 30.0),
    ):
        assert ExecResult.model_validate_json(r.model_dump_json()) == r


def test_lone_surrogates_are_replaced_so_every_result_serializes() -> None:
    # A value's repr (a cell's display) can hold them; UTF-8 and JSON encoders refuse them.
    r = ExecResult(
        True, "\ud800", "x\udcff", 0, False, 0.03,
        detail="\ud83d", fetch_errors={"\udc80": "\ud800"},
        cells=[CellResult(display=[{"text/plain": "ok \ud800 end"}],
                          error=[{"ename": "E", "evalue": "\udfff", "traceback": ["\ud800"]}])],
    )  # fmt: skip
    assert (r.stdout, r.stderr, r.detail, r.fetch_errors) == ("?", "x?", "?", {"?": "?"})
    assert r.cells[0].display == [{"text/plain": "ok ? end"}]
    assert r.cells[0].error == [{"ename": "E", "evalue": "?", "traceback": ["?"]}]
    assert ExecResult.model_validate_json(r.model_dump_json()) == r
    assert ExecResult(True, "é 😀 \ufffd", "", 0, False, 0.03).stdout == "é 😀 \ufffd"


@settings(max_examples=200)
@given(exec_results())
def test_json_round_trip(r: ExecResult) -> None:
    assert ExecResult.model_validate_json(r.model_dump_json()) == r


@settings(max_examples=100)
@given(exec_results())
def test_python_dict_round_trip(r: ExecResult) -> None:
    assert ExecResult.model_validate(r.model_dump()) == r


def test_seed_shaped_json_derives_outcome() -> None:
    # JSON written by the seed has only the six fields; outcome is derived on load.
    text = (
        '{"ok": false, "stdout": "", "stderr": "", "returncode": null,'
        ' "timed_out": true, "latency": 30.0}'
    )
    assert ExecResult.model_validate_json(text).outcome is Outcome.TIMEOUT


def test_seed_shaped_dict_derives_outcome() -> None:
    data = {
        "ok": False,
        "stdout": "",
        "stderr": "Traceback ...",
        "returncode": 1,
        "timed_out": False,
        "latency": 0.03,
    }
    assert ExecResult.model_validate(data).outcome is Outcome.ERROR


def test_every_file_asked_for_is_returned_or_named_with_a_reason() -> None:
    """A result whose read-back was lost with the call's end (gVisor's container killed
    whole for memory, a timeout's output lost) had the file neither in ``files`` nor in
    ``fetch_errors``: a reward looking it up got a ``KeyError`` (thirty-third red-team
    round). The Sandbox names every such path."""
    from retool_exec import FakeBackend, Sandbox

    def lost(request: object) -> ExecResult:
        return ExecResult(
            False, "", "", None, True, 3.0, files={"a": b"1"}, fetch_errors={"b": "not found"}
        )

    with Sandbox(FakeBackend(lost)) as sandbox:
        result = sandbox.run_code("pass", fetch=["a", "./b", "c/d"])
    assert result.files == {"a": b"1"}
    assert result.fetch_errors == {"./b": "not found", "c/d": "not returned by the sandbox"}
    with Sandbox(FakeBackend(lambda request: "")) as sandbox:
        assert sandbox.run_code("pass").fetch_errors == {}


def test_repr_shows_a_large_fetched_file_by_its_size() -> None:
    """The code chooses a fetched file's size: a repr of 31 MiB took 0.5 s and 89 MiB of
    text (``asyncio.run`` reprs its main task's result; red team D, thirty-sixth round)."""
    result = ExecResult(True, "", "", 0, False, 0.1, files={"a": b"short", "b": b"x" * 10**6})
    shown = repr(result)
    assert "'a': b'short'" in shown and "<1000000 bytes: b'xxx" in shown
    assert len(shown) < 2000 and len(str(result)) < 2000
    assert result.files["b"] == b"x" * 10**6  # the data itself is whole
