"""The audit's scorecard as text (for a terminal), Markdown (for docs) and JSON (for tools).

Evidence quotes sandbox output, which is untrusted: every renderer escapes
control characters in it (and Markdown keeps it on one line, in a code span
without backticks), so a case's output can neither drive a terminal nor
restructure the document.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence
from typing import Any

from retool_exec._text import escape_controls
from retool_exec.security.model import Case, CaseClass, CaseReport, Status
from retool_exec.security.runner import AuditRun, BackendRun

__all__ = ["render_markdown", "render_text", "to_json", "totals"]

_SHOWN = {
    Status.CONTAINED: "contained",
    Status.EXPOSED: "EXPOSED",
    Status.ERROR: "ERROR",
    Status.SKIPPED: "skipped",
}
_ORDER = (Status.CONTAINED, Status.EXPOSED, Status.ERROR, Status.SKIPPED)


def totals(reports: Iterable[CaseReport]) -> collections.Counter[Status]:
    """How many reports have each status."""
    return collections.Counter(report.status for report in reports)


def _counts(counter: collections.Counter[Status]) -> str:
    return " / ".join(str(counter.get(status, 0)) for status in _ORDER)


def _classes(cases: Sequence[Case]) -> list[CaseClass]:
    present = {case.klass for case in cases}
    return [klass for klass in CaseClass if klass in present]


def _verdict(run: BackendRun) -> str:
    if not run.isolating:
        return "not a security boundary (exposures expected)"
    return "FAIL" if run.failed else "PASS"


def _by_case(audit: AuditRun) -> dict[str, dict[str, CaseReport]]:
    table: dict[str, dict[str, CaseReport]] = collections.defaultdict(dict)
    for run in audit.backends:
        for report in run.reports:
            table[report.case_id][run.backend] = report
    return table


def _findings(audit: AuditRun) -> list[CaseReport]:
    return [
        report
        for run in audit.backends
        if run.isolating
        for report in run.reports
        if report.status in (Status.EXPOSED, Status.ERROR)
    ]


def _evidence(report: CaseReport, limit: int = 240) -> str:
    text = escape_controls(report.evidence)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def render_text(audit: AuditRun, cases: Sequence[Case]) -> str:
    """A fixed-width scorecard for a terminal."""
    backends = [run.backend for run in audit.backends]
    table = _by_case(audit)
    width = max([len(case.id) for case in cases] + [4]) + 2
    columns = [max(len(b), 9) + 2 for b in backends]
    lines = [
        f"retool-exec audit: {len(cases)} cases x {len(backends)} backend(s)",
        "",
        "case".ljust(width)
        + "class".ljust(13)
        + "severity".ljust(10)
        + "".join(b.ljust(w) for b, w in zip(backends, columns, strict=True)),
    ]
    for case in cases:
        row = table.get(case.id, {})
        cells = [_SHOWN[row[b].status] if b in row else "-" for b in backends]
        lines.append(
            case.id.ljust(width)
            + case.klass.value.ljust(13)
            + case.severity.value.ljust(10)
            + "".join(c.ljust(w) for c, w in zip(cells, columns, strict=True))
        )
    lines += ["", "Totals per class (contained / exposed / error / skipped)"]
    lines.append(
        "class".ljust(14)
        + "".join(b.ljust(max(w, 16)) for b, w in zip(backends, columns, strict=True))
    )
    for klass in _classes(cases):
        cells = []
        for run in audit.backends:
            cells.append(_counts(totals(r for r in run.reports if r.klass is klass)))
        lines.append(
            klass.value.ljust(14)
            + "".join(c.ljust(max(w, 16)) for c, w in zip(cells, columns, strict=True))
        )
    lines += [
        "",
        "Totals per backend",
        "backend".ljust(16) + "contained exposed error skipped  seconds  verdict",
    ]
    for run in audit.backends:
        count = totals(run.reports)
        lines.append(
            run.backend.ljust(16)
            + "".join(
                str(count.get(s, 0)).rjust(w) for s, w in zip(_ORDER, (9, 8, 6, 8), strict=True)
            )
            + f"{run.seconds:9.1f}  {_verdict(run)}"
        )
        lines += [f"  problem: {problem}" for problem in run.problems]
    findings = _findings(audit)
    if findings:
        lines += ["", "Findings on isolating backends:"]
        for report in findings:
            lines.append(
                f"  [{report.backend}] {report.case_id} ({report.severity.value}): "
                + escape_controls("; ".join(report.reasons))
            )
            if report.evidence:
                lines.append(f"      evidence: {_evidence(report)}")
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    """Untrusted text for a Markdown list item: controls escaped, on one line."""
    return escape_controls(text).replace("\n", " ")


def render_markdown(audit: AuditRun, cases: Sequence[Case]) -> str:
    """The scorecard as Markdown tables (docs/security.md embeds one)."""
    backends = [run.backend for run in audit.backends]
    table = _by_case(audit)
    out = []
    if audit.command:
        out += ["Produced by:", "", "```", audit.command, "```", ""]
    out += [
        "| backend | contained | exposed | error | skipped | seconds | verdict |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for run in audit.backends:
        count = totals(run.reports)
        out.append(
            f"| {run.backend} | "
            + " | ".join(str(count.get(s, 0)) for s in _ORDER)
            + f" | {run.seconds:.0f} | {_verdict(run)} |"
        )
    out += ["", "Per class (contained / exposed / error / skipped):", ""]
    out += ["| class | " + " | ".join(backends) + " |", "|---|" + "---|" * len(backends)]
    for klass in CaseClass:
        cells = [
            _counts(totals(r for r in run.reports if r.klass is klass)) for run in audit.backends
        ]
        out.append(f"| {klass.value} | " + " | ".join(cells) + " |")
    out += [
        "",
        "| case | class | severity | " + " | ".join(backends) + " |",
        "|---|---|---|" + "---|" * len(backends),
    ]
    for case in cases:
        row = table.get(case.id, {})
        cells = [_SHOWN[row[b].status] if b in row else "-" for b in backends]
        out.append(
            f"| `{case.id}` | {case.klass.value} | {case.severity.value} | "
            + " | ".join(cells)
            + " |"
        )
    findings = _findings(audit)
    if findings:
        out += ["", "Findings on isolating backends:", ""]
        for report in findings:
            out.append(
                f"- **{report.backend} `{report.case_id}`** ({report.severity.value}): "
                + _md("; ".join(report.reasons))
                + (
                    " — evidence: `" + _md(_evidence(report)).replace("`", "'") + "`"
                    if report.evidence
                    else ""
                )
            )
    problems = [(run.backend, p) for run in audit.backends for p in run.problems]
    if problems:
        out += ["", "Backend problems:", ""] + [f"- {b}: {_md(p)}" for b, p in problems]
    return "\n".join(out) + "\n"


def to_json(audit: AuditRun, cases: Sequence[Case]) -> dict[str, Any]:
    """Everything, as plain data."""
    return {
        "command": audit.command,
        "failed": audit.failed,
        "cases": [
            {
                "id": case.id,
                "class": case.klass.value,
                "title": case.title,
                "severity": case.severity.value,
                "reference": case.reference,
                "catalogue": list(case.catalogue),
                "note": case.note,
            }
            for case in cases
        ],
        "backends": [
            {
                "backend": run.backend,
                "isolating": run.isolating,
                "failed": run.failed,
                "seconds": round(run.seconds, 1),
                "problems": run.problems,
                "totals": {s.value: totals(run.reports).get(s, 0) for s in _ORDER},
                "reports": [report.to_json() for report in run.reports],
            }
            for run in audit.backends
        ],
    }
