"""Joining a Ray cluster: which cluster, and never a second one by accident.

Ray is imported here and only here, when a ray backend starts, so that
``import retool_exec`` (and building a RayConfig) works without the extra.
"""

from __future__ import annotations

import logging
import os
from types import ModuleType

from retool_exec._errors import BackendUnavailableError

__all__ = ["INSTALL_HINT", "connect", "import_ray"]

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'retool_exec[ray]'"

_connected_in: list[int] = []
"""The process that called ``ray.init`` here (a forked child must not reuse it)."""


def import_ray() -> ModuleType:
    """The ``ray`` module, or an error that says what to install."""
    try:
        import ray
    except ImportError as exc:
        raise BackendUnavailableError(
            f"the ray backend needs Ray, which is not installed: {INSTALL_HINT}"
        ) from exc
    return ray


def connect(address: str | None) -> ModuleType:
    """Ray, connected to the cluster ``address`` names (see ``RayConfig.address``).

    Already connected (a training job called ``ray.init``, or this is a Ray
    worker): that connection is used whatever ``address`` says, since a process
    has one Ray connection and the job's is the one its resources live in.
    None or ``"auto"`` joins a running cluster and fails if there is none: a
    sandbox must not quietly start a second Ray inside a verl job, where it
    would compete for the same CPUs and never see the job's nodes. ``"local"``
    starts a private one only because it is asked to by name.
    """
    ray = import_ray()
    if ray.is_initialized():
        if _connected_in and _connected_in[0] != os.getpid():
            raise BackendUnavailableError(
                f"Ray was connected in process {_connected_in[0]} and this is its fork "
                f"{os.getpid()}: a Ray connection does not survive fork(); create the "
                "Sandbox in a process started with the 'spawn' method"
            )
        if address not in (None, "auto", "local"):
            log.info("Ray is already initialised in this process; address %r is not used", address)
        return ray
    target = None if address == "local" else address or "auto"
    try:
        ray.init(address=target, log_to_driver=False)
    except ConnectionError as exc:
        raise BackendUnavailableError(
            f"no Ray cluster to join at {target!r}: start one (`ray start --head`, or run "
            "inside your Ray job), set RAY_ADDRESS, or pass address='local' to start a "
            f"private one here ({exc})"
        ) from exc
    except Exception as exc:
        raise BackendUnavailableError(f"could not connect to Ray at {target!r}: {exc}") from exc
    _connected_in[:] = [os.getpid()]
    return ray
