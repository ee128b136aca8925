"""The corpus's shape, the scorecard, and ``retool-exec audit`` itself (no Docker needed)."""

from __future__ import annotations

import collections
import ipaddress
import json
import re
from pathlib import Path

import pytest

from retool_exec.cli import main
from retool_exec.security import (
    CORPUS,
    AuditRun,
    BackendRun,
    CaseClass,
    CaseContext,
    CaseReport,
    Expect,
    HostFacts,
    Severity,
    Status,
)
from retool_exec.security.runner import _render
from retool_exec.security.scorecard import render_markdown, render_text, to_json

pytestmark = pytest.mark.security

CATALOGUE_ITEMS = range(1, 45)


def _context() -> CaseContext:
    host = HostFacts(
        hostname="host",
        canary_name="CANARY",
        canary_value="value",
        secret_file="/nonexistent/secret",
        package_dir="/nonexistent/retool_exec",
        tcp_port=1,
        udp_port=2,
        unix_name="unix",
    )
    return CaseContext(token="rx0123456789", backend="local", gvisor=False, timeout=5, host=host)


def test_corpus_has_at_least_60_cases_in_every_class() -> None:
    assert len(CORPUS) >= 60
    per_class = collections.Counter(case.klass for case in CORPUS)
    assert set(per_class) == set(CaseClass)


def test_every_catalogue_item_is_covered() -> None:
    covered = {item for case in CORPUS for item in case.catalogue}
    assert set(CATALOGUE_ITEMS) - covered == set()


def test_case_ids_are_unique_and_prefixed_by_class() -> None:
    prefixes = {
        CaseClass.PRIVILEGE: "priv-",
        CaseClass.NETWORK: "net-",
        CaseClass.RESOURCES: "res-",
        CaseClass.OUTPUT: "out-",
        CaseClass.INFORMATION: "info-",
        CaseClass.ISOLATION: "iso-",
        CaseClass.PROTOCOL: "proto-",
    }
    ids = [case.id for case in CORPUS]
    assert len(ids) == len(set(ids))
    for case in CORPUS:
        assert re.fullmatch(r"[a-z0-9-]+", case.id)
        assert case.id.startswith(prefixes[case.klass])


@pytest.mark.parametrize("case", CORPUS, ids=lambda case: case.id)
def test_case_is_well_formed(case: object) -> None:
    from retool_exec.security import Case

    assert isinstance(case, Case)
    assert case.title and case.reference and isinstance(case.severity, Severity)
    context = _context()
    rendered = _render(case.source(), context, raw=case.raw)
    if not case.raw:  # raw cases are malformed on purpose (NUL bytes, surrogates)
        compile(rendered, "<sandbox>", "exec")
    if not case.raw:
        assert "__TOKEN__" not in rendered
        assert not re.search(r"__[A-Z_]+__", rendered.replace("__name__", ""))
    for extra in (case.follow_up, case.companion, *case.cell_sources()):
        if extra is not None:
            cell = _render(extra, context)
            compile(cell, "<sandbox>", "exec")
            assert not re.search(r"__[A-Z_]+__", cell.replace("__name__", ""))
    assert isinstance(case.local_expectation(), Expect)
    if case.session_steps:
        assert case.source() == ""  # a session case's code is its cells
        assert any(step.key == "attack" for step in case.session_steps)


def test_network_cases_only_contact_the_hosts_own_listeners() -> None:
    """The catalogue's rule: no outside, private, link-local address or real DNS name.

    Loopback addresses other than 127.0.0.1 are allowed: iso-loopback-addresses adds
    one to the container's lo (and is not run locally), it contacts nothing.
    """
    literal = re.compile(r"\b\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}\b")
    for case in CORPUS:
        for code in (
            case.source(),
            case.follow_up or "",
            case.companion or "",
            *case.cell_sources(),
        ):
            if case.raw:
                continue
            for address in literal.findall(code):
                assert ipaddress.ip_address(address).is_loopback, (case.id, address)
            for name in re.findall(r"getaddrinfo\(\"([^\"]+)\"", code):
                assert name in ("localhost", "retool-exec-probe.invalid"), (case.id, name)


def test_harmful_cases_never_run_locally() -> None:
    harmful = {case.id for case in CORPUS if case.local_expectation() is Expect.HARMFUL}
    assert {"res-fork-bomb", "res-memory-one-block", "res-fill-tmp", "res-fill-shm"} <= harmful
    for case in CORPUS:
        if case.id in harmful:
            assert case.local_skip_reason()


def _report(backend: str, case_id: str, status: Status, evidence: str = "") -> CaseReport:
    return CaseReport(
        case_id=case_id,
        klass=CaseClass.OUTPUT,
        severity=Severity.LOW,
        backend=backend,
        status=status,
        reasons=("the attack got through",) if status is Status.EXPOSED else (),
        evidence=evidence,
    )


def test_an_exposure_fails_only_an_isolating_backend() -> None:
    local = BackendRun("local", [_report("local", "out-nul-bytes", Status.EXPOSED)])
    docker = BackendRun(
        "docker-reuse", [_report("docker-reuse", "out-nul-bytes", Status.CONTAINED)]
    )
    assert not AuditRun([local, docker]).failed
    docker.reports.append(_report("docker-reuse", "out-chat-markers", Status.ERROR))
    assert AuditRun([local, docker]).failed


def test_scorecards_escape_hostile_evidence() -> None:
    hostile = "\x1b]0;pwned\x07 | `tick`"
    run = BackendRun(
        "docker-fresh", [_report("docker-fresh", "out-nul-bytes", Status.EXPOSED, hostile)]
    )
    audit = AuditRun([run], command="retool-exec audit --backend docker-fresh")
    cases = [case for case in CORPUS if case.id == "out-nul-bytes"]
    text, markdown = render_text(audit, cases), render_markdown(audit, cases)
    assert "\x1b" not in text and "\x07" not in text
    assert "\x1b" not in markdown and "\\x1b]0;pwned\\x07 | 'tick'" in markdown
    assert "FAIL" in text
    data = to_json(audit, cases)
    assert data["failed"] is True
    assert data["backends"][0]["totals"]["exposed"] == 1


def test_audit_lists_cases(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "--list", "--class", "network"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == sum(case.klass is CaseClass.NETWORK for case in CORPUS)


@pytest.mark.parametrize(
    "argv",
    [["--backend", "nowhere"], ["--case", "no-such-case"], ["--class", "no-such-class"]],
)
def test_audit_rejects_unknown_names(argv: list[str]) -> None:
    assert main(["audit", *argv]) == 2


def test_audit_runs_local_cases_and_writes_reports(tmp_path: Path) -> None:
    json_file, markdown_file = tmp_path / "audit.json", tmp_path / "audit.md"
    status = main(
        [
            "audit",
            "--backend",
            "local",
            "--case",
            "out-chat-markers",
            "--case",
            "info-env-canary",
            "--json",
            str(json_file),
            "--markdown",
            str(markdown_file),
            "--quiet",
        ]
    )
    assert status == 0  # local is not meant to isolate: its exposures do not fail the audit
    data = json.loads(json_file.read_text())
    verdicts = {r["case"]: r["status"] for r in data["backends"][0]["reports"]}
    assert verdicts == {"out-chat-markers": "contained", "info-env-canary": "exposed"}
    assert "retool-exec audit --backend local" in markdown_file.read_text()
