"""Runs one peer library's calls for ``benchmarks/peers.py``, inside that peer's own venv.

Why a separate process: epicbox 1.1.0 builds its docker-py retry policy with
``Retry(method_whitelist=...)``, which urllib3 2 removed, so it needs urllib3
1.26 while retool_exec's venv has urllib3 2; and no peer should load into the
process whose own backends are being timed. So each peer lives in a venv of
its own (``benchmarks/peers/setup.sh``) and this script, run by that venv's
Python, speaks JSON lines with the orchestrator:

- it writes ``{"ready": true, "startup_seconds": s, "versions": {...}}`` (or
  ``{"ready": false, "error": "..."}``) once the peer is set up;
- then, for each request line ``{"code": "...", "timeout": s}`` it writes one
  reply ``{"latency", "stdout", "stderr", "exit_code", "timed_out",
  "oom_killed", "error"}``; latency is timed here, around the library's own
  call, so the pipe to the orchestrator is not counted;
- at end of input it closes the peer (llm-sandbox removes its container) and
  exits. The orchestrator's end closes our stdin, so this process cannot
  outlive it.

Only the standard library and the peer are imported: this file runs under
another venv than the project's.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
import time
import traceback
from typing import Any, Protocol

PEERS = ("epicbox", "llm-sandbox")


class Peer(Protocol):
    def run(self, code: str, timeout: float) -> dict[str, Any]: ...

    def close(self) -> None: ...


class Epicbox:
    """epicbox's documented use: one profile, ``epicbox.run`` per call.

    Each call creates a container (``/bin/sh -c 'python3 main.py'``), copies
    ``main.py`` in with put_archive, starts and attaches to it, inspects its
    exit state and removes it: a new container per call, as epicbox always does.
    Hardening is epicbox's default profile (no network, root user, writable
    root filesystem, logging off) with the same memory, process and time
    limits as the retool_exec backends.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        import epicbox  # type: ignore[import-not-found]  # lives in its own venv

        self.epicbox = epicbox
        epicbox.configure(profiles=[epicbox.Profile("python", args.image)])
        self.limits = {
            "cputime": int(args.timeout),
            "realtime": int(args.timeout),
            "memory": args.memory_mb,
            "processes": args.pids,
        }

    def run(self, code: str, timeout: float) -> dict[str, Any]:
        limits = {**self.limits, "realtime": max(1, round(timeout))}
        result = self.epicbox.run(
            "python",
            "python3 main.py",
            files=[{"name": "main.py", "content": code.encode()}],
            limits=limits,
        )
        return {
            "stdout": result["stdout"].decode(errors="replace"),
            "stderr": result["stderr"].decode(errors="replace"),
            "exit_code": result["exit_code"],
            "timed_out": bool(result["timeout"]),
            "oom_killed": bool(result["oom_killed"]),
        }

    def close(self) -> None:
        pass


class LlmSandbox:
    """llm-sandbox's documented use: one ``SandboxSession`` kept open for every call.

    The session starts one container (as root, llm-sandbox's default) at open;
    each ``session.run`` then makes a ``docker exec mkdir -p``, copies the code
    file in with put_archive, and ``docker exec``s ``python <file>`` in the same
    container, so calls share the container's files and processes.
    ``skip_environment_setup=True`` because its default set-up creates a venv
    and upgrades pip from PyPI, and these containers have no network (their
    docs give that switch for images with the libraries pre-installed).
    ``runtime_configs`` give the same limits as the retool_exec backends
    (memory, CPU share, process count) and no network.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        from llm_sandbox import SandboxSession  # type: ignore[import-not-found]

        mib = 1024 * 1024
        self.session = SandboxSession(
            lang="python",
            image=args.image,
            keep_template=True,
            skip_environment_setup=True,
            execution_timeout=args.timeout,
            runtime_configs={
                "network_mode": "none",
                "mem_limit": args.memory_mb * mib,
                "memswap_limit": args.memory_mb * mib,
                "nano_cpus": int(args.cpus * 1e9),
                "pids_limit": args.pids,
                "labels": dict(args.label),
            },
        )
        self.session.open()

    def run(self, code: str, timeout: float) -> dict[str, Any]:
        from llm_sandbox.exceptions import SandboxTimeoutError  # type: ignore[import-not-found]

        try:
            output = self.session.run(code, timeout=timeout)
        except SandboxTimeoutError as exc:
            return {"stdout": "", "stderr": str(exc), "exit_code": None, "timed_out": True}
        return {
            "stdout": output.stdout,
            "stderr": output.stderr,
            "exit_code": output.exit_code,
            "timed_out": False,
            "oom_killed": False,
        }

    def close(self) -> None:
        self.session.close()


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--label takes KEY=VALUE, got {text!r}")
    return key, value


def _versions(peer: str) -> dict[str, str]:
    names = [peer, "docker", "requests", "urllib3"]
    found = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    found["python"] = sys.version.split()[0]
    return found


def _make(args: argparse.Namespace) -> Peer:
    return Epicbox(args) if args.peer == "epicbox" else LlmSandbox(args)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", choices=PEERS, required=True)
    parser.add_argument("--image", required=True)
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--memory-mb", type=int, default=1024)
    parser.add_argument("--cpus", type=float, default=1.0)
    parser.add_argument("--pids", type=int, default=128)
    parser.add_argument("--label", type=_label, action="append", default=[])
    args = parser.parse_args()

    # The protocol keeps the real stdout; anything a library prints goes to stderr.
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def send(message: dict[str, Any]) -> None:
        protocol.write(json.dumps(message) + "\n")

    started = time.perf_counter()
    try:
        peer = _make(args)
    except Exception as exc:
        send({"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        traceback.print_exc()
        return 1
    send(
        {
            "ready": True,
            "startup_seconds": time.perf_counter() - started,
            "versions": _versions(args.peer),
        }
    )
    try:
        for line in sys.stdin:
            request = json.loads(line)
            began = time.perf_counter()
            try:
                reply = peer.run(request["code"], float(request["timeout"]))
                reply["error"] = None
            except Exception as exc:
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            reply["latency"] = time.perf_counter() - began
            send(reply)
    finally:
        peer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
