"""Peers side by side: epicbox and llm-sandbox against our backends, in one interleaved run.

    python benchmarks/peers.py          # full run -> docs/benchmarks-peers.json
    python benchmarks/peers.py --quick  # a dry run: a few calls per cell
    python benchmarks/peers.py --clean  # remove the peers' image(s) and any leftover container

Users choose between retool_exec and the libraries they know, so the same
workloads (print, numpy, sympy, error: ``retool_exec.bench.workloads``) run on
epicbox and llm-sandbox and on our local, docker-reuse and docker-fresh
backends, call by call in rotating order, so machine drift hits all alike;
every ratio divides by the local backend's p50 from the same run.

- **Their own venvs.** epicbox 1.1.0 needs urllib3 < 2, ours has 2, and no
  peer should load into the process that times our backends: each peer runs
  in ``benchmarks/peers_worker.py`` under its own venv
  (``benchmarks/peers/setup.sh``, pins beside it), speaking JSON lines.
- **Their image, derived from ours** (no registry is reachable): a container
  of our sandbox image gets a ``python`` symlink and a ``/sandbox`` folder,
  and ``docker commit`` makes it an image with no entry point, labelled
  ``org.retool_exec_bench.peers`` and tagged by the hash of what went in.
- **Concurrency 1 only**: the question is the cost of one call, each peer
  used as its README shows (``epicbox.run``; one ``SandboxSession``).
- **Nothing left behind**: every container of the run carries the label (the
  peers' inherit it from the image), and is removed at the end; the workers
  exit when their stdin closes, and are killed if they do not.

``benchmarks/make_report.py`` renders the JSON as the Peers section of
docs/benchmarks.md (``render_section`` below).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import hashlib
import io
import json
import os
import shlex
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from retool_exec import ExecResult, Outcome, Sandbox
from retool_exec.bench.backends import LOCAL, bench_config, is_docker
from retool_exec.bench.pools import settle
from retool_exec.bench.report import Table, fmt_ms, fmt_ratio, render_markdown_table
from retool_exec.bench.results import CellResult
from retool_exec.bench.stats import ratio
from retool_exec.bench.workloads import Workload, select_workloads

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "retool-exec-bench"
PEERS_DIR = Path(os.environ.get("BENCH_PEERS_DIR") or CACHE / "peers")
DEFAULT_JSON = ROOT / "docs" / "benchmarks-peers.json"

SCHEMA = "retool_exec.bench.peers/1"
PEERS = ("epicbox", "llm-sandbox")
OURS = (LOCAL, "docker-reuse", "docker-fresh")
WORKLOADS = ("print", "numpy", "sympy", "error")
LABEL = "org.retool_exec_bench.peers"
"""On every container of a run (value: the run id) and on the peers' image (``image``)."""
IMAGE_REPOSITORY = "retool-exec-bench-peers"
DERIVE_VERSION = "1"
"""Bumped when the derivation changes, so the tag changes with it."""

PER_CALL: dict[str, str] = {
    LOCAL: "a fresh `python -B` subprocess on the host (the seed's way; NOT isolated)",
    "docker-reuse": "a fork of a warm container's preloaded agent; the container serves "
    "many calls with a verified reset between them",
    "docker-fresh": "a fork of a warm container's preloaded agent; the container is removed "
    "after the call and a new one warms up in the background",
    "epicbox": "a new container per call: create, copy `main.py` in (put_archive), start, "
    "attach, inspect, remove (`epicbox.run`)",
    "llm-sandbox": "one container kept by an open `SandboxSession`: per call a `docker exec "
    "mkdir -p`, the code file copied in, and a `docker exec python <file>`; files persist "
    "between calls",
}
HARDENING: dict[str, str] = {
    LOCAL: "none",
    "docker-reuse": "docs/security.md: no network, read-only root, capped tmpfs, all "
    "capabilities dropped before the code runs, non-root uid, no-new-privileges, "
    "memory/pids/CPU/nofile/fsize limits",
    "docker-fresh": "as docker-reuse",
    "epicbox": "its default profile: network disabled, runs as root, writable root "
    "filesystem, logging off; limits: memory and processes as ours, CPU time and wall "
    "time = our timeout (it has no CPU share setting)",
    "llm-sandbox": "its defaults (runs as root, writable root filesystem, no security "
    "policy) plus `runtime_configs`: no network, memory, CPU share and pids as ours",
}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PeerBackend(_Model):
    """One backend of the run: ours or a peer's, and what it costs to get ready."""

    name: str
    peer: bool
    startup_seconds: float | None = None
    versions: dict[str, str] = Field(default_factory=dict)


class PeersResult(_Model):
    """Everything one run measured; the Peers section is rendered from this alone."""

    schema_: str = Field(default=SCHEMA, alias="schema")
    started_at: str
    finished_at: str = ""
    duration_seconds: float = 0.0
    command: str
    quick: bool
    calls: int
    warmup: int
    timeout: float
    memory_mb: int
    image: str = ""
    """Our sandbox image, as our Docker backends ran it."""
    peer_image: str = ""
    backends: list[PeerBackend] = Field(default_factory=list)
    cells: list[CellResult] = Field(default_factory=list)
    environment: dict[str, Any] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# --- pure parts: results, table, section ------------------------------------------------


def peer_exec_result(name: str, reply: dict[str, Any]) -> ExecResult:
    """A worker's reply as an ``ExecResult``, so ``Workload.failure`` judges it as ours."""
    latency = float(reply.get("latency", 0.0))
    if reply.get("error"):
        return ExecResult(
            False,
            "",
            "",
            None,
            False,
            latency,
            outcome=Outcome.SANDBOX_ERROR,
            backend=name,
            detail=str(reply["error"]),
        )
    code = reply.get("exit_code")
    timed_out = bool(reply.get("timed_out"))
    if timed_out:
        outcome = Outcome.TIMEOUT
    elif reply.get("oom_killed"):
        outcome = Outcome.OOM
    else:
        outcome = Outcome.SUCCESS if code == 0 else Outcome.ERROR
    return ExecResult(
        outcome is Outcome.SUCCESS,
        str(reply.get("stdout") or ""),
        str(reply.get("stderr") or ""),
        code,
        timed_out,
        latency,
        outcome=outcome,
        backend=name,
    )


def peers_table(result: PeersResult) -> Table:
    """Per workload, per backend: calls, p50, p95, p50 / local p50 (same run), failures."""
    by_key = {(c.workload, c.backend): c for c in result.cells}
    names = [b.name for b in result.backends]
    workloads = list(dict.fromkeys(c.workload for c in result.cells))
    rows = []
    for workload in workloads:
        local = by_key.get((workload, LOCAL))
        local_p50 = local.summary().p50 if local is not None else None
        for name in names:
            cell = by_key.get((workload, name))
            if cell is None:
                continue
            summary = cell.summary()
            rows.append(
                [
                    workload,
                    name,
                    str(summary.count),
                    fmt_ms(summary.p50),
                    fmt_ms(summary.p95),
                    fmt_ratio(ratio(summary.p50, local_p50)),
                    str(cell.failures),
                ]
            )
    headers = ["workload", "backend", "calls", "p50 ms", "p95 ms", "p50 vs local", "failed"]
    notes = [
        f"{c.backend} {c.workload}: {example}"
        for c in result.cells
        for example in c.failure_examples
    ]
    return Table("peers, concurrency 1", headers, rows, notes)


def per_call_table(result: PeersResult) -> Table:
    rows = []
    for backend in result.backends:
        versions = ", ".join(
            f"{k} {v}" for k, v in backend.versions.items() if k in (backend.name, "docker")
        )
        name = f"{backend.name} ({versions})" if versions else backend.name
        rows.append([name, PER_CALL.get(backend.name, "?"), HARDENING.get(backend.name, "?")])
    return Table("what each backend does per call", ["backend", "per call", "hardening"], rows)


def render_section(result: PeersResult, *, json_name: str = DEFAULT_JSON.name) -> str:
    """The Peers section of docs/benchmarks.md (Markdown), from one run's result."""
    env = result.environment
    source = env.get("source") or {}
    loads = env.get("load_average_at_start")
    load_text = " / ".join(f"{v:.2f}" for v in loads) if loads else "-"
    startups = ", ".join(
        f"{b.name} {b.startup_seconds:.2f} s"
        for b in result.backends
        if b.startup_seconds is not None and b.name != LOCAL
    )
    table = peers_table(result)
    parts = [
        "## Peers",
        "",
        "[epicbox](https://pypi.org/project/epicbox/) and "
        "[llm-sandbox](https://pypi.org/project/llm-sandbox/), Docker sandboxes for "
        "untrusted code on PyPI, ran the same workloads as the tables above, interleaved "
        "call by call (rotating order) with our local, docker-reuse and docker-fresh "
        "backends in one run. Concurrency 1 only: it measures the cost of one call, each "
        "peer used the way its README shows (`epicbox.run`; a `SandboxSession`); "
        "llm-sandbox's optional container pool is not measured. *p50 vs "
        "local* divides by the local backend's p50 of the same run. Each peer runs in a "
        "worker process under a venv of its own (`benchmarks/peers/setup.sh`, every "
        "package pinned), and its latency is timed in that process around the library's "
        "own call; ours is `ExecResult.latency`. The peers' image is derived from our "
        "sandbox image (no registry is reachable): the same Debian Python and math "
        "stack, plus a `python` symlink, a `/sandbox` folder and no entry point.",
        "",
        "Reproduce (`benchmarks/run.sh` runs it after the matrix; `--quick` for a dry run):",
        "",
        "```sh",
        ".venv/bin/python benchmarks/peers.py",
        "```",
        "",
        f"The table below is from the run of {result.started_at} "
        f"({result.duration_seconds / 60:.1f} min, source "
        f"{str(source.get('commit', '?'))[:12]}"
        f"{' with uncommitted changes' if source.get('dirty') else ''}, "
        f"load average at start {load_text}), which ran exactly "
        f"`{result.command}` and wrote `docs/{json_name}`.",
        "",
        render_markdown_table(per_call_table(result)),
        "",
        render_markdown_table(table),
        "",
        f"Images: ours `{result.image}`, the peers' `{result.peer_image}`. "
        f"{result.calls} recorded calls per backend per workload after {result.warmup} "
        f"warm-up calls; timeout {result.timeout:g} s, memory {result.memory_mb} MiB for "
        f"every backend. Start-up (not in the latencies): {startups or '-'}.",
        "",
    ]
    if result.notes:
        parts += ["Notes from the run:", "", *[f"- {n}" for n in result.notes], ""]
    return "\n".join(parts)


# --- the peers' image ---------------------------------------------------------------------


def _derive_tar() -> bytes:
    """What the peers need beyond our image: ``python`` (llm-sandbox runs ``python file``)
    and ``/sandbox`` (both peers' working directory). Deterministic, as it is hashed."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        link = tarfile.TarInfo("usr/local/bin/python")
        link.type, link.linkname, link.mode = tarfile.SYMTYPE, "/usr/bin/python3", 0o777
        folder = tarfile.TarInfo("sandbox")
        folder.type, folder.mode = tarfile.DIRTYPE, 0o1777
        tar.addfile(link)
        tar.addfile(folder)
    return buffer.getvalue()


def _derive_conf(base_tag: str) -> dict[str, Any]:
    return {
        "Entrypoint": [],
        "Cmd": ["python3"],
        "User": "65534:65534",
        "WorkingDir": "/sandbox",
        "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"],
        # Not "1": `retool-exec image ls` and our backends must not take it for theirs.
        "Labels": {
            LABEL: "image",
            "org.retool_exec.image": "peers",
            "org.retool_exec.tag": base_tag.partition(":")[2],
        },
    }


def peer_image_tag(base_id: str, base_tag: str) -> str:
    """Content-addressed: our image's id, the files added and the config."""
    digest = hashlib.sha256()
    for part in (DERIVE_VERSION, base_id, json.dumps(_derive_conf(base_tag), sort_keys=True)):
        digest.update(part.encode() + b"\0")
    digest.update(_derive_tar())
    return f"{IMAGE_REPOSITORY}:{digest.hexdigest()[:16]}"


def ensure_peer_image(client: Any, base_tag: str) -> str:
    """The peers' image, derived from ours with no registry and no container network."""
    import docker.errors

    try:
        base = client.images.get(base_tag)
    except docker.errors.ImageNotFound as exc:
        raise SystemExit(
            f"our sandbox image {base_tag} is missing: `retool-exec image build`"
        ) from exc
    tag = peer_image_tag(str(base.id), base_tag)
    with contextlib.suppress(docker.errors.ImageNotFound):
        client.images.get(tag)
        return tag
    helper = client.api.create_container(
        base_tag,
        entrypoint=["/bin/true"],
        network_disabled=True,
        labels={LABEL: "derive"},
        host_config=client.api.create_host_config(network_mode="none"),
    )
    try:
        client.api.put_archive(helper["Id"], "/", _derive_tar())
        repository, _, version = tag.partition(":")
        client.api.commit(
            helper["Id"], repository=repository, tag=version, conf=_derive_conf(base_tag)
        )
    finally:
        client.api.remove_container(helper["Id"], force=True)
    return tag


def sweep(client: Any) -> int:
    """Remove every container carrying the label (ours and the peers'); returns how many."""
    removed = 0
    for info in client.api.containers(all=True, filters={"label": LABEL}):
        with contextlib.suppress(Exception):
            client.api.remove_container(info["Id"], force=True)
            removed += 1
    return removed


def clean(client: Any) -> None:
    """Leftover containers, then the peers' images (all tags)."""
    print(f"removed {sweep(client)} container(s)", file=sys.stderr)
    for image in client.images.list(filters={"label": f"{LABEL}=image"}):
        for tag in image.tags or [image.id]:
            client.images.remove(tag, force=True)
            print(f"removed image {tag}", file=sys.stderr)


# --- the workers ----------------------------------------------------------------------------


class Worker:
    """One peer's worker process (``peers_worker.py`` under the peer's venv)."""

    def __init__(self, name: str, command: list[str]) -> None:
        self.name = name
        self.command = command
        self.process: asyncio.subprocess.Process | None = None
        self.ready: dict[str, Any] = {}

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            *self.command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=64 << 20,
        )
        self.ready = await self._read()
        if not self.ready.get("ready"):
            raise RuntimeError(f"{self.name} worker did not start: {self.ready.get('error')}")

    async def _read(self) -> dict[str, Any]:
        assert self.process is not None and self.process.stdout is not None
        line = await self.process.stdout.readline()
        if not line:
            code = await self.process.wait()
            raise RuntimeError(f"{self.name} worker exited (status {code}); its stderr is above")
        reply: dict[str, Any] = json.loads(line)
        return reply

    async def call(self, code: str, timeout: float) -> ExecResult:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write((json.dumps({"code": code, "timeout": timeout}) + "\n").encode())
        await self.process.stdin.drain()
        return peer_exec_result(self.name, await self._read())

    async def close(self, grace: float = 60.0) -> None:
        """End of input lets the peer close (llm-sandbox stops its container); kill after
        ``grace`` seconds."""
        process = self.process
        if process is None or process.returncode is not None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), grace)
        except TimeoutError:
            process.kill()
            await process.wait()


def worker_command(peer: str, args: argparse.Namespace, image: str, run_id: str) -> list[str]:
    return [
        str(PEERS_DIR / f"{peer}-venv" / "bin" / "python"),
        str(HERE / "peers_worker.py"),
        "--peer", peer,
        "--image", image,
        "--timeout", str(args.timeout),
        "--memory-mb", str(args.memory_mb),
        "--label", f"{LABEL}={run_id}",
    ]  # fmt: skip


# --- the run ----------------------------------------------------------------------------------


class Backends:
    """Our sandboxes and the peers' workers behind one ``call``."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.ours: dict[str, Sandbox] = {}
        self.workers: dict[str, Worker] = {}

    async def call(self, name: str, workload: Workload) -> ExecResult:
        if name in self.workers:
            timeout = workload.timeout or self.timeout
            return await self.workers[name].call(workload.code, timeout)
        result = await self.ours[name].arun_code(workload.code, timeout=workload.timeout)
        if is_docker(name):  # its pool refills and removals must not land in the next call
            await settle(self.ours[name], drain_removals=True)
        return result

    async def close(self) -> None:
        for worker in self.workers.values():
            await worker.close()
        for sandbox in self.ours.values():
            await sandbox.aclose()


TIMEOUT_DEFAULT = 30.0


def _wait_for_quiet(max_load: float, max_wait: float) -> None:
    deadline = time.monotonic() + max_wait
    while os.getloadavg()[0] >= max_load and time.monotonic() < deadline:
        print(f"load average {os.getloadavg()[0]:.2f} >= {max_load}; waiting 15 s", file=sys.stderr)
        time.sleep(15)


async def start_ours(name: str, args: argparse.Namespace, run_id: str) -> Sandbox:
    config = bench_config(
        name,
        timeout=args.timeout,
        pool_size=args.pool_size,
        labels={LABEL: run_id},
        local_python=args.local_python,
        settings={"memory_mb": args.memory_mb},
    )
    sandbox = Sandbox(config, max_workers=1)
    await sandbox.astart()
    if is_docker(name):
        await settle(sandbox, drain_removals=True)
    return sandbox


async def start_all(
    backends: Backends, args: argparse.Namespace, result: PeersResult, client: Any, run_id: str
) -> None:
    """Ours first, so the peers' image derives from the very image our backends run."""
    from retool_exec.backends.docker.image import ensure_image

    for name in (n for n in args.backends if n not in PEERS):
        began = time.perf_counter()
        sandbox = backends.ours[name] = await start_ours(name, args, run_id)
        result.image = result.image or str(getattr(sandbox.backend, "image", None) or "")
        result.backends.append(
            PeerBackend(name=name, peer=False, startup_seconds=time.perf_counter() - began)
        )
    if not result.image:  # no Docker backend of ours in the run: the default image
        say = lambda line: print(line, file=sys.stderr)  # noqa: E731
        result.image = (await asyncio.to_thread(ensure_image, client, progress=say)).tag
    result.peer_image = await asyncio.to_thread(ensure_peer_image, client, result.image)
    for name in (n for n in args.backends if n in PEERS):
        worker = Worker(name, worker_command(name, args, result.peer_image, run_id))
        backends.workers[name] = worker
        await worker.start()
        result.backends.append(
            PeerBackend(
                name=name,
                peer=True,
                startup_seconds=float(worker.ready.get("startup_seconds", 0.0)),
                versions=worker.ready.get("versions") or {},
            )
        )
    order = {n: i for i, n in enumerate(args.backends)}
    result.backends.sort(key=lambda b: order[b.name])


async def run(args: argparse.Namespace, command: str) -> PeersResult:
    from retool_exec.backends.docker.client import connect
    from retool_exec.bench.environment import collect_environment, missing_modules

    run_id = uuid.uuid4().hex[:12]
    client = connect()
    sweep(client)
    _wait_for_quiet(args.max_load, args.max_wait)
    result = PeersResult(
        started_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        command=command,
        quick=args.quick,
        calls=args.calls,
        warmup=args.warmup,
        timeout=args.timeout,
        memory_mb=args.memory_mb,
    )
    result.environment = await asyncio.to_thread(
        collect_environment, local_python=args.local_python, docker=True
    )
    missing = missing_modules(result.environment["local_python"], ("numpy", "sympy"))
    if missing:
        result.notes.append(
            f"the local interpreter {args.local_python} cannot import {', '.join(missing)}: "
            "those ratios mean nothing (benchmarks/run.sh builds the baseline interpreter)"
        )
    started = time.perf_counter()
    backends = Backends(args.timeout)
    try:
        await start_all(backends, args, result, client, run_id)
        await matrix(backends, args, result)
    finally:
        await backends.close()
        left = sweep(client)
        if left:
            result.notes.append(f"{left} labelled container(s) were still there at the end")
        client.close()
    result.finished_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    result.duration_seconds = time.perf_counter() - started
    return result


async def matrix(backends: Backends, args: argparse.Namespace, result: PeersResult) -> None:
    names = list(args.backends)
    for workload in select_workloads(list(WORKLOADS)):
        print(f"{workload.name}: warm-up", file=sys.stderr)
        for name in names:
            for _ in range(args.warmup):
                await backends.call(name, workload)
        cells = {n: CellResult(backend=n, workload=workload.name, concurrency=1) for n in names}
        for index in range(args.calls):
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                began = time.perf_counter()
                outcome = await backends.call(name, workload)
                cell = cells[name]
                cell.latencies.append(outcome.latency)
                cell.queue_waits.append(outcome.queue_wait)
                cell.outcomes.append(outcome.outcome.value)
                cell.segment_walls.append(time.perf_counter() - began)
                cell.segment_calls.append(1)
                why = workload.failure(outcome)
                if why is not None:
                    cell.failures += 1
                    if len(cell.failure_examples) < 3:
                        cell.failure_examples.append(why)
        print(f"{workload.name}: {args.calls} calls per backend done", file=sys.stderr)
        result.cells.extend(cells.values())


def _default_local_python() -> str:
    baseline = CACHE / "baseline-venv" / "bin" / "python"
    return str(baseline) if baseline.exists() else sys.executable


def _scrub(text: str) -> str:
    return text.replace(str(ROOT), ".").replace(str(Path.home()), "~")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a dry run: 3 calls, 1 warm-up")
    parser.add_argument("--calls", type=int, default=None, help="recorded calls per cell (40)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up calls per cell (2)")
    parser.add_argument("--backends", default=",".join(OURS + PEERS))
    parser.add_argument("--timeout", type=float, default=TIMEOUT_DEFAULT)
    parser.add_argument("--memory-mb", type=int, default=1024)
    parser.add_argument(
        "--pool-size", type=int, default=2, help="our Docker pools (calls are 1 at a time)"
    )
    parser.add_argument("--local-python", default=_default_local_python())
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--max-load", type=float, default=1.5, help="wait for a lower load")
    parser.add_argument("--max-wait", type=float, default=600.0, help="seconds to wait at most")
    parser.add_argument("--no-setup", action="store_true", help="do not run peers/setup.sh")
    parser.add_argument("--clean", action="store_true", help="remove the peers' images; no run")
    args = parser.parse_args(argv)
    args.calls = args.calls or (3 if args.quick else 40)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    args.backends = [n.strip() for n in args.backends.split(",") if n.strip()]
    unknown = [n for n in args.backends if n not in OURS + PEERS]
    if unknown or LOCAL not in args.backends:
        parser.error(f"--backends: choose from {', '.join(OURS + PEERS)}, local included")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.clean:
        from retool_exec.backends.docker.client import connect

        clean(connect())
        return 0
    peers = [n for n in args.backends if n in PEERS]
    if peers and not args.no_setup:
        subprocess.run([str(HERE / "peers" / "setup.sh"), *peers], check=True)
    command = _scrub(
        shlex.join(["python", "benchmarks/peers.py", *(sys.argv[1:] if argv is None else argv)])
    )
    result = asyncio.run(run(args, command))
    raw = _scrub(result.model_dump_json(indent=1, by_alias=True))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(raw + "\n")
    from retool_exec.bench.report import render_text_table

    print(render_text_table(peers_table(result)))
    print(f"wrote {_scrub(str(args.json))}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
