"""The attack corpus, one module per class; ``CORPUS`` is all of it, in a stable order."""

from __future__ import annotations

from retool_exec.security.cases import (
    information,
    isolation,
    network,
    output,
    privilege,
    protocol,
    redteam,
    resources,
    sessions,
)
from retool_exec.security.model import Case

__all__ = ["CORPUS"]


def _collect() -> tuple[Case, ...]:
    cases = (
        *privilege.CASES,
        *network.CASES,
        *resources.CASES,
        *output.CASES,
        *information.CASES,
        *isolation.CASES,
        *protocol.CASES,
        *redteam.CASES,
        *sessions.CASES,
    )
    ids = [case.id for case in cases]
    duplicates = sorted({case_id for case_id in ids if ids.count(case_id) > 1})
    if duplicates:
        raise RuntimeError(f"duplicate case ids in the corpus: {duplicates}")
    return cases


CORPUS: tuple[Case, ...] = _collect()
"""Every attack case."""
