"""A SandboxFusion-compatible HTTP server over retool_exec (the ``[server]`` extra).

Training stacks that already speak SandboxFusion's API (verl, SkyRL, ToRL,
ZeroTIR) switch to retool_exec by changing one URL. Start it with
``retool-exec serve`` or build the ASGI app yourself:

    from retool_exec import DockerConfig
    from retool_exec.server import ServerSettings, create_app

    app = create_app(DockerConfig(pool_size=8), settings=ServerSettings(max_queue=512))

See ``docs/server.md``. Needs ``pip install 'retool_exec[server]'``.
"""

from __future__ import annotations

try:
    import fastapi as _fastapi  # noqa: F401 - only checks that the extra is installed
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
    raise ModuleNotFoundError(
        f"retool_exec.server needs {exc.name}; install it with: pip install 'retool_exec[server]'",
        name=exc.name,
    ) from exc

from retool_exec.server.app import OUTCOME_HEADER, create_app
from retool_exec.server.connections import uvicorn_config
from retool_exec.server.settings import ServerSettings

__all__ = ["OUTCOME_HEADER", "ServerSettings", "create_app", "uvicorn_config"]
