"""``retool-exec audit``: run the attack corpus against backends and print a scorecard."""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from retool_exec._errors import ConfigError
from retool_exec.backends.config import BackendConfigBase
from retool_exec.backends.registry import backend_spec, backend_specs
from retool_exec.cli._common import (
    EXIT_STATUS_HELP,
    SETTINGS_HELP,
    UsageError,
    add_settings_options,
    backend_list,
    build_configs,
    check_output_file,
)

__all__ = ["NOT_AUDITED_BY_DEFAULT", "build_audit_configs", "default_backends", "register"]

NOT_AUDITED_BY_DEFAULT = ("ray", "fake")
"""Backends audited only when named: ``ray`` needs a running cluster (and runs docker-reuse
containers on each node: audit it with ``--backend ray`` next to one), ``fake`` runs nothing."""

_DEFAULT_BACKENDS_HELP = "every one but aliases, " + " and ".join(NOT_AUDITED_BY_DEFAULT)

_EPILOG = """\
Backends (--backend NAME; default: {default_backends}):
{backends}
Isolating backends (every docker one) must contain every case; local is the
seed's subprocess (NOT isolated: exposures are expected) and does not run the
cases that would harm this host. An alias is audited under the name it
stands for (docker as docker-reuse).

{settings}
Settings go on top of the audit's own limits (memory_mb=256, pids=64, ...),
which the resource cases assume; a setting applies to the backends that have it.

Exit status: 0 every isolating backend contained every case; 1 an isolating
backend exposed a case, could not judge one, or failed.
{exit_status}

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
        epilog=_EPILOG.format(
            default_backends=_DEFAULT_BACKENDS_HELP,
            backends=backend_list(),
            settings=SETTINGS_HELP,
            exit_status=EXIT_STATUS_HELP,
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--backend",
        action="append",
        default=None,
        metavar="NAME",
        help=f"backend to audit (repeatable; default: {_DEFAULT_BACKENDS_HELP})",
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
    add_settings_options(parser)
    parser.set_defaults(handler=_handle)


def default_backends() -> list[str]:
    """Every backend of the table but aliases and ``NOT_AUDITED_BY_DEFAULT``."""
    return [
        spec.name
        for spec in backend_specs()
        if spec.alias_of is None and spec.name not in NOT_AUDITED_BY_DEFAULT
    ]


def build_audit_configs(
    names: list[str], args: argparse.Namespace, *, run_id: str = "", timeout: float = 5.0
) -> dict[str, BackendConfigBase]:
    """Each backend's audit config: the audit's own (limits, pool size), then the user's
    settings on top; the audit's run label is kept whatever ``labels`` says."""
    from retool_exec.security import BACKEND_IDS, audit_config, with_audit_limits
    from retool_exec.security.runner import AUDIT_LABEL

    bases: dict[str, dict[str, Any]] = {}
    for name in names:
        if name in BACKEND_IDS:
            base: BackendConfigBase = audit_config(name, run_id=run_id, timeout=timeout)
        else:
            settings = {"timeout": timeout} if backend_spec(name).accepts("timeout") else {}
            base = with_audit_limits(backend_spec(name).config(settings), run_id=run_id)
        bases[name] = base.model_dump(exclude={"kind"})
    # The audit's values are each backend's command defaults; the user's layers win.
    configs = build_configs(names, args, backend_defaults=bases)
    for name, config in configs.items():
        labels = getattr(config, "labels", None)
        if run_id and isinstance(labels, dict) and labels.get(AUDIT_LABEL) != run_id:
            configs[name] = type(config).model_validate(
                {**config.model_dump(), "labels": {**labels, AUDIT_LABEL: run_id}}
            )
    return configs


def _handle(args: argparse.Namespace) -> int:
    from retool_exec.security import CORPUS, CaseClass

    requested = args.backend or default_backends()
    for name in requested:
        backend_spec(name)  # an unknown name is a ConfigError naming the choices
    # An alias is audited under the name it stands for, so its verdict counts as that one's.
    backends = list(dict.fromkeys(backend_spec(name).alias_of or name for name in requested))
    cases = list(CORPUS)
    if args.case:
        known = {case.id for case in CORPUS}
        missing = [case_id for case_id in args.case if case_id not in known]
        if missing:
            raise UsageError(f"unknown case(s) {', '.join(missing)} (see --list)")
        cases = [case for case in cases if case.id in args.case]
    if args.klass:
        classes = {klass.value for klass in CaseClass}
        missing = [name for name in args.klass if name not in classes]
        if missing:
            raise UsageError(
                f"unknown class(es) {', '.join(missing)}; choose from {', '.join(sorted(classes))}"
            )
        cases = [case for case in cases if case.klass.value in args.klass]
    if args.list:
        for case in cases:
            print(f"{case.id:34} {case.klass.value:12} {case.severity.value:9} {case.title}")
        return 0
    if args.timeout is not None and not 0 < args.timeout <= 600:
        raise UsageError("--timeout must be in (0, 600]")
    build_audit_configs(backends, args)  # settings are checked before anything starts
    for flag, path in (("--json", args.json), ("--markdown", args.markdown)):
        if path is not None:
            check_output_file(path, flag)  # before the run, not after it
    audit = asyncio.run(_run(backends, cases, args))
    from retool_exec.security.scorecard import render_markdown, render_text, to_json

    sys.stdout.write(render_text(audit, cases))
    sys.stdout.flush()
    try:
        if args.json is not None:
            args.json.write_text(json.dumps(to_json(audit, cases), indent=2) + "\n")
        if args.markdown is not None:
            args.markdown.write_text(render_markdown(audit, cases))
    except OSError as exc:
        raise ConfigError(f"cannot write the report: {exc}") from exc
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
    if args.config_file is not None:
        words += ["--config", str(args.config_file)]
    for item in args.set_items:
        words += ["--set", item]
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
        configs = build_audit_configs(backends, args, run_id=host.run_id, timeout=timeout)
        for backend in backends:
            if not args.quiet:
                print(f"[{backend}] starting ({len(cases)} cases)", file=sys.stderr, flush=True)
            run = await audit_backend(
                backend,
                cases,
                host,
                config=configs[backend],
                concurrency=args.concurrency,
                timeout=timeout,
                progress=progress,
            )
            for problem in run.problems:
                print(f"[{backend}] problem: {problem}", file=sys.stderr, flush=True)
            audit.backends.append(run)
    return audit
