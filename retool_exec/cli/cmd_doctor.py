"""``retool-exec doctor``: is Docker here, is the image built, is the isolation real?"""

from __future__ import annotations

import argparse
from typing import Any

from retool_exec._errors import RetoolExecError
from retool_exec.backends.config import BackendConfigBase, DockerConfig
from retool_exec.backends.registry import backend_spec
from retool_exec.cli._common import (
    EXIT_STATUS_HELP,
    SETTINGS_HELP,
    UsageError,
    add_settings_options,
    backend_list,
    build_configs,
)

__all__ = ["DEFAULT_BACKENDS", "build_doctor_configs", "register"]

DEFAULT_BACKENDS = ("docker", "docker-runsc")
"""Checked when no --backend is given (docker-runsc only where Docker has runsc)."""

_EPILOG = """\
The checks are cases of the security corpus (retool_exec/security/cases), run
with the audit's limits; `retool-exec audit` runs all of them.

Backends (--backend NAME; default: docker, and docker-runsc where Docker has
the runsc runtime; any docker backend of the table):
{backends}

{settings}

Exit status: 0 every check passed; 1 a check failed (Docker unreachable and a
missing image are failed checks too).
{exit_status}
"""


def register(subparsers: Any) -> None:
    """Add the ``doctor`` subcommand."""
    parser = subparsers.add_parser(
        "doctor",
        help="check Docker, the image and runtimes, and prove the isolation",
        description=(
            "Check the Docker daemon, the sandbox image and the runtimes, then run attack "
            "cases in real containers (network, read-only root, user, capabilities, "
            "environment, memory and process limits, the agent's reach). Exits non-zero "
            "if anything fails."
        ),
        epilog=_EPILOG.format(
            backends=backend_list(), settings=SETTINGS_HELP, exit_status=EXIT_STATUS_HELP
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--backend",
        action="append",
        default=None,
        metavar="NAME",
        help="docker backend to check (repeatable)",
    )
    parser.add_argument("--runtime", default=None, help="OCI runtime for every backend checked")
    parser.add_argument(
        "--docker-host", default=None, metavar="URL", help="daemon address (DOCKER_HOST)"
    )
    add_settings_options(parser)
    parser.set_defaults(handler=_handle)


def _line(ok: bool, name: str, detail: str = "") -> None:
    mark = "PASS" if ok else "FAIL"
    print(f"  {mark}  {name}" + (f"  ({detail})" if detail else ""), flush=True)


def build_doctor_configs(
    names: list[str], args: argparse.Namespace
) -> dict[str, BackendConfigBase]:
    """The config of each backend to check; every one must be a Docker backend."""
    for name in names:
        if not issubclass(backend_spec(name).config_class, DockerConfig):
            raise UsageError(f"doctor checks docker backends; {name!r} is not one")
    flags = {
        key: (value, flag)
        for key, value, flag in (
            ("runtime", args.runtime, "--runtime"),
            ("docker_host", args.docker_host, "--docker-host"),
        )
        if value is not None
    }
    # The doctor never builds the image: a missing one is a failed check, said at once.
    return build_configs(names, args, defaults={"auto_build": False}, flags=flags)


def _handle(args: argparse.Namespace) -> int:
    from retool_exec.backends.docker.client import connect
    from retool_exec.backends.docker.image import find_image
    from retool_exec.backends.docker.image_inputs import build_flags, image_tag
    from retool_exec.doctor import run_doctor

    names = list(args.backend or DEFAULT_BACKENDS[:1])
    configs = build_doctor_configs(names, args)  # bad settings: one line before any check
    docker_host = next(
        (c.docker_host for c in configs.values() if isinstance(c, DockerConfig)), None
    )
    failures = 0
    print("retool-exec doctor")
    try:
        client = connect(docker_host)
    except RetoolExecError as exc:
        _line(False, "Docker daemon reachable", str(exc))
        return 1
    try:
        info = client.info()
        runtimes = sorted(info.get("Runtimes", {}))
        _line(True, "Docker daemon reachable", f"server {info.get('ServerVersion')}")
        dockers = [c for c in configs.values() if isinstance(c, DockerConfig)]
        images = {c.image or image_tag(c.spec): c for c in dockers} or {image_tag(): DockerConfig()}
        for tag, wanted in sorted(images.items()):
            found = find_image(client, tag)
            if found is None:
                hint = (
                    "not in the daemon (images are never pulled: `docker load` it)"
                    if wanted.image
                    else f"run `retool-exec image build{build_flags(wanted.spec)}`"
                )
                _line(False, "sandbox image present", f"{tag}: {hint}")
                return 1
            what = found.spec or "your own image: the agent is sent in at start"
            pip = f"; from PyPI: {', '.join(found.pip)}" if found.pip else ""
            _line(True, "sandbox image present", f"{tag} ({what}{pip})")
        _line(True, "runtimes", ", ".join(runtimes))
    finally:
        client.close()
    if not args.backend and "runsc" in runtimes:
        names.append("docker-runsc")
        configs = build_doctor_configs(names, args)
    for name, config in configs.items():
        runtime = getattr(config, "runtime", None)
        print(f"backend: {name} (runtime {runtime or 'default'})", flush=True)
        for check in run_doctor(config, name=name, report=lambda c: _line(c.ok, c.name, c.detail)):
            failures += not check.ok
    print("all checks passed" if not failures else f"{failures} check(s) FAILED", flush=True)
    return 1 if failures else 0
