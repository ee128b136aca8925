"""The zygote: a warm interpreter that forks calls and never sees any call's data.

Forked from the supervisor at start, before any request exists, it imports
the preloaded modules once and then only forks. The supervisor hands it the
child's end of each descriptor over a unix socket (SCM_RIGHTS); the child
reads its own request from one of them *after* it exists and has dropped to
the calls' uid. So no call's code, stdin, files, output or nonce is ever in
an address space a later call is forked from, and freed memory of earlier
calls cannot be found in a child: there is none to copy. Nor is how a call
ended: a call's process is the supervisor's child, not the zygote's
(``forking``), so the supervisor reaps it and reads its exit status and CPU
time (with the name the process gave itself) into memory no call is forked
from.

Zygote <-> supervisor messages (SOCK_SEQPACKET, one datagram each):
    supervisor -> zygote  b"F" + SCM_RIGHTS(events_w, request_r, out_w, err_w)
    zygote -> supervisor  b"R" + JSON {"loaded": [...], "failed": {...}} (ready, once)
                          b"P" + pid               (forked)
                          b"E" + reason            (fork failed)
"""

from __future__ import annotations

import _io
import _signal  # type: ignore[import-not-found]  # the C half of signal: no stub
import _socket
import array
import atexit
import builtins
import errno
import functools
import gc
import importlib.machinery
import io
import itertools
import json
import locale
import operator
import os
import resource
import select
import signal
import socket
import struct
import sys
import threading
import traceback
import types
import weakref
from collections.abc import Callable, Iterable
from importlib.machinery import BuiltinImporter
from typing import Any

from . import forking, generators, identity, recursion, reset, trees, wire
from .auto_print import compile_auto_printed, stdlib_ast

# A call's process runs the agent's Python again after the code (its end; between cells),
# in the interpreter the code has changed. So what the agent calls there is bound now,
# as the zygote is imported, not looked up then: the builtins (a copy of their module's
# dict, the builtins of every function defined below) and the functions of modules the
# end needs whatever the code did to them (python3's end is C, and the code's changes do
# not reach it). Why: ``builtins.vars = None`` or ``builtins.isinstance = None`` ended a
# call that had printed its answer with status 70 and no output (twenty-ninth red-team
# round). What python3's end does read at its end (``sys.stdout``, ``sys.excepthook``,
# ``threading._shutdown``, ...) is read then, from the ``sys`` module's own dict.
globals()["__builtins__"] = dict(vars(builtins))
_exit_now, _kill, _own_pid = os._exit, os.kill, os.getpid
_set_signal_handler = _signal.signal
_collect, _weak_ref, _islice = gc.collect, weakref.ref, itertools.islice
_ModuleType, _FunctionType = types.ModuleType, types.FunctionType
_MappingProxyType, _GetSetDescriptorType = types.MappingProxyType, types.GetSetDescriptorType
_default_excepthook, _default_unraisablehook = sys.__excepthook__, sys.__unraisablehook__
_audit, _run_exitfuncs = sys.audit, atexit._run_exitfuncs
_active_count = threading.active_count

EVENTS_FD, REQUEST_FD, STARTED_FD = 3, 4, 5
FORKED_BYTE = b"F"
"""What a session's copy sends on its new request socket once it serves it."""
"""In a child: 3 carries its events to the supervisor, 4 its request (a unix socket), 5
the one byte that says its code starts (closed before the code exists, see ``_mark_started``)."""
CHILD_FDS = 5
STARTED_BYTE = b"S"
FORKED_PID = struct.Struct("=i")
"""The pid of a process forked for the supervisor (whose child it is: ``forking``)."""
CHILD_NICE = 10
"""Calls run below the supervisor's priority, so it keeps the CPU it needs for deadlines."""
M_ARENA_MAX = -8
"""``mallopt``'s parameter for the most malloc arenas (glibc's ``malloc.h``)."""
CHILD_MEMLOCK = 0
"""No page a call may lock: each ``mlock`` moves host-wide counts by one (``Mlocked`` in
``/proc/meminfo``, the unevictable events), which calls in other containers read under
runc (eleventh red-team round). Nothing a call runs needs locked memory."""
PYTHON_IGNORES = (signal.SIGPIPE, signal.SIGXFSZ)
"""What a fresh Python process ignores, restored in the child before user code runs."""
CHILD_DEFAULT_SIGNALS = tuple(int(s) for s in (*identity.IGNORED_SIGNALS, signal.SIGCHLD))
CHILD_IGNORED_SIGNALS = tuple(int(s) for s in PYTHON_IGNORES)
SIGINT_NUMBER = int(signal.SIGINT)
"""Plain numbers, for ``_signal.signal``: ``signal.signal`` converts every argument and
result through enums, which in a child cost ~0.2 ms of CPU and ~50 page copies for
these ~35 signals (measured in the image); the effect is the same."""

WARMUPS = {
    "sympy": "x = sympy.Symbol('x'); sympy.solve(x**2 - 2, x); sympy.simplify(sympy.sin(x)**2 + "
    "sympy.cos(x)**2); sympy.integrate(x**2, x); sympy.Rational(1, 3) + 1",
    "numpy": "numpy.linalg.solve(numpy.eye(2), numpy.ones(2)); numpy.random.default_rng(0)",
}
"""Run once after import, so lazily imported submodules are warm in every child."""


StdStreams = tuple[io.TextIOWrapper, io.TextIOWrapper, io.TextIOWrapper]


class Setup:
    """What every call's child gets, made once: how it drops its privileges (decided
    before the zygote exists) and the std streams of its first run (``prepare_std_streams``)."""

    drop: identity.SandboxDrop | None = None
    std_streams: StdStreams | None = None
    warm_child = False
    """Under gVisor: each spare child runs ``warm_up`` before it waits for its request."""
    descriptor_bound = 1024
    """Above the highest descriptor number a child can hold (``lock_zygote``)."""
    module_names: frozenset[str] = frozenset()
    """The names in ``sys.modules`` as the zygote starts serving: never a call's
    (``ModulesAtStart``)."""
    pythons_own: frozenset[str] | None = None
    """The modules python3 had imported as the agent started (the entry's count, given to
    ``supervisor.main``); None: not known, and then no module is ``shadowable``."""
    shadowable: frozenset[str] = frozenset()
    """The modules the zygote holds that a python3 starting afresh would not (what the
    agent and the preloads imported, the agent's package aside): a call's upload of the
    same name wins over them (``forget_shadowed_preloads``)."""
    cpu_time_limited = True
    """Whether a call's process gets ``RLIMIT_CPU``: not under gVisor, which counts the
    time its tasks wait for the container's CPU share as CPU time (16 threads of fixed
    work: 58 s counted in 14 s), so benign threaded programs were killed as
    ``cpu_limit`` seconds into a 35 s limit (eighteenth red-team round). There the
    call's wall-clock timeout and the container's CPU share bound it."""
    data_limit_spares_mmap = False
    """Whether ``RLIMIT_DATA`` leaves ``mmap`` alone (gVisor): ``_limit_memory``."""
    recursion: recursion.Counter | None = None
    """The thread's depth count, set for the code as ``python3 -c`` starts it
    (``recursion.find``; None: the agent's frames count against the code's limit)."""
    machine_memory = 0
    """Bytes of memory of the machine Docker runs on (0: not told), the most one
    allocation gets where nothing else bounds it (under gVisor: ``_limit_address_space``)."""
    generators: list[Any] = []  # noqa: RUF012 - found once, before the first fork
    """Every random generator the zygote holds (``generators.find``), reseeded before each fork."""
    agent_path: str | None = None
    """``sys.path[0]`` as the agent started (its own archive): a call gets the working
    directory there instead, as ``python3 -c`` has it (``_fresh_main``)."""
    installed_streams: tuple[weakref.ref[io.TextIOWrapper], ...] | None = None
    """In a call's process: the std streams ``_std_streams`` installed last, weakly (a
    stream the code dropped is finalized then, as in python3). python3 writes what its
    own streams hold at its end even after the code replaced ``sys.stdout``, so the end
    closes these too (``_close_agent_streams``)."""
    unraisable_args: type | None = None
    """The type CPython hands ``sys.unraisablehook`` (``UnraisableHookArgs``, not
    public), found once: the end reports a ``sys.stdout`` whose flush failed as python3
    does (``_report_unraisable``)."""


def make_call_safe() -> None:
    """In a forked child, before anything of the call: its uid, no capability (the
    filter and the empty bounding set it has from the zygote, ``lock_zygote``)."""
    _drop().apply()


def lock_zygote() -> None:
    """In the zygote, before its first fork: what every child inherits (see
    ``identity.SandboxDrop.lock_zygote``), and the limits a call gets that the zygote
    can hold as well: no core dump, no locked page (``CHILD_MEMLOCK``).

    Why here: a child's every step before its request is CPU each call pays (see
    ``identity.SandboxDrop``); limits pass across fork, so they are set once.
    """
    _drop().lock_zygote(wire.ZYGOTE_SERVING_CAPABILITIES)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _lower(resource.RLIMIT_MEMLOCK, CHILD_MEMLOCK)
    Setup.descriptor_bound = max(os.sysconf("SC_OPEN_MAX"), 1024)


def _drop() -> identity.SandboxDrop:
    if Setup.drop is None:
        raise RuntimeError("the agent did not prepare how calls drop their privileges")
    return Setup.drop


def preload(modules: list[str], huge_pages: bool = True) -> tuple[list[str], dict[str, str]]:
    """Import (and warm up) ``modules`` once, for every call to inherit.

    ``huge_pages``: collapse the heap into 2 MiB pages (``collapse_heap``), which
    pays for itself over many forks; a container that serves one call
    (``docker-fresh``) skips it.

    Imports run with ``HOME`` in a scratch directory that is removed afterwards:
    a library that writes a cache at import (matplotlib's font list) then
    leaves nothing in ``/tmp`` for the reset to find, and its in-memory result
    is what the calls inherit.
    """
    import shutil
    import tempfile

    loaded, failed = [], {}
    home = os.environ.get("HOME")
    scratch = tempfile.mkdtemp(prefix=".preload-")
    os.environ["HOME"] = scratch
    try:
        for module in modules:
            try:
                __import__(module)
                warmup = WARMUPS.get(module)
                if warmup:
                    exec(warmup, {module: sys.modules[module]})
                loaded.append(module)
            except Exception as exc:  # a missing optional module must not stop the agent
                failed[module] = f"{type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if home is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = home
    gc.collect()
    gc.freeze()  # keep the collector from touching (and so copying) the zygote's pages
    if huge_pages:
        collapse_heap()
    return loaded, failed


MADV_COLLAPSE = 25
HUGE_PAGE = 2 << 20


def collapse_heap() -> int:
    """Back the preloaded heap with 2 MiB pages; how many were made. Best effort.

    Why: every call is a fork of this process, and fork copies one page-table
    entry per 4 KiB page (exit frees them again). Measured in the image with
    numpy, sympy, scipy and mpmath loaded, fork + exit of a ``print`` child
    went from 3.2 ms to 2.1 ms of CPU once ~40 MB of heap sat in huge pages
    (one entry per 2 MiB). A child's first write to such a page splits it and
    copies 4 KiB as before, so memory use does not grow. ``MADV_COLLAPSE``
    (Linux 6.1) works whatever the system's THP setting; gVisor and older
    kernels refuse it (EINVAL), which only leaves things as they were.
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    made = 0
    try:
        with open("/proc/self/maps") as handle:
            regions = [line.split() for line in handle]
    except OSError:
        return 0
    for fields in regions:
        # Private writable anonymous memory (the heap, Python's arenas, numpy's buffers).
        if len(fields) < 5 or fields[1] != "rw-p" or (len(fields) > 5 and fields[5] != "[heap]"):
            continue
        low, high = (int(value, 16) for value in fields[0].split("-"))
        start = (low + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
        while start + HUGE_PAGE <= high:
            if libc.madvise(start, HUGE_PAGE, MADV_COLLAPSE) == 0:
                made += 1
            elif ctypes.get_errno() == errno.EINVAL:
                return made  # not supported here: stop asking
            start += HUGE_PAGE
    return made


def check_child_setup() -> None:
    """Fork once before serving, to prove a child can drop and filter."""
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(err_r)
        try:
            make_call_safe()
            os._exit(0)
        except BaseException as exc:
            os.write(err_w, f"{type(exc).__name__}: {exc}".encode(errors="replace"))
            os._exit(71)
    os.close(err_w)
    with os.fdopen(err_r, "rb") as handle:
        reason = handle.read(4096).decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if status != 0:
        raise PermissionError(f"a call could not be made safe: {reason or status}")


# -- the fork server -----------------------------------------------------------------


def serve(
    control: socket.socket,
    zygote_user: identity.Identity,
    modules: list[str],
    huge_pages: bool = True,
) -> None:
    """The zygote's whole life (never returns)."""
    try:
        Setup.agent_path = sys.path[0] if sys.path else None
        identity.become(zygote_user, wire.ZYGOTE_CAPABILITIES)
        identity.harden_self()
        lock_zygote()
        check_child_setup()
        registered: list[str] = []
        with forking.recording_hooks(registered):
            loaded, failed = preload(modules, huge_pages)
        prepare_std_streams()
        Setup.unraisable_args = _unraisable_args_type()
        warm_zygote()
        Setup.generators = generators.find()
        Setup.recursion = recursion.find(_run_probe)
        forking.choose(registered)
        Setup.warm_child = reset._in_gvisor()
        Setup.cpu_time_limited = not Setup.warm_child
        Setup.data_limit_spares_mmap = Setup.warm_child
        Setup.module_names = frozenset(sys.modules)
        package = __name__.rpartition(".")[0]
        if Setup.pythons_own is not None:
            Setup.shadowable = frozenset(
                name
                for name in Setup.module_names - Setup.pythons_own
                if name != package and not name.startswith(package + ".")
            )
        control.send(b"R" + json.dumps({"loaded": loaded, "failed": failed}).encode())
    except BaseException as exc:
        control.send(b"!" + f"{type(exc).__name__}: {exc}".encode(errors="replace")[:4000])
        os._exit(70)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    poller = select.poll()
    poller.register(control.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    while True:
        for fd, _event in poller.poll():
            if fd == wake_r:
                discard_pending(wake_r)
                _reap_quietly()
            else:
                _fork_one(control, wake_r, wake_w)


def _reap_quietly() -> None:
    """Reap this zygote's own children (``forking``'s middle processes), knowing nothing of
    how they ended: a call's process is never the zygote's child."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _fork_one(control: socket.socket, wake_r: int, wake_w: int) -> None:
    fds = array.array("i")
    try:
        message, ancillary, _flags, _addr = control.recvmsg(16, socket.CMSG_SPACE(CHILD_FDS * 4))
    except InterruptedError:
        return
    if not message:  # the supervisor is gone: so is the container
        os._exit(0)
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    if message != b"F" or len(fds) != CHILD_FDS:
        for fd in fds:
            os.close(fd)
        control.send(b"E" + b"bad fork request")
        return
    generators.reseed(Setup.generators)  # here, not in the child (see ``generators``)
    try:
        pid = forking.fork()
    except OSError as exc:
        for fd in fds:
            os.close(fd)
        control.send(b"E" + str(exc).encode(errors="replace"))
        return
    if pid == 0:
        # The socket's C close, not ``socket.close``: its Python frames cost the child
        # ~20 page copies (~40 us, measured in the image) before its request comes.
        _socket.socket.close(control)
        os.close(wake_r)
        os.close(wake_w)
        child_main(*fds)
    for fd in fds:
        os.close(fd)
    control.send(b"P" + FORKED_PID.pack(pid))


DRAIN_LIMIT = 4 << 20
"""Bytes taken from a pipe "as it is now" at most: four times the largest pipe an
unprivileged writer can ask for (``fs.pipe-max-size``, 1 MiB), so a pipe is emptied,
and a writer that refills it as fast as it is read cannot keep the reader there."""


def discard_pending(fd: int) -> None:
    """Drop whatever a non-blocking pipe holds now (a wakeup pipe, what a cell left)."""
    taken = 0
    try:
        while taken < DRAIN_LIMIT:
            data = os.read(fd, 4096)
            if not data:
                break
            taken += len(data)
    except OSError:
        pass  # BlockingIOError: it is empty


# -- the child -------------------------------------------------------------------------


def child_main(events_w: int, request_r: int, out_w: int, err_w: int, started_w: int) -> None:
    """Runs in the forked child; never returns.

    Descriptors: 0 stdin (``/dev/null``, or a memfd holding the request's
    stdin), 1 and 2 the output pipes, 3 the events pipe (notebook calls and
    sessions only), 4 the request socket (the same), 5 the started gate until
    the code starts. Nothing else: the zygote's socket is closed before any
    user code exists.
    """
    status = 70
    try:
        signal.set_wakeup_fd(-1)
        try:
            make_call_safe()
        except BaseException as exc:
            os.write(err_w, f"sandbox setup failed: {exc}\n".encode(errors="replace"))
            status = 71
            return
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.dup2(events_w, EVENTS_FD)
        os.dup2(request_r, REQUEST_FD)
        os.dup2(started_w, STARTED_FD)
        os.closerange(STARTED_FD + 1, Setup.descriptor_bound)
        for signum in CHILD_DEFAULT_SIGNALS:
            try:
                _signal.signal(signum, _signal.SIG_DFL)
            except (OSError, ValueError):
                pass
        for signum in CHILD_IGNORED_SIGNALS:
            _signal.signal(signum, _signal.SIG_IGN)
        _signal.signal(SIGINT_NUMBER, _signal.default_int_handler)
        try:
            os.nice(CHILD_NICE)
        except OSError:
            pass
        # Its own /proc entries (owned by root while non-dumpable), so
        # oom_score_adj below is writable and the kernel's OOM killer picks it.
        identity._libc.prctl(identity.PR_SET_DUMPABLE, 1, 0, 0, 0)
        _write_quietly("/proc/self/oom_score_adj", b"1000")
        os.chdir(wire.WORKDIR)
        if Setup.warm_child:
            warm_up()
        try:
            request = _read_request(REQUEST_FD)
        except (EOFError, ValueError):
            status = 0
            return  # a spare discarded unused
        cpu = int(request.get("cpu_seconds", wire.DEFAULT_CPU_SECONDS))
        # Soft below hard: at the soft limit Linux (and gVisor) send SIGXCPU, which reads
        # as cpu_limit; with the two equal the hard limit's SIGKILL came first, a bare
        # "signal 9" that SandboxFusion's clients take for an OOM kill.
        if Setup.cpu_time_limited:
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        _set_stdin(request.pop("stdin", None))  # (its text freed: it is the memfd's now)
        streamed = bool(request.get("session") or request.get("cells"))
        if streamed:
            Interrupts.between_cells()  # before the mark: the supervisor interrupts after it
            # Its kind given, not asked of the kernel (three getsockopt calls): the
            # supervisor's socketpair (``supervisor.Child``).
            request_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, REQUEST_FD)
        # The limits the request chose, last before the mark: set earlier, a small memory
        # limit made the decoding of a large stdin fail before the code started, which
        # read as the sandbox's failure, and the code chose when by its own size
        # (thirtieth red-team round).
        memory_mb = request.get("memory_mb")
        if memory_mb:
            _limit_memory(int(memory_mb) * 1024 * 1024)
        elif Setup.data_limit_spares_mmap and Setup.machine_memory:
            # Under gVisor without ``memory_mb``: an allocation past the machine's memory
            # raises ``MemoryError``, as Linux's overcommit heuristic makes it under runc.
            # gVisor maps any size and fails only when the pages are used, so
            # ``bytearray(2**40)`` was the container's ``oom`` (or a timeout) and
            # ``numpy.zeros(2**37)`` a success (thirty-second red-team round). Glibc's
            # thread arenas and stacks fit far below a machine's memory: no arena setting.
            _limit_address_space(Setup.machine_memory)
        stack_mb = request.get("stack_mb")
        if stack_mb:
            _raise_soft(resource.RLIMIT_STACK, int(stack_mb) * 1024 * 1024)
        # From here on the call's own code runs: an ending before this mark is the
        # sandbox's failure, after it the code's.
        if not _mark_started():
            status = 71
            return
        if not streamed:
            os.close(EVENTS_FD)  # a plain call has no events: its code gets no channel to us
            os.close(REQUEST_FD)
        if request.get("session"):
            _enter_workdir(str(request.get("workdir") or wire.WORKDIR), copy_from=None)
            # Sessions of a family share a uid: non-dumpable, a sibling (a fork) can neither
            # trace this one nor read its memory through /proc.
            identity._libc.prctl(identity.PR_SET_DUMPABLE, 0, 0, 0, 0)
            status = run_session(request_sock)
        elif request.get("cells"):
            status = run_cells(
                request_sock, int(request["cells"]), shadowing=request.get("shadowing")
            )
        else:
            script = request.get("script")
            status = run_user_code(
                str(request["code"]),
                script if isinstance(script, str) else None,
                auto_print=request.get("auto_print") is True,
                shadowing=request.get("shadowing"),
            )
    finally:
        if status == ENDED_BY_INTERRUPT:
            _exit_by_sigint()
        _exit_now(status)


ENDED_BY_INTERRUPT = -SIGINT_NUMBER
"""``run_user_code``'s status for code that ended with a ``KeyboardInterrupt`` nothing
caught: the process then ends by SIGINT (``_exit_by_sigint``)."""


def _exit_by_sigint() -> None:
    """End as python3 ends after a ``KeyboardInterrupt`` nothing caught (``exit_sigint``):
    killed by SIGINT, so its parent sees -2, or exit status 130 if SIGINT is blocked.

    Why: the code's process exited 1, where python3 (and the seed's subprocess) report
    -2 (twenty-third outside check)."""
    try:
        _set_signal_handler(SIGINT_NUMBER, _signal.SIG_DFL)
        _kill(_own_pid(), SIGINT_NUMBER)
    except BaseException:
        pass
    _exit_now(128 + SIGINT_NUMBER)


WARM_UP_SOURCE = """\
def total(n):
    return sum(i * i for i in range(n))
values = [total(k) for k in range(5)]
print(values, f"{2 ** 0.5:.3f}", 1 / 3, 2 ** 70, sorted({"b": 1, "a": 2}.items()))
1 / 0
"""
"""A call in miniature: compile, exec, a print and an error's traceback (see ``warm_up``)."""
WARM_UP_REQUEST = wire.encode_for_call(
    {"type": "request", "code": "print(2 + 3)", "cells": 0, "cpu_seconds": 10, "memory_mb": None}
)[wire.FRAME_HEADER.size :]


def warm_zygote() -> None:
    """In the zygote, once before any fork: the rehearsal (``warm_up``), so that what a
    call does for the first time in the process is done already, and shared.

    Why: a child pays for whatever its call is the first to do in the process, and
    some of it is large. Measured in the image by forking children of a process
    that imported the light zygote's modules, each doing one step and exiting:
    ``compile("print(2+3)", ...)`` cost 2.19 ms of CPU and 302 page faults against
    0.51 ms and 104 for a child that exits at once, and 0.79 ms for ten lines once
    the parent had compiled anything; ``import atexit`` 0.84 ms, ``json.loads`` of
    a request 0.72 ms, a text stream 0.77 ms. The first compile builds the
    parser's lazily made state; done here, every child shares it. Constant code,
    before any request exists; its garbage is collected and the survivors frozen,
    so no child's collector walks (and copies) them.
    """
    warm_up()
    gc.collect()
    gc.freeze()


def warm_up() -> None:
    """Rehearse a call, into ``/dev/null``, before any request exists.

    Why, and only under gVisor: there a forked child's first touch of a page traps
    into gVisor's kernel (a system call cost ~29 us on the project's Intel host under
    the ptrace platform, against 0.15 us under runc), so a spare child that has
    already been through the call's own steps pays those traps while it waits, not
    on the call's path: decoding a request, compile and exec, a ``print`` through the
    same stream classes as the call's stdout down to a ``write``, an error's
    traceback through ``_print_exception``, and the end (``_finish``, and the look for
    files to flush; not the finalization of ``__main__``, which is the agent's here).
    Measured in the image (``python benchmarks/child_faults.py --runtime runsc
    --timed``, alternated with the agent before): request to end of output 6.5-10 ms
    with only a ``print`` rehearsed, 3.7-5.6 ms with all of it; ``1/0`` 12.9 -> 5.5 ms.
    The end's ``import atexit`` alone was ~2 ms of it. Under runc the touches are
    cheap and the rehearsal's writes would only copy more of the zygote's pages.
    What it must not do is consume what the call uses once: the prepared std
    streams, ``__main__``, the at-exit functions. Nothing of it is kept: its
    namespace and streams are dropped, and no call data exists yet.
    """
    null = os.open(os.devnull, os.O_WRONLY)
    saved = sys.stdout, sys.stderr
    try:
        sys.stdout, sys.stderr = _text_writer(null), _text_writer(null, stderr=True)
        wire.decode_for_call(WARM_UP_REQUEST)
        namespace = types.ModuleType("__warm_up__").__dict__
        try:
            exec(compile(WARM_UP_SOURCE, "<warm-up>", "exec", dont_inherit=True), namespace)
        except BaseException as exc:
            _print_exception(exc, set_sys_last_vars=False)  # (a call finds no sys.last_value)
        _flush_files_held_by(namespace)
        _finish(0)
    except BaseException:
        pass  # best effort: the call itself will say what is wrong
    finally:
        sys.stdout, sys.stderr = saved
        os.close(null)


def _mark_started() -> bool:
    """Say on the started gate that the code starts now, and close the gate; False if not said.

    Why a pipe of its own, closed here: whether the code started decides whether an
    ending is the code's outcome or the sandbox's failure (which the host reports as
    such, and retries elsewhere if the code never ran). On a channel the code can still
    write to, it could bury the mark under garbage before the supervisor read it and
    have its own wrong answer reported as a sandbox failure (the events pipe carried
    the mark until 2026-12-02: 5 of 40 such calls won that race). Once this returns
    the code holds no end of the gate, and the byte waits in the pipe, so the
    supervisor reads it only when it needs to know.
    """
    try:
        written = os.write(STARTED_FD, STARTED_BYTE) == len(STARTED_BYTE)
    except OSError:
        written = False
    os.close(STARTED_FD)
    return written


def _write_quietly(path: str, data: bytes) -> None:
    """Best effort, with plain syscalls: ``open()`` would build a text stream (see
    ``prepare_std_streams``) and copy ~30 of the zygote's pages doing so."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.write(fd, data)
    except OSError:
        pass
    finally:
        os.close(fd)


def _lower(limit: int, value: int) -> None:
    _soft, hard = resource.getrlimit(limit)
    if hard == resource.RLIM_INFINITY or hard > value:
        try:
            resource.setrlimit(limit, (value, value))
        except (OSError, ValueError):
            pass


def _limit_memory(limit: int) -> None:
    """The call's memory limit: ``RLIMIT_DATA`` at ``limit`` (past it an allocation
    raises ``MemoryError``), and under gVisor also ``RLIMIT_AS``.

    Why both there: gVisor applies ``RLIMIT_DATA`` to ``brk`` only, never to ``mmap``,
    where CPython's large allocations go, so code 300 MB past a 64 MB limit was a
    success (thirtieth red-team round). The address-space limit is ``limit`` plus
    what the process maps outside its data as it starts (code, read-only data, its
    stack): the same room the data limit leaves under runc. It is stricter in one
    way: shared and file mappings the code makes count too.

    And one arena: glibc gives each new thread a malloc arena that reserves 64 MiB of
    address space it never writes. Counted against the address-space limit, a pool of
    16 threads could not start, or ran each ``malloc`` through a failing ``mmap`` (a
    job of 0.1 s under runc timed out at 120 s; the same round). With ``M_ARENA_MAX``
    at 1 every thread allocates from the main arena. A program the call starts has
    glibc's default again: its threads may meet the limit there.
    """
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    if Setup.data_limit_spares_mmap:
        identity._libc.mallopt(M_ARENA_MAX, 1)
        _limit_address_space(limit)


def _limit_address_space(limit: int) -> None:
    """``RLIMIT_AS`` at ``limit`` plus what the process maps outside its data as it starts
    (code, read-only data, its stack)."""
    size, data = _status_kilobytes(b"VmSize:", b"VmData:")
    room = limit + (size - data) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (room, room))


def _status_kilobytes(*fields: bytes) -> list[int]:
    """The values of ``fields`` (``b"VmSize:"``, ...) in ``/proc/self/status``, in kB,
    read with plain syscalls (see ``_write_quietly``)."""
    fd = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
    try:
        text = os.read(fd, 1 << 16)
    finally:
        os.close(fd)
    values = {}
    for line in text.splitlines():
        name, _, rest = line.partition(b"\t")
        if name in fields:
            values[name] = int(rest.split()[0])
    return [values[name] for name in fields]


def _raise_soft(limit: int, value: int) -> None:
    """Set ``limit``'s soft value to ``value``, or to its hard value if that is lower.

    Why for the stack: the running interpreter's main thread may then grow its stack
    that far (up to the first mapping below it), while threads keep the default size
    the C library took at the interpreter's start."""
    _soft, hard = resource.getrlimit(limit)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(limit, (value, hard))


def _read_request(fd: int) -> dict[str, Any]:
    """The call's request: the first frame on the request socket, which never carries
    descriptors, read with plain syscalls.

    Why not ``_receive``: a socket object and ``recvmsg`` are Python code a spare child
    runs for the first time, each page it touches a copy (see ``identity.SandboxDrop``);
    a plain call's process needs no socket object at all.
    """
    size = _frame_size(_read_exactly(fd, wire.FRAME_HEADER.size))
    return wire.decode_for_call(_read_exactly(fd, size))


def _frame_size(header: bytes) -> int:
    (size,) = wire.FRAME_HEADER.unpack(header)
    if size > wire.MAX_FRAME:
        raise ValueError("request frame too large")
    return int(size)


def _read_exactly(fd: int, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("request socket closed")
        chunks.append(chunk)
        left -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _receive(sock: socket.socket, fds_wanted: int = 0) -> dict[str, Any]:
    """One frame from the request socket, with ``fds_wanted`` descriptors installed on 1 and 2."""
    message, fds = _receive_raw(sock, fds_wanted)
    _install_output(fds)
    return message


def _receive_raw(sock: socket.socket, fds_wanted: int = 2) -> tuple[dict[str, Any], list[int]]:
    """One frame from the request socket and the descriptors that came with it."""
    header, fds = _recv_with_fds(sock, wire.FRAME_HEADER.size, fds_wanted)
    payload = _read_exactly(sock.fileno(), _frame_size(header))  # (descriptors: the header's)
    return wire.decode_for_call(payload), fds


def _recv_with_fds(sock: socket.socket, size: int, fds_wanted: int) -> tuple[bytes, list[int]]:
    fds = array.array("i")
    data = b""
    while len(data) < size:
        chunk, ancillary, _flags, _addr = sock.recvmsg(
            size - len(data), socket.CMSG_SPACE(max(fds_wanted, 1) * 4)
        )
        if not chunk:
            raise EOFError("request socket closed")
        data += chunk
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return data, list(fds)


def _set_stdin(encoded: object) -> None:
    if encoded is None:
        return
    data = wire.b64decode(encoded)
    fd = os.memfd_create("stdin", 0)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    os.dup2(fd, 0)
    os.close(fd)


EVENT_TEXT_LIMITS = (1 << 13, 1 << 10, 1 << 7)
"""Characters each string of an event is cut to, in turn, until its frame fits."""


def _send_event(event: dict[str, Any]) -> None:
    """Send ``event``, its strings cut (``_shortened``) if its frame is larger than the
    supervisor reads (``wire.EVENT_FRAME_LIMIT``).

    Why: a cell's end holds its error record, and a traceback line carries the whole
    message of its exception (a failed ``assert`` printing a long list, a ``SyntaxError``
    on a long line). Over the limit, the supervisor took the frame for a broken event
    stream and killed the interpreter: the session's state was lost and the cell
    reported as killed by a signal (twenty-eighth red-team round). The cut is said in
    the text; the cell's stderr still has the traceback up to the output cap."""
    _send_frame(fitted_frame(event))


def fitted_frame(event: dict[str, Any]) -> bytes:
    """The frame of ``event``, its strings cut as little as makes it fit (``_send_event``).

    Not encoded whole when its text alone is over the limit (each character is a byte
    of JSON at least): a message of hundreds of MiB would not even fit ``MAX_FRAME``."""
    frame = b""
    if _characters(event) <= wire.EVENT_FRAME_LIMIT:
        frame = wire.encode_frame(event)
    for limit in EVENT_TEXT_LIMITS:
        if frame and len(frame) <= wire.FRAME_HEADER.size + wire.EVENT_FRAME_LIMIT:
            break
        frame = wire.encode_frame(_shortened(event, limit))
    return frame


def _characters(value: Any) -> int:
    """How many characters the strings of ``value`` (an event) hold together."""
    if isinstance(value, str):
        return len(_plain(value))
    if isinstance(value, dict):
        return sum(_characters(key) + _characters(item) for key, item in value.items())
    if isinstance(value, list):
        return sum(_characters(item) for item in value)
    return 0


def _shortened(value: Any, limit: int) -> Any:
    """``value`` (an event: dicts, lists, strings) with every string over ``limit``
    characters cut, saying how many characters were cut."""
    if isinstance(value, str):
        text = _plain(value)
        if len(text) <= limit:
            return text
        return f"{text[:limit]}... [{len(text) - limit} characters cut]"
    if isinstance(value, dict):
        return {key: _shortened(item, limit) for key, item in value.items()}
    if isinstance(value, list):
        return [_shortened(item, limit) for item in value]
    return value


def _send_frame(frame: bytes) -> None:
    try:
        view = memoryview(frame)
        while view:
            view = view[os.write(EVENTS_FD, view) :]
    except OSError:
        pass


COERCED_LOCALES = ("C", "POSIX", "C.UTF-8", "C.utf8", "UTF-8")
"""The locales in which python3 reads and writes stdin and stdout with ``surrogateescape``:
the legacy C and POSIX ones and the targets of their coercion (CPython's
``config_get_stdio_errors``); in any other, ``strict``."""


def stdio_errors() -> str:
    """The error handler of stdin and stdout a fresh ``python3`` here has.

    Why: a strict handler made ``input()`` of a line that is not UTF-8, and ``print`` of a
    file name read from ``os.listdir`` that is not, fail with ``UnicodeError`` where
    python3 in the same image (and the local backend) went on (twentieth red-team round).
    """
    if sys.flags.utf8_mode:
        return "surrogateescape"
    try:
        name = locale.setlocale(locale.LC_CTYPE)  # python3 set it from the environment
    except locale.Error:
        return "strict"
    return "surrogateescape" if name in COERCED_LOCALES else "strict"


def _new_std_streams() -> StdStreams:
    """Text streams over descriptors 0, 1 and 2, as a fresh ``python3`` has them (CPython's
    ``create_stdio``: names, modes and error handlers included)."""
    raw = io.FileIO(0, "r", closefd=False)
    raw.name = "<stdin>"
    # newline="\n" on all three, as CPython's ``create_stdio`` on POSIX: a "\r\n" in the
    # input is the code's to see (universal newlines turned it into "\n": a verdict
    # comparing ``len(input())`` flipped; a real client's check, twenty-eighth round).
    stdin = io.TextIOWrapper(
        io.BufferedReader(raw), encoding="utf-8", errors=stdio_errors(), newline="\n"
    )
    stdin.mode = "r"  # type: ignore[misc]
    return (stdin, _text_writer(1), _text_writer(2, stderr=True))


def _text_writer(fd: int, stderr: bool = False) -> io.TextIOWrapper:
    """A text stream writing to ``fd``, as a fresh ``python3``'s stdout (or stderr) is."""
    raw = io.FileIO(fd, "w", closefd=False)
    raw.name = "<stderr>" if stderr else "<stdout>"
    if stderr:
        stream = io.TextIOWrapper(
            io.BufferedWriter(raw),
            encoding="utf-8",
            errors="backslashreplace",
            newline="\n",
            line_buffering=True,
        )
    else:
        stream = io.TextIOWrapper(
            io.BufferedWriter(raw), encoding="utf-8", errors=stdio_errors(), newline="\n"
        )
    stream.mode = "w"  # type: ignore[misc]
    return stream


def prepare_std_streams() -> None:
    """In the zygote: the std streams of each child's first run, built once.

    Why: a child that builds them runs the codecs' Python code for the first
    time and copies ~30 of the zygote's pages doing so. They are built over
    what a child has on each descriptor, so they behave as if built there:
    ``/dev/null`` on 0 (the zygote keeps it: it has no use for the
    supervisor's input) and, for the moment of building, a pipe on 1 and 2
    (a stream asks once whether its file is seekable).
    """
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.close(null)
    saved = [os.dup(1), os.dup(2)]
    read_end, write_end = os.pipe()
    try:
        os.dup2(write_end, 1)
        os.dup2(write_end, 2)
        Setup.std_streams = _new_std_streams()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, read_end, write_end):
            os.close(fd)


def _std_streams() -> None:
    """Install the std streams: the prepared ones for a child's first run, new ones after."""
    streams, Setup.std_streams = Setup.std_streams or _new_std_streams(), None
    Setup.installed_streams = tuple(weakref.ref(stream) for stream in streams)
    sys.stdin = sys.__stdin__ = streams[0]  # type: ignore[misc]
    sys.stdout = sys.__stdout__ = streams[1]  # type: ignore[misc]
    sys.stderr = sys.__stderr__ = streams[2]  # type: ignore[misc]


def importable_names(paths: list[str], script: object = None) -> list[str]:
    """The top-level modules that uploads at ``paths`` (as ``wire.check_relative_path``
    gives them) make importable from the code's first ``sys.path`` entry (``name.py``,
    ``name.so``, ... or ``name/__init__.py``), for ``forget_shadowed_preloads``: the
    working directory, or the ``script``'s own directory, as ``python3 SCRIPT`` has it.

    Why the script's: with ``script="sub/main.py"``, uploads ``sub/random.py`` and
    ``sub/numpy/__init__.py`` lost to the preloaded modules of their names, and a script
    ``sub/json.py`` that imports ``json`` got the standard one where python3 imports the
    script itself (thirty-fourth red-team round)."""
    suffixes = importlib.machinery.all_suffixes()
    base = ""
    if isinstance(script, str) and "/" in script:
        base = script.rpartition("/")[0] + "/"
    names = set()
    for path in paths:
        if not path.startswith(base):
            continue
        parts = path[len(base) :].split("/")
        if len(parts) == 1:
            for suffix in suffixes:
                if parts[0].endswith(suffix):
                    names.add(parts[0][: -len(suffix)])
        elif len(parts) == 2 and parts[1] in {"__init__" + suffix for suffix in suffixes}:
            names.add(parts[0])
    return sorted(name for name in names if name.isidentifier())


def forget_shadowed_preloads(names: object) -> None:
    """Take out of ``sys.modules`` the modules the zygote holds and python3 would not
    (``Setup.shadowable``; their submodules too) that a call's upload of the same name
    shadows, so the code's ``import`` finds the upload as python3 would, its working
    directory first on ``sys.path``.

    Why: an uploaded ``random.py`` (or ``json``, ``fractions``, ``numpy``, ...) was
    ignored for the zygote's copy, and a program built on it gave another answer than
    under python3 (thirty-first round). The preloaded modules that imported it keep their
    own reference, as the agent's modules do (none imports after the code starts; the
    standard ``ast`` that ``auto_print`` needs is imported apart from the working
    directory). Only uploads, in plain calls and notebooks: a file the code writes itself
    and then imports is not seen (docs/server.md)."""
    if not isinstance(names, list):
        return
    for name in names:
        if not isinstance(name, str) or name not in Setup.shadowable:
            continue
        prefix = name + "."
        for key in [key for key in sys.modules if key == name or key.startswith(prefix)]:
            if key in Setup.shadowable:
                del sys.modules[key]


class _imports_undone:
    """Context manager: take out of ``sys.modules``, after the block, the modules it
    imported. Why: the agent's own work before the code starts, which python3 does not
    do, must not decide what the code's ``import`` finds (the module objects the agent
    keeps still work)."""

    def __enter__(self) -> None:
        self.there = set(sys.modules)

    def __exit__(self, *exc_info: object) -> None:
        for name in [name for name in sys.modules if name not in self.there]:
            del sys.modules[name]


def _fresh_main(script_path: str | None = None) -> dict[str, Any]:
    """A new ``__main__``, ``sys.argv`` and ``sys.path[0]`` as ``python3 -c`` (or
    ``python3 SCRIPT``) gives them: the code's own directory first, so a module uploaded
    with the call imports (the agent's archive, which started this process, is not there)."""
    sys.argv = [script_path] if script_path else ["-c"]
    if sys.path and sys.path[0] == Setup.agent_path:
        sys.path[0] = os.path.dirname(script_path) if script_path else ""
    main = types.ModuleType("__main__")
    # What python3 -c puts there besides: code that reads __builtins__.print or
    # __annotations__ behaves as it does under the local backend.
    main.__dict__.update(__builtins__=builtins, __annotations__={}, __loader__=BuiltinImporter)
    sys.modules["__main__"] = main
    return main.__dict__


def _run_probe(counter: recursion.Counter, code: Any, namespace: dict[str, Any]) -> None:
    """A recursion probe run as ``run_user_code`` runs the code (``recursion.find``)."""
    counter.enter()
    try:
        exec(code, namespace)
    finally:
        counter.leave()


def run_user_code(
    source: str, script: str | None = None, *, auto_print: bool = False, shadowing: object = None
) -> int:
    _std_streams()
    path = None
    if script is not None:  # as `python SCRIPT`: the file is in the working directory
        path = os.path.join(wire.WORKDIR, wire.check_relative_path(script))
    # Compiled before the uploads shadow anything, by the agent's own modules, and what
    # that imported taken out again (``_imports_undone``): the auto-print's ``ast`` walk
    # imported an uploaded ``collections/`` (the call failed before its code ran), and the
    # ``ast``, ``enum`` and ``contextlib`` it brought in hid the call's uploads of those
    # names (the review of the thirty-third round). Its error, if any, is raised below,
    # where the code runs, as it was.
    code: Any = None
    failed: BaseException | None = None
    try:
        if auto_print:
            with _imports_undone():
                code = compile_auto_printed(source, "<sandbox>")
        else:  # (imports nothing)
            code = compile(source, "<sandbox>", "exec", dont_inherit=True)
    except BaseException as exc:
        failed = exc
    if shadowing:
        forget_shadowed_preloads(shadowing)
    gc.freeze()  # what exists now is the agent's: the end's collection visits the call's only
    before = ModulesAtStart()  # the call's own modules are finalized at its end
    namespace = _fresh_main(path)
    if path is not None:
        namespace["__file__"] = path
    status = 0
    trace = profile = None
    try:
        if failed is not None:
            raise failed
        if Setup.recursion is not None:
            Setup.recursion.enter()  # (the shape ``_run_probe`` calibrated)
        try:
            exec(code, namespace)
        finally:  # the first thing after the code: its hooks off (see ``CodeHooks``)
            trace, profile = _get_trace(), _get_profile()
            try:
                if profile is not None:
                    _set_profile(None)
            except BaseException:
                pass  # refused by an audit hook of the code's: on, as it chose
            try:
                if trace is not None:
                    _set_trace(None)
            except BaseException:
                pass
            if Setup.recursion is not None:
                Setup.recursion.leave()
    except SystemExit as exc:
        status = exit_status(exc)
    except BaseException as exc:
        hook_status = _print_exception(exc, CodeHooks(trace, profile))
        if hook_status is not None:
            status = hook_status
        else:  # the exact class, as CPython (``run_eval_code_obj``) checks it
            status = ENDED_BY_INTERRUPT if type(exc) is KeyboardInterrupt else 1
    del namespace  # ``__main__`` alone holds it now, as in python3 at its end
    return _finish(status, before, CodeHooks(trace, profile))


_partial = functools.partial
_get_trace, _set_trace = _partial(sys.gettrace), _partial(sys.settrace)
_get_profile, _set_profile = _partial(sys.getprofile), _partial(sys.setprofile)


class CodeHooks:
    """The trace and profile functions the code left set (``sys.settrace``,
    ``sys.setprofile``): taken off as its code ends, and set again only around what python3
    runs of the code's with them still on (the at-exit functions, an excepthook; a
    session's or notebook's next cell).

    Why: the end is the agent's Python; a tracer left on saw ~40 of its functions (their
    names in the call's stdout), and one that raised once the agent had closed its
    streams ended the call with status 70 (twenty-ninth red-team round). How: the hooks
    are read and set inline, never from a function of the agent's entered while they are
    on (the tracer would see its frame), and through ``functools.partial`` objects: a
    profiler is told of each built-in function called (``c_call``), not of a partial
    object, and python3's profiler sees nothing of its end but the code's own.
    """

    def __init__(self, trace: Any = None, profile: Any = None) -> None:
        self.trace = trace
        self.profile = profile

    def call(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` (the code's, or what runs the code's) with the hooks on, and
        then off again, whatever it raised (kept as it left them).

        Only hooks that are set are set and unset: each ``sys.settrace`` and
        ``sys.setprofile`` raises an audit event, and the code's audit hook, which python3
        never shows them at its end, saw six and could refuse them (the review of the
        twenty-ninth round: a refused unset left the tracer on the agent's frames). A
        refusal leaves the hooks as they are; it never ends the call."""
        try:
            if self.trace is not None:
                _set_trace(self.trace)
            if self.profile is not None:
                _set_profile(self.profile)
        except BaseException:
            pass
        try:
            return _partial(function, *args)()
        finally:
            self.trace, self.profile = _get_trace(), _get_profile()
            try:
                if self.profile is not None:
                    _set_profile(None)
            except BaseException:
                pass
            try:
                if self.trace is not None:
                    _set_trace(None)
            except BaseException:
                pass


def _print_exception(
    exc: BaseException, hooks: CodeHooks | None = None, *, set_sys_last_vars: bool = True
) -> int | None:
    """Print ``exc`` as python3 does with an exception nothing caught (CPython's
    ``_PyErr_PrintEx``): ``sys.last_type``, ``last_value`` and ``last_traceback`` set (an
    at-exit function reads them), the ``sys.excepthook`` audit event, then the hook, with
    the code's trace and profile functions on. None, or the status an ``excepthook`` that
    raised ``SystemExit`` chose (python3 exits with it at once: an uncaught exception is
    status 1 or, a ``KeyboardInterrupt``, SIGINT)."""
    hooks = hooks or CodeHooks()
    try:
        # Drop the driver's frames, so tracebacks start at "<sandbox>" (or "<cell N>").
        tb = _code_traceback(exc)
        _TRACEBACK_SLOT.__set__(exc, tb)  # excepthook prints the exception's own traceback
        names = vars(sys)
        if set_sys_last_vars:
            names["last_type"], names["last_value"], names["last_traceback"] = type(exc), exc, tb
            if sys.version_info >= (3, 12):
                names["last_exc"] = exc
        hook = names.get("excepthook")
        try:
            hooks.call(_audit, "sys.excepthook", hook, type(exc), exc, tb)
        except RuntimeError:
            return None  # an audit hook refused it: python3 prints nothing
        except BaseException as audit_error:
            _report_unraisable(audit_error, None, "Exception ignored in audit hook")
        if hook is None:  # the code deleted it: as python3
            _write_stderr("sys.excepthook is missing\n")
            _default_excepthook(type(exc), exc, tb)
            return None
        with _one_write(vars(sys).get("stderr"), hook, exc):
            hooks.call(hook, type(exc), exc, tb)
    except SystemExit as hook_exit:  # python3 exits with it, silently (handle_system_exit)
        return exit_status(hook_exit)
    except BaseException as hook_error:
        _print_hook_failure(hook_error, exc)
    return None


def _print_hook_failure(hook_error: BaseException, exc: BaseException) -> None:
    """As python3 reports an ``excepthook`` that raised (``_PyErr_PrintEx``): both
    exceptions, by the default hook. Before, nothing was printed (twentieth red-team
    round); the hook's traceback starts at the hook, not in the agent. Never raises:
    the exceptions are the code's, and so are their attributes."""
    try:
        # (through the C slots, as python3 reads them: see ``_code_traceback``)
        trimmed = _without_agent_frames(_TRACEBACK_SLOT.__get__(hook_error))
        _TRACEBACK_SLOT.__set__(hook_error, trimmed)
        context = _EXCEPTION_SLOTS["__context__"]
        if context.__get__(hook_error) is exc:  # raised while ``exc`` was handled: by the agent
            context.__set__(hook_error, None)
        _write_stderr("Error in sys.excepthook:\n")
        _default_excepthook(type(hook_error), hook_error, trimmed)
        _write_stderr("\nOriginal exception was:\n")
        _default_excepthook(type(exc), exc, _TRACEBACK_SLOT.__get__(exc))
    except BaseException:
        pass


def _write_stderr(text: str) -> None:
    """CPython's ``PySys_WriteStderr``: to ``sys.stderr``'s ``write`` if it has one that
    works, else to descriptor 2. Never raises."""
    try:
        stderr = vars(sys).get("stderr")
        if stderr is None:
            raise AttributeError("no sys.stderr")
        stderr.write(text)
    except BaseException:
        _write_descriptor(2, text)


def _write_descriptor(fd: int, text: str) -> None:
    """``text`` to ``fd`` as CPython writes to its C ``stderr`` (UTF-8, backslash escapes
    for what does not encode). Never raises."""
    try:
        data = text.encode("utf-8", "backslashreplace")
        while data:
            data = data[os.write(fd, data) :]
    except BaseException:
        pass


class _one_write:
    """Context manager: the default excepthook's lines leave in one write, not one each.

    Why: every write to a pipe wakes the supervisor, which reads it on the other
    core; a three-line traceback cost three wakeups, CPU that calls under
    concurrency share. The text is the same. Only for our own line-buffered
    stream and the default hook (finite, fast): a hook of the call's own may
    print slowly, and must be seen line by line as ``python3`` would show it.
    And only for an exception whose printing runs none of the code's Python
    (``_prints_by_itself``): one whose ``__str__`` wrote showed that before the
    traceback's header, and one whose ``__str__`` ended the process lost the
    header python3 had already written (thirty-second round's review).
    """

    def __init__(self, stream: object, hook: object, exc: BaseException) -> None:
        self.stream: io.TextIOWrapper | None = None
        default_hook = hook is _default_excepthook
        if (
            type(stream) is _io.TextIOWrapper
            and stream.line_buffering
            and default_hook
            and _prints_by_itself(exc)
        ):
            self.stream = stream  # ours: the exact class, not a subclass of the call's

    def __enter__(self) -> None:
        if self.stream is not None:
            self.stream.reconfigure(line_buffering=False)

    def __exit__(self, *exc_info: object) -> None:
        if self.stream is not None:
            self.stream.reconfigure(line_buffering=True)  # which flushes


_PLAIN_EXCEPTIONS = frozenset(
    {
        ArithmeticError, AssertionError, EOFError, FloatingPointError, IndexError, KeyError,
        KeyboardInterrupt, LookupError, MemoryError, NotImplementedError, OverflowError,
        RecursionError, RuntimeError, TypeError, ValueError, ZeroDivisionError, Exception,
        BaseException,
    }
)  # fmt: skip
"""Builtin exceptions the default hook prints from their ``args`` alone: no attribute it
reads there is an object of the code's (``AttributeError`` asks its ``obj`` for names,
``NameError`` lists the frame's namespaces for a suggestion, ``OSError`` shows its
``filename``'s repr, ``SyntaxError`` its fields)."""
_PLAIN_ARGS = (str, int, float, bool, type(None))
_EXCEPTION_SLOTS = {
    name: BaseException.__dict__[name] for name in ("args", "__dict__", "__cause__", "__context__")
}


_INTERPRETERS_MODULES = sys.modules
"""The interpreter's own table of modules, which its C code imports from (a call may bind
``sys.modules`` to another object; this one it can only change)."""


def _prints_by_itself(exc: BaseException) -> bool:
    """Whether the default hook prints ``exc`` and its chain without running any Python of
    the code's: plain builtin exceptions (``_PLAIN_EXCEPTIONS``) whose arguments are plain
    values and which carry no attribute of their own (notes included), read through the
    exceptions' C slots, a chain followed as the hook follows it, up to 100 links; and the
    ``io`` the hook opens each frame's source file with still the C library's (a call
    that replaced ``io.open`` ran its code between the traceback's lines: the review of
    the thirty-third round)."""
    io_module = _INTERPRETERS_MODULES.get("io")
    if io_module is not io or vars(io).get("open") is not _io.open:
        return False
    if vars(io).get("TextIOWrapper") is not _io.TextIOWrapper:
        return False
    pending: list[BaseException] = [exc]
    for _ in range(100):
        if not pending:
            return True
        link = pending.pop()
        if type(link) not in _PLAIN_EXCEPTIONS or _EXCEPTION_SLOTS["__dict__"].__get__(link):
            return False
        if any(type(arg) not in _PLAIN_ARGS for arg in _EXCEPTION_SLOTS["args"].__get__(link)):
            return False
        for name in ("__cause__", "__context__"):
            chained = _EXCEPTION_SLOTS[name].__get__(link)
            if chained is not None:
                pending.append(chained)
    return False


def _finish(
    status: int, before: ModulesAtStart | None = None, hooks: CodeHooks | None = None
) -> int:
    """End as ``python3`` does (``Py_FinalizeEx``): join the threads, run the at-exit
    functions, flush, set the std streams back, finalize the modules of the call, flush
    what is left.

    Why the last two: ``os._exit`` skips them, and so a file the code left open lost
    what it had buffered (a grader fetching ``answer.txt`` read it empty), an object's
    ``__del__`` and a generator's ``finally`` never ran, where python3 and the local
    backend ran them (twentieth red-team round). ``before``: the modules there before
    the code ran (the agent's, the zygote's); None (``warm_up``'s rehearsal): no at-exit
    functions, which run once, and no module of the agent's is finalized. ``hooks``: the
    code's trace and profile functions, on where python3 has them on (``CodeHooks``).
    """
    hooks = hooks or CodeHooks()
    flushed: bool | None = None
    try:
        with _unraisable_without_agent_frames():
            if before is not None:
                _end_threads(before.modules)
                _quietly(hooks.call, _run_exitfuncs)
            flushed = _flush()
            if before is not None:
                _quietly(_restore_std_streams)
                _quietly(_finalize_modules, before)
            else:
                _quietly(_collect)
    except BaseException:
        pass  # (a signal handler of the code's, raising here: the status stands)
    finally:
        if flushed is None:  # the end was cut short before its flush
            with _unraisable_without_agent_frames():
                flushed = _flush()
        _close_agent_streams()
    # python3 ends by SIGINT after an uncaught KeyboardInterrupt, whatever its flush did.
    return status if flushed or status == ENDED_BY_INTERRUPT else FLUSH_FAILED


FLUSH_FAILED = 120
"""python3's exit status when flushing ``sys.stdout`` or ``sys.stderr`` failed at its end
(``Py_RunMain``), whatever the code's own status was. Only the first flush counts: by
python3's second, its ``sys`` is cleared, and its own streams are flushed as they are
finalized, where a failure changes nothing (``_close_agent_streams``; measured against the
image's python3: a ``sys.stdout`` the code opened on descriptor 1 and dropped closes
it, and python3 still ends 0)."""


def _quietly(step: Callable[..., object], *args: Any) -> None:
    """One step of the end: whatever the code's objects raise in it, the end goes on."""
    try:
        step(*args)
    except BaseException:
        pass


def _end_threads(modules: dict[str, Any]) -> None:
    """CPython's ``wait_for_thread_shutdown``: the ``_shutdown`` of the ``threading``
    module in the interpreter's modules (if there is one), and what it raises reported
    as python3 reports it.

    Why its own ``_shutdown``: it runs the threading module's at-exit calls (an executor
    left open wakes its workers with one: the review of the twenty-second round) and
    then waits on the interpreter's lock of every thread that is not a daemon, until
    none is left. The agent's own join of the threads alive as the end began missed one
    that another thread started later (its output lost), and called a ``join`` the code
    had overridden: a worker that such a ``join`` stopped made a success of a call
    python3 never ends (twenty-ninth red-team round). ``_shutdown`` finds the main
    thread of a call's process as in a process ``os.fork`` made: ``forking`` copies the
    zygote's one thread, whose ident it keeps.

    Not with the code's trace and profile functions on: python3 has them see
    ``_shutdown`` only where the code imported ``threading``, and here the agent has
    imported it for every call (a tracer that printed would have printed its frames
    after every answer)."""
    module = modules.get("threading", _MISSING)
    if module is _MISSING:
        return  # never imported: python3 has nothing to wait for
    try:
        _call_shutdown(module)
    except BaseException as exc:
        _report_unraisable(exc, module)


_MISSING = object()
_call_shutdown = operator.methodcaller("_shutdown")


class ModulesAtStart:
    """Where ``sys.modules`` stood as a call's code started: what its end finalizes is
    what came after (``added``).

    Why not ``frozenset(sys.modules)``: that takes a reference to every module name
    the zygote holds, and each such write copies the page the name is on, in every
    call (~70 pages for the light zygote, hundreds for the full one: measured with
    ``perf``'s page-fault events in the image, where ``set_add_entry`` was 12% of all
    the containers' faults). ``sys.modules`` keeps insertion order, so what a call
    imports follows the entry that was last when it started, and only those are read
    at its end. A call that deleted entries or moved that one is found by the count,
    and then every name is read against those the zygote had (``Setup.module_names``);
    only one that moved it and also deleted as many entries as it added before is not
    (its own modules then go unfinalized, which only its own output can suffer).

    The dict is the interpreter's own, kept here (python3 finalizes that one, whatever
    ``sys.modules`` names at the end), and it is read with none of the code's methods
    beyond what a dict lookup runs (a key planted with the hash of ``__main__`` or of a
    name the end sets to None, as python3's own stores of None run it): items in
    reverse, exact ``str`` names only, modules told by their type (twenty-seventh
    red-team round: a dict subclass bound to ``sys.modules``, or a key whose ``__eq__``
    loops, made the end run the code's methods until its time was up).
    """

    def __init__(self) -> None:
        self.modules = sys.modules
        self.count = len(self.modules)
        self.last = next(reversed(self.modules.items()))

    def added(self) -> list[tuple[str, object]]:
        """The call's entries (name, value), as ``sys.modules`` orders them, ``__main__``
        first: what python3 would set to None (modules or not), exact ``str`` names."""
        modules = self.modules
        last_name, last_module = self.last
        tail: list[tuple[object, object]] = []
        for name, module in reversed(modules.items()):
            if name is last_name and module is last_module:
                break
            tail.append((name, module))
        if len(modules) - len(tail) == self.count:
            candidates: Iterable[tuple[object, object]] = reversed(tail)
        else:  # an entry before the mark was deleted or moved: read them all
            candidates = list(modules.items())
        found: list[tuple[str, object]] = []
        if "__main__" in modules:  # (where the zygote had it: before the mark)
            found.append(("__main__", modules["__main__"]))
        for key, value in candidates:
            if type(key) is str and key != "__main__" and key not in Setup.module_names:
                found.append((key, value))
        return found


def _finalize_modules(before: ModulesAtStart) -> None:
    """CPython's ``finalize_modules`` for ``__main__`` and the modules the call imported:
    each set to None in ``sys.modules``, a collection (what only they held is finalized,
    their globals intact), then the dicts of those still alive cleared as
    ``_PyModule_ClearDict`` does, in reverse order, and a last collection.

    Why this order: clearing first made a ``__del__`` in a cycle see its globals as None
    (a report it printed with ``json`` failed; ``os._exit`` in one failed); collecting
    alone leaves what a module kept alive unfinalized (a text file an imported module
    left open lost its buffered text); the twenty-second red-team round's comparison."""
    added = before.added()
    modules = [m for _name, m in added if issubclass(type(m), _ModuleType)]
    _flush_modules(modules, frozenset(name for name, _value in added))
    alive = [_weak_ref(module) for module in modules]
    names = [name for name, _value in added]  # (no loop here holds a value past its end)
    with _as_at_finalization(before.modules):
        # Only the weak references are left: the collection below. Each reference the
        # end drops is dropped from ``sys:1`` (``_at_sys``), where python3 has no frame.
        _at_sys(list.clear, added)
        _at_sys(list.clear, modules)
        for name in names:
            _at_sys(dict.__setitem__, before.modules, name, None)
        _end_collection()  # the zygote's own objects are frozen, not visited
        if _active_count() > 1:
            return  # a daemon thread runs on (python3 stops them): no globals taken from it
        for ref in reversed(alive):
            _clear_namespace_of(ref)
        _end_collection()


_GC_CALLBACKS: list[Any] = gc.callbacks
"""The collector's own list of callbacks (rebinding ``gc.callbacks`` does not change it)."""
_AT_SYS_LINE_1 = types.FunctionType(
    compile("lambda call, *args: call(*args)", "sys", "eval").co_consts[0],
    {"__name__": "sys", "__builtins__": builtins},  # (without builtins a dealloc's warning
)  # was lost; python3's frameless one takes the ``sys`` module's name and its registry)


def _at_sys(call: Callable[..., Any], *args: Any) -> Any:
    """``call(*args)`` from a frame at ``sys:1``: a warning raised by what it releases
    (an unclosed file's ``ResourceWarning``) is attributed there, as python3 attributes
    one raised with no Python frame running (CPython's ``setup_context``), which is how
    its finalization runs. From the agent's frames it named the agent's file and line
    (thirty-fourth red-team round)."""
    return _AT_SYS_LINE_1(call, *args)


class _as_at_finalization:
    """Context manager: the end of a call with what python3's finalization has: no
    ``warnings`` module (its entry in ``modules`` is None, so a warning is printed by
    the C fallback, without the tracemalloc hint) and none of the code's
    ``gc.callbacks`` (``_PyGC_CollectNoFail`` calls none: one that exited chose the
    call's status; the same round)."""

    def __init__(self, modules: dict[str, Any]) -> None:
        self.modules = modules

    def __enter__(self) -> None:
        self.callbacks = list.copy(_GC_CALLBACKS)
        list.clear(_GC_CALLBACKS)
        self.had_warnings = dict.__contains__(self.modules, "warnings")
        self.warnings = dict.get(self.modules, "warnings")
        dict.__setitem__(self.modules, "warnings", None)

    def __exit__(self, *exc_info: object) -> None:
        if self.had_warnings:
            dict.__setitem__(self.modules, "warnings", self.warnings)
        else:
            dict.pop(self.modules, "warnings", None)
        list.extend(_GC_CALLBACKS, self.callbacks)


def _end_collection() -> None:
    """A collection at the end of a call, from ``sys:1`` (``_at_sys``)."""
    _at_sys(_collect)


def _flush_modules(modules: list[Any], owners: frozenset[str]) -> None:
    """``_flush_files_held_by`` for each of ``modules``, on one budget for them all."""
    looks = FlushBudget(END_FLUSH_LOOKS)
    for module in modules:  # what the collection finalizes next, in no set order
        _flush_files_held_by(_module_dict(module), looks, owners)


def _clear_namespace_of(ref: weakref.ref[Any]) -> None:
    module = ref()
    if module is not None:
        _clear_namespace(_module_dict(module))


def _module_dict(module: types.ModuleType) -> dict[str, Any]:
    """A module's own dict, without its class's ``__getattribute__`` (a lazy module's
    would import it now)."""
    namespace: dict[str, Any] = object.__getattribute__(module, "__dict__")
    return namespace


FLUSH_LOOKS = 10_000
"""How many objects ``_flush_files_held_by`` looks at, at most, for one namespace."""
END_FLUSH_LOOKS = 100_000
"""... and for all the modules of a call's end together: 20,000 modules of a call, each
holding a long list, made the end look 10,000 objects each and pass the call's time
(twenty-seventh red-team round)."""


class FlushBudget:
    """Looks left to ``_flush_files_held_by``, shared by the namespaces of one end."""

    def __init__(self, looks: int) -> None:
        self.left = looks


FLUSH_DEPTH = 6
"""How far below a module's globals it looks (an object's attributes: one level)."""
FLUSHED_TYPES = (_io.TextIOWrapper, _io.BufferedWriter, _io.BufferedRandom)
"""The files whose buffers ``_flush_files_held_by`` flushes: the C ones, whose ``flush``
runs none of the code's methods."""
CONTAINER_TYPES = (list, tuple, set, frozenset)


def _flush_files_held_by(
    namespace: dict[str, Any],
    budget: FlushBudget | None = None,
    owners: frozenset[str] = frozenset(),
) -> None:
    """Flush each open file a module holds: in a global, or below one in built-in
    containers, objects' attributes, and the attributes and closures of the classes and
    functions that modules named in ``owners`` (the call's) defined (``FLUSH_DEPTH``
    levels down, ``FLUSH_LOOKS`` objects at most, fewer if ``budget`` has fewer left).

    Why: python3 writes what such a file buffered at its end, even when the module is in
    a cycle (a function defined beside the file); the collection that finalizes a cycle
    here closed a file's binary buffer before the text file above it, and the text was
    lost (the review of the twentieth round's fix; a class attribute and a closure, the
    twenty-seventh round). Flushing first keeps it, in whatever order the collection
    then finalizes them. Only exact built-in types are looked into and flushed, and a
    class's or an object's own dict read by the interpreter's descriptor: none of the
    code's methods (``__iter__``, ``__class__``, a lazy module's loading) runs here,
    where python3 runs none. The zygote's classes and functions are not looked into:
    each object read there is a page the call's process copies (a call naming
    ``BuiltinImporter`` cost ~0.1 ms).
    """
    budget = budget or FlushBudget(FLUSH_LOOKS)
    allowed = looks = min(FLUSH_LOOKS, budget.left)
    level: list[Any] = [namespace]
    try:
        for _depth in range(FLUSH_DEPTH + 1):
            below: list[Any] = []
            for value in level:
                looks -= 1
                if looks < 0:
                    return
                cls = type(value)
                room = max(0, looks - len(below))  # (one level's list stays within the looks)
                try:
                    if cls in FLUSHED_TYPES:
                        if not value.closed:
                            value.flush()
                    elif cls in CONTAINER_TYPES:
                        below.extend(_islice(value, room))
                    elif cls is dict:
                        below.extend(_islice(dict.values(value), room))
                    elif cls is _FunctionType:
                        if _owned(value.__module__, owners):
                            cells = (value.__closure__ or ())[:room]
                            below.extend(cell.cell_contents for cell in cells)
                            attributes = object.__getattribute__(value, "__dict__")
                            below.extend(_islice(dict.values(attributes), room))
                    elif issubclass(cls, type):
                        if _owned(_TYPE_MODULE.__get__(value), owners):
                            values = _MappingProxyType.values(_class_dict(value))
                            below.extend(_islice(values, room))
                    elif _plain_dict_of(cls):
                        attributes = object.__getattribute__(value, "__dict__")
                        below.extend(_islice(dict.values(attributes), room))
                except BaseException:
                    pass  # the code's objects: their own failures (an empty cell)
            level = below
    finally:
        budget.left -= allowed - max(looks, 0)


_CLASS_DICT = type.__dict__["__dict__"]
_TYPE_MODULE = type.__dict__["__module__"]


def _owned(module: object, owners: frozenset[str]) -> bool:
    """Whether a class's or function's ``__module__`` names one of ``owners``."""
    return type(module) is str and module in owners


def _class_dict(cls: type) -> types.MappingProxyType[str, Any]:
    """A class's own namespace, read without its metaclass (whose ``__dict__`` could be
    the code's property): a proxy of the real dict the interpreter keeps."""
    proxy: types.MappingProxyType[str, Any] = _CLASS_DICT.__get__(cls)
    return proxy


def _plain_dict_of(cls: type) -> bool:
    """Whether instances of ``cls`` keep their attributes in a plain dict (its ``__dict__``
    is the interpreter's own descriptor, not a property of the code's)."""
    if cls is type or issubclass(cls, (type, _ModuleType)):
        return False
    for klass in cls.__mro__:
        descriptor = klass.__dict__.get("__dict__")
        if descriptor is not None:
            return type(descriptor) is _GetSetDescriptorType
    return False


def _clear_namespace(namespace: dict[str, Any]) -> None:
    """Release what a module still holds as CPython does at the end
    (``_PyModule_ClearDict``): names of one leading underscore first, then every other
    but ``__builtins__``, each set to None, so objects go by their reference counts in
    that order."""
    # As CPython: names only (a key of another type stays), str's own methods. The
    # values are not held here: each goes as its name is set to None (``_at_sys``).
    for name in list(namespace):
        text = issubclass(type(name), str)
        underscored = text and str.startswith(name, "_") and not str.startswith(name, "__")
        if underscored and dict.get(namespace, name) is not None:
            _at_sys(dict.__setitem__, namespace, name, None)
    for name in list(namespace):
        text = issubclass(type(name), str)
        named = text and str.__eq__(name, "__builtins__") is not True
        if named and dict.get(namespace, name) is not None:
            _at_sys(dict.__setitem__, namespace, name, None)


AGENT_DIRECTORY = os.path.dirname(_finish.__code__.co_filename)
"""Where the agent's frames say they are (no ``__file__``: an image without the agent
loads it from the archive it is sent)."""


class _unraisable_without_agent_frames:
    """Context manager: an exception that cannot be raised (in an at-exit function, a
    ``__del__``) is reported without the agent's frames.

    Why: reporting one that has no traceback of its own, CPython adds the frame that is
    running; python3 has none at its end, the agent has ``_finish``, and its path in the
    agent's archive reached the observation of a failed call (twentieth red-team round).
    Whatever hook the code installed is called, with the trimmed traceback. Never
    raises: the hook in place is the code's (it may have deleted it).
    """

    def __enter__(self) -> None:
        self.previous = getattr(sys, "unraisablehook", None)
        try:
            sys.unraisablehook = self.hook
        except BaseException:
            pass

    def __exit__(self, *exc_info: object) -> None:
        try:
            if getattr(sys, "unraisablehook", None) is self.hook:
                sys.unraisablehook = self.previous  # type: ignore[assignment]
        except BaseException:
            pass

    def hook(self, unraisable: Any) -> None:
        trimmed = type(unraisable)(
            (
                unraisable.exc_type,
                unraisable.exc_value,
                _without_agent_frames(unraisable.exc_traceback),
                unraisable.err_msg,
                unraisable.object,
            )
        )
        hook = self.previous if self.previous is not None else _default_unraisablehook
        try:
            hook(trimmed)
        except BaseException as failure:  # as CPython reports a hook that failed, but
            # without this wrapper (its frame, its repr: the agent's path) in the report
            _default_unraisablehook(
                type(unraisable)(
                    (
                        type(failure),
                        failure,
                        _without_agent_frames(_TRACEBACK_SLOT.__get__(failure)),
                        "Exception ignored in sys.unraisablehook",
                        hook,
                    )
                )
            )


def _without_agent_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` from its first frame that is not the agent's own."""
    while tb is not None and str.startswith(tb.tb_frame.f_code.co_filename, AGENT_DIRECTORY + "/"):
        tb = tb.tb_next
    return tb


def _flush() -> bool:
    """CPython's ``flush_std_files``: ``sys.stdout`` and then ``sys.stderr`` as the code
    left them, each unless missing or None, and unless its ``closed`` says so; whether
    both flushed. A failed ``sys.stdout`` is reported as python3 reports it (an
    exception ignored in it); a failed ``sys.stderr`` is not.

    Read from the ``sys`` module's own dict, as CPython reads them: a module
    ``__getattr__`` of the code's is not asked for a stream it deleted, and a deleted
    one is no failure (it made every such call status 70, "the sandbox failed": the
    twenty-eighth red-team round, with the streams below).
    """
    flushed = True
    names = vars(sys)
    both = ((names.get("stdout"), True), (names.get("stderr"), False))  # read before either
    for stream, reported in both:
        if stream is None or _is_closed(stream):
            continue
        try:
            stream.flush()
        except BaseException as exc:
            flushed = False
            if reported:
                _report_unraisable(exc, stream)
    return flushed


def _is_closed(stream: object) -> bool:
    """CPython's ``file_is_closed``: a ``closed`` that cannot be read is not closed."""
    try:
        return bool(stream.closed)  # type: ignore[attr-defined]
    except BaseException:
        return False


def _flush_quietly() -> None:
    """A cell's end: flush the code's streams as it left them, then the ones the agent
    installed for the cell that are still alive, whatever fails."""
    names = vars(sys)
    for stream in (names.get("stdout"), names.get("stderr"), *_agent_streams()):
        if stream is not None:
            _quietly(stream.flush)


def _close_agent_streams() -> None:
    """A call's end: close the std streams the agent installed that are still alive, as
    python3's finalizer of its own streams does (``close``, which flushes; descriptors 1
    and 2 stay open), whatever fails.

    Why: python3 writes what its own stdout holds when that object is finalized, even
    after the code replaced ``sys.stdout`` (and ``sys.__stdout__``), and the answer
    printed before the swap reached the output; here it was lost, or came out in the
    next cell of a notebook. One the code dropped was finalized then, as in python3
    (``Setup.installed_streams`` holds weak references)."""
    for stream in _agent_streams():
        _quietly(stream.close)


def _agent_streams() -> list[io.TextIOWrapper]:
    """The stdout and stderr ``_std_streams`` installed last, those still alive."""
    refs = Setup.installed_streams or ()
    return [stream for stream in (ref() for ref in refs[1:]) if stream is not None]


def _restore_std_streams() -> None:
    """As CPython's ``finalize_modules`` starts (``finalize_modules_delete_special``):
    ``sys.last_type`` and the others set to None, and ``sys.stdout`` and the others set
    back to ``sys.__stdout__`` and the others (None where those are gone).

    Why the first: an uncaught exception's traceback, kept there, holds the frames of the
    code and what they hold; python3 lets them go here, and a finalizer in a cycle they
    held ran (``os._exit(0)`` in one chose the status; the last values are set since the
    twenty-ninth round). Its other names (``sys.path``, ``sys.meta_path``, ...) are left:
    a finalizer's import works here where python3's fails."""
    names = vars(sys)
    for name in LAST_VALUES:
        names[name] = None
    for name in ("stdin", "stdout", "stderr"):
        names[name] = names.get(f"__{name}__")


LAST_VALUES = ("last_type", "last_value", "last_traceback") + (
    ("last_exc",) if sys.version_info >= (3, 12) else ()
)
"""What ``_print_exception`` sets of ``sys`` (as ``_PyErr_PrintEx`` does)."""


def _report_unraisable(exc: BaseException, owner: object, message: str | None = None) -> None:
    """Report ``exc``, raised by ``owner`` (a stream's flush, the threading module's
    shutdown), to ``sys.unraisablehook``, as CPython's ``PyErr_WriteUnraisable(owner)``
    (or, with a ``message``, ``_PyErr_WriteUnraisableMsg``) does. Never raises."""
    kind = Setup.unraisable_args
    if kind is None:
        return
    try:
        trimmed = _without_agent_frames(_TRACEBACK_SLOT.__get__(exc))  # as python3's: none
        _TRACEBACK_SLOT.__set__(exc, trimmed)
        report = kind((type(exc), exc, trimmed, message, owner))
        hook = vars(sys).get("unraisablehook")
        (_default_unraisablehook if hook is None else hook)(report)
    except BaseException:
        pass


def _unraisable_args_type() -> type | None:
    """The type of what CPython hands ``sys.unraisablehook``, from one report made on
    purpose (an exception in ``__del__``); None if it gave none."""
    seen: list[Any] = []
    previous = sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        _RaisesWhenFinalized()
    finally:
        sys.unraisablehook = previous
    return type(seen[0]) if seen else None


class _RaisesWhenFinalized:
    def __del__(self) -> None:
        raise RuntimeError("a report made on purpose")


def run_cells(request_sock: socket.socket, count: int, *, shadowing: object = None) -> int:
    """Notebook mode: each cell arrives with fresh stdout/stderr pipes, after the last one ended.

    The supervisor sends cell ``k + 1`` only once this process reported cell
    ``k`` ended; each cell's output lands in its own pipes. Uploads shadow imported
    modules as in a plain call (its cells are parsed by ``stdlib_ast``, never an upload).
    """
    with _imports_undone():
        stdlib_ast()  # (kept by the agent, for every cell: see ``run_user_code``)
    if shadowing:
        forget_shadowed_preloads(shadowing)
    gc.freeze()  # what exists now is the agent's: the end's collection visits the calls' only
    before = ModulesAtStart()  # the call's own modules are finalized at its end
    namespace = _fresh_main()
    # The call's own pipes: between cells and after the last, what the interpreter writes
    # is the call's stdout and stderr (the server's ``driver``), as on the local backend.
    driver = (os.dup(1), os.dup(2))
    hooks = CodeHooks()
    for index in range(count):
        try:
            cell = _receive(request_sock, fds_wanted=2)
        except (EOFError, ValueError):
            return 0
        token = str(cell.get("token", ""))
        code = str(cell.get("code", ""))
        caps = wire.text_caps(cell)
        _one_cell(code, namespace, index, token, hooks, caps=caps, print_error=False, after=driver)
    del namespace  # ``__main__`` alone holds it now, as in python3 at its end
    return _finish(0, before, hooks)


def run_session(request_sock: socket.socket) -> int:
    """A session: cells (and forks) for as long as the supervisor keeps the request socket open.

    ``{"type": "cell"}`` comes with its stdout/stderr pipes; ``{"type": "fork"}``
    with a new events pipe and request socket: this process forks twice (so
    the copy's parent is PID 1, the supervisor, which sees its exit status),
    and the copy announces itself with ``FORKED_BYTE`` on its new request socket
    (whose credentials the kernel vouches for: ``sessions._copy_pid``) and
    serves those.
    """
    namespace = _fresh_main()
    hooks = CodeHooks()
    index = 0
    while True:
        try:
            message, fds = _receive_raw(request_sock)
        except (EOFError, ValueError):
            return 0
        kind = message.get("type")
        if kind == "cell" and len(fds) == 2:
            _install_output(fds)
            code, token = str(message.get("code", "")), str(message.get("token", ""))
            _one_cell(code, namespace, index, token, hooks, caps=wire.text_caps(message))
            index += 1
        elif kind == "fork" and len(fds) == 2:
            chosen = _generators_to_reseed()
            if _fork_session(*fds):
                _reseed_copy(chosen)
                try:  # the copy's files are its own: a copy of the directory, in a new one
                    _enter_workdir(str(message.get("workdir")), copy_from=_Workdir.path)
                except (OSError, ValueError, trees.TooLarge) as exc:
                    _send_event({"type": "fork_failed", "reason": str(exc)[:300]})
                    os._exit(70)
                request_sock.send(FORKED_BYTE)  # its pid: the kernel's, not ours to say
        else:
            for fd in fds:
                os.close(fd)


class _SessionGenerators:
    """This session's ``generators.OfASession``, made at its first fork."""

    found: generators.OfASession | None = None


def _generators_to_reseed() -> list[Any]:
    """The generators a fork's copy reseeds, looked for here, before the fork; none if
    the session's code broke the look (its modules are its own: anything can be there)."""
    try:
        if _SessionGenerators.found is None:
            _SessionGenerators.found = generators.OfASession(Setup.generators, Setup.module_names)
        _SessionGenerators.found.update()
        return _SessionGenerators.found.chosen()
    except Exception:
        return list(Setup.generators)


def _reseed_copy(chosen: list[Any]) -> None:
    """New states for the libraries' random generators in a fork's copy (``generators``).

    A generator that cannot take one is the session's code's doing (it replaced or
    broke it): its branches then share that one, and the fork goes on."""
    for generator in chosen:
        try:
            generators.reseed([generator])
        except Exception:  # noqa: S112 - see above
            continue


class _Workdir:
    """The session's own working directory: what a fork copies, wherever a cell chdir'd."""

    path = ""


def _enter_workdir(path: str, copy_from: str | None) -> None:
    """Make ``path`` this session's working directory (a copy of ``copy_from``'s files)."""
    if not path.startswith(wire.WORKDIR + "/") or ".." in path.split("/"):
        raise ValueError(f"bad session directory {path!r}")
    os.mkdir(path, 0o700)
    where = "."
    if copy_from is not None:
        trees.copy_tree(copy_from, path)  # links are copied, never followed
        where = _below(copy_from)
    os.chdir(path)
    _Workdir.path = path
    try:
        os.chdir(where)  # where the parent's cell left it, in the copy
    except OSError:
        pass


def _below(top: str) -> str:
    """The current directory relative to ``top`` if it is under it, else ``"."``."""
    try:
        here = os.getcwd()
    except OSError:  # gone, or past PATH_MAX
        return "."
    return os.path.relpath(here, top) if here.startswith(top + "/") else "."


def _fork_session(events_w: int, request_fd: int) -> bool:
    """Fork a copy of this session onto new descriptors; True in the copy."""
    try:
        middle = os.fork()
    except OSError:
        middle = -1  # the new events pipe just closes: the supervisor reports the failure
    if middle == 0:
        try:
            copy = os.fork()
        except OSError:
            os._exit(1)
        if copy != 0:
            os._exit(0)  # the copy is orphaned at once: PID 1 adopts it
        _close_copies_of_channels(keep=(events_w, request_fd))
        os.dup2(events_w, EVENTS_FD)
        os.dup2(request_fd, REQUEST_FD)
        os.close(events_w)
        os.close(request_fd)
        return True
    os.close(events_w)
    os.close(request_fd)
    if middle > 0:
        try:
            os.waitpid(middle, 0)
        except ChildProcessError:
            pass
    return False


def _close_copies_of_channels(keep: tuple[int, ...]) -> None:
    """In a fork's copy: close every descriptor that is the parent's events pipe or request
    socket under another number (``os.dup(3)`` in an earlier cell), but ``keep``.

    Why: the copy inherited them, and with them read its parent's next cells and
    answered them: a cell came back ``success`` with the copy's output and value, its
    own code never run (thirty-seventh round). Within a family the code can still pass
    such a descriptor on by other ways (docs/security.md, "Sessions")."""
    channels = set()
    for fd in (EVENTS_FD, REQUEST_FD):
        try:
            info = os.fstat(fd)
        except OSError:
            continue
        channels.add((info.st_dev, info.st_ino))
    try:
        numbers = [int(name) for name in os.listdir("/proc/self/fd")]
    except (OSError, ValueError):
        return
    for fd in numbers:
        if fd in keep or fd in (EVENTS_FD, REQUEST_FD):
            continue
        try:
            info = os.fstat(fd)
        except OSError:
            continue  # (the listing's own descriptor, closed by now)
        if (info.st_dev, info.st_ino) in channels:
            try:
                os.close(fd)
            except OSError:  # (closed meanwhile by a thread an at-fork hook started)
                pass


def _install_output(fds: list[int]) -> None:
    for target, fd in zip((1, 2), fds):  # noqa: B905 - no strict= on 3.9
        if fd != target:  # received descriptors take the lowest free numbers: maybe 1 and 2
            os.dup2(fd, target)
            os.close(fd)


class Interrupts:
    """SIGINT (a cell past its timeout: KeyboardInterrupt) reaches a cell's code only.

    Why: the supervisor interrupts a cell at its deadline, and a cell that ended
    just then (its end still in the pipe), or had not started yet, took the
    signal in this loop's own code, outside any cell: the interpreter died and
    the session was lost (10 to 40% of cells ending near their deadline, most
    under gVisor), a notebook with a tiny cell timeout ended as "the process
    ended before the code started" (the sixth red-team round). Between cells
    SIGINT is ignored (a signal that came but was not yet handled is dropped too:
    Python runs the handler set when it checks, none); a cell gets the handler
    its session has, the default ``KeyboardInterrupt`` or one an earlier cell set.
    """

    handler: Any = _signal.default_int_handler

    @classmethod
    def between_cells(cls) -> None:
        # What the cell left is kept for the next cell (SIG_IGN too, if it chose that).
        cls.handler = _signal.signal(SIGINT_NUMBER, _signal.SIG_IGN)

    @classmethod
    def settle(cls) -> None:
        """SIGINT ignored before a cell's end is sent, whatever cut ``between_cells``
        short: a pending signal is handled as ``signal.signal`` starts (or as that
        method does), before SIGINT is replaced, so the cell's interrupt at its very end
        left SIGINT armed, and the next cell's, landing in this loop's own code before
        that cell began, ended the session (status 70; the thirty-sixth session). A cell
        gets one interrupt: by now that one was taken."""
        handler = _signal.signal(SIGINT_NUMBER, _signal.SIG_IGN)
        if handler is not _signal.SIG_IGN:  # (the cell's, not kept by ``between_cells``)
            cls.handler = handler

    @classmethod
    def in_cell(cls) -> None:
        _signal.signal(SIGINT_NUMBER, cls.handler)


def _one_cell(
    source: str,
    namespace: dict[str, Any],
    index: int,
    token: str,
    hooks: CodeHooks,
    *,
    caps: tuple[int, int],
    print_error: bool = True,
    after: tuple[int, int] | None = None,
) -> None:
    """Run one cell on the output pipes now on 1 and 2, then point 1 and 2 at ``after``
    (a notebook's own stdout and stderr), or at /dev/null (a session's cells).

    As in IPython, ``SystemExit`` is the cell's error and the interpreter lives
    on; only the process ending (``os._exit``, a signal) ends it. A session's cell
    also prints its exception to stderr (its result's stderr ends with the traceback,
    as a call's does); a notebook's cell does not: there, as in Jupyter, the
    traceback is the cell's error, not its stderr. ``hooks``: the trace and profile
    functions the session's cells left, on while a cell's code runs (``CodeHooks``).
    """
    _std_streams()
    display, error = [], []
    try:
        Interrupts.in_cell()
        try:
            value = _run_cell(source, namespace, index, hooks)
            if value is not None:
                display.append({"text/plain": _safe_repr(value, caps[0])})
        finally:
            Interrupts.between_cells()
    except BaseException as exc:
        error.append(_error_record(exc, caps[1]))
        if print_error:
            _print_exception(exc, hooks)
    try:
        Interrupts.settle()
    except BaseException:  # the cell's interrupt, taken as ``settle`` began: now it is
        Interrupts.settle()
    _flush_quietly()  # (python3 fidelity is the call's end's: a cell's end is IPython's)
    # This cell's pipes end here; stray writers (threads, children) hit ``after`` or
    # /dev/null, never a descriptor number reused by something else.
    try:
        if after is None:
            raise OSError("no streams of its own: a session's cell")
        os.dup2(after[0], 1)
        os.dup2(after[1], 2)
    except OSError:  # (a cell closed them: its writes between cells go nowhere)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)
    # The token is this cell's (random, sent with it): an end a cell forges for a later
    # cell cannot carry that cell's token, which does not exist yet.
    _send_event(
        {"type": "cell_end", "index": index, "token": token, "display": display, "error": error}
    )


def _run_cell(source: str, namespace: dict[str, Any], index: int, hooks: CodeHooks) -> Any:
    ast = stdlib_ast()  # never an ast.py of the session's working directory

    tree = ast.parse(source, f"<cell {index + 1}>", "exec")
    last = tree.body[-1] if tree.body else None
    if isinstance(last, ast.Expr):
        body = ast.Module(body=tree.body[:-1], type_ignores=[])
        hooks.call(exec, compile(body, f"<cell {index + 1}>", "exec", dont_inherit=True), namespace)
        expression = ast.Expression(body=last.value)
        compiled = compile(expression, f"<cell {index + 1}>", "eval", dont_inherit=True)
        return hooks.call(eval, compiled, namespace)
    hooks.call(exec, compile(tree, f"<cell {index + 1}>", "exec", dont_inherit=True), namespace)
    return None


def _safe_repr(value: Any, cap: int) -> str:
    try:
        return wire.cut_tail(_plain(repr(value)), cap)
    except BaseException as exc:
        return f"<repr failed: {_class_name(type(exc))}>"


def _plain(text: str) -> str:
    """``text`` as an exact ``str``: ``repr`` and ``str`` may return a subclass, whose
    ``__len__`` and ``__getitem__`` are the code's (one that says 0 kept a cell's end
    from being cut to fit: the review of the twenty-eighth round)."""
    return text if type(text) is str else str.__str__(text)


def _error_record(exc: BaseException, cap: int) -> dict[str, Any]:
    """A cell's error as Jupyter's ``error`` output has it. Never raises: what it reads of
    the code's exception through Python (its formatting, its text) is guarded, the rest
    is read from C slots (``_code_traceback``, ``_class_name``)."""
    tb = _code_traceback(exc)
    try:
        lines = [_plain(line) for line in traceback.format_exception(type(exc), exc, tb)]
    except BaseException:
        lines = []
    try:
        evalue = wire.cut_tail(_plain(str(exc)), cap)
    except BaseException:
        evalue = ""
    name = _class_name(type(exc))[:200]
    return {"ename": name, "evalue": evalue, "traceback": wire.traceback_tail(lines, cap)}


_TRACEBACK_SLOT = BaseException.__dict__["__traceback__"]
_TYPE_NAME = type.__dict__["__name__"]


def _code_traceback(exc: BaseException) -> types.TracebackType | None:
    """``exc``'s traceback from the code's first frame (a file name like "<sandbox>" or
    "<cell 2>"), read as python3 reads it.

    Why the C slot and ``str.startswith``: a ``__traceback__`` property of the code's
    exception class, or a code object whose file name is a ``str`` subclass with its
    own ``startswith``, ran the code's Python in the agent, outside any guard: an
    exception raised there ended a session's interpreter (status 70, the session
    lost; thirty-third red-team round), where python3 prints the traceback."""
    tb: types.TracebackType | None = _TRACEBACK_SLOT.__get__(exc)
    while tb is not None and not str.startswith(tb.tb_frame.f_code.co_filename, "<"):
        tb = tb.tb_next
    return tb


def _class_name(cls: type) -> str:
    """``cls.__name__`` from the type's own slot: never a metaclass's ``__name__``
    property, which python3's traceback does not ask either (``_code_traceback``)."""
    return _plain(_TYPE_NAME.__get__(cls))


LONG_RANGE = (-(1 << 63), 1 << 63)
"""A C ``long`` on the agent's 64-bit machines: an exit code outside it gives 255."""


def exit_status(exc: SystemExit) -> int:
    """The status python3 exits with on ``exc`` (CPython's ``_Py_HandleSystemExit``).

    Why exactly: ``code & 0xFF`` made ``sys.exit(2**63)`` a success (python3: 255) and
    asked an int subclass's own ``__and__``, which could answer 0 (python3 takes the
    int's value); the local backend, a real python3, gave ``error`` for both (twentieth
    red-team round). A ``code`` that cannot be read is printed as the exception, like
    any other object that is not an int, and gives 1."""
    code: object
    try:
        code = exc.code
    except BaseException:
        code = exc
    if code is None:
        return 0
    if isinstance(code, int):
        value = int.__index__(code)  # the int's own value: no method of a subclass is asked
        low, high = LONG_RANGE
        return value & 0xFF if low <= value < high else 255
    _print_exit_message(code)
    return 1


def _print_exit_message(code: object) -> None:
    """What ``_Py_HandleSystemExit`` prints for a ``code`` that is not an int: ``str(code)``
    to ``sys.stderr``'s ``write`` or, with no ``sys.stderr``, to descriptor 2, and then a
    newline (``PySys_WriteStderr``), whatever the first did.

    Why not ``print``: ``print(file=None)`` writes to ``sys.stdout``, and a call that set
    ``sys.stderr = None`` before ``sys.exit("ANSWER")`` had its message read as its
    answer; a ``print`` the code replaced got the message (twenty-ninth red-team round)."""
    try:
        stderr = vars(sys).get("stderr")
        if stderr is None:
            _write_descriptor(2, str(code))
        else:
            write = stderr.write
            write(str(code))
    except BaseException:
        pass
    _write_stderr("\n")
