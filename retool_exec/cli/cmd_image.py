"""``retool-exec image build|ls``: the sandbox image, built without any registry."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pydantic import ValidationError

from retool_exec.backends.docker.image_spec import (
    PRESETS,
    ImageSpec,
    ImageSpecError,
    describe_errors,
)
from retool_exec.cli._common import EXIT_STATUS_HELP, UsageError

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``image`` subcommand."""
    parser = subparsers.add_parser(
        "image",
        help="build or list the sandbox image",
        description="Build the sandbox image from Debian's packages (no registry), or list it.",
        epilog=EXIT_STATUS_HELP,
    )
    actions = parser.add_subparsers(dest="image_action", metavar="ACTION", required=True)
    build = actions.add_parser(
        "build",
        help="build the image unless it is already present",
        description="Build a sandbox image: a preset plus extra Debian and PyPI packages "
        "(docs: images/README.md). The tag is content-addressed over what goes in, so the "
        "same spec never builds twice.",
    )
    build.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default=None,
        help="base package set: " + "; ".join(f"{k}: {v}" for k, v in sorted(PRESETS.items())),
    )
    build.add_argument(
        "--apt", action="append", default=[], metavar="NAME", help="extra Debian package (repeat)"
    )
    build.add_argument(
        "--pip",
        action="append",
        default=[],
        metavar="REQ",
        help="extra PyPI requirement, installed at build time (repeat)",
    )
    build.add_argument(
        "--spec", default=None, metavar="FILE", help="an image spec TOML file (flags add to it)"
    )
    build.add_argument("--force", action="store_true", help="rebuild even if present")
    build.add_argument(
        "--install-tools",
        action="store_true",
        help="apt-get install mmdebstrap when it is missing (needs root)",
    )
    build.add_argument("--docker-host", default=None, help="daemon address (default: DOCKER_HOST)")
    build.set_defaults(handler=_build)
    listing = actions.add_parser("ls", help="list sandbox images")
    listing.add_argument(
        "--docker-host", default=None, help="daemon address (default: DOCKER_HOST)"
    )
    listing.set_defaults(handler=_list)


def _progress(line: str) -> None:
    print(f"  {line}", file=sys.stderr, flush=True)


def spec_from_args(args: argparse.Namespace) -> ImageSpec:
    """The spec the flags describe (``--spec`` first, the other flags on top)."""
    try:
        spec = ImageSpec.from_toml(args.spec) if args.spec else ImageSpec()
        return ImageSpec.model_validate(
            {
                **spec.model_dump(),
                "preset": args.preset or spec.preset,
                "apt": [*spec.apt, *args.apt],
                "pip": [*spec.pip, *args.pip],
            }
        )
    except ImageSpecError as exc:
        raise UsageError(str(exc)) from exc
    except ValidationError as exc:
        raise UsageError(f"bad image spec: {describe_errors(exc, prefix='--')}") from exc


def _build(args: argparse.Namespace) -> int:
    from retool_exec.backends.docker.client import connect
    from retool_exec.backends.docker.image import build_image

    spec = spec_from_args(args)
    client = connect(args.docker_host)
    try:
        info = build_image(
            client,
            spec,
            force=args.force,
            progress=_progress,
            install_tools=args.install_tools,
        )
    finally:
        client.close()
    state = "built" if info.built else "present"
    print(f"{info.tag}  {info.size_bytes / 1e6:.0f} MB  ({state})  {info.spec}")
    if info.pip:
        print(f"  from PyPI: {', '.join(info.pip)}")
    return 0


def _list(args: argparse.Namespace) -> int:
    from retool_exec.backends.docker.client import connect
    from retool_exec.backends.docker.image import is_current, list_images
    from retool_exec.backends.docker.image_inputs import image_tag

    client = connect(args.docker_host)
    try:
        images = list_images(client)
    finally:
        client.close()
    default = image_tag()
    print(f"{'TAG':<38} {'SIZE':>7}  {'CREATED':<19}  {'CURRENT':<7}  SPEC")
    for info in images:
        mark = "default" if info.tag == default else "yes" if is_current(info) else ""
        created = info.created.strftime("%Y-%m-%d %H:%M:%S")
        size = f"{info.size_bytes / 1e6:.0f}MB"
        print(f"{info.tag:<38} {size:>7}  {created:<19}  {mark:<7}  {info.spec or '?'}")
        if info.pip:
            print(f"{'':<38} from PyPI: {', '.join(info.pip)}")
    if not any(info.tag == default for info in images):
        print(f"(the default image {default} is not built: run `retool-exec image build`)")
    print("CURRENT: built from this version's agent and build script (older ones are unused)")
    return 0
