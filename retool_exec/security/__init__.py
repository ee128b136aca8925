"""The security regression corpus: attacks, what containing them means, and the audit.

    from retool_exec.security import CORPUS, HostFixtures, audit_backend

``CORPUS`` holds every attack case (see ``model.Case``); ``audit_backend``
runs cases against one backend and returns a ``CaseReport`` per case;
``retool-exec audit`` (``retool_exec.cli.cmd_audit``) runs it from the shell
and prints a scorecard. docs/security.md explains the threat model.
"""

from __future__ import annotations

from retool_exec.security.cases import CORPUS
from retool_exec.security.host import HostFixtures
from retool_exec.security.model import (
    Case,
    CaseClass,
    CaseContext,
    CaseReport,
    Expect,
    HostFacts,
    Observation,
    Severity,
    Status,
)
from retool_exec.security.runner import (
    AUDIT_LIMITS,
    BACKEND_IDS,
    ISOLATING,
    AuditRun,
    BackendRun,
    audit_backend,
    audit_config,
    run_backend,
    run_case,
    with_audit_limits,
)

__all__ = [
    "AUDIT_LIMITS",
    "BACKEND_IDS",
    "CORPUS",
    "ISOLATING",
    "AuditRun",
    "BackendRun",
    "Case",
    "CaseClass",
    "CaseContext",
    "CaseReport",
    "Expect",
    "HostFacts",
    "HostFixtures",
    "Observation",
    "Severity",
    "Status",
    "audit_backend",
    "audit_config",
    "run_backend",
    "run_case",
    "with_audit_limits",
]
