"""``retool-exec bench``: latency and throughput of the backends, side by side, in one run."""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from pathlib import Path
from typing import Any

from retool_exec._errors import ConfigError
from retool_exec.cli._common import (
    EXIT_STATUS_HELP,
    SETTINGS_HELP,
    UsageError,
    add_settings_options,
    backend_list,
    build_configs,
    check_output_file,
    user_layers,
)

__all__ = ["EXIT_TARGET_FAILED", "QUICK", "build_settings", "register"]

EXIT_TARGET_FAILED = 1
"""A performance target measured FAIL (NOT MEASURED is not a failure of the run)."""

DEFAULT_BACKENDS = "local,docker"
DEFAULT_CONCURRENCY = "1,4,16,64"
QUICK: dict[str, Any] = {
    "concurrency": "1,16",
    "calls": 6,
    "warmup": 1,
    "slow_rounds": 1,
    "undrained_calls": 5,
    "sustained_calls": 24,
    "cpu_calls": 10,
}
"""What ``--quick`` changes (each can still be set explicitly)."""
FULL: dict[str, Any] = {
    "concurrency": DEFAULT_CONCURRENCY,
    "calls": 40,
    "warmup": 2,
    "slow_rounds": 2,
    "undrained_calls": 20,
    "sustained_calls": 60,
    "cpu_calls": 40,
}

_EPILOG = """\
Backends (--backends NAME,...; an alias and its name are the same backend):
{backends}
Workloads: print, numpy, sympy, error, sleep, timeout, flood.

{settings}
A setting applies to the backends that have it; pool_size, timeout and the
local python come from --pool-size, --timeout and --local-python.

Calls are interleaved: for each workload and concurrency level, the backends
take turns batch by batch, so machine drift hits them alike; ratios to the
local backend come from the same rounds. Warm-up calls are not recorded.

Each target is PASS, FAIL or NOT MEASURED (its backends or workloads were
not in the run, or the local baseline cannot import the workload's modules:
give --local-python an interpreter with numpy and sympy, as benchmarks/run.sh
does).

Exit status: 0 no target failed; 1 a target failed.
{exit_status}

Examples:
  retool-exec bench --backends local,docker --quick
  retool-exec bench --backends local,docker-reuse,docker-fresh,docker-runsc \\
      --json bench.json --plot bench.png
"""


def register(subparsers: Any) -> None:
    """Add the ``bench`` subcommand."""
    parser = subparsers.add_parser(
        "bench",
        help="benchmark latency and throughput of the backends",
        description="Benchmark latency and throughput of backends side by side in one run.",
        epilog=_EPILOG.format(
            backends=backend_list(), settings=SETTINGS_HELP, exit_status=EXIT_STATUS_HELP
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--backends", default=DEFAULT_BACKENDS, help=f"comma list (default {DEFAULT_BACKENDS})"
    )
    parser.add_argument("--workloads", default=None, help="comma list (default: all)")
    parser.add_argument(
        "--concurrency",
        default=None,
        help=f"comma list of concurrent callers (default {DEFAULT_CONCURRENCY}; quick 1,16)",
    )
    parser.add_argument(
        "--calls", type=int, default=None, help="recorded calls per cell (default 40; quick 6)"
    )
    parser.add_argument("--warmup", type=int, default=None, help="warm-up calls (default 2)")
    parser.add_argument(
        "--slow-rounds",
        type=int,
        default=None,
        help="batches per cell for the sleep and timeout workloads (default 2; quick 1)",
    )
    parser.add_argument(
        "--pool-size", type=int, default=8, help="warm containers per Docker backend (default 8)"
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="sandbox timeout (30 s)")
    parser.add_argument("--quick", action="store_true", help="a small run (under a minute)")
    parser.add_argument(
        "--no-extras",
        action="store_true",
        help="skip start-up, fresh-policy, client-CPU and memory figures",
    )
    parser.add_argument("--undrained-calls", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--sustained-calls", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--sustained-concurrency", type=int, default=16, help="fresh drained: callers (16)"
    )
    parser.add_argument(
        "--sustained-pool-size", type=int, default=4, help="fresh drained: pool size (4)"
    )
    parser.add_argument("--cpu-calls", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--local-python",
        default=sys.executable,
        help="interpreter of the local backend; it needs numpy and sympy for a fair baseline",
    )
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="raw figures")
    parser.add_argument("--plot", type=Path, default=None, metavar="FILE.png", help="a PNG")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument(
        "--docker-host", default=None, metavar="URL", help="docker: daemon address (DOCKER_HOST)"
    )
    # Extra container labels (tests mark their containers so a sweep finds leftovers).
    parser.add_argument("--label", action="append", default=[], help=argparse.SUPPRESS)
    add_settings_options(parser)
    parser.set_defaults(handler=_handle)


def _ints(text: str, name: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise UsageError(f"--{name} takes comma-separated integers, got {text!r}") from exc
    if not values or any(v < 1 for v in values):
        raise UsageError(f"--{name} needs positive integers, got {text!r}")
    return sorted(set(values))


def _labels(items: list[str]) -> dict[str, str]:
    labels = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--label takes KEY=VALUE, got {item!r}")
        labels[key] = value
    return labels


def _check_outputs(args: argparse.Namespace) -> None:
    """Each output file can be written; a missing folder is made, as the writes at the
    end of the run make it."""
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        if path is None:
            continue
        try:  # (a file there is the probe's "Not a directory")
            path.parent.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            pass
        except OSError as exc:
            raise UsageError(
                f"{flag} {path}: cannot make its folder: {exc.strerror or exc}"
            ) from exc
        check_output_file(path, flag)


def build_settings(args: argparse.Namespace) -> Any:
    """Settings from the parsed arguments (``--quick`` fills in what was not given)."""
    from retool_exec.bench.backends import bench_config, parse_backends
    from retool_exec.bench.results import BenchSettings
    from retool_exec.bench.workloads import select_workloads

    base = QUICK if args.quick else FULL

    def pick(name: str) -> Any:
        value = getattr(args, name)
        return base[name] if value is None else value

    backends = parse_backends(args.backends)
    try:
        workloads = select_workloads(
            [w.strip() for w in args.workloads.split(",") if w.strip()] if args.workloads else None
        )
    except ValueError as exc:
        raise UsageError(f"--workloads: {exc}") from exc
    concurrency = _ints(pick("concurrency"), "concurrency")
    counts = {
        name: pick(name)
        for name in ("calls", "warmup", "slow_rounds", "undrained_calls", "sustained_calls")
    }
    counts["cpu_calls"] = pick("cpu_calls")
    for name, value in counts.items():
        if value < (0 if name == "warmup" else 1):
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {value}")
    if args.pool_size < 1 or args.sustained_pool_size < 1 or args.sustained_concurrency < 1:
        raise UsageError("pool sizes and --sustained-concurrency must be positive")
    backend_settings = user_layers(args).values
    if args.docker_host is not None:
        backend_settings["docker_host"] = args.docker_host
    build_configs(backends, args)  # a setting none of the backends has is an error
    for name in backends:  # every config is valid before anything starts
        bench_config(
            name,
            timeout=args.timeout,
            pool_size=args.pool_size,
            local_python=args.local_python,
            settings=backend_settings,
        )
    command = ["retool-exec", "bench", "--backends", ",".join(backends)]
    if args.workloads:
        command += ["--workloads", ",".join(w.name for w in workloads)]
    if args.quick:
        command.append("--quick")
    command += ["--concurrency", ",".join(map(str, concurrency))]
    for name, value in counts.items():
        if getattr(args, name) is not None:
            command += [f"--{name.replace('_', '-')}", str(value)]
    command += ["--pool-size", str(args.pool_size)]
    if args.no_extras:
        command.append("--no-extras")
    if args.local_python != sys.executable:
        command += ["--local-python", args.local_python]
    if args.config_file is not None:
        command += ["--config", str(args.config_file)]
    for item in args.set_items:
        command += ["--set", item]
    settings = BenchSettings(
        backends=list(backends),
        workloads=[w.name for w in workloads],
        concurrency=concurrency,
        pool_size=args.pool_size,
        timeout=args.timeout,
        quick=args.quick,
        extras=not args.no_extras,
        sustained_concurrency=args.sustained_concurrency,
        sustained_pool_size=args.sustained_pool_size,
        local_python=args.local_python,
        backend_settings=backend_settings,
        command=shlex.join(command),
        **counts,
    )
    return settings, workloads


def _handle(args: argparse.Namespace) -> int:
    from retool_exec.bench.plot import MatplotlibMissingError, require_matplotlib, write_plot
    from retool_exec.bench.progress import Progress
    from retool_exec.bench.report import render_text, summary_json
    from retool_exec.bench.runner import planned_calls, run_bench
    from retool_exec.bench.targets import evaluate_targets

    settings, workloads = build_settings(args)
    labels = _labels(args.label)
    if args.plot is not None:
        try:
            require_matplotlib()
        except MatplotlibMissingError as exc:
            raise UsageError(str(exc)) from exc
    _check_outputs(args)
    progress = Progress(planned_calls(settings, workloads), enabled=not args.no_progress)
    result = asyncio.run(
        run_bench(
            settings,
            workloads,
            progress=progress,
            labels=labels,
            docker_host=args.docker_host,
        )
    )
    result.summary = summary_json(result)
    sys.stdout.write(render_text(result))
    sys.stdout.flush()
    try:
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(result.model_dump_json(by_alias=True, indent=1) + "\n")
            print(f"raw figures: {args.json}", file=sys.stderr)
        if args.plot is not None:
            write_plot(result, args.plot)
            print(f"plot: {args.plot}", file=sys.stderr)
    except OSError as exc:
        raise ConfigError(f"cannot write output: {exc}") from exc
    failed = [t for t in evaluate_targets(result) if t.passed is False]
    if failed:
        print(
            f"retool-exec bench: {len(failed)} target(s) FAILED: "
            + ", ".join(t.name for t in failed),
            file=sys.stderr,
        )
        return EXIT_TARGET_FAILED
    return 0
