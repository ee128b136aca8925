"""Running the agent in an image that does not hold it: any image with a ``python3`` >= 3.9.

Why this way: a team's own image must not be rebuilt, written into, mounted
into or pushed anywhere to become a sandbox. So the container starts
``python3 -I -B -c BOOTSTRAP`` instead of the baked-in agent: a few lines
that read one frame from stdin (the attach stream the host already holds),
check its sha256 against the digest written into the command line, and run
the agent zipapp from memory. Everything else (read-only root, no network,
the uid split, the syscall filter, the verified reset) is the same container.

The bootstrap also drops every environment variable the host did not set,
so an image's ``ENV`` (``PYTHONPATH``, tokens...) never reaches a call.
It is written for the oldest Python it may meet and says so in a ``fatal``
frame when the Python is too old, which the host turns into a clear error.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from retool_exec.backends.docker.agent import wire

__all__ = [
    "BOOTSTRAP_ENTRYPOINT",
    "MIN_PYTHON",
    "agent_frame",
    "bootstrap_command",
    "needs_bootstrap",
]

MIN_PYTHON = (3, 9)
"""The oldest Python the agent runs on (it is tested on 3.9 and on the image's 3.11)."""

BOOTSTRAP_ENTRYPOINT = ("python3", "-I", "-B", "-c")
"""Found on the image's PATH: ``/usr/bin/python3`` in Debian, ``/usr/local/bin`` in others."""

# Kept to syntax every Python 3 parses, so a too-old one reaches the version check.
_BOOTSTRAP = r"""
import os, sys
_pythons_own = frozenset(sys.modules)
def _fatal(reason):
    text = "".join(c if " " <= c <= "~" and c not in "\\\"" else "?" for c in reason)
    data = ('{"type": "fatal", "reason": "' + text + '"}').encode()
    os.write(1, len(data).to_bytes(4, "big") + data)
    sys.exit(70)
if sys.version_info < %(min_python)r:
    _fatal("the image's python3 is %%s; the sandbox agent needs %(min_text)s or newer"
           %% sys.version.split()[0])
_missing = []
for _name in %(stdlib)r:
    try:
        __import__(_name)
    except ImportError:
        _missing.append(_name)
if _missing:
    _fatal("the image's python3 lacks standard-library modules the sandbox agent needs: "
           + ", ".join(_missing) + " (a minimal Python, such as Debian's python3-minimal?)")
import hashlib, struct
def _read(n):
    chunks, left = [], n
    while left:
        chunk = os.read(0, left)
        if not chunk:
            _fatal("the host closed the stream before sending the agent")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
size = struct.unpack(">I", _read(4))[0]
if size > %(max_size)d:
    _fatal("agent frame of %%d bytes is too large" %% size)
blob = _read(size)
if hashlib.sha256(blob).hexdigest() != %(digest)r:
    _fatal("the agent received does not match its digest")
keep = set(%(keep_env)r)
for name in list(os.environ):
    if name not in keep:
        del os.environ[name]
import importlib.abc, importlib.util, io, zipfile
with zipfile.ZipFile(io.BytesIO(blob)) as archive:
    members = {name: archive.read(name) for name in archive.namelist()}
del blob
class _AgentFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name != %(package)r and not name.startswith(%(package)r + "."):
            return None
        package = name == %(package)r
        key = %(package)r + "/__init__.py" if package else name.replace(".", "/") + ".py"
        if key not in members:
            return None
        return importlib.util.spec_from_loader(
            name, self, origin="agent.pyz/" + key, is_package=package)
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        origin = module.__spec__.origin
        source = members[origin[len("agent.pyz/"):]]
        exec(compile(source, origin, "exec"), module.__dict__)
sys.meta_path.insert(0, _AgentFinder())
from %(package)s.supervisor import main
sys.exit(main(["agent.pyz"] + sys.argv[1:], _pythons_own))
"""

_STDLIB = (
    "array", "ast", "base64", "ctypes", "gc", "hashlib", "importlib.abc", "importlib.util",
    "io", "json", "random", "resource", "secrets", "select", "shutil", "signal", "socket",
    "stat", "struct", "tempfile", "threading", "traceback", "typing", "zipfile", "zlib",
)  # fmt: skip
"""What the agent imports; checked first, so a minimal Python is named as the cause."""

MAX_AGENT_BYTES = 16 * 1024 * 1024
"""Far above the zipapp's size (tens of kB); a bound on what the bootstrap accepts."""


def bootstrap_command(zipapp: bytes, keep_env: Iterable[str]) -> list[str]:
    """The entrypoint that runs ``zipapp`` (sent as the first frame) in any image."""
    source = _BOOTSTRAP % {
        "min_python": MIN_PYTHON,
        "min_text": ".".join(map(str, MIN_PYTHON)),
        "max_size": MAX_AGENT_BYTES,
        "digest": hashlib.sha256(zipapp).hexdigest(),
        "keep_env": sorted(set(keep_env)),
        "stdlib": _STDLIB,
        "package": wire.AGENT_PACKAGE,
    }
    return [*BOOTSTRAP_ENTRYPOINT, source]


def agent_frame(zipapp: bytes) -> bytes:
    """What the host writes to the container's stdin first: length, then the zipapp."""
    if len(zipapp) > MAX_AGENT_BYTES:
        raise ValueError(f"agent zipapp of {len(zipapp)} bytes exceeds {MAX_AGENT_BYTES}")
    return wire.FRAME_HEADER.pack(len(zipapp)) + zipapp


def needs_bootstrap(image_attrs: Mapping[str, Any], agent_digest: str) -> bool:
    """Whether the image lacks this host's agent (not ours, or ours with another agent)."""
    from retool_exec.backends.docker.image_inputs import AGENT_LABEL

    labels = (image_attrs.get("Config") or {}).get("Labels") or {}
    return bool(labels.get(AGENT_LABEL) != agent_digest)
