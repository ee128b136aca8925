"""Produce docs/benchmarks.md (and .png, .json): run the benchmark, then render the page.

    benchmarks/run.sh                       # what produced the committed page
    python benchmarks/make_report.py --render-only   # re-render from docs/benchmarks.json

The Peers section comes from docs/benchmarks-peers.json (``benchmarks/peers.py``,
which run.sh runs after the matrix); without that file the page has no such section.

The page is generated: every number on it comes from the JSON that the run
wrote next to it, so it can be checked and re-rendered without re-running.
Edit this script, not the page.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from retool_exec.bench.report import (
    Table,
    extra_tables,
    render_markdown_table,
    target_table,
    workload_tables,
)
from retool_exec.bench.results import BenchResult

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/peers.py
import peers

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BACKENDS = "local,docker-reuse,docker-fresh,docker-runsc"


def _wait_for_quiet(max_load: float, max_wait: float) -> list[float]:
    """Wait (up to ``max_wait`` s) for the 1-minute load to drop below ``max_load``."""
    deadline = time.monotonic() + max_wait
    while True:
        load = list(os.getloadavg())
        if load[0] < max_load or time.monotonic() >= deadline:
            return load
        print(f"load average {load[0]:.2f} >= {max_load}; waiting 15 s", file=sys.stderr)
        time.sleep(15)


def run_bench(args: argparse.Namespace, extra: list[str]) -> None:
    load = _wait_for_quiet(args.max_load, args.max_wait)
    print(f"load average before the run: {load}", file=sys.stderr)
    command = [
        sys.executable,
        "-m",
        "retool_exec.cli",
        "bench",
        "--backends",
        args.backends,
        "--json",
        str(args.json),
        "--plot",
        str(args.plot),
        *(["--local-python", args.local_python] if args.local_python else []),
        *extra,
    ]
    print("+ " + shlex.join(command), file=sys.stderr)
    # 1 means a target FAILed: the figures are still worth rendering (the page says which).
    status = subprocess.run(command, check=False, cwd=ROOT).returncode
    if status not in (0, 1):
        raise SystemExit(f"the benchmark failed (exit status {status})")


def _fmt_bytes(value: Any) -> str:
    if not isinstance(value, int):
        return "-"
    return f"{value / (1 << 30):.1f} GiB"


def _environment_table(result: BenchResult) -> Table:
    env = result.environment
    docker = env.get("docker") or {}
    image = docker.get("image") or {}
    local = env.get("local_python") or {}
    image_python = env.get("image_python") or {}
    packages = env.get("packages") or {}
    load_start = env.get("load_average_at_start")
    load_end = env.get("load_average_at_end")

    def modules(info: dict[str, Any]) -> str:
        found = info.get("modules") or {}
        listed = ", ".join(f"{k} {v}" for k, v in found.items() if v)
        return f"Python {info.get('python', '?')}; {listed or 'no math modules'}"

    def loads(values: Any) -> str:
        return " / ".join(f"{v:.2f}" for v in values) if values else "-"

    rows = [
        ["date (UTC)", f"{result.started_at} ({result.duration_seconds / 60:.1f} min)"],
        ["CPU", f"{env.get('cpu_count')} cores ({env.get('cpu_model') or '?'})"],
        ["memory", _fmt_bytes(env.get("memory_total_bytes"))],
        ["load average (1/5/15 min) at start", loads(load_start)],
        ["load average (1/5/15 min) at end", loads(load_end)],
        ["kernel", str(env.get("kernel"))],
        [
            "Docker",
            f"{docker.get('server_version', '-')} (API {docker.get('api_version', '-')}), "
            f"cgroup v{docker.get('cgroup_version', '?')} {docker.get('cgroup_driver', '')}, "
            f"{docker.get('storage_driver', '')}",
        ],
        ["Docker runtimes", ", ".join(docker.get("runtimes") or []) or "-"],
        ["sandbox image", f"{image.get('tag', '-')} ({str(image.get('id', '-'))[:19]})"],
        ["inside the image", modules(image_python) if image_python else "-"],
        ["local baseline interpreter", f"{local.get('path', '-')}: {modules(local)}"],
        [
            "packages (host)",
            ", ".join(f"{k} {v}" for k, v in packages.items() if v),
        ],
        [
            "source",
            f"{(env.get('source') or {}).get('commit', '?')[:12]}"
            + (" (with uncommitted changes)" if (env.get("source") or {}).get("dirty") else ""),
        ],
    ]
    return Table("environment", ["what", "value"], rows)


def _settings_table(result: BenchResult) -> Table:
    s = result.settings
    pools = ", ".join(f"{b.name}: {b.pool_size}" for b in result.backends if b.pool_size)
    rows = [
        ["backends", ", ".join(s.backends)],
        ["concurrency levels", ", ".join(map(str, s.concurrency))],
        ["recorded calls per cell", f"at least {s.calls} (whole batches)"],
        ["sleep/timeout calls per cell", f"{s.slow_rounds} batches of the concurrency level"],
        ["warm-up calls (not recorded)", f"{s.warmup} per backend per workload"],
        ["Docker pool sizes (matrix)", pools or "-"],
        ["sandbox max_workers", str(max(s.concurrency))],
        [
            "fresh, drained",
            f"{s.sustained_calls} calls, {s.sustained_concurrency} callers, pool "
            f"{s.sustained_pool_size}",
        ],
        ["fresh, not drained", f"{s.undrained_calls} sequential calls per workload"],
        ["client CPU", f"{s.cpu_calls} sequential print(2+3) calls per backend"],
    ]
    return Table("settings", ["setting", "value"], rows)


METHOD = """\
- **Interleaved.** For each workload and concurrency level *c*, the calls are
  cut into batches of *c* simultaneous callers, and the backends take turns
  batch by batch; the order rotates every round. Machine drift (other jobs on
  this shared 2-core machine) therefore hits every backend alike, and the
  *vs local* ratios compare batches that ran seconds apart.
- **Settled.** After each batch of a Docker backend the runner waits, untimed,
  until its pool is full again (`pool.ready_count == pool.size`) and Docker
  has removed the used containers, so one backend's background container
  starts, removals and resets never run during another backend's batch.
- **Warm-up.** Before each workload every backend runs unrecorded calls
  (sleep and timeout have nothing to warm and skip this).
- **Latency** is `ExecResult.latency`: from submission to result, including
  any wait for a slot or a warm container. **Throughput** is the calls of a
  cell divided by the wall time of its batches. **Failures** are calls whose
  outcome (or, where checked, output) is not the workload's expected one;
  a target whose cells have failures is marked FAIL.
- **Concurrency.** Each sandbox has `max_workers` = the highest level, so
  callers never queue in the Sandbox; for Docker the pool size bounds how many
  calls really run at once (see the sleep workload).
- **Fresh, pool not drained**: sequential calls on docker-fresh, each made only
  once the pool is full again (that wait is not counted), paired call by call
  with a local call (alternating which goes first).
- **Fresh, pool drained**: a separate docker-fresh backend with a small pool and
  many closed-loop callers; the sustained rate counts the calls completed after
  the pre-warmed ones.
- **Client CPU per call**: `time.process_time()` of the benchmarking process
  (every thread: event loops, docker-py threads) over N sequential calls, until
  the pool is full again, divided by N. It excludes the child processes of the
  local backend and everything in the containers.
- **Memory**: each warm container's memory cgroup (`memory.usage_in_bytes`,
  working set = usage minus inactive file cache), summed over the pool, after
  the run. Page cache shared between containers is charged to the first one to
  touch it; under gVisor the figure includes the Sentry's memory file.
- **Timeout**: the timeout workload loops forever under a 1 s limit; the target
  is judged on `latency - queue_wait - timeout` (how long the call took once
  it had its container) over every concurrency level, and on `latency - timeout`
  at concurrency 1.
- **Load.** The load average at the start is taken before the benchmark starts
  anything; the one at the end includes the benchmark's own processes (up to 64
  concurrent calls), so it is high by construction. Other jobs shared the
  machine during the run; the interleaving spreads their effect over every
  backend, but tail latencies (p95, p99) stay noisy.
- The local baseline runs in its own interpreter with the same numpy, sympy,
  scipy and mpmath versions as the sandbox image (see the environment), so
  the import costs compared are the same libraries'.
"""


def render(
    result: BenchResult,
    *,
    plot_name: str,
    json_name: str,
    peers_result: peers.PeersResult | None = None,
    peers_json_name: str = peers.DEFAULT_JSON.name,
) -> str:
    command = result.settings.command
    targets = target_table(result)
    parts = [
        "# Benchmarks",
        "",
        "<!-- Generated by benchmarks/make_report.py from "
        f"docs/{json_name}; do not edit by hand. -->",
        "",
        "Latency and throughput of the local subprocess backend (the seed's way, not "
        "isolated) and the Docker backend's policies, measured side by side in one run "
        "on this project's 2-core machine. Absolute times drift on a shared machine; "
        "the ratios to the local backend, measured in the same interleaved rounds, are "
        "the figures to compare.",
        "",
        "Reproduce (builds a baseline interpreter with the image's math stack, waits for "
        "a quiet machine, runs the benchmark, renders this page):",
        "",
        "```sh",
        "benchmarks/run.sh",
        "```",
        "",
        "which ran exactly:",
        "",
        "```sh",
        command + f" --json docs/{json_name} --plot docs/{plot_name}",
        "```",
        "",
        "## Targets",
        "",
        *(
            ["How it compares with epicbox and llm-sandbox: [Peers](#peers).", ""]
            if peers_result is not None
            else []
        ),
        "Why each figure is what it is (CPU per call, what limits throughput, gVisor, the "
        "fresh policy, memory), and the targets missed with their causes: "
        "[performance.md](performance.md).",
        "",
        "Each target of the Docker backend, the figure this run measured for it, and "
        "the verdict (NOT MEASURED is never a pass; a cell with failed calls fails). "
        "A ratio close to its limit is within this shared machine's run-to-run noise: "
        "throughput ratios in particular move by tens of percent between runs when "
        "other jobs load the two CPUs.",
        "",
        render_markdown_table(targets),
        "",
        "## Environment",
        "",
        render_markdown_table(_environment_table(result)),
        "",
        render_markdown_table(_settings_table(result)),
        "",
        "## Method",
        "",
        METHOD,
        "## Results",
        "",
        f"![latency CDFs and throughput against concurrency]({plot_name})",
        "",
        "Times in milliseconds. *p50 vs local* and *calls/s vs local* divide by the "
        "local backend's figure at the same concurrency in the same run.",
        "",
    ]
    for table in workload_tables(result):
        parts += [render_markdown_table(table, heading=f"### {table.title}"), ""]
    parts += ["## Start-up, fresh policy, client CPU, memory", ""]
    for table in extra_tables(result):
        parts += [render_markdown_table(table, heading=f"### {table.title}"), ""]
    if peers_result is not None:
        parts += [peers.render_section(peers_result, json_name=peers_json_name)]
    if result.notes:
        parts += ["## Notes from the run", ""]
        parts += [f"- {note}" for note in result.notes]
        parts.append("")
    return "\n".join(parts)


def scrub_paths(text: str) -> str:
    """The build machine's own paths out of the published figures: the checkout becomes
    ``.`` and the home directory ``~`` (the commands stay runnable from the repository)."""
    return text.replace(str(ROOT), ".").replace(str(Path.home()), "~")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=ROOT / "docs" / "benchmarks.json")
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "benchmarks.png")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--peers-json", type=Path, default=peers.DEFAULT_JSON)
    parser.add_argument("--backends", default=DEFAULT_BACKENDS)
    parser.add_argument("--local-python", default=None)
    parser.add_argument("--render-only", action="store_true", help="do not run; re-render")
    parser.add_argument("--max-load", type=float, default=1.5, help="wait for a lower load")
    parser.add_argument("--max-wait", type=float, default=600.0, help="seconds to wait at most")
    args, extra = parser.parse_known_args()
    if not args.render_only:
        run_bench(args, extra)
    raw = scrub_paths(args.json.read_text())
    args.json.write_text(raw)
    result = BenchResult.model_validate_json(raw)
    peers_result = None
    if args.peers_json.exists():
        peers_raw = scrub_paths(args.peers_json.read_text())
        peers_result = peers.PeersResult.model_validate_json(peers_raw)
    page = scrub_paths(
        render(
            result,
            plot_name=args.plot.name,
            json_name=args.json.name,
            peers_result=peers_result,
            peers_json_name=args.peers_json.name,
        )
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(page)
    print(f"wrote {args.out} ({dt.datetime.now(dt.UTC):%H:%M:%S} UTC)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
