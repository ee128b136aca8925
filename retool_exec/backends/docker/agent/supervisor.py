"""The supervisor: PID 1 of every sandbox container, and the only process that holds call data.

It speaks ``wire`` frames with the host over the container's attach stream
(fd 0 in, fd 1 out; no ``docker exec``, no mounts, no sockets), and runs each
call in a copy of the zygote (``zygote.py``), which never sees call data, not even
how a call ended: the copy is the supervisor's child (``forking``), reaped here.

Why it is built this way:
- Four parties, three uids (``wire``): the supervisor (holds every call's
  code, stdin, files, output and the nonce), the zygote (forks calls, holds
  none of it), and the calls (a uid allocated per container by the host, so
  per-uid kernel limits are not shared with any other container). Neither
  agent process is dumpable, and both ignore every catchable signal: a call
  can neither signal, trace nor read them.
- A call's inputs never pass through the call's own output: files are
  written into the working directory *before* the child gets its request,
  fetched files are read *after* every process of the call is gone, and the
  result (with the per-call nonce the child never sees) is built here. No
  byte the code prints can change an outcome, a file or a metric.
- Output is drained while produced and only a tail is kept. At the deadline,
  and after every call, every process of the calls' uid is killed
  (``kill(-1)`` as that uid: it spares the zygote) and orphans are reaped.
- Calls run niced below the supervisor, whose memory is locked where the
  runtime allows, so it keeps answering on time under a call's CPU and
  memory pressure.
- After a call, when asked, ``reset`` empties every place a call can leave
  data and then proves the container is back to the baseline measured when
  it became ready; on any doubt the host retires the container.
"""

from __future__ import annotations

import array
import ctypes
import errno
import fcntl
import json
import os
import resource
import select
import signal
import socket
import stat
import sys
import time
from typing import Any

from . import identity, light_calls, reset, result_fit, wire, zygote
from .identity import Identity

CHUNK = 1 << 16
_CONTINUATION = bytes(range(0x80, 0xC0))
OOM_COUNTERS = (
    "/sys/fs/cgroup/memory.events",  # cgroup v2
    "/sys/fs/cgroup/memory/memory.oom_control",  # cgroup v1
)
SETTLE_SECONDS = 1.0
"""After a call ends, how long its output pipes may take to reach EOF."""
TIMEOUT_SETTLE_SECONDS = 0.1
"""After a timeout the killed processes write nothing more, and what they wrote is already
in the pipes: waiting for end-of-file is not worth a second past the limit (under gVisor
with busy neighbours a killed process took that long to go, +1.09 s in the benchmark)."""
BROKEN_EVENTS_GRACE = 0.5
"""Seconds a notebook call that wrote garbage on its events pipe may take to end by itself
(then its exit status is its own) before it is killed: none of its cells can end any more."""
INTERRUPT_GRACE = 1.0
"""Notebook mode: seconds a cell has to stop after KeyboardInterrupt before the process dies."""
MCL_CURRENT = 1


FULL, LIGHT = "full", "light"
"""The zygotes: ``full`` preloads the configured modules; ``light`` (optional) only a few
standard ones, for the plain calls that need nothing else (``light_calls``)."""


class ForkServer:
    """A zygote as the supervisor sees it: its pid and its control socket."""

    def __init__(self, pid: int, control: socket.socket) -> None:
        self.pid, self.control = pid, control


class State:
    """Facts fixed at start."""

    agent = Identity(wire.AGENT_USER)
    sandbox = Identity(wire.DEFAULT_SANDBOX_USER)
    zygotes: dict[str, ForkServer] = {}  # noqa: RUF012 - set once, at start
    preloaded: tuple[str, ...] = ()
    """What the full zygote preloads: code naming any of it never forks from the light one."""
    spare: Child | None = None
    next_kind = FULL
    """Which zygote the next spare comes from: the one the last call wanted."""
    baseline: dict[str, object] = {}  # noqa: RUF012 - set once, at start
    kept_inodes: list[str] = []  # noqa: RUF012 - set once, at start
    """What calls may write that no reset removes (``reset.kept_inodes``): its times are reset."""
    oom_counter: int | None = None
    """The cgroup's OOM-kill counter, opened once (``open_oom_counter``); None if there is none."""
    large_result = False
    """The last call's result was large (``SMALL``): the reset gives the freed memory back
    (``give_back_memory``) before it compares memory with the baseline."""
    child_ended = -1
    """The read end of the SIGCHLD wakeup pipe: a call's process ended (``watch_children``)."""
    child_ended_w = -1
    tasks_counted = False
    """The container's task count says when only the agent is left (``only_the_agent_counted``)."""


# -- framing on the attach stream ------------------------------------------------------


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
    (length,) = wire.FRAME_HEADER.unpack(read_exact(fd, wire.FRAME_HEADER.size))
    if length > wire.MAX_FRAME:
        raise wire.WireError(f"frame of {length} bytes exceeds {wire.MAX_FRAME}")
    return wire.decode_payload(read_exact(fd, length))


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_frame(fd: int, message: dict[str, Any]) -> None:
    write_all(fd, wire.encode_frame(message))


SIOCOUTQ = 0x5411
"""ioctl: bytes this end sent that the other end has not read (and freed) yet."""


class UnreadFrameError(OSError):
    """The call's process left an earlier frame of ours unread: nothing more is sent to it."""


def unread_bytes(sock: socket.socket) -> int:
    """Bytes we sent on ``sock`` that are still queued for the other end (0 where the
    runtime cannot say)."""
    queued = array.array("i", [0])
    try:
        fcntl.ioctl(sock.fileno(), SIOCOUTQ, queued, True)
    except OSError:
        return 0
    return queued[0]


def check_unread_bytes_counted() -> None:
    """Raise unless this runtime counts our unread bytes (``send_to_call``'s check):
    without it a call could keep descriptors in flight unseen (finding 38)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        ours.send(b"x")
        if unread_bytes(ours) <= 0:
            raise OSError("the runtime does not report unread bytes of a unix socket (SIOCOUTQ)")
    finally:
        ours.close()
        theirs.close()


def send_to_call(
    sock: socket.socket,
    frame: bytes,
    fds: list[int],
    deadline: float,
    *,
    check_taken: bool = True,
) -> None:
    """Send ``frame`` to a call's process, its header carrying ``fds``, by ``deadline``.

    Why a deadline: once a cell has run, the process reading this socket is the
    call's to stop (or to patch), and a frame larger than the socket's buffer would
    block the agent past every deadline. Raises TimeoutError when it is not taken
    in time (the frame may be half sent: the caller ends the process).

    ``check_taken``: raise UnreadFrameError, sending nothing, if an earlier frame
    is still queued. Why: the kernel charges descriptors in flight to the
    sender, and a cell that only peeks (``MSG_PEEK``, ``SO_PEEK_OFF``) at later
    cells gets working copies of their pipes while the originals stay queued;
    ~70 per call piled up against the supervisor's ``RLIMIT_NOFILE`` until
    every descriptor-passing send failed (finding 38). Each cell is sent only
    after the previous one ended, which a process that read it has; so at most
    one frame's descriptors are ever in flight.
    """
    if check_taken and (queued := unread_bytes(sock)):
        raise UnreadFrameError(
            f"its process left {queued} bytes of an earlier frame unread "
            "(its code reads the request socket itself)"
        )
    sock.settimeout(max(0.001, deadline - time.monotonic()))
    try:
        sock.sendmsg(
            [frame[: wire.FRAME_HEADER.size]],
            [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))],
        )
        sock.sendall(frame[wire.FRAME_HEADER.size :])  # (the timeout bounds the whole send)
    except socket.timeout as exc:  # noqa: UP041 - an OSError, no TimeoutError, before 3.10
        raise TimeoutError(f"not taken within its deadline: {exc}") from exc
    finally:
        sock.settimeout(None)


def write_result(fd: int, message: dict[str, Any]) -> None:
    """A call's result (or a session's reply): cut to fit one frame if it must be
    (``result_fit``), never left unsent."""
    try:
        frame = wire.encode_frame(message)
    except wire.FrameTooLargeError:
        frame = wire.encode_frame(result_fit.fit(message))
    write_all(fd, frame)


# -- output capture ----------------------------------------------------------------------


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


# -- children, through the zygote -----------------------------------------------------------


class Child:
    """A child forked by a zygote (``kind``) ahead of its call, waiting for its request."""

    def __init__(self, kind: str = FULL) -> None:
        server = State.zygotes[kind]
        events_r, events_w = os.pipe()
        request_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        started_r, started_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        theirs = [events_w, child_sock.fileno(), out_w, err_w, started_w]
        try:
            server.control.sendmsg(
                [b"F"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", theirs))]
            )
            pid = wait_for_fork(server)
        finally:
            os.close(events_w)
            child_sock.close()
            os.close(out_w)
            os.close(err_w)
            os.close(started_w)
        for fd in (events_r, out_r, err_r):
            # Our ends only (the child's writes block as a fresh process's do); set here,
            # with the spare, not on the call's path. A stale poll event must never block.
            os.set_blocking(fd, False)
        self.pid, self.kind = pid, kind
        self.events_r, self.out_r, self.err_r = events_r, out_r, err_r
        self.started_r = started_r
        self.request = request_sock
        self.status: int | None = None
        """The wait status, once the supervisor reaped it."""
        self.code_started = False
        self.gate_closed = False
        """The gate reached end-of-file: past it, ``code_started`` is final."""

    def check_started(self) -> bool:
        """Whether the child has said its code starts (``zygote._mark_started``); no wait.

        The byte stays in the pipe until read, and the code never holds an end of
        it, so reading late loses nothing and nothing the code does can fake it.
        """
        if self.code_started or self.gate_closed:
            return self.code_started
        try:
            data = os.read(self.started_r, 16)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        self.code_started = data.startswith(zygote.STARTED_BYTE)
        self.gate_closed = not self.code_started
        return self.code_started

    def close(self) -> None:
        for fd in (self.out_r, self.err_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self.close_channels()

    def close_channels(self) -> None:
        """The events pipe, the gate and the request socket: what is left once a call's
        output pipes are closed by whoever read them (never a number twice: it may be reused)."""
        for fd in (self.events_r, self.started_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self.request.close()


exits: dict[int, int] = {}
"""Wait statuses of the processes the supervisor reaped, by pid, not yet claimed."""
xcpu_seconds: dict[int, float] = {}
"""CPU seconds each process that SIGXCPU ended used itself (not its children), by pid,
not yet claimed: what says whether it reached its limit."""
CPU_LIMIT_SLACK = 0.1
"""Seconds below the CPU limit a SIGXCPU death may have used and still be the limit's
(the kernel checks at its tick; the limit is whole seconds, a forger is far below)."""


watched: set[int] = set()
"""The processes whose status someone will claim: each call's and session's process, from
when its pid is learnt (``watch``). Any other child (an orphan a call left) is reaped
and nothing of it kept, so a call that makes and ends processes by the thousand cannot
grow the supervisor."""
REAPS_PER_WAKE = 1024
"""Children reaped at most per look (``reap_children``); then the look is asked for again,
so that a call making orphans as fast as they are reaped cannot hold the supervisor."""


def watch_children() -> None:
    """SIGCHLD wakes the supervisor's polls (``State.child_ended``), so it reaps at once.

    Every call's process is the supervisor's child (``forking``), so the supervisor,
    not the zygote, learns how calls end.
    """
    ended_r, ended_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(ended_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    State.child_ended, State.child_ended_w = ended_r, ended_w


def watch(pid: int) -> None:
    """``pid`` is a new process of ours whose status will be claimed. Called before the
    supervisor reaps anything again, so it is not reaped yet: whatever is recorded for its
    pid is an earlier process's, and goes."""
    forget_exit(pid)
    watched.add(pid)


def reap_children() -> None:
    """Reap the children that ended, keeping the wait status (and for a SIGXCPU death the
    CPU it used itself) of each watched one for whoever claims its pid."""
    for _ in range(REAPS_PER_WAKE):
        try:
            ended = reap(-1)
        except ChildProcessError:
            return
        if ended is None:
            return
        if ended[0] in watched:
            watched.discard(ended[0])
            record_exit(*ended)
    try:
        os.write(State.child_ended_w, b"\0")  # more may have ended: look again soon
    except OSError:
        pass


REAL_ENDS = (os.CLD_EXITED, os.CLD_KILLED, os.CLD_DUMPED)
"""How a wait may report a process that ended. A tracer's wait reports its tracee's stops
too (``CLD_TRAPPED``) without being asked, and a stop's status read as an exit with the
stop signal's number (finding 54); the calls' filter refuses ``PTRACE_TRACEME``, which
made the supervisor a tracer, and the wait takes only these."""


def reap(pid: int) -> tuple[int, int, float] | None:
    """Reap child ``pid`` (-1: any) if it ended: its pid, wait status and, if SIGXCPU
    ended it, the CPU seconds it used itself; None if none ended yet.

    Why its own: the rusage ``wait4`` gives adds the children it reaped, and a call
    that forked children to burn the limit's CPU and then sent itself SIGXCPU read as
    ``cpu_limit`` (ninth red-team round), which no process of it had reached. The
    zombie's ``/proc/PID/stat`` still holds the process's own times until it is reaped.
    """
    which = os.P_ALL if pid == -1 else os.P_PID
    while True:
        ended = os.waitid(which, max(pid, 0), os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if ended is None:
            return None
        if ended.si_code in REAL_ENDS:
            break
        # A stop reported to a tracer: taken (only stops: an end that came since stays
        # for the next wait), never an end.
        if os.waitid(os.P_PID, ended.si_pid, os.WSTOPPED | os.WNOHANG) is None:
            return None
    cpu = 0.0
    killed = ended.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
    if killed and ended.si_status == signal.SIGXCPU and ended.si_pid in watched:
        cpu = own_cpu_seconds(ended.si_pid)
    _, status = os.waitpid(ended.si_pid, 0)
    return ended.si_pid, status, cpu


def own_cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` itself, not its children (0: unknown)."""
    try:
        fields = reset.stat_fields(pid)
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def record_exit(pid: int, status: int, cpu_seconds: float) -> None:
    exits[pid] = status
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXCPU:
        xcpu_seconds[pid] = cpu_seconds


def forget_exit(pid: int) -> None:
    """Drop what is recorded of an earlier process with ``pid``: a new one has it now.

    Why: a status is claimed by the pid a call's child has. One left unclaimed (a
    killed child's, reaped after its call) would be taken, once the pid counter came
    round, by whichever later child drew that pid: its status, not the child's own
    (tenth red-team round, where a call planted them). Called when a new process's pid
    is learnt and before the supervisor reaps anything again: the new process cannot
    have been reaped yet, so whatever is recorded for its pid is an earlier one's.
    """
    exits.pop(pid, None)
    xcpu_seconds.pop(pid, None)


def forget_unclaimed_exits() -> None:
    """At a reset, once no call process is left: no report may carry into the next call."""
    exits.clear()
    xcpu_seconds.clear()


def reached_cpu_limit(pid: int, returncode: int | None, limit: float) -> bool:
    """Whether process ``pid`` ended at its CPU-time limit, not just by SIGXCPU.

    Why: SIGXCPU is a signal like any other; a call that sent it to itself after
    3 ms read as ``cpu_limit`` (which SandboxFusion's answer turns into
    ``TimeLimitExceeded``), a resource verdict it never earned (eighth red-team
    round). The limit's own SIGXCPU comes only once the process used ``limit``
    seconds of CPU itself (``zygote.reap``).
    """
    used = xcpu_seconds.pop(pid, None)
    return returncode == -signal.SIGXCPU and used is not None and used >= limit - CPU_LIMIT_SLACK


def wait_for_fork(server: ForkServer) -> int:
    while True:
        message = server.control.recv(4096)
        if not message:
            raise OSError("the zygote is gone")
        kind, body = message[:1], message[1:]
        if kind == b"P":
            pid = int(zygote.FORKED_PID.unpack(body)[0])
            watch(pid)
            return pid
        if kind == b"E":
            raise OSError(f"the zygote could not fork: {body.decode(errors='replace')}")


def control_fds() -> list[int]:
    """What to poll for a call's process ending: the SIGCHLD wakeup, and the zygotes'
    control sockets (their end is the container's)."""
    return [State.child_ended, *(server.control.fileno() for server in State.zygotes.values())]


def take_exit_messages() -> None:
    """Reap what ended (non-blocking); OSError if a zygote is gone."""
    zygote.discard_pending(State.child_ended)
    reap_children()
    for server in State.zygotes.values():
        while True:  # a zygote speaks only when asked (``wait_for_fork``): this is its end
            try:
                message = server.control.recv(4096, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            if not message:
                raise OSError("the zygote is gone")


def decode_status(status: int) -> int:
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def kill_calls() -> None:
    """SIGKILL every process of the calls' uid (as that uid: the agent and zygote are spared)."""
    with identity.acting_as(State.sandbox, State.agent):
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass  # ESRCH: none left


def signal_call(pid: int, signum: int) -> None:
    with identity.acting_as(State.sandbox, State.agent):
        try:
            os.kill(pid, signum)
        except OSError:
            pass


def agent_pids() -> list[int]:
    """The agent's own processes: the supervisor and the zygotes."""
    return [os.getpid(), *(server.pid for server in State.zygotes.values())]


def call_processes() -> list[int]:
    """Processes other than the supervisor and the zygotes, zombies included.

    Why zombies count: a zombie is dead, but until it is reaped the next call can
    read its name (16 bytes its code chose), ids and times in ``/proc``. Killing,
    reaping, then listing only the live ones let through every process that turned
    zombie between the reaping and the listing (a process of many threads takes a
    while to: corpus case ``res-zombie-of-the-reset``). Every zombie here has a
    parent that reaps it: the supervisor (each call's process, and orphans).
    """
    spared = set(agent_pids())
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in spared:
            try:
                state = reset.stat_fields(entry)[0]
            except (OSError, IndexError):
                continue  # gone (reaped) meanwhile
            if state != "X":
                pids.append(int(entry))
    return pids


def end_all_calls(budget: float = 2.0) -> list[int]:
    """Kill and reap until no call process is left, not even a zombie (or ``budget`` runs
    out); what is left."""
    give_up = time.monotonic() + budget
    take_exit_messages()  # (also where a zygote that died is found: OSError)
    # Mostly none: the call's process was reaped with its result.
    left = [] if only_the_agent_counted() else call_processes()
    while left:
        kill_calls()
        take_exit_messages()
        left = call_processes()
        if not left or time.monotonic() > give_up:
            break
        time.sleep(0.002)
    return left


def only_the_agent_counted() -> bool:
    """Whether the container's task count is the agent's own processes alone, so that no
    call process is left, zombie or thread, without listing ``/proc`` (~13 us of every
    reset, measured in the image).

    The pids controller counts a task from its fork until it is reaped, and a call
    cannot leave the container's cgroup (its filesystem is read-only). Under gVisor,
    whose count is its own emulation, ``/proc`` is always listed
    (``State.tasks_counted``); a count that differs, either way, lists it too.
    """
    return State.tasks_counted and reset.tasks_counted() == len(agent_pids())


def open_oom_counter() -> None:
    """Find the cgroup's OOM-kill counter once, and keep it open.

    Why: it is read before and after every call, and a ``pread`` of an open file is
    one system call where finding and opening it by name were four to five (each
    ~29 us under gVisor, which has no such file: there the search is not repeated).
    """
    for path in OOM_COUNTERS:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        State.oom_counter = fd
        if oom_kills() is not None:
            return
        os.close(fd)
        State.oom_counter = None


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer ended in this container so far."""
    if State.oom_counter is None:
        return None
    try:
        text = os.pread(State.oom_counter, 4096, 0).decode(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            try:
                return int(value)
            except ValueError:
                return None
    return None


# -- files in and out ---------------------------------------------------------------------

_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
"""Directories walked to an upload or a fetched file: passed through, not read (O_PATH),
as python3 opening the path does. Opened for reading, a directory the code had made
execute-only (``chmod 0o311``) refused a fetch of a file its code could open."""


def _open_parent(root_fd: int, path: str, create: bool) -> tuple[int, str]:
    """A descriptor of ``path``'s directory (walked with O_NOFOLLOW) and the last name."""
    *parents, name = path.split("/")
    fd = os.dup(root_fd)
    try:
        for part in parents:
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            if stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode):
                # O_NOFOLLOW alone is not enough: gVisor follows a link to a directory.
                raise OSError(errno.ELOOP, "a symbolic link (not followed)", part)
            next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd, name


def stdin_over_file_limit(encoded: object) -> str | None:
    """Why the call's stdin cannot be given to it, or None.

    Why: the stdin is a file (a memfd the child writes before its code starts), so the
    container's file size limit (``fsize_mb``) bounds it; over it the child failed before
    the code's first line, which read as the sandbox's failure (the thirtieth round's
    review). Refused here, as an upload over the limit is."""
    if not isinstance(encoded, str) or not encoded:
        return None
    size = len(encoded) // 4 * 3 - encoded[-2:].count("=")
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit == resource.RLIM_INFINITY or size <= limit:
        return None
    return (
        f"the stdin is {size} bytes; the sandbox keeps it in a file, and a file here may "
        f"hold at most {limit} bytes (fsize_mb)"
    )


def write_uploads(files: list[list[str]]) -> tuple[list[str], str | None]:
    """Write the call's files (as the calls' uid, never following a link): the paths
    written (``wire.check_relative_path``'s form), and why not all of them, or None."""
    written: list[str] = []
    if not files:
        return written, None
    with identity.acting_as(State.sandbox, State.agent):
        root = os.open(wire.WORKDIR, _DIR_FLAGS)
        try:
            for path_text, encoded in files:
                path = wire.check_relative_path(path_text)
                data = wire.b64decode(encoded)
                parent, name = _open_parent(root, path, create=True)
                try:
                    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                    fd = os.open(name, flags, 0o644, dir_fd=parent)
                    try:
                        write_all(fd, data)
                    finally:
                        os.close(fd)
                finally:
                    os.close(parent)
                written.append(path)
        except (OSError, ValueError) as exc:
            where = getattr(exc, "filename", None) or ""
            why = f"could not write the call's files: {exc.__class__.__name__}: {exc} {where}"
            return written, why
        finally:
            os.close(root)
    return written, None


def read_fetched(paths: list[str], cap: int) -> tuple[dict[str, str], dict[str, str]]:
    """Read the files asked for (as the calls' uid), after every process of the call is gone."""
    found: dict[str, str] = {}
    errors: dict[str, str] = {}
    budget = cap
    with identity.acting_as(State.sandbox, State.agent):
        root = os.open(wire.WORKDIR, _DIR_FLAGS)
        try:
            for raw in paths:
                try:
                    path = wire.check_relative_path(raw)
                    parent, name = _open_parent(root, path, create=False)
                    try:
                        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
                        if stat.S_ISLNK(
                            os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
                        ):
                            raise OSError(errno.ELOOP, "a symbolic link (not followed)", name)
                        fd = os.open(name, flags, dir_fd=parent)
                    finally:
                        os.close(parent)
                except OSError as exc:
                    errors[raw] = wire.FetchRefused.cannot_open(exc)
                    continue
                except ValueError as exc:
                    errors[raw] = str(exc)
                    continue
                try:
                    info = os.fstat(fd)
                    if not stat.S_ISREG(info.st_mode):
                        errors[raw] = wire.FetchRefused.NOT_REGULAR
                        continue
                    if info.st_size > budget:
                        errors[raw] = wire.FetchRefused.too_large(info.st_size, budget)
                        continue
                    data = os.read(fd, budget + 1) if budget else b""
                    if len(data) > budget:
                        errors[raw] = wire.FetchRefused.grew(budget)
                        continue
                except OSError as exc:
                    errors[raw] = wire.FetchRefused.cannot_read(exc)
                    continue
                finally:
                    os.close(fd)
                budget -= len(data)
                found[raw] = wire.b64encode(data)
        finally:
            os.close(root)
    return found, errors


# -- one call ---------------------------------------------------------------------------------


def run_call(request: dict[str, Any], child: Child, nonce: object = None) -> dict[str, Any]:
    timeout = float(request["timeout"])
    cap = int(request.get("read_cap", 16384))
    cell_cap = int(request.get("cell_read_cap", cap))  # each notebook cell's (its share)
    started = time.monotonic()
    deadline = started + timeout
    oom_before = oom_kills()
    cells = [str(cell) for cell in request.get("cells") or []]
    cell_timeout = request.get("cell_timeout")
    caps = wire.text_caps(request)

    uploaded: list[str] = []
    setup_error = stdin_over_file_limit(request.get("stdin"))
    if setup_error is None:
        uploaded, setup_error = write_uploads(request.get("files") or [])
    if setup_error is not None:
        child.close()  # the spare never gets its request: it ends, and the reset reaps it
        return {
            "type": "result",
            "id": request.get("id"),
            "setup_error": setup_error,
            "returncode": None,
            "timed_out": False,
            "oom": False,
            "stdout": "",
            "stdout_dropped": 0,
            "stderr": "",
            "stderr_dropped": 0,
            "duration": time.monotonic() - started,
        }

    to_child = {
        "type": "request",
        "code": "" if cells else request["code"],
        "cells": len(cells),
        "cpu_seconds": request.get("cpu_seconds", wire.DEFAULT_CPU_SECONDS),
        "memory_mb": request.get("memory_mb"),
        "stack_mb": request.get("stack_mb"),
        "stdin": request.get("stdin"),
        "script": request.get("script"),
        "auto_print": request.get("auto_print") is True,
    }
    if uploaded:
        to_child["shadowing"] = zygote.importable_names(uploaded, request.get("script"))
    child.request.sendall(wire.encode_for_call(to_child))

    events = wire.FrameDecoder(max_frame=wire.EVENT_FRAME_LIMIT)
    cell_token = ""
    tails = {child.out_r: Tail(cap), child.err_r: Tail(cap)}
    open_pipes = {child.out_r, child.err_r}
    # The call's own streams: a notebook's hold what it wrote outside every cell (each
    # cell's output is its record's), as on the local backend and as the server's
    # ``driver`` documents; the pipes stay open beside each cell's.
    own_tails = (tails[child.out_r], tails[child.err_r])
    cell_pipes: set[int] = set()
    poller = select.poll()
    # A plain call's events pipe stays unread (the child closes it): fast calls cost one
    # wake-up fewer, and "started" is asked of the gate only when it matters (below).
    controls = control_fds()
    for fd in (child.out_r, child.err_r, *controls):
        poller.register(fd, select.POLLIN)
    if cells:
        poller.register(child.events_r, select.POLLIN)
    returncode: int | None = None
    timed_out = False
    cell_results: list[dict[str, Any]] = []
    cell_index = -1
    cell_deadline = deadline
    interrupted_at: float | None = None
    events_open = True
    tell_started_at: float | None = started + wire.STARTED_DELAY  # None once told (or never can be)
    watching_gate = False  # past tell_started_at without a mark: woken by the gate itself
    undeliverable = False  # a cell could not be sent by its deadline (start_cell)

    def start_cell(index: int) -> None:
        """Send cell ``index``; by the cell's deadline, else the call has timed out."""
        nonlocal cell_pipes, cell_deadline, interrupted_at, undeliverable
        for fd in cell_pipes & open_pipes:  # the previous cell's, if not at their end yet
            drain_pipe(fd, tails, open_pipes, poller, close=True)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        nonlocal events, cell_token
        cell_token = os.urandom(16).hex()  # the only end accepted for this cell carries it
        # A half frame left by a cell is dropped.
        events = wire.FrameDecoder(max_frame=wire.EVENT_FRAME_LIMIT)
        if index > 0:  # ... and so is whatever an earlier cell wrote after its end
            zygote.discard_pending(child.events_r)
            announce_started()  # an earlier cell ended: the code ran; say so before waiting
        frame = wire.encode_for_call(
            {
                "type": "cell",
                "index": index,
                "code": cells[index],
                "token": cell_token,
                "text_cap": caps[0],
            }
        )
        tails[out_r], tails[err_r] = Tail(cell_cap), Tail(cell_cap)  # (numbers reused: new)
        cell_pipes = {out_r, err_r}
        open_pipes.update(cell_pipes)
        for fd in (out_r, err_r):
            os.set_blocking(fd, False)  # numbers are reused: a stale poll event must not block
            poller.register(fd, select.POLLIN)
        cell_results.append(
            {
                "tails": (tails[out_r], tails[err_r]),
                "finished": False,
                "timed_out": False,
                "display": [],
                "error": [],
            }
        )
        limit = float(cell_timeout) if cell_timeout else timeout
        cell_deadline = min(deadline, time.monotonic() + limit)
        interrupted_at = None
        try:
            # Cell 0 may be sent before the process read its request (no descriptors).
            send_to_call(child.request, frame, [out_w, err_w], cell_deadline, check_taken=index > 0)
        except (TimeoutError, UnreadFrameError):
            cell_results[index]["timed_out"] = True
            undeliverable = True  # the process stopped taking its cells: its time is up
        finally:
            os.close(out_w)
            os.close(err_w)

    def announce_started() -> None:
        """Tell the host the code started, once it did (a call that did must never be run
        again elsewhere); until the gate says so, leave it to the loop below."""
        nonlocal tell_started_at, watching_gate
        if tell_started_at is None or not (child.check_started() or child.gate_closed):
            return
        if child.code_started:
            write_frame(1, {"type": "started", "id": request.get("id"), "nonce": nonce})
        tell_started_at = None
        if watching_gate:
            poller.unregister(child.started_r)
            watching_gate = False

    if cells:
        try:
            cell_index = 0
            start_cell(0)
        except OSError:
            pass  # the child is gone: its exit is reported below

    broken_at: float | None = None  # when a notebook's events pipe broke (see below)
    while returncode is None:
        now = time.monotonic()
        if now >= deadline or undeliverable:
            timed_out = True
            break
        if broken_at is not None and now >= broken_at + BROKEN_EVENTS_GRACE:
            kill_calls()  # no cell of it can end any more: ended, as a session that does this
            broken_at = None
        if cells and cell_index >= 0 and now >= cell_deadline:
            if interrupted_at is None and not child.check_started():
                # No code of it runs yet, nothing to interrupt (the signal would end the
                # process before its code): look again soon; the call's deadline holds.
                cell_deadline = min(deadline, now + 0.005)
            elif interrupted_at is None:
                cell_results[cell_index]["timed_out"] = True
                signal_call(child.pid, signal.SIGINT)
                interrupted_at = now
                cell_deadline = min(deadline, now + INTERRUPT_GRACE)
            else:
                timed_out = True  # the cell did not stop: the process goes
                break
        if tell_started_at is not None and now >= tell_started_at:
            # Still running: once its code started, tell the host; until then the gate's
            # own write or end wakes us.
            announce_started()
            if tell_started_at is not None and not watching_gate:
                poller.register(child.started_r, select.POLLIN)
                watching_gate = True
        wake = min(deadline, cell_deadline if cells else deadline)
        if broken_at is not None:
            wake = min(wake, broken_at + BROKEN_EVENTS_GRACE)
        if tell_started_at is not None and not watching_gate:
            wake = min(wake, tell_started_at)
        wait = wake - now
        generation = len(cell_results)
        for fd, _event in poller.poll(max(1, int(wait * 1000) + 1)):
            if len(cell_results) != generation:
                break  # a new cell's pipes may reuse numbers of this batch's events: poll again
            if fd in controls:
                take_exit_messages()
            elif fd == child.started_r:
                pass  # the gate: read at the top of the loop
            elif fd == child.events_r and events_open:
                try:
                    data = os.read(fd, CHUNK)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    events_open = False
                    poller.unregister(fd)
                    continue
                try:
                    messages = events.feed(data)
                except wire.WireError:
                    messages = []
                    events_open = False  # garbage from the call: stop listening to it
                    poller.unregister(fd)
                    if cells:  # its cells end only on this pipe: the call cannot go on
                        broken_at = time.monotonic()
                for message in messages:
                    kind = message.get("type")
                    if (
                        kind == "cell_end"
                        and cells
                        and message.get("index") == cell_index
                        and message.get("token") == cell_token
                    ):
                        record = cell_results[cell_index]
                        record["finished"] = True
                        record["display"] = _display(message.get("display"), caps)
                        record["error"] = _errors(message.get("error"), caps)
                        if cell_index + 1 < len(cells):
                            cell_index += 1
                            try:
                                start_cell(cell_index)
                            except OSError:
                                pass
                        else:
                            cell_index = len(cells)
                            cell_deadline = deadline
            elif fd in open_pipes:
                pump(fd, tails, open_pipes, poller)
        if returncode is None and child.pid in exits:
            returncode = decode_status(exits.pop(child.pid))

    # The call is over. If a pipe is still open (or the time is up) something of the call
    # still runs: end every process it left, so that every writer goes and the pipes reach
    # EOF. Otherwise what it left (a process that closed its output) is ended by the reset,
    # before anything else reads what it could touch (fetched files: ``end_all_calls`` below).
    if open_pipes or timed_out:
        kill_calls()
    settle = time.monotonic() + (TIMEOUT_SETTLE_SECONDS if timed_out else SETTLE_SECONDS)
    while open_pipes and time.monotonic() < settle:
        woken = poller.poll(50)
        for fd, _event in woken:
            if fd in open_pipes:  # (non-blocking: a stale event cannot stall us)
                pump(fd, tails, open_pipes, poller)
            elif fd in controls:
                take_exit_messages()
        if woken:
            continue
        reap_children()  # a zombie the supervisor adopted is not a writer
        if not call_processes():
            # No writer is left, yet a pipe is open: its end is held in flight (a unix
            # socket cycle the call made, which only the kernel's collector ends). Nothing
            # more can come: waiting for end-of-file would only spend the call's time.
            break
    for fd in list(open_pipes):
        drain_pipe(fd, tails, open_pipes, poller, close=True)
    started_code = child.check_started()  # the child is gone: the gate said all it will
    cpu_limit = reached_cpu_limit(child.pid, returncode, float(to_child["cpu_seconds"]))
    child.close_channels()  # (its output pipes were closed above)
    big = request.get("fetch") or cells or sum(len(tail.buf) for tail in tails.values()) > SMALL
    State.large_result = State.large_result or bool(big) or _large_request(request)
    if big and started_code:
        announce_ended(
            request,
            nonce,
            None if timed_out else returncode,
            timed_out,
            oom_before,
            cpu_limit=cpu_limit,
        )
    # Fetched files are read only once nothing of the call can still write them;
    # otherwise the wait for the last process to go is the reset's, off the hot path.
    left = end_all_calls() if request.get("fetch") else []
    exits.pop(child.pid, None)
    xcpu_seconds.pop(child.pid, None)

    if timed_out:
        returncode = None
    oom_after = oom_kills()
    oom = (
        oom_before is not None
        and oom_after is not None
        and oom_after > oom_before
        and returncode != 0
    )
    fetched: dict[str, str] = {}
    fetch_errors: dict[str, str] = {}
    if request.get("fetch"):
        fetched, fetch_errors = read_fetched(
            list(request["fetch"]), int(request.get("fetch_cap", wire.MAX_FETCH_BYTES))
        )
    out_tail, err_tail = own_tails
    result: dict[str, Any] = {
        "type": "result",
        "id": request.get("id"),
        "returncode": returncode,
        "timed_out": timed_out,
        "oom": bool(oom) and not timed_out,
        "oom_kills": oom_after,
        "cpu_limit": cpu_limit and not timed_out,
        "stdout": out_tail.text(),
        "stdout_dropped": out_tail.dropped,
        "stderr": err_tail.text(),
        "stderr_dropped": err_tail.dropped,
        "duration": time.monotonic() - started,
        "started": started_code,
        "files": fetched,
        "fetch_errors": fetch_errors,
    }
    if cells:
        result["cells"] = [_cell_frame(record) for record in cell_results]
    if left:
        result["leftover"] = f"processes would not die: {left[:5]}"
    return result


SMALL = 1 << 18
"""Bytes of output below which a result is encoded and sent at once: above them, or with
fetched files or cells, the outcome goes ahead in an ``ended`` frame (``announce_ended``)."""


def announce_ended(
    request: dict[str, Any],
    nonce: object,
    returncode: int | None,
    timed_out: bool,
    oom_before: int | None,
    *,
    cpu_limit: bool,
) -> None:
    """Tell the host how the call ended before the work whose size the call chose.

    Why: reading fetched files, building cells' records and encoding a result of up to
    64 MiB (``result_fit`` may encode it several times) take a time the call controls,
    after its deadline; past the host's grace the call was a ``sandbox_error`` (a
    sample trainers drop) instead of its own timeout. With this frame the host can
    return the call's own outcome on time, its output marked lost.
    """
    oom_after = oom_kills()
    oom = oom_before is not None and oom_after is not None and oom_after > oom_before
    write_frame(
        1,
        {
            "type": "ended",
            "id": request.get("id"),
            "nonce": nonce,
            "returncode": returncode,
            "timed_out": timed_out,
            "oom": oom and returncode != 0 and not timed_out,
            "oom_kills": oom_after,
            "cpu_limit": cpu_limit and not timed_out,
        },
    )


def _cell_frame(record: dict[str, Any]) -> dict[str, Any]:
    out, err = record["tails"]
    return {
        "stdout": out.text(),
        "stdout_dropped": out.dropped,
        "stderr": err.text(),
        "stderr_dropped": err.dropped,
        "display": record["display"],
        "error": record["error"],
        "finished": record["finished"],
        "timed_out": record["timed_out"],
    }


def _display(value: object, caps: tuple[int, int]) -> list[dict[str, str]]:
    """A cell's value as its end event gave it, within ``wire.text_caps``."""
    if not isinstance(value, list):
        return []
    return [
        {"text/plain": wire.bounded(_text(item.get("text/plain")), caps[0])}
        for item in value[:1]
        if isinstance(item, dict)
    ]


def _errors(value: object, caps: tuple[int, int]) -> list[dict[str, Any]]:
    """A cell's exception as its end event gave it, within ``wire.text_caps``."""
    if not isinstance(value, list):
        return []
    records = []
    for item in value[:1]:
        if isinstance(item, dict):
            lines = item.get("traceback")
            lines = lines[-TRACEBACK_LINES:] if isinstance(lines, list) else []
            records.append(
                {
                    # (a class name: its head, as the local backend keeps it)
                    "ename": _text(item.get("ename"))[:200],
                    "evalue": wire.bounded(_text(item.get("evalue")), caps[1]),
                    "traceback": [wire.bounded(_text(line), caps[1]) for line in lines],
                }
            )
    return records


TRACEBACK_LINES = 203
"""Most lines of a cell's traceback: ``wire.traceback_tail`` keeps 200, its header and
the count of those left out."""


def _text(value: object) -> str:
    """A text field of a call's event: a string or a plain scalar, else "" (the events
    pipe is the call's to write, and ``str()`` of a deeply nested list it sent raises)."""
    if isinstance(value, str):
        return value
    return str(value) if isinstance(value, (int, float)) else ""


def pump(fd: int, tails: dict[int, Tail], open_pipes: set[int], poller: select.poll) -> None:
    try:
        data = os.read(fd, CHUNK)
    except BlockingIOError:
        return  # a stale event (the number was reused by a newer pipe): nothing to read yet
    except OSError:
        data = b""
    if data:
        tails[fd].feed(data)
        return
    poller.unregister(fd)
    open_pipes.discard(fd)
    os.close(fd)


def drain_pipe(
    fd: int, tails: dict[int, Tail], open_pipes: set[int], poller: select.poll, close: bool
) -> None:
    """Take what is already in a pipe without waiting for its writers; then close it.

    At most ``zygote.DRAIN_LIMIT`` bytes: a writer of the call that is still running
    could otherwise refill the pipe as fast as it is read, and this never return.
    """
    os.set_blocking(fd, False)
    taken = 0
    try:
        while taken < zygote.DRAIN_LIMIT:
            data = os.read(fd, CHUNK)
            if not data:
                break
            taken += len(data)
            tails[fd].feed(data)
    except OSError:
        pass
    if close and fd in open_pipes:
        poller.unregister(fd)
        open_pipes.discard(fd)
        os.close(fd)


# -- reset between calls -------------------------------------------------------------------------


def _large_request(request: dict[str, Any]) -> bool:
    """Whether what came in (code, stdin, uploads) was large enough to leave freed heap."""
    files = request.get("files")
    parts = [request.get("code"), request.get("stdin")]
    if isinstance(files, list):
        parts += [part for item in files if isinstance(item, list) for part in item]
    return sum(len(part) for part in parts if isinstance(part, str)) > SMALL


def give_back_memory() -> None:
    """Return the supervisor's freed heap to the kernel (glibc's ``malloc_trim``).

    Why: a large result (a notebook's cells of 1 MiB each, fetched files) is freed once
    sent, but glibc keeps the freed heap, and the reset counted it as memory a call
    left: ~51 MiB after a 64 MiB result, so every such call retired its container, and
    a neighbour's call waited for a new one (eighteenth red-team round).
    """
    State.large_result = False
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: nothing to trim with


def reset_container() -> tuple[bool, str]:
    """Empty every place a call can leave state, then prove the baseline. Never raises."""
    try:
        problems = []
        left = end_all_calls()
        if left:
            problems.append(f"processes left: {left[:5]}")
        forget_unclaimed_exits()
        with identity.acting_as(State.sandbox, State.agent):
            problems.extend(reset.clean(time.monotonic() + reset.CLEAN_BUDGET, State.kept_inodes))
        if State.large_result:
            give_back_memory()
        problems.extend(reset.back_to_baseline(State.baseline, agent_pids()))
        return not problems, "; ".join(problems)
    except BaseException as exc:  # a hostile shape must retire the container, not crash us
        return False, f"reset failed: {type(exc).__name__}: {exc}"


# -- start -----------------------------------------------------------------------------------------


def parse_options(argv: list[str]) -> dict[str, str]:
    """``--name value`` pairs; anything else is an error (the host wrote them)."""
    options, rest = {}, argv[1:]
    while rest:
        if len(rest) < 2 or not rest[0].startswith("--"):
            raise ValueError(f"bad agent arguments: {rest!r}")
        options[rest[0][2:]] = rest[1]
        rest = rest[2:]
    return options


def lock_memory() -> None:
    """Keep the supervisor's pages resident (where RLIMIT_MEMLOCK and the runtime allow)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mlockall(MCL_CURRENT)  # best effort: a failure only loses the protection


def start(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """Everything that must hold before the agent reports ready; what the zygote preloaded."""
    options = parse_options(argv)
    agent_user = Identity(options.pop("agent-user", wire.AGENT_USER))
    zygote_user = Identity(options.pop("zygote-user", wire.ZYGOTE_USER))
    sandbox_user = Identity(options.pop("sandbox-user", wire.DEFAULT_SANDBOX_USER))
    modules = [m for m in options.pop("preload", "").split(",") if m]
    huge_pages = _yes_or_no(options, "huge-pages", "yes")
    light = _yes_or_no(options, "light-zygote", "no") and bool(modules)
    ip = _yes_or_no(options, "ip", "yes")
    zygote.Setup.machine_memory = int(options.pop("machine-memory-mb", "0")) << 20
    if options:
        raise ValueError(f"unknown agent options: {sorted(options)}")
    if len({agent_user.uid, zygote_user.uid, sandbox_user.uid}) != 3:
        raise ValueError("the supervisor, the zygote and the calls need three different uids")
    machine = os.uname().machine
    if machine not in identity.AUDIT_ARCH:
        raise OSError(f"no syscall filter for {machine}")
    check_unread_bytes_counted()
    locked = identity.lock_shared_devices()
    if locked:
        raise PermissionError(f"cannot keep calls off shared devices: {'; '.join(locked)}")
    identity.set_login_uid(sandbox_user.uid)
    State.agent, State.sandbox = agent_user, sandbox_user
    zygote.Setup.drop = identity.SandboxDrop(
        sandbox_user,
        identity.last_capability(),
        identity.syscall_filter(machine, ip=ip, zygote=True),
        identity.parent_filter(machine),
    )

    State.preloaded = tuple(modules)
    State.zygotes[FULL] = _fork_zygote(zygote_user, modules, huge_pages)
    if light:
        # Small: no huge pages to collapse (its heap is a few MiB).
        State.zygotes[LIGHT] = _fork_zygote(zygote_user, list(light_calls.LIGHT_PRELOAD), False)
    watch_children()
    identity.become(agent_user, wire.SUPERVISOR_CAPABILITIES)
    identity.harden_self()
    lock_memory()
    open_oom_counter()
    ready = {kind: _wait_ready(server) for kind, server in State.zygotes.items()}
    return list(ready[FULL]["loaded"]), dict(ready[FULL]["failed"])


def _yes_or_no(options: dict[str, str], name: str, default: str) -> bool:
    value = options.pop(name, default)
    if value not in ("yes", "no"):
        raise ValueError(f"--{name} takes yes or no, not {value!r}")
    return value == "yes"


def _fork_zygote(zygote_user: Identity, modules: list[str], huge_pages: bool) -> ForkServer:
    """Start one zygote (still as root: it drops to ``zygote_user`` itself)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        ours.close()
        for other in State.zygotes.values():  # a zygote holds no end of another's socket
            other.control.close()
        zygote.serve(theirs, zygote_user, modules, huge_pages)
        os._exit(70)
    theirs.close()
    return ForkServer(pid, ours)


def _wait_ready(server: ForkServer) -> dict[str, Any]:
    message = server.control.recv(1 << 16)
    if message[:1] != b"R":
        reason = message[1:].decode(errors="replace") or "the zygote died before it was ready"
        raise OSError(reason)
    ready: dict[str, Any] = json.loads(message[1:])
    return ready


def zygote_for(request: dict[str, Any]) -> str:
    """The zygote a ``run`` request's child comes from (``light_calls``)."""
    if LIGHT not in State.zygotes or request.get("cells"):
        return FULL
    code = request.get("code")
    if not isinstance(code, str) or not light_calls.runs_light(code, State.preloaded):
        return FULL
    return LIGHT


def take_spare(kind: str = FULL) -> Child:
    """A child of zygote ``kind`` for a call: the spare forked ahead, if it is of that kind.

    A spare of the other kind is discarded unused and a child forked now: a call
    never runs in the other zygote's child, because what that child holds (the
    modules in ``sys.modules``) would tell the call which zygote the previous call
    of this container wanted, that is, something of that call's code. The next
    spare comes from the zygote this call wanted, so a run of calls of one kind
    never waits for a fork; only a change of kind does (~1 ms).

    A spare that is gone is replaced the same way (killed while it waited: the calls'
    processes are the OOM killer's first pick, and a spare is one). Handed its
    request, its broken pipe made the call the sandbox's failure, though its code
    never began (thirty-second red-team round: two calls so, on a host at load 55).
    """
    child, State.spare = State.spare, None
    State.next_kind = kind
    if child is None:
        return Child(kind)
    if child.kind == kind and not _gone_while_waiting(child):
        return child
    signal_call(child.pid, signal.SIGKILL)  # it has seen nothing; it dies while we fork
    child.close()
    fresh = Child(kind)
    _wait_gone(child.pid)
    return fresh


def _gone_while_waiting(child: Child) -> bool:
    """Whether a spare's end of its request socket is closed (it died) or it wrote to it,
    which a child waiting for its request never does: one ``poll`` that does not wait."""
    poller = select.poll()
    poller.register(child.request, select.POLLIN | select.POLLHUP | select.POLLERR)
    return bool(poller.poll(0))


DISCARD_BUDGET = 2.0
"""Seconds a discarded spare may take to be gone (killed, reaped and reported)."""


def _state_of(pid: int) -> str:
    """A process's state and parent, for a message."""
    try:
        state, parent = reset.stat_fields(pid)[:2]
    except (OSError, ValueError):
        return "no longer listed"
    return f"state {state}, parent {parent}"


def _wait_gone(pid: int) -> None:
    """Until ``pid`` is reaped: the call must not find it in ``/proc`` (a
    process it cannot account for) nor its sockets in the container's counts."""
    give_up = time.monotonic() + DISCARD_BUDGET
    poller = select.poll()
    for fd in control_fds():
        poller.register(fd, select.POLLIN)
    while True:
        take_exit_messages()
        if exits.pop(pid, None) is not None:
            return
        left = give_up - time.monotonic()
        if left <= 0:
            raise OSError(f"a discarded spare ({pid}) is still there: {_state_of(pid)}")
        poller.poll(max(1, int(left * 1000)))


def settle_start(budget: float = 1.0) -> None:
    """Before the baseline: reap what start left (the zygotes' probe of ``forking``, whose
    copy is the supervisor's child), so no zombie of it is in the baseline or a call."""
    give_up = time.monotonic() + budget
    while True:
        reap_children()
        if not call_processes() or time.monotonic() > give_up:
            return
        time.sleep(0.005)


def main(argv: list[str], pythons_own: frozenset[str] | None = None) -> int:
    """The container's PID 1; ``pythons_own``: the modules python3 had imported before the
    agent's first import (its entry's count), which no call's upload shadows."""
    from . import sessions

    zygote.Setup.pythons_own = pythons_own
    try:
        loaded, failed = start(argv)
        settle_start()
        reset.create_loopback_neighbours()
        reset.read_mounted_files_once()
        reset.keep_open(reset.files_to_keep_open())
        State.tasks_counted = not reset._in_gvisor() and reset.tasks_counted() is not None
        State.baseline = reset.measure(agent_pids())
        State.kept_inodes = reset.kept_inodes()
        State.spare = Child(FULL)
    except Exception as exc:
        write_frame(1, {"type": "fatal", "reason": f"{type(exc).__name__}: {exc}"})
        return 70
    write_frame(
        1,
        {
            "type": "ready",
            "python": sys.version.split()[0],
            "preloaded": loaded,
            "failed": failed,
            "zygotes": sorted(State.zygotes),
            "pid": os.getpid(),
            "sandbox_uid": State.sandbox.uid,
        },
    )
    while True:
        try:
            request = read_frame(0)
        except EOFError:
            return 0
        kind = request.get("type")
        # The nonce authenticates our answers to the host; no call process ever
        # holds it (a child gets its own request, without it, from us).
        nonce = request.pop("nonce", None)
        handed_over = False  # once a child has the request, its code may have run
        try:
            if kind == "run":
                child = take_spare(zygote_for(request))
                handed_over = True
                result = run_call(request, child, nonce)
                write_result(1, {**result, "nonce": nonce})
                del result  # freed before the reset weighs the container's memory
                for field in ("code", "stdin", "files", "cells"):  # ... as is what came in
                    request.pop(field, None)
                if request.get("reset"):
                    write_frame(1, _reset_frame(request.get("id"), nonce))
            elif isinstance(kind, str) and kind in SESSION_FRAMES:
                reply = sessions.handle(request, nonce)
                if reply.get("type") == "reset" and reply.get("clean"):
                    reply = _with_spare(reply)
                write_result(1, reply)
            elif kind == "ping":
                write_frame(1, {"type": "pong"})
            else:
                write_frame(
                    1, {"type": "error", "reason": f"unknown frame type {kind!r}", "started": False}
                )
        except Exception as exc:
            end_all_calls()
            write_frame(
                1,
                {
                    "type": "error",
                    "id": request.get("id"),
                    "nonce": nonce,
                    "reason": f"{type(exc).__name__}: {exc}",
                    # The host runs a call elsewhere only when its code provably never ran.
                    "started": handed_over,
                },
            )
            return 70


SESSION_FRAMES = frozenset(
    {"session_open", "session_cell", "session_fork", "session_close", "family_reset"}
)


def _reset_frame(call_id: object, nonce: object) -> dict[str, Any]:
    clean, reason = reset_container()
    return _with_spare(
        {"type": "reset", "id": call_id, "nonce": nonce, "clean": clean, "reason": reason}
    )


def _with_spare(reply: dict[str, Any]) -> dict[str, Any]:
    """After a clean reset, fork the next call's child; failing to is not clean."""
    if reply.get("clean"):
        try:
            State.spare = Child(State.next_kind)
        except OSError as exc:
            return {**reply, "clean": False, "reason": f"cannot fork the next call: {exc}"}
    return reply
