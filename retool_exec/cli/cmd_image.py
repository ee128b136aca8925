"""``retool-exec image build|ls``: the sandbox image, built without any registry."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from retool_exec.cli._common import EXIT_STATUS_HELP

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
    build = actions.add_parser("build", help="build the image unless it is already present")
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


def _build(args: argparse.Namespace) -> int:
    from retool_exec.backends.docker.client import connect
    from retool_exec.backends.docker.image import build_image

    client = connect(args.docker_host)
    try:
        info = build_image(
            client, force=args.force, progress=_progress, install_tools=args.install_tools
        )
    finally:
        client.close()
    state = "built" if info.built else "present"
    print(f"{info.tag}  {info.size_bytes / 1e6:.0f} MB  ({state})")
    return 0


def _list(args: argparse.Namespace) -> int:
    from retool_exec.backends.docker.client import connect
    from retool_exec.backends.docker.image import image_tag, list_images

    client = connect(args.docker_host)
    try:
        images = list_images(client)
    finally:
        client.close()
    current = image_tag()
    print(f"{'TAG':<40} {'SIZE':>8}  {'CREATED':<20} CURRENT")
    for info in images:
        mark = "*" if info.tag == current else ""
        created = info.created.strftime("%Y-%m-%d %H:%M:%S")
        print(f"{info.tag:<40} {info.size_bytes / 1e6:>6.0f}MB  {created:<20} {mark}")
    if not any(info.tag == current for info in images):
        print(f"(the current image {current} is not built: run `retool-exec image build`)")
    return 0
