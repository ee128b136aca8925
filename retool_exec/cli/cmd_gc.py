"""``retool-exec gc``: remove sandbox containers whose owner process is gone."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from retool_exec.cli._common import EXIT_STATUS_HELP

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``gc`` subcommand."""
    parser = subparsers.add_parser(
        "gc",
        help="remove orphaned sandbox containers",
        description=(
            "Remove retool_exec containers whose owner process on this host has exited "
            "(crashed trainers, killed notebooks). Live pools are left alone."
        ),
        epilog="Exit status: 0 nothing left to remove; 1 a container could not be removed.\n"
        + EXIT_STATUS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dry-run", action="store_true", help="list, do not remove")
    parser.add_argument(
        "--docker-host", default=None, metavar="URL", help="daemon address (DOCKER_HOST)"
    )
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    import docker.errors

    from retool_exec.backends.docker.client import connect
    from retool_exec.backends.docker.containers import find_orphans, remove_container

    client = connect(args.docker_host)  # unreachable: one line and its status (cli.main)
    failed = 0
    try:
        orphans = find_orphans(client)
        for orphan in orphans:
            if args.dry_run:
                print(f"would remove {orphan.short_id} (owner {orphan.owner or '?'})")
                continue
            try:
                remove_container(client, orphan.id)
                print(f"removed {orphan.short_id} (owner {orphan.owner or '?'})")
            except docker.errors.APIError as exc:
                failed += 1
                print(f"could not remove {orphan.short_id}: {exc}", file=sys.stderr)
        if not orphans:
            print("no orphaned sandbox containers")
    finally:
        client.close()
    return 1 if failed else 0
