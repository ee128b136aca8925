"""``retool-exec doctor``: is Docker here, is the image built, is the isolation real?"""

from __future__ import annotations

import argparse
from typing import Any

from retool_exec._errors import RetoolExecError

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``doctor`` subcommand."""
    parser = subparsers.add_parser(
        "doctor",
        help="check Docker, the image and runtimes, and prove the isolation",
        description=(
            "Check the Docker daemon, the sandbox image and the runtimes, then run probes in "
            "real containers (network, read-only root, memory and pid limits, environment, "
            "capabilities, user). Exits non-zero if anything fails."
        ),
    )
    parser.add_argument(
        "--runtime",
        action="append",
        default=None,
        help="runtime to probe (repeatable; default: the daemon's default, plus runsc if present)",
    )
    parser.add_argument("--docker-host", default=None)
    parser.set_defaults(handler=_handle)


def _line(ok: bool, name: str, detail: str = "") -> None:
    mark = "PASS" if ok else "FAIL"
    print(f"  {mark}  {name}" + (f"  ({detail})" if detail else ""), flush=True)


def _handle(args: argparse.Namespace) -> int:
    from retool_exec.backends.docker.client import connect
    from retool_exec.backends.docker.image import image_tag
    from retool_exec.doctor import run_doctor

    failures = 0
    print("retool-exec doctor")
    try:
        client = connect(args.docker_host)
    except RetoolExecError as exc:
        _line(False, "Docker daemon reachable", str(exc))
        return 1
    try:
        info = client.info()
        runtimes = sorted(info.get("Runtimes", {}))
        _line(True, "Docker daemon reachable", f"server {info.get('ServerVersion')}")
        tag = image_tag()
        present = bool(client.images.list(name=tag))
        _line(
            present,
            "sandbox image present",
            tag if present else f"{tag}: run `retool-exec image build`",
        )
        if not present:
            return 1
        wanted = args.runtime or [None] + (["runsc"] if "runsc" in runtimes else [])
        _line(True, "runtimes", ", ".join(runtimes))
    finally:
        client.close()
    for runtime in wanted:
        print(f"runtime: {runtime or 'default (runc)'}")
        for check in run_doctor(runtime, report=lambda c: _line(c.ok, c.name, c.detail)):
            failures += not check.ok
    print("all checks passed" if not failures else f"{failures} check(s) FAILED", flush=True)
    return 1 if failures else 0
