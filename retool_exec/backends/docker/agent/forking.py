"""How the zygote forks a call's process: as a child of the supervisor, never its own.

Why the supervisor's: the parent of a process learns how it ended (its exit status,
its signal) and reads what it needs of it (its CPU time, from ``/proc/PID/stat``,
which holds the name the process gave itself). Whatever the zygote learns stays in
its memory, live or freed, and every later call is a copy of that memory: a call that
named itself and died of SIGXCPU had its chosen name found by later calls in their
own memory (eighteenth red-team round). So the zygote is never a call's parent: the
supervisor, which forks nothing after its start, is; it reaps and judges every call.

Two ways, by what is safe in the zygote:

- ``clone(CLONE_PARENT)`` itself, when it safely can (below): one fork, as before.
- Else ``os.fork()`` twice: a middle process forks the call's process, reports its
  pid and exits, and the orphan goes to PID 1, the supervisor.


Why: ``os.fork()`` runs CPython's at-fork machinery in every child, and the
interpreter's own hooks (``threading``'s and ``random``'s) are Python code
running for the first time in that child's copy of the zygote. Each page
they touch is copied: measured in the image, ~65 of the ~640 pages a
``print`` call's child copies, and ~0.3-0.6 ms of CPU per call.

A plain ``clone(2)`` (through ``ctypes.PyDLL``, which keeps the GIL) skips
that machinery, which exists for a parent with other threads: it re-creates
locks another thread might hold, and drops other threads' state. So it is
used only when

- the zygote has exactly one thread (``/proc/self/task``) once its modules
  are loaded, and
- no at-fork hook was registered other than the two the agent knows and
  redoes itself: ``random`` (its generator is reseeded in the zygote before
  each fork, from ``os.urandom`` as its hook does: ``generators``) and
  ``threading`` (whose only effect on a one-thread process is the main
  thread's ``native_id``, set in the child), and
- the C library says where a thread's id lives in its descriptor
  (``_thread_db_pthread_tid``, glibc's): the kernel writes the child's id there
  (``CLONE_CHILD_SETTID``), as glibc's own ``fork`` has it do, and
- the kernel honours ``CLONE_PARENT`` (gVisor ignores it: ``_gives_the_parent``).

Unlike glibc's ``fork``, the plain clone runs no C-level ``pthread_atfork`` handler
and registers no robust-mutex list in the copy. Both exist for a parent with other
threads (locks another thread may hold, a pool to restart); with one thread there is
none, and a preloaded library that keeps threads makes the zygote use two forks.

Any other hook (a preloaded library that registers one) keeps ``os.fork()``.
"""

from __future__ import annotations

import _thread
import ctypes
import os
import signal
import struct
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

KNOWN_HOOK_MODULES = frozenset({"random", "threading"})
"""Modules whose at-fork hooks this module redoes (see the module docstring)."""
SYS_CLONE = 56  # x86_64
CLONE_PARENT, CLONE_CHILD_SETTID = 0x8000, 0x01000000
PID = struct.Struct("=i")


class Fork:
    """The fork in use: ``os.fork`` twice unless ``choose`` found the plain clone safe."""

    plain: Callable[[], int] | None = None
    main_thread = threading.main_thread()
    """The zygote's (``choose`` looks again): a copy's main thread is the same object."""


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
    Fork.main_thread = threading.main_thread()
    if set(registered) - KNOWN_HOOK_MODULES:
        return False
    try:
        if len(os.listdir("/proc/self/task")) != 1 or os.uname().machine != "x86_64":
            return False
        libc = ctypes.PyDLL(None, use_errno=True)
        _bits, _count, offset = (ctypes.c_uint32 * 3).in_dll(libc, "_thread_db_pthread_tid")
        libc.pthread_self.restype = ctypes.c_ulong
        thread_id_at = int(libc.pthread_self()) + int(offset)
        syscall = libc.syscall
    except (OSError, AttributeError, ValueError):
        return False
    syscall.restype = ctypes.c_long
    syscall.argtypes = [ctypes.c_long] + [ctypes.c_ulong] * 5
    flags = CLONE_PARENT | CLONE_CHILD_SETTID | signal.SIGCHLD

    def plain() -> int:
        return int(syscall(SYS_CLONE, flags, 0, 0, thread_id_at, 0))

    if not _gives_the_parent(plain):
        return False
    Fork.plain = plain
    return True


def _gives_the_parent(clone: Callable[[], int]) -> bool:
    """Whether ``clone`` makes the copy its caller's parent's child: gVisor ignores
    ``CLONE_PARENT`` (the copy is the caller's), so there the two forks are used.

    The probe's copy says whose child it is and exits: the zygote reaps it if it is its
    own; else its parent (the supervisor) does, as any orphan.
    """
    read_end, write_end = os.pipe()
    parent = os.getppid()
    pid = clone()
    if pid == 0:
        os.write(write_end, b"y" if os.getppid() == parent else b"n")
        os._exit(0)
    os.close(write_end)
    try:
        said = os.read(read_end, 1) if pid > 0 else b""
    finally:
        os.close(read_end)
    if said == b"n":
        os.waitpid(pid, 0)
    return said == b"y"


def fork() -> int:
    """Fork a copy of the zygote as its parent's child: 0 in the copy, its pid in the
    zygote; OSError on failure."""
    plain = Fork.plain
    if plain is None:
        return _fork_twice()
    pid = plain()
    if pid < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"clone: {os.strerror(errno)}")
    if pid == 0:
        _name_main_thread()
    return pid


def _name_main_thread() -> None:
    """In the copy: its main thread's ``native_id`` is its own (what ``threading``'s at-fork
    hook does), set without that method's Python frames (~15 page copies per child)."""
    Fork.main_thread._native_id = _thread.get_native_id()  # type: ignore[attr-defined]


def _fork_twice() -> int:
    """``os.fork`` a middle process that forks the copy, says its pid and exits: the copy
    is orphaned at once, and PID 1 (the supervisor) adopts it."""
    pid_r, pid_w = os.pipe()
    try:
        middle = os.fork()
    except OSError:
        os.close(pid_r)
        os.close(pid_w)
        raise
    if middle == 0:
        os.close(pid_r)
        try:
            copy = os.fork()
        except OSError:
            os._exit(1)
        if copy == 0:
            os.close(pid_w)
            _name_main_thread()
            return 0
        os.write(pid_w, PID.pack(copy))
        os._exit(0)
    os.close(pid_w)
    try:
        said = os.read(pid_r, PID.size)
    finally:
        os.close(pid_r)
        os.waitpid(middle, 0)  # the middle's own end: nothing of the call
    if len(said) != PID.size:
        raise OSError("fork: the middle process could not fork")
    return int(PID.unpack(said)[0])
