"""``retool-exec audit`` and ``doctor`` read the backend table and take every setting;
the doctor's checks are cases of the security corpus."""

from __future__ import annotations

import argparse
import ast
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

import retool_exec.doctor
from retool_exec import DockerConfig, LocalConfig
from retool_exec.backends.registry import backend_specs
from retool_exec.cli import build_parser, cmd_audit, main
from retool_exec.cli._common import UsageError
from retool_exec.cli.cmd_audit import build_audit_configs, default_backends
from retool_exec.cli.cmd_doctor import build_doctor_configs
from retool_exec.doctor import DOCTOR_CASES, doctor_cases, run_doctor
from retool_exec.security import CORPUS
from retool_exec.security.runner import AUDIT_LABEL
from tests.conftest import LABELS, require_docker


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


# -- audit ---------------------------------------------------------------------------------------


def test_audit_defaults_to_every_name_but_aliases_and_fake() -> None:
    assert default_backends() == ["local", "docker-reuse", "docker-fresh", "docker-runsc"]


def test_audit_accepts_docker_and_audits_it_as_docker_reuse(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[list[str]] = []

    async def fake_run(backends: list[str], cases: list[Any], args: argparse.Namespace) -> Any:
        from retool_exec.security import AuditRun

        seen.append(backends)
        return AuditRun()

    monkeypatch.setattr(cmd_audit, "_run", fake_run)
    assert main(["audit", "--backend", "docker", "--backend", "local", "--quiet"]) == 0
    assert seen == [["docker-reuse", "local"]]


def test_audit_unknown_backend_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "--backend", "dokcer"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "no backend named 'dokcer'" in err


def test_audit_settings_go_on_top_of_the_audit_limits_and_keep_its_label() -> None:
    args = parse(
        "audit", "--set", "memory_mb=512", "--set", 'labels={"mine": "1"}', "--set", "python=py"
    )
    configs = build_audit_configs(["docker-reuse", "docker-fresh", "local"], args, run_id="r1")
    reuse, fresh, local = configs["docker-reuse"], configs["docker-fresh"], configs["local"]
    assert isinstance(reuse, DockerConfig) and isinstance(fresh, DockerConfig)
    assert reuse.memory_mb == fresh.memory_mb == 512  # the user's setting wins
    assert (reuse.pids, reuse.pool_size, fresh.pool_size) == (64, 1, 4)  # the audit's
    assert reuse.labels == {"mine": "1", AUDIT_LABEL: "r1"}
    assert isinstance(local, LocalConfig)
    assert local.python == "py"


def test_audit_setting_that_no_backend_has_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["audit", "--backend", "local", "--set", "pool_size=2", "--quiet"])
    assert status == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "unknown setting 'pool_size'" in err


def test_audit_runs_a_case_on_local_with_settings(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["audit", "--backend", "local", "--case", "out-chat-markers", "--set", "timeout=4"]
    status = main([*argv, "--quiet"])
    assert status == 0
    assert "out-chat-markers" in capsys.readouterr().out


def test_audit_help_names_every_backend_it_leaves_out_by_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["audit", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the option's help
    left_out = [
        spec.name
        for spec in backend_specs()
        if spec.alias_of is None and spec.name not in default_backends()
    ]
    assert "ray" in left_out
    said = re.findall(r"default: every one but aliases, ([\w, -]+?)\)", text)
    assert len(said) == 2, text  # the option's help and the epilog
    for words in said:
        assert sorted(re.split(r", | and ", words)) == sorted(left_out)


def _refuse_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fake_run(backends: list[str], cases: list[Any], args: argparse.Namespace) -> Any:
        pytest.fail("the audit ran before its output paths were checked")

    monkeypatch.setattr(cmd_audit, "_run", fake_run)


@pytest.mark.parametrize("flag", ["--json", "--markdown"])
def test_audit_refuses_an_output_it_cannot_write_before_it_runs(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _refuse_to_run(monkeypatch)
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for path in ("/proc/x.out", str(tmp_path / "missing" / "x.out"), str(a_file / "x.out")):
        assert main(["audit", "--backend", "local", "--quiet", flag, path]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert err.startswith(f"retool-exec audit: {flag} {path}: cannot write it: "), err
    assert not (tmp_path / "missing").exists()


def test_audit_output_checks_leave_no_file_and_keep_an_existing_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _refuse_to_run(monkeypatch)
    new = tmp_path / "new.json"
    kept = tmp_path / "kept.json"
    kept.write_text("keep")
    for json_path in (new, kept):
        argv = ["audit", "--backend", "local", "--json", str(json_path), "--markdown", "/proc/x"]
        assert main(argv) == 2
        assert "--markdown /proc/x: cannot write it" in capsys.readouterr().err
    assert not new.exists()
    assert kept.read_text() == "keep"


# -- doctor --------------------------------------------------------------------------------------


def test_doctor_cases_come_from_the_security_corpus() -> None:
    corpus = {case.id: case for case in CORPUS}
    cases = doctor_cases()
    assert [case.id for case in cases] == list(DOCTOR_CASES)
    assert all(case is corpus[case.id] for case in cases)


def test_doctor_has_no_probe_model_and_no_eval() -> None:
    tree = ast.parse(inspect.getsource(retool_exec.doctor))
    calls = {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    assert "eval" not in calls
    assert not hasattr(retool_exec.doctor, "PROBES")


def test_doctor_configs_take_settings_and_refuse_non_docker_backends() -> None:
    args = parse("doctor", "--backend", "docker-runsc", "--set", "memory_mb=300")
    config = build_doctor_configs(["docker-runsc"], args)["docker-runsc"]
    assert isinstance(config, DockerConfig)
    assert (config.runtime, config.memory_mb, config.auto_build) == ("runsc", 300, False)
    with pytest.raises(UsageError, match="'local' is not one"):
        build_doctor_configs(["local"], parse("doctor"))


def test_doctor_with_a_bad_setting_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--set", "pids=1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "pids" in err


@pytest.mark.docker
def test_run_doctor_passes_on_the_hardened_backend() -> None:
    require_docker()
    config = DockerConfig(labels=LABELS, auto_build=False)
    checks = run_doctor(config, name="docker")
    assert len(checks) == len(DOCTOR_CASES)
    failed = [check for check in checks if not check.ok]
    assert not failed, failed
