"""``retool-exec audit``: run the attack corpus against backends and print a scorecard."""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
from pathlib import Path
from typing import Any

__all__ = ["register"]

_EPILOG = """\
Backends: local (the seed's subprocess: NOT isolated, exposures expected),
docker-fresh, docker-reuse, docker-runsc (hardened containers: must contain
every case). Cases that would harm this host are not run on local.

Exit status: 0 every isolating backend contained every case; 1 an isolating
backend exposed a case, could not judge one, or failed; 2 usage error.

Examples:
  retool-exec audit --backend docker-reuse
  retool-exec audit --backend local --backend docker-fresh --class network
  retool-exec audit --list
"""


def register(subparsers: Any) -> None:
    """Add the ``audit`` subcommand."""
    parser = subparsers.add_parser(
        "audit",
        help="run the security regression corpus and print a scorecard",
        description=(
            "Run every attack case against each backend (privilege, network, resources, "
            "output, information, cross-call isolation, agent protocol) and report, per "
            "case, whether the backend contained it."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--backend",
        action="append",
        default=None,
        metavar="NAME",
        help="backend to audit (repeatable; default: all four)",
    )
    parser.add_argument(
        "--case", action="append", default=None, metavar="ID", help="only this case"
    )
    parser.add_argument(
        "--class",
        dest="klass",
        action="append",
        default=None,
        metavar="NAME",
        help="only this class",
    )
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="write JSON here")
    parser.add_argument(
        "--markdown", type=Path, default=None, metavar="FILE", help="write a Markdown scorecard"
    )
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds per attack call (default 5)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=None, help="calls in flight per backend (default: auto)"
    )
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    from retool_exec.security import BACKEND_IDS, CORPUS, CaseClass

    backends = args.backend or list(BACKEND_IDS)
    unknown = [b for b in backends if b not in BACKEND_IDS]
    if unknown:
        print(
            f"retool-exec audit: unknown backend(s) {', '.join(unknown)}; "
            f"choose from {', '.join(BACKEND_IDS)}",
            file=sys.stderr,
        )
        return 2
    cases = list(CORPUS)
    if args.case:
        known = {case.id for case in CORPUS}
        missing = [case_id for case_id in args.case if case_id not in known]
        if missing:
            print(
                f"retool-exec audit: unknown case(s) {', '.join(missing)} (see --list)",
                file=sys.stderr,
            )
            return 2
        cases = [case for case in cases if case.id in args.case]
    if args.klass:
        classes = {klass.value for klass in CaseClass}
        missing = [name for name in args.klass if name not in classes]
        if missing:
            print(
                f"retool-exec audit: unknown class(es) {', '.join(missing)}; "
                f"choose from {', '.join(sorted(classes))}",
                file=sys.stderr,
            )
            return 2
        cases = [case for case in cases if case.klass.value in args.klass]
    if args.list:
        for case in cases:
            print(f"{case.id:34} {case.klass.value:12} {case.severity.value:9} {case.title}")
        return 0
    if args.timeout is not None and not 0 < args.timeout <= 600:
        print("retool-exec audit: --timeout must be in (0, 600]", file=sys.stderr)
        return 2
    audit = asyncio.run(_run(backends, cases, args))
    from retool_exec.security.scorecard import render_markdown, render_text, to_json

    sys.stdout.write(render_text(audit, cases))
    sys.stdout.flush()
    if args.json is not None:
        args.json.write_text(json.dumps(to_json(audit, cases), indent=2) + "\n")
    if args.markdown is not None:
        args.markdown.write_text(render_markdown(audit, cases))
    return 1 if audit.failed else 0


def _command(args: argparse.Namespace) -> str:
    """The command line that reproduces this audit (for the scorecard)."""
    words = ["retool-exec", "audit"]
    for backend in args.backend or []:
        words += ["--backend", backend]
    for case_id in args.case or []:
        words += ["--case", case_id]
    for klass in args.klass or []:
        words += ["--class", klass]
    for flag, value in (("--timeout", args.timeout), ("--concurrency", args.concurrency)):
        if value is not None:
            words += [flag, str(value)]
    for flag, path in (("--json", args.json), ("--markdown", args.markdown)):
        if path is not None:
            words += [flag, str(path)]
    return shlex.join(words)


async def _run(backends: list[str], cases: list[Any], args: argparse.Namespace) -> Any:
    from retool_exec.security import AuditRun, HostFixtures, audit_backend
    from retool_exec.security.runner import DEFAULT_TIMEOUT

    audit = AuditRun(command=_command(args))
    timeout = args.timeout or DEFAULT_TIMEOUT

    def progress(report: Any) -> None:
        if not args.quiet:
            print(
                f"[{report.backend}] {report.case_id}: {report.status.value} "
                f"({report.seconds:.1f}s)",
                file=sys.stderr,
                flush=True,
            )

    with HostFixtures() as host:
        for backend in backends:
            if not args.quiet:
                print(f"[{backend}] starting ({len(cases)} cases)", file=sys.stderr, flush=True)
            run = await audit_backend(
                backend,
                cases,
                host,
                concurrency=args.concurrency,
                timeout=timeout,
                progress=progress,
            )
            for problem in run.problems:
                print(f"[{backend}] problem: {problem}", file=sys.stderr, flush=True)
            audit.backends.append(run)
    return audit
