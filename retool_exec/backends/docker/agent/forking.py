"""How the zygote forks: ``fork(2)`` itself when it safely can, else ``os.fork()``.

Why: ``os.fork()`` runs CPython's at-fork machinery in every child, and the
interpreter's own hooks (``threading``'s and ``random``'s) are Python code
running for the first time in that child's copy of the zygote. Each page
they touch is copied: measured in the image, ~65 of the ~640 pages a
``print`` call's child copies, and ~0.3-0.6 ms of CPU per call.

A plain ``fork(2)`` (through ``ctypes.PyDLL``, which keeps the GIL) skips
that machinery, which exists for a parent with other threads: it re-creates
locks another thread might hold, and drops other threads' state. So it is
used only when

- the zygote has exactly one thread (``/proc/self/task``) once its modules
  are loaded, and
- no at-fork hook was registered other than the two the agent knows and
  redoes itself: ``random`` (its generator is reseeded in the zygote before
  each fork, from ``os.urandom`` as its hook does: ``generators``) and
  ``threading`` (whose only effect on a one-thread process is the main
  thread's ``native_id``, set in the child).

Any other hook (a preloaded library that registers one) keeps ``os.fork()``.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

KNOWN_HOOK_MODULES = frozenset({"random", "threading"})
"""Modules whose at-fork hooks this module redoes (see the module docstring)."""


class Fork:
    """The fork in use: ``os.fork`` unless ``choose`` found the plain one safe."""

    plain: Callable[[], int] | None = None


@contextmanager
def recording_hooks(registered: list[str]) -> Iterator[None]:
    """Within the block, note the module of every ``os.register_at_fork`` call."""
    original = os.register_at_fork

    def record(**hooks: Any) -> None:
        caller = _caller_module()
        registered.append(caller)
        original(**hooks)

    os.register_at_fork = record
    try:
        yield
    finally:
        os.register_at_fork = original


def _caller_module() -> str:
    try:
        return str(sys._getframe(2).f_globals.get("__name__", "?"))
    except ValueError:
        return "?"


def choose(registered: list[str]) -> bool:
    """Use the plain fork when it is safe (see the module docstring); whether it is."""
    Fork.plain = None
    if set(registered) - KNOWN_HOOK_MODULES:
        return False
    try:
        if len(os.listdir("/proc/self/task")) != 1:
            return False
        libc = ctypes.PyDLL(None, use_errno=True)
        plain = libc.fork
    except (OSError, AttributeError):
        return False
    plain.restype = ctypes.c_int
    plain.argtypes = []
    Fork.plain = plain
    return True


def fork() -> int:
    """Fork the zygote: 0 in the child, the child's pid in the zygote; OSError on failure."""
    plain = Fork.plain
    if plain is None:
        return os.fork()
    pid = int(plain())
    if pid < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"fork: {os.strerror(errno)}")
    if pid == 0:
        threading.main_thread()._set_native_id()  # type: ignore[attr-defined]
    return pid
