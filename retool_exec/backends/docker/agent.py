"""The in-container agent: PID 1 of every sandbox container. Standard library only.

It runs INSIDE the container (``/opt/retool_exec/agent.py``), so it must not
import anything from retool_exec: the image copies this one file.

Protocol: length-prefixed JSON frames (4-byte big-endian length, then UTF-8
JSON) read from fd 0 and written to fd 1, which Docker connects to the host
over the container's attach stream. No ``docker exec``, no mounts, no sockets.

    agent -> host  {"type": "ready", "python": ..., "preloaded": [...], "failed": {...}}
                   or {"type": "fatal", "reason": str} (and exit) if it cannot start safely
    host  -> agent {"type": "run", "id": n, "nonce": hex, "code": str, "timeout": s,
                    "cpu_seconds": n, "read_cap": bytes, "reset": bool}
    agent -> host  {"type": "result", "id": n, "nonce": hex, "returncode": n|null, "timed_out": b,
                    "oom": b, "stdout": str, "stdout_dropped": n, "stderr": ..., "duration": s}
    agent -> host  {"type": "reset", "id": n, "nonce": hex, "clean": b, "reason": str} (if asked)
    host  -> agent {"type": "ping"}  ->  {"type": "pong"}

Why it is built this way:
- It is a zygote: modules are imported once, and each call runs in a
  ``fork()`` of that interpreter, skipping Python start-up and imports.
- It and the calls run as different users. The container starts as root with
  only CAP_KILL, CAP_SETUID, CAP_SETGID and CAP_SETPCAP; before reading
  anything the agent becomes its own uid (``--agent-user``) keeping just those,
  and each child drops to the sandbox uid (``--sandbox-user``) with every
  capability gone, bounding set included. So a call can neither signal, trace
  nor open the agent's ``/proc`` entries (the attach stream is ``/proc/1/fd/1``),
  under gVisor too, where PID 1 and PR_SET_DUMPABLE give no such shield. The
  agent is also non-dumpable and ignores every catchable signal.
- Each child installs a seccomp filter on top of Docker's: io_uring (allowed by
  Docker 20.10's default profile), POSIX message queues (which gVisor gives no
  way to list, so a reset could not verify them gone) and every non-native
  syscall ABI (i386, x32) fail with ENOSYS.
- The child gets a new session, ``/dev/null`` on stdin, fresh pipes on
  stdout/stderr and no other descriptor, rlimits, ``oom_score_adj`` 1000 (so the
  kernel's OOM killer picks it, not the agent) and freshly seeded generators.
- Output is drained while produced and only a tail is kept, so a flood cannot
  fill memory or block. At the wall-clock limit, and after every call,
  ``kill(-1, SIGKILL)`` ends every other process in the container, including
  ones that left the session; then all zombies are reaped.
- After a call, when asked, it empties ``/tmp``, ``/dev/shm``, POSIX message
  queues and SysV IPC objects (acting as the sandbox uid, which owns them) and
  then *verifies* the container is clean; the host retires the container on
  any doubt.
"""

from __future__ import annotations

import atexit
import ctypes
import io
import json
import os
import random
import resource
import select
import signal
import struct
import sys
import threading
import time
import traceback  # noqa: F401 - preloaded so a child's traceback costs no import
import types
from typing import Any

MAX_FRAME = 64 * 1024 * 1024
STATUS_FD = 3
REQUEST_FD = 4
CHUNK = 1 << 16
SCRATCH_DIRS = ("/tmp", "/dev/shm")
MQUEUE_DIR = "/dev/mqueue"
OOM_COUNTERS = (
    "/sys/fs/cgroup/memory.events",  # cgroup v2
    "/sys/fs/cgroup/memory/memory.oom_control",  # cgroup v1
)
PR_SET_DUMPABLE = 4
IPC_RMID = 0
# Every signal the agent can ignore, it ignores: under runc, PID 1 of a pid
# namespace is already shielded from its own processes' fatal signals, but
# gVisor gives no such shield, and a call must not be able to end the agent.
# (The kernel still delivers real faults of the agent itself.)
UNIGNORABLE = {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD}
IGNORED_SIGNALS = tuple(sorted(set(signal.valid_signals()) - UNIGNORABLE))
# What a fresh Python process has, restored in the child before user code runs.
PYTHON_IGNORES = (signal.SIGPIPE, signal.SIGXFSZ)
_CONTINUATION = bytes(range(0x80, 0xC0))

_libc = ctypes.CDLL(None, use_errno=True)


# -- framing -------------------------------------------------------------------


def read_exact(fd: int, size: int) -> bytes:
    chunks = []
    while size:
        data = os.read(fd, min(size, CHUNK))
        if not data:
            raise EOFError("host closed the stream")
        chunks.append(data)
        size -= len(data)
    return b"".join(chunks)


def read_frame(fd: int) -> dict[str, Any]:
    (length,) = struct.unpack(">I", read_exact(fd, 4))
    if length > MAX_FRAME:
        raise ValueError(f"frame of {length} bytes exceeds {MAX_FRAME}")
    message = json.loads(read_exact(fd, length).decode("utf-8"))
    if not isinstance(message, dict):
        raise ValueError("frame is not a JSON object")
    return message


def write_frame(fd: int, message: dict[str, Any]) -> None:
    payload = json.dumps(message, ensure_ascii=True, separators=(",", ":")).encode("ascii")
    data = struct.pack(">I", len(payload)) + payload
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


# -- output capture --------------------------------------------------------------


class Tail:
    """Last ``cap`` bytes of a stream plus the characters that fell off the front."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.buf = bytearray()
        self.dropped = 0

    def feed(self, data: bytes) -> None:
        self.buf += data
        excess = len(self.buf) - self.cap
        if excess > 0:
            self.dropped += len(bytes(self.buf[:excess]).translate(None, _CONTINUATION))
            del self.buf[:excess]

    def text(self) -> str:
        return bytes(self.buf).decode("utf-8", errors="replace")


# -- the agent's own protection --------------------------------------------------


def harden_self() -> None:
    if _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")
    for signum in IGNORED_SIGNALS:
        try:
            signal.signal(signum, signal.SIG_IGN)
        except (OSError, ValueError):
            pass  # a runtime may refuse some (e.g. real-time signals it uses itself)


# -- identities: the agent's uid, the calls' uid ------------------------------------

PR_SET_KEEPCAPS = 8
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2
CAP_KILL, CAP_SETGID, CAP_SETUID, CAP_SETPCAP = 5, 6, 7, 8
AGENT_CAPABILITIES = (CAP_KILL, CAP_SETGID, CAP_SETUID, CAP_SETPCAP)
"""Kill a call's processes; make children the sandbox user; empty their bounding set."""
_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


class Identity:
    """A uid and gid the agent switches between."""

    def __init__(self, spec: str) -> None:
        uid, _, gid = spec.partition(":")
        self.uid, self.gid = int(uid), int(gid or uid)
        if min(self.uid, self.gid) <= 0:
            raise ValueError(f"identity {spec!r} must be a non-root uid:gid")


def _prctl(option: int, arg: int = 0) -> None:
    if _libc.prctl(option, arg, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl({option}, {arg}): {os.strerror(errno)}")


def capability_mask(capabilities: tuple[int, ...]) -> int:
    return sum(1 << capability for capability in capabilities)


def set_capabilities(capabilities: tuple[int, ...]) -> None:
    """Make ``capabilities`` this process's permitted and effective set, exactly."""
    data = (_CapData * 2)()
    data[0].effective = data[0].permitted = capability_mask(capabilities)
    if _libc.capset(ctypes.byref(_CapHeader(_CAPABILITY_VERSION_3, 0)), data) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"capset: {os.strerror(errno)}")


def capability_sets() -> dict[str, int]:
    """CapPrm/CapEff/CapBnd/... of this process, as read back from /proc."""
    sets = {}
    with open("/proc/self/status") as handle:
        for line in handle:
            key, _, value = line.partition(":")
            if key.startswith("Cap"):
                sets[key] = int(value.strip(), 16)
    return sets


def become_agent(agent: Identity) -> None:
    """From root, become the agent's own uid, keeping only AGENT_CAPABILITIES."""
    if os.getuid() != 0:
        raise PermissionError(
            f"the agent must start as root to set the calls apart (it runs as uid {os.getuid()})"
        )
    _prctl(PR_SET_KEEPCAPS, 1)
    os.setgroups([])
    os.setresgid(agent.gid, agent.gid, agent.gid)
    os.setresuid(agent.uid, agent.uid, agent.uid)
    _prctl(PR_SET_KEEPCAPS, 0)
    set_capabilities(AGENT_CAPABILITIES)
    sets, wanted = capability_sets(), capability_mask(AGENT_CAPABILITIES)
    if os.getresuid() != (agent.uid,) * 3 or sets.get("CapEff") != wanted:
        raise PermissionError(f"could not become the agent user: {os.getresuid()} {sets}")


def last_capability() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as handle:
            return int(handle.read())
    except (OSError, ValueError):
        return 63  # PR_CAPBSET_DROP of an unknown one is EINVAL, which is ignored


def become_sandbox(sandbox: Identity, last_cap: int) -> None:
    """In a child: become the sandbox uid with no capability at all, or fail."""
    for capability in range(last_cap + 1):
        if _libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0 and ctypes.get_errno() != 22:
            raise OSError(ctypes.get_errno(), f"PR_CAPBSET_DROP {capability}")  # EINVAL: unknown
    os.setgroups([])
    os.setresgid(sandbox.gid, sandbox.gid, sandbox.gid)
    os.setresuid(sandbox.uid, sandbox.uid, sandbox.uid)
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)  # EINVAL where unsupported
    set_capabilities(())
    sets = capability_sets()
    if os.getresuid() != (sandbox.uid,) * 3 or any(sets.get(k, 0) for k in ("CapPrm", "CapEff")):
        raise PermissionError(f"could not become the sandbox user: {os.getresuid()} {sets}")


class acting_as:
    """Context manager: the agent's effective ids are ``who``'s for the block.

    Used for the reset: what a call leaves (files, queues, SysV objects) is
    owned by the sandbox uid, which can remove all of it; the agent keeps its
    real and saved ids, so no process of that uid can signal or trace it.
    """

    def __init__(self, who: Identity, back: Identity) -> None:
        self.who, self.back = who, back

    def __enter__(self) -> None:
        os.setresgid(-1, self.who.gid, -1)
        os.setresuid(-1, self.who.uid, -1)

    def __exit__(self, *exc_info: object) -> None:
        os.setresuid(-1, self.back.uid, -1)
        os.setresgid(-1, self.back.gid, -1)


# -- the calls' syscall filter ------------------------------------------------------

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
DENIED_SYSCALLS = {
    # io_uring_setup, io_uring_enter, io_uring_register (one number on every arch)
    "x86_64": (425, 426, 427, 240),  # ... and mq_open
    "aarch64": (425, 426, 427, 180),
}
X32_SYSCALL_BIT = 0x40000000
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
ENOSYS = 38
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_JSET_K, _BPF_RET_K = 0x20, 0x15, 0x45, 0x06


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def syscall_filter(machine: str) -> bytes:
    """The classic-BPF seccomp program for ``machine`` (see DENIED_SYSCALLS)."""
    arch, denied = AUDIT_ARCH[machine], DENIED_SYSCALLS[machine]
    # (code, jump-if-true, jump-if-false, k); "DENY" is resolved to the last instruction.
    program: list[tuple[int, int | str, int | str, int]] = [
        (_BPF_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        (_BPF_JEQ_K, 0, "DENY", arch),
        (_BPF_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
        (_BPF_JSET_K, "DENY", 0, X32_SYSCALL_BIT),
        *((_BPF_JEQ_K, "DENY", 0, number) for number in denied),
        (_BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
        (_BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | ENOSYS),
    ]
    deny = len(program) - 1
    encoded = []
    for index, (code_, true, false, k) in enumerate(program):
        jt = deny - index - 1 if true == "DENY" else int(true)
        jf = deny - index - 1 if false == "DENY" else int(false)
        encoded.append(struct.pack("=HBBI", code_, jt, jf, k))
    return b"".join(encoded)


def install_syscall_filter(program_bytes: bytes) -> None:
    program = ctypes.create_string_buffer(program_bytes, len(program_bytes))
    fprog = _SockFprog(len(program_bytes) // 8, ctypes.addressof(program))
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"installing the seccomp filter: {os.strerror(errno)}")


DEFAULT_AGENT_USER = "65533:65533"
DEFAULT_SANDBOX_USER = "65534:65534"


class Setup:
    """Who the agent is, who its calls are, and their filter: decided once by ``start``."""

    agent = Identity(DEFAULT_AGENT_USER)
    sandbox = Identity(DEFAULT_SANDBOX_USER)
    last_cap = 63
    syscall_program = b""


def make_call_safe() -> None:
    """In a forked child, before anything of the call: its uid, no capability, the filter."""
    become_sandbox(Setup.sandbox, Setup.last_cap)
    install_syscall_filter(Setup.syscall_program)


# Run once in the zygote after import, so lazily imported submodules and caches
# are warm in every forked child (sympy's first solve() imports half of sympy).
WARMUPS = {
    "sympy": "x = sympy.Symbol('x'); sympy.solve(x**2 - 2, x); sympy.simplify(sympy.sin(x)**2 + "
    "sympy.cos(x)**2); sympy.integrate(x**2, x); sympy.Rational(1, 3) + 1",
    "numpy": "numpy.linalg.solve(numpy.eye(2), numpy.ones(2)); numpy.random.default_rng(0)",
}


def preload(modules: list[str]) -> tuple[list[str], dict[str, str]]:
    loaded, failed = [], {}
    for module in modules:
        try:
            __import__(module)
            warmup = WARMUPS.get(module)
            if warmup:
                exec(warmup, {module: sys.modules[module]})
            loaded.append(module)
        except Exception as exc:  # a missing optional module must not stop the agent
            failed[module] = f"{type(exc).__name__}: {exc}"
    import gc

    gc.collect()
    gc.freeze()  # keep the collector from touching (and so copying) the zygote's pages
    return loaded, failed


def oom_kills() -> int | None:
    for path in OOM_COUNTERS:
        try:
            with open(path) as handle:
                for line in handle:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


# -- the child ---------------------------------------------------------------------


class Spare:
    """A child forked ahead of time from the zygote, waiting for its one request.

    Forking an interpreter that holds numpy and sympy costs milliseconds (its
    page tables are copied); doing it between calls takes that off the path
    of the next call.
    """

    def __init__(self) -> None:
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        self.status_r, status_w = os.pipe()
        request_r, self.request_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            for fd in (self.out_r, self.err_r, self.status_r, self.request_w):
                os.close(fd)
            child_main(request_r, out_w, err_w, status_w)
        for fd in (out_w, err_w, status_w, request_r):
            os.close(fd)

    def send(self, request: dict[str, Any]) -> bool:
        """Hand the request over; False if the spare is gone."""
        try:
            write_frame(self.request_w, request)
            return True
        except OSError:
            return False
        finally:
            os.close(self.request_w)

    def discard(self) -> None:
        for fd in (self.out_r, self.err_r, self.status_r):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass


def child_main(request_r: int, out_w: int, err_w: int, status_w: int) -> None:
    """Runs in the forked child; never returns.

    Descriptors: 0 ``/dev/null``, 1 and 2 the output pipes, 3 the status pipe
    (the exit status is written there before the process tears down, so the
    agent need not wait for a large address space to be unmapped), 4 the
    request pipe until the request is read. Nothing else: the attach stream
    and the agent's own pipes are closed before any user code exists.
    """
    status = 70
    try:
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
        os.dup2(status_w, STATUS_FD)
        os.dup2(request_r, REQUEST_FD)
        os.closerange(REQUEST_FD + 1, max(os.sysconf("SC_OPEN_MAX"), 1024))
        signal.set_wakeup_fd(-1)
        for signum in (*IGNORED_SIGNALS, signal.SIGCHLD):
            try:
                signal.signal(signum, signal.SIG_DFL)
            except (OSError, ValueError):
                pass
        for signum in PYTHON_IGNORES:
            signal.signal(signum, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        # Its own /proc entries (owned by root while non-dumpable, as after the
        # uid change), so oom_score_adj below is writable.
        _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        try:
            with open("/proc/self/oom_score_adj", "w") as handle:
                handle.write("1000")
        except OSError:
            pass
        os.chdir("/tmp")
        try:
            request = read_frame(REQUEST_FD)
        except (EOFError, ValueError):
            status = 0
            return  # discarded unused
        os.close(REQUEST_FD)
        cpu = int(request.get("cpu_seconds", 35))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        memory_mb = request.get("memory_mb")
        if memory_mb:
            data = int(memory_mb) * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_DATA, (data, data))
        status = run_user_code(request["code"])
        os.close(1)
        os.close(2)
        os.write(STATUS_FD, b"%d\n" % status)
    finally:
        os._exit(status)


def run_user_code(source: str) -> int:
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(  # type: ignore[misc]
        io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8"
    )
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(  # type: ignore[misc]
        io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8"
    )
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(  # type: ignore[misc]
        io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
    )
    sys.argv = ["-c"]
    reseed()
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    status = 0
    try:
        code = compile(source, "<sandbox>", "exec")
        exec(code, main.__dict__)
    except SystemExit as exc:
        status = exit_status(exc)
    except BaseException as exc:
        tb = exc.__traceback__
        # Drop this function's frame, so tracebacks start at "<sandbox>".
        if tb is not None and tb.tb_frame.f_code is run_user_code.__code__:
            tb = tb.tb_next
        try:
            exc.__traceback__ = tb  # excepthook prints the exception's own traceback
            sys.excepthook(type(exc), exc, tb)
        except BaseException:
            pass
        status = 1
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            try:
                thread.join()
            except BaseException:
                pass
    try:
        atexit._run_exitfuncs()
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    return status


def exit_status(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except BaseException:
        pass
    return 1


def reseed() -> None:
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        try:
            numpy.random.seed()
        except Exception:
            pass


# -- one call ------------------------------------------------------------------------


def run_call(request: dict[str, Any], wake_r: int, spare: Spare | None) -> dict[str, Any]:
    timeout = float(request["timeout"])
    cap = int(request.get("read_cap", 16384))
    started = time.monotonic()
    oom_before = oom_kills()
    if spare is None or not spare.send(request):
        if spare is not None:
            spare.discard()
        spare = Spare()
        if not spare.send(request):
            spare.discard()
            raise OSError("the forked child died before it read its request")
    pid, out_r, err_r, status_r = spare.pid, spare.out_r, spare.err_r, spare.status_r

    tails = {out_r: Tail(cap), err_r: Tail(cap)}
    reported = bytearray()
    poller = select.poll()
    for fd in (out_r, err_r, status_r, wake_r):
        poller.register(fd, select.POLLIN)
    open_pipes = {out_r, err_r}
    deadline = started + timeout
    returncode = None
    timed_out = False
    while returncode is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        for fd, _event in poller.poll(max(1, int(remaining * 1000) + 1)):
            if fd == wake_r:
                drain(wake_r)
            elif fd == status_r:
                chunk = os.read(status_r, 64)
                reported += chunk
                if not chunk or reported.endswith(b"\n") or len(reported) > 32:
                    poller.unregister(status_r)  # (more than 32 bytes: forged; ignore)
                    returncode = parse_status(reported)
            elif fd in open_pipes:
                pump(fd, tails, open_pipes, poller)
        if returncode is None:
            reaped, raw = os.waitpid(pid, os.WNOHANG)
            if reaped:
                returncode = decode_status(raw)
    os.close(status_r)

    # The call is over: end every process it left (killing the main child too
    # if it is still around); with every writer gone the pipes reach EOF.
    kill_everything(reap=False)
    settle_deadline = time.monotonic() + 1.0
    while open_pipes and time.monotonic() < settle_deadline:
        for fd, _event in poller.poll(100):
            if fd == wake_r:
                drain(wake_r)
            elif fd in open_pipes:
                pump(fd, tails, open_pipes, poller)
    for fd in list(open_pipes):
        poller.unregister(fd)
        os.close(fd)
    poller.unregister(wake_r)

    if timed_out:
        returncode = None
    oom_after = oom_kills()
    if oom_before is not None and oom_after is not None:
        oom = oom_after > oom_before and returncode != 0
    else:
        oom = returncode == -signal.SIGKILL
    return {
        "type": "result",
        "id": request.get("id"),
        "returncode": returncode,
        "timed_out": timed_out,
        "oom": bool(oom) and not timed_out,
        "stdout": tails[out_r].text(),
        "stdout_dropped": tails[out_r].dropped,
        "stderr": tails[err_r].text(),
        "stderr_dropped": tails[err_r].dropped,
        "duration": time.monotonic() - started,
    }


def parse_status(reported: bytes | bytearray) -> int | None:
    """The status the child wrote before exiting; None if it died before writing one."""
    try:
        return int(reported) if reported.endswith(b"\n") else None
    except ValueError:
        return None


def pump(fd: int, tails: dict[int, Tail], open_pipes: set[int], poller: select.poll) -> None:
    try:
        data = os.read(fd, CHUNK)
    except OSError:
        data = b""
    if data:
        tails[fd].feed(data)
        return
    poller.unregister(fd)
    open_pipes.discard(fd)
    os.close(fd)


def drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def decode_status(status: int) -> int:
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def kill_everything(reap: bool = True) -> None:
    """SIGKILL every process in the container but this one (PID 1 is exempt).

    With ``reap``, also wait until they are gone; without, only signal them
    (the hot path after a call: the reset between calls does the waiting).
    """
    for _ in range(500):
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:  # ESRCH: nobody else is left
            return
        if not reap:
            return
        reap_all()
        if not other_processes():
            return
        time.sleep(0.002)


def reap_all() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def other_processes() -> list[int]:
    me = os.getpid()
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    state = handle.read().rpartition(")")[2].split()[0]
            except OSError:
                continue
            if state not in ("Z", "X"):
                pids.append(int(entry))
    return pids


# -- reset between calls -------------------------------------------------------------


def reset_container() -> tuple[bool, str]:
    """Empty every place a call can leave state, then verify it is empty."""
    kill_everything()
    reap_all()
    problems = []
    with acting_as(Setup.sandbox, Setup.agent):  # the owner of everything a call leaves behind
        for directory in SCRATCH_DIRS:
            empty_directory(directory)
        empty_directory(MQUEUE_DIR)
        if os.path.isdir(SYSVIPC_DIR):
            remove_sysv_ipc()
        else:
            problems.extend(sweep_sysv_ipc_by_id())
    leftover = other_processes()
    if leftover:
        problems.append(f"processes left: {leftover[:5]}")
    for directory in (*SCRATCH_DIRS, MQUEUE_DIR):
        try:
            if os.listdir(directory):
                problems.append(f"{directory} not empty")
        except FileNotFoundError:
            pass
        except OSError as exc:
            problems.append(f"{directory} unreadable: {exc}")
    for kind, ids in sysv_ipc_ids().items():
        if ids:
            problems.append(f"SysV {kind} left: {ids[:5]}")
    return not problems, "; ".join(problems)


def empty_directory(path: str) -> None:
    try:
        entries = list(os.scandir(path))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                try:
                    os.chmod(entry.path, 0o700)
                except OSError:
                    pass
                empty_directory(entry.path)
                os.rmdir(entry.path)
            else:
                os.unlink(entry.path)
        except OSError:
            pass  # verification reports what could not be removed


SYSVIPC_DIR = "/proc/sysvipc"
IPC_STAT = 2
IPC_CREAT_PRIVATE = 0o1600  # IPC_CREAT | 0600, with key IPC_PRIVATE (0)
MAX_SWEEP = 65536
# Highest SysV id of each kind already swept (see sweep_sysv_ipc_by_id).
_swept_up_to = {"shm": 0, "msg": 0, "sem": 0}


def _ipc_create(kind: str) -> int:
    if kind == "shm":
        return int(_libc.shmget(0, 1, IPC_CREAT_PRIVATE))
    if kind == "msg":
        return int(_libc.msgget(0, IPC_CREAT_PRIVATE))
    return int(_libc.semget(0, 1, IPC_CREAT_PRIVATE))


def _ipc_remove(kind: str, ipc_id: int) -> None:
    if kind == "shm":
        _libc.shmctl(ipc_id, IPC_RMID, None)
    elif kind == "msg":
        _libc.msgctl(ipc_id, IPC_RMID, None)
    else:
        _libc.semctl(ipc_id, 0, IPC_RMID)


def _ipc_exists(kind: str, ipc_id: int) -> bool:
    buf = ctypes.create_string_buffer(512)
    if kind == "shm":
        return int(_libc.shmctl(ipc_id, IPC_STAT, buf)) == 0
    if kind == "msg":
        return int(_libc.msgctl(ipc_id, IPC_STAT, buf)) == 0
    return int(_libc.semctl(ipc_id, 0, IPC_STAT, buf)) >= 0


def sweep_sysv_ipc_by_id() -> list[str]:
    """Remove SysV objects where they cannot be listed (gVisor has no /proc/sysvipc).

    gVisor hands out ids of each kind in increasing order. Creating a probe
    object gives the newest id; every id between the last sweep and the probe
    (the probe included) is removed, then each is checked to be gone. Anything
    unexpected (a probe that fails, a range too large, an object that stays)
    is reported, and the host retires the container.
    """
    problems = []
    for kind, swept in _swept_up_to.items():
        newest = _ipc_create(kind)
        if newest < 0:
            problems.append(f"SysV {kind}: cannot probe ids")
            continue
        if newest <= swept or newest - swept > MAX_SWEEP:
            _ipc_remove(kind, newest)
            problems.append(f"SysV {kind}: ids not in sweepable order ({swept} -> {newest})")
            continue
        for ipc_id in range(swept + 1, newest + 1):
            _ipc_remove(kind, ipc_id)
        left = [i for i in range(swept + 1, newest + 1) if _ipc_exists(kind, i)]
        if left:
            problems.append(f"SysV {kind} left: {left[:5]}")
        _swept_up_to[kind] = newest
    return problems


def sysv_ipc_ids() -> dict[str, list[int]]:
    found = {}
    for kind in ("shm", "msg", "sem"):
        ids = []
        try:
            with open(f"/proc/sysvipc/{kind}") as handle:
                next(handle, None)
                for line in handle:
                    fields = line.split()
                    if len(fields) > 1:
                        ids.append(int(fields[1]))
        except OSError:
            pass
        found[kind] = ids
    return found


def remove_sysv_ipc() -> None:
    for kind, ids in sysv_ipc_ids().items():
        for ipc_id in ids:
            _ipc_remove(kind, ipc_id)


# -- main loop ------------------------------------------------------------------------


def parse_options(argv: list[str]) -> dict[str, str]:
    """``--name value`` pairs; anything else is an error (the host wrote them)."""
    options, rest = {}, argv[1:]
    while rest:
        if len(rest) < 2 or not rest[0].startswith("--"):
            raise ValueError(f"bad agent arguments: {rest!r}")
        options[rest[0][2:]] = rest[1]
        rest = rest[2:]
    return options


def check_child_setup() -> None:
    """Fork once, before anything is imported, to prove a child can drop and filter."""
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


def start(argv: list[str]) -> list[str]:
    """Everything that must hold before the agent reports ready; the modules to preload."""
    options = parse_options(argv)
    agent_user = Identity(options.pop("agent-user", DEFAULT_AGENT_USER))
    sandbox_user = Identity(options.pop("sandbox-user", DEFAULT_SANDBOX_USER))
    modules = [m for m in options.pop("preload", "").split(",") if m]
    if options:
        raise ValueError(f"unknown agent options: {sorted(options)}")
    if agent_user.uid == sandbox_user.uid:
        raise ValueError("the agent and the calls need different uids")
    machine = os.uname().machine
    if machine not in AUDIT_ARCH:
        raise OSError(f"no syscall filter for {machine}")
    Setup.agent, Setup.sandbox = agent_user, sandbox_user
    Setup.last_cap, Setup.syscall_program = last_capability(), syscall_filter(machine)
    become_agent(Setup.agent)
    harden_self()
    check_child_setup()
    return modules


def main(argv: list[str]) -> int:
    try:
        modules = start(argv)
    except Exception as exc:
        write_frame(1, {"type": "fatal", "reason": f"{type(exc).__name__}: {exc}"})
        return 70
    loaded, failed = preload(modules)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler makes the wakeup fd fire
    spare: Spare | None = Spare()
    write_frame(
        1,
        {
            "type": "ready",
            "python": sys.version.split()[0],
            "preloaded": loaded,
            "failed": failed,
            "pid": os.getpid(),
        },
    )
    while True:
        try:
            request = read_frame(0)
        except EOFError:
            return 0
        kind = request.get("type")
        if kind == "run":
            # The nonce authenticates our answers to the host. The child never
            # sees it (it is removed before the request reaches the child), so
            # a call that can write to the attach stream (gVisor does not stop
            # it opening /proc/1/fd/1) cannot forge this call's result or the
            # next one's: the host only picks the next nonce after this reset.
            nonce = request.pop("nonce", None)
            result = run_call(request, wake_r, spare)
            spare = None
            write_frame(1, {**result, "nonce": nonce})
            if request.get("reset"):
                clean, reason = reset_container()
                if clean:
                    spare = Spare()
                write_frame(
                    1,
                    {
                        "type": "reset",
                        "id": request.get("id"),
                        "nonce": nonce,
                        "clean": clean,
                        "reason": reason,
                    },
                )
        elif kind == "ping":
            write_frame(1, {"type": "pong"})
        else:
            write_frame(1, {"type": "error", "reason": f"unknown frame type {kind!r}"})


if __name__ == "__main__":
    sys.exit(main(sys.argv))
