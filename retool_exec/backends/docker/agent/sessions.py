"""Sessions in the supervisor: long-lived interpreters driven cell by cell, and their forks.

One container serves one session family (a session and its forks) at a
time; the host never mixes families in a container. Each session is a
process of the calls' uid with its own events pipe and request socket. A
cell is sent with fresh stdout/stderr pipes (so no cell can write another
cell's output) and answered by the session's ``cell_end`` event; a cell
past its timeout gets SIGINT (KeyboardInterrupt), and one that does not stop
within ``INTERRUPT_GRACE`` is killed and its session lost. A fork is a
double fork inside the session, so the copy's parent is PID 1 and its exit
status is the supervisor's to collect.

Host -> agent frames (each with ``id`` and ``nonce``; each answered by a frame
carrying them): ``session_open`` {sid, cpu_seconds, memory_mb},
``session_cell`` {sid, code, timeout, read_cap, text_cap}, ``session_fork`` {sid, new_sid},
``session_close`` {sid}, ``family_reset`` (kill everything, clean, prove the
baseline; answered by a ``reset`` frame).
"""

from __future__ import annotations

import os
import resource
import select
import signal
import socket
import struct
import time
from typing import Any

from . import identity, reset, trees, wire, zygote
from . import supervisor as sv

START_BUDGET = 5.0
DESCRIPTORS_KEPT_FREE = 32
"""Descriptors the supervisor keeps free when it opens or forks a session: each session
holds two, a cell takes four for its time, a call or reset a few. Past it the session is
refused, and the family goes on (an ``EMFILE`` in the middle of a fork ended the agent,
and with it every session of the family: the thirty-sixth round)."""
"""Seconds a new session or fork has to report that it is ready."""
LIVENESS_TICK = 0.1
"""Seconds between checks that a session's process still exists, while a cell runs."""


class SessionProcess:
    """The supervisor's end of one session: its pid, events pipe and request socket."""

    def __init__(self, pid: int, events_r: int, request: socket.socket, cpu_seconds: float) -> None:
        self.pid = pid
        self.events_r = events_r
        self.request = request
        self.cpu_seconds = cpu_seconds
        """Its CPU-time limit (a fork inherits its parent's)."""
        self.events = wire.FrameDecoder(max_frame=wire.EVENT_FRAME_LIMIT)
        self.lost: str | None = None
        os.set_blocking(events_r, False)

    def close(self) -> None:
        try:
            os.close(self.events_r)
        except OSError:
            pass
        self.request.close()


table: dict[int, SessionProcess] = {}


def handle(request: dict[str, Any], nonce: object) -> dict[str, Any]:
    """Answer one session frame (never raises for the session's own failures)."""
    return {**_answer(request, nonce), "oom_kills": sv.oom_kills()}


def _answer(request: dict[str, Any], nonce: object) -> dict[str, Any]:
    kind = request.get("type")
    reply: dict[str, Any] = {"id": request.get("id"), "nonce": nonce}
    sid = request.get("sid")
    if kind == "session_open":
        return {**reply, **open_session(int(sid or 0), request)}
    if kind == "session_fork":
        return {**reply, **fork_session(int(sid or 0), int(request.get("new_sid") or 0))}
    if kind == "session_cell":
        return {**reply, **run_cell(int(sid or 0), request)}
    if kind == "session_close":
        close_session(int(sid or 0))
        return {**reply, "type": "session", "sid": sid, "ok": True}
    if kind == "family_reset":
        for key in list(table):  # the reset below kills the rest and empties every directory
            end_session(table.pop(key))
        sv.State.large_result = True  # a family's cells may have sent large results
        clean, reason = sv.reset_container()
        return {**reply, "type": "reset", "clean": clean, "reason": reason}
    return {**reply, "type": "error", "reason": f"unknown session frame {kind!r}"}


def workdir(sid: int) -> str:
    """Each session's own working directory: a fork gets a copy of its parent's files there."""
    return f"{wire.WORKDIR}/session-{sid}"


def _refused(sid: int, reason: str) -> dict[str, Any]:
    return {"type": "session", "sid": sid, "ok": False, "reason": reason}


def _short_of_descriptors() -> str | None:
    """Why no session more fits the supervisor's descriptors, or None."""
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    try:
        used = len(os.listdir("/proc/self/fd"))
    except OSError:
        return None
    if limit == resource.RLIM_INFINITY or used + DESCRIPTORS_KEPT_FREE <= limit:
        return None
    return (
        f"no session more fits this family: its {len(table)} session(s) hold the agent's "
        f"descriptors ({used} of its {limit}, the container's nofile); close one, or start "
        "with a larger DockerConfig(nofile=...)"
    )


def open_session(sid: int, request: dict[str, Any]) -> dict[str, Any]:
    if sid in table:
        return _refused(sid, "session id in use")
    short = _short_of_descriptors()
    if short is not None:
        return _refused(sid, short)
    child = sv.take_spare()
    to_child = {
        "type": "request",
        "session": True,
        "code": "",
        "cpu_seconds": request.get("cpu_seconds", 24 * 3600),
        "memory_mb": request.get("memory_mb"),
        "stdin": None,
        "workdir": workdir(sid),
    }
    try:
        child.request.sendall(wire.encode_for_call(to_child))
    except OSError as exc:
        child.close()
        return _refused(sid, f"the session's process is gone: {exc}")
    for fd in (child.out_r, child.err_r):
        os.close(fd)  # a session's output goes to each cell's own pipes
    ready = _wait_started(child)
    os.close(child.started_r)
    process = SessionProcess(
        child.pid, child.events_r, child.request, float(to_child["cpu_seconds"])
    )
    if not ready:
        process.close()
        sv.signal_call(child.pid, signal.SIGKILL)
        return _refused(sid, "the session's process did not start")
    table[sid] = process
    return {"type": "session", "sid": sid, "ok": True}


def fork_session(sid: int, new_sid: int) -> dict[str, Any]:
    parent = table.get(sid)
    if parent is None or parent.lost:
        reason = (parent.lost if parent else None) or "no such session"
        return {**_refused(sid, reason), "parent_lost": True}
    if new_sid in table:
        return _refused(new_sid, "session id in use")
    short = _short_of_descriptors()
    if short is not None:
        return _refused(new_sid, short)
    try:
        events_r, events_w = os.pipe()
    except OSError as exc:
        return _refused(new_sid, f"the fork did not start: {exc}")
    try:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as exc:
        os.close(events_r)
        os.close(events_w)
        return _refused(new_sid, f"the fork did not start: {exc}")
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # see _copy_pid
    try:
        message = {"type": "fork", "workdir": workdir(new_sid)}
        _send(parent, message, [events_w, theirs.fileno()], time.monotonic() + START_BUDGET)
    except OSError as exc:  # (TimeoutError too: a parent that no longer reads is no use)
        os.close(events_r)
        ours.close()
        parent.lost = _lost_reason(exc)
        return {**_refused(sid, parent.lost), "parent_lost": True}
    finally:
        os.close(events_w)
        theirs.close()
    copy = SessionProcess(0, events_r, ours, parent.cpu_seconds)
    give_up = time.monotonic() + START_BUDGET
    pid = _copy_pid(ours, give_up)
    late = time.monotonic() >= give_up
    if pid is not None and not _adopted(pid, give_up):
        copy.close()
        remove_workdir(new_sid)
        return _refused(
            new_sid, f"the fork's copy did not become the agent's within {START_BUDGET:g} s"
        )
    if pid is None or pid in {process.pid for process in table.values()}:
        said = _fork_failure(events_r) if pid is None else None
        copy.close()
        remove_workdir(new_sid)  # what a copy that failed had copied (a late one's stays)
        if said is not None:
            return _refused(new_sid, f"the fork failed: {said}")
        if pid is None and late:
            return _refused(
                new_sid,
                f"the fork's copy did not start within {START_BUDGET:g} s (a large working "
                "directory to copy, a slow at-fork hook, or the container short of memory "
                "or processes)",
            )
        return _refused(new_sid, "the fork did not start (out of memory or processes?)")
    sv.watch(pid)  # nothing is reaped between the fork and here: it is not reaped yet
    copy.pid = pid
    table[new_sid] = copy
    return {"type": "session", "sid": new_sid, "ok": True}


def _fork_failure(events_r: int) -> str | None:
    """Why a copy that never announced itself gave up (its ``fork_failed`` event), if it said.

    Only words for the caller's error message: the copy has run the session's code, and
    nothing it says decides more than that this fork failed, which it did.
    """
    try:
        os.set_blocking(events_r, False)
        said = wire.FrameDecoder(max_frame=4096).feed(os.read(events_r, 4096))
    except (OSError, wire.WireError):
        return None
    for event in said:
        if event.get("type") == "fork_failed":
            return str(event.get("reason", ""))[:300]
    return None


def close_session(sid: int) -> None:
    """End a session: its process, the processes it started that are still its
    descendants, and its working directory (``end_tree``, ``remove_workdir``).

    Why all three: a closed fork's directory stayed in the family's ``/tmp`` (a tmpfs
    charged to its memory), so honest pruning of branches (fork, close, fork ...) ran
    the family out of space, and a process a closed fork's cell started ran on beside
    its siblings (thirty-seventh round). A process that left the session's tree (a
    daemon, adopted by the supervisor) cannot be told from a sibling's: it runs until
    the family ends, when the reset kills every process of the calls' uid.
    """
    process = table.pop(sid, None)
    if process is None:
        return
    sv.reap_children()
    if process.pid not in sv.exits:  # not reaped: the pid is still its process's (run_cell)
        end_tree(process.pid)
    end_session(process)
    remove_workdir(sid)


def end_session(process: SessionProcess) -> None:
    """Kill a session's process and collect its exit status."""
    process.close()  # its request socket closes: it leaves its loop
    if process.pid not in sv.exits:  # reaped, its pid may be another process's by now
        sv.signal_call(process.pid, signal.SIGKILL)
    _collect(process.pid)
    sv.xcpu_seconds.pop(process.pid, None)


TREE_PASSES = 5
"""Listings of ``/proc`` a session's close makes at most while killing its descendants."""
LOST_REMOVE_BUDGET = 0.2
"""The same for a session lost in a cell, whose answer the host awaits within its grace."""
REMOVE_BUDGET = 1.0
"""Seconds a closed session's directory may take to remove; what is left then is the
family's reset's (every scratch directory is emptied when the family ends)."""


def end_tree(pid: int) -> None:
    """Kill ``pid`` and its descendants, listing them again until a listing finds no new
    one (at most ``TREE_PASSES``).

    A process with SIGKILL pending cannot finish a fork, so only a child forked between
    a listing and its parent's kill can be missed: orphaned to the supervisor, it is
    lost to the tree and runs until the family ends, as a daemon does. Why not SIGSTOP
    first, so that none can fork: a session's processes share its process group, and
    under gVisor a member of that group ending while another is stopped sends the whole
    group SIGHUP, which ended the parent session a close left alone (the thirty-seventh
    session's contract run).
    """
    killed: set[int] = set()
    for _ in range(TREE_PASSES):
        found = _tree(pid) - killed
        if not found:
            break
        for each in found:
            sv.signal_call(each, signal.SIGKILL)
        killed |= found


def _tree(root: int) -> set[int]:
    """``root`` and its descendants now, by the parent pid each has in ``/proc``."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:  # (out of descriptors or memory): the root alone, as a kill did before
        return {root}
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            parent = int(reset.stat_fields(entry)[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(parent, []).append(int(entry))
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def remove_workdir(sid: int, budget: float = REMOVE_BUDGET) -> None:
    """Remove a closed session's working directory, as the calls' uid (whose files are
    in it), within ``budget`` seconds; never raises. Nothing is followed: a link put in
    its place is not opened (``trees``)."""
    path = workdir(sid)
    with identity.acting_as(sv.State.sandbox, sv.State.agent):
        try:
            if not trees.empty_directory(path, time.monotonic() + budget):
                os.rmdir(path)
        except (OSError, trees.BudgetExceeded):
            pass


def _send(
    process: SessionProcess, message: dict[str, Any], fds: list[int], deadline: float
) -> None:
    """To the session's process by ``deadline`` (``supervisor.send_to_call``: the process
    that reads it has run the session's code); TimeoutError when it does not take it.

    A process that left an earlier frame unread is killed (``UnreadFrameError``): its
    code took over the socket, and no later cell of it could be run as sent.
    """
    try:
        sv.send_to_call(process.request, wire.encode_for_call(message), fds, deadline)
    except sv.UnreadFrameError:
        end_tree(process.pid)  # (killed alone, its children would be orphaned: lost to it)
        raise


def _lost_reason(exc: OSError) -> str:
    """Why a session whose frame could not be sent is lost."""
    if isinstance(exc, sv.UnreadFrameError):
        return f"the session was killed: {exc}"
    return f"the session's process is gone ({exc})"


def _wait_started(child: sv.Child) -> bool:
    """Whether the session's process reached its loop within START_BUDGET (its started gate)."""
    give_up = time.monotonic() + START_BUDGET
    while time.monotonic() < give_up:
        if child.check_started():
            return True
        if child.gate_closed:
            return False
        select.select([child.started_r], [], [], LIVENESS_TICK)
    return child.check_started()


CREDENTIALS = struct.Struct("iII")
"""``struct ucred``: pid, uid, gid."""


def _copy_pid(sock: socket.socket, give_up: float) -> int | None:
    """The pid of the session's copy, from the kernel: None if it did not announce itself.

    Why not a pid the copy reports: it runs the session's code, which can say
    anything (``os.getpid`` replaced: a pid of 2**70 made the supervisor's
    ``waitpid`` raise, and the agent, the family and the cell's own result were
    lost as a ``sandbox_error``). With ``SO_PASSCRED`` on our end, the kernel
    attaches the sending process's own pid and uid to what it sends; a process
    without CAP_SYS_ADMIN (no call has it) cannot claim another's.
    """
    try:
        sock.settimeout(max(give_up - time.monotonic(), 0.001))
        data, ancillary, _flags, _addr = sock.recvmsg(
            len(zygote.FORKED_BYTE), socket.CMSG_SPACE(CREDENTIALS.size)
        )
    except OSError:  # (a timeout too: it stalled, or out of memory or processes)
        return None
    finally:
        sock.settimeout(None)
    if data != zygote.FORKED_BYTE:
        return None
    for level, kind, body in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            pid, uid, _gid = CREDENTIALS.unpack(body[: CREDENTIALS.size])
            if uid == sv.State.sandbox.uid and pid > 1:
                return int(pid)
    return None


def _adopted(pid: int, give_up: float) -> bool:
    """Whether ``pid`` is (by ``give_up``) the supervisor's own child, as a fork's copy is:
    its parent, the session's middle process, exits at once and PID 1 adopts it
    (``zygote._fork_session``). Such a pid stays the process's until the supervisor reaps
    it, so every signal sent to it reaches the process that announced itself.

    Why: the middle holds the copy's request socket too, and a cell's
    ``os.register_at_fork`` hook runs there. Announced from the middle, its pid, reaped by
    the session at once and free for the next process, was watched, interrupted and killed
    (thirty-third red-team round). Not a proof that the announcer is the copy: an orphan
    the code makes is adopted too, and within its family the code chooses which of its
    processes answers for a fork, as it chooses what the fork runs (docs/security.md,
    finding 83)."""
    while True:
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            return True
        except ChildProcessError:
            if time.monotonic() >= give_up:
                return False
            time.sleep(0.002)


def _discard_stale_events(process: SessionProcess) -> None:
    """Before a cell: drop what earlier cells left on the events pipe, and any half frame."""
    zygote.discard_pending(process.events_r)
    process.events = wire.FrameDecoder(max_frame=wire.EVENT_FRAME_LIMIT)


def _collect(pid: int, wait: float = 0.5) -> int | None:
    """The wait status of a session process that ended, if known within ``wait`` seconds
    (every session process is PID 1's child: ``forking``, and a fork's copy is orphaned)."""
    give_up = time.monotonic() + wait
    while True:
        sv.take_exit_messages()
        if pid in sv.exits:
            return sv.exits.pop(pid)
        if time.monotonic() > give_up:
            return None
        time.sleep(0.005)


def _ended(pid: int) -> bool:
    """Whether the session's process ended, by its exit status (the supervisor reaps it).

    Why not its state in ``/proc``: a process whose main thread ended shows that thread,
    the group's leader, as a zombie while its other threads run on; the cell read as
    killed by SIGKILL within a second, its session lost, and the process ran on in the
    family's container (twentieth red-team round). The kernel reports a process's end
    only once its last thread has ended."""
    sv.reap_children()
    return pid in sv.exits


def run_cell(sid: int, request: dict[str, Any]) -> dict[str, Any]:
    process = table.get(sid)
    result: dict[str, Any] = {
        "type": "result",
        "sid": sid,
        "returncode": None,
        "timed_out": False,
        "oom": False,
        "cpu_limit": False,
        "stdout": "",
        "stdout_dropped": 0,
        "stderr": "",
        "stderr_dropped": 0,
        "cells": [],
        "lost": None,
    }
    if process is None or process.lost:
        result["lost"] = process.lost if process else "no such session"
        return result
    timeout = float(request["timeout"])
    cap = int(request.get("read_cap", 16384))
    caps = wire.text_caps(request)
    started = time.monotonic()
    deadline = started + timeout
    oom_before = sv.oom_kills()
    _discard_stale_events(process)
    token = os.urandom(16).hex()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    undeliverable = False
    try:
        cell_frame = {
            "type": "cell",
            "code": str(request.get("code", "")),
            "token": token,
            "text_cap": caps[0],
        }
        _send(process, cell_frame, [out_w, err_w], deadline)
    except TimeoutError:
        undeliverable = True  # it stopped taking cells (its code saw to it): time is up
        end_tree(process.pid)
        process.lost = f"the session's process did not take its cell within {timeout:g} s"
    except OSError as exc:
        process.lost = _lost_reason(exc)
    finally:
        os.close(out_w)
        os.close(err_w)
    tails = {out_r: sv.Tail(cap), err_r: sv.Tail(cap)}
    open_pipes = {out_r, err_r}
    poller = select.poll()
    for fd in (out_r, err_r, process.events_r):
        os.set_blocking(fd, False)
        poller.register(fd, select.POLLIN)
    cell: dict[str, Any] | None = None
    interrupted = False
    cell_timed_out = False
    while cell is None and process.lost is None:
        now = time.monotonic()
        if now >= deadline:
            if interrupted:
                end_tree(process.pid)  # with what it started, still its own
                process.lost = (
                    f"the cell did not stop within {sv.INTERRUPT_GRACE:.0f} s of its "
                    f"{timeout:g} s timeout, so the session was killed"
                )
                break
            cell_timed_out = interrupted = True
            sv.signal_call(process.pid, signal.SIGINT)
            deadline = now + sv.INTERRUPT_GRACE
        wait = min(deadline - now, LIVENESS_TICK)
        for fd, _event in poller.poll(max(1, int(wait * 1000))):
            if fd == process.events_r:
                try:
                    data = os.read(fd, sv.CHUNK)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    poller.unregister(fd)
                    continue
                try:
                    for event in process.events.feed(data):
                        if event.get("type") == "cell_end" and event.get("token") == token:
                            cell = event  # any other end (forged, stale) is ignored
                except wire.WireError:
                    process.lost = "the session's process broke its event stream"
            elif fd in open_pipes:
                sv.pump(fd, tails, open_pipes, poller)
        if cell is None and process.lost is None and _ended(process.pid):
            process.lost = "the session's process ended"
    for fd in list(open_pipes):
        sv.drain_pipe(fd, tails, open_pipes, poller, close=True)
    oom_after = sv.oom_kills()
    status = None
    if process.lost is not None:
        # Not reaped, so the pid is still its own (no other session of the family can
        # have drawn it since: the pid counter would have had to come round).
        if process.pid not in sv.exits:
            # A lost session's process never runs on, nor what it started that is still
            # its own (``close_session``).
            end_tree(process.pid)
        status = _collect(process.pid)
        oom = oom_before is not None and oom_after is not None and oom_after > oom_before
        if oom:
            process.lost = "the session ran out of memory and was killed"
        result["oom"] = oom
        if status is not None:
            result["returncode"] = sv.decode_status(status)
            result["cpu_limit"] = sv.reached_cpu_limit(
                process.pid, result["returncode"], process.cpu_seconds
            )
            if os.WIFEXITED(status):
                process.lost = f"the session's interpreter exited (status {os.WEXITSTATUS(status)})"
        result["lost"] = process.lost
        table.pop(sid, None)
        process.close()
        remove_workdir(sid, LOST_REMOVE_BUDGET)  # the cell's answer is due: the rest later
    else:
        error = sv._errors((cell or {}).get("error"), caps)
        result["returncode"] = 1 if error else 0
        result["cells"] = [
            {
                "display": sv._display((cell or {}).get("display"), caps),
                "error": error,
                "finished": True,
                "timed_out": cell_timed_out,
            }
        ]
    result["timed_out"] = (
        cell_timed_out or undeliverable or (process.lost is not None and interrupted)
    )
    out, err = tails[out_r], tails[err_r]
    result.update(
        stdout=out.text(),
        stdout_dropped=out.dropped,
        stderr=err.text(),
        stderr_dropped=err.dropped,
        duration=time.monotonic() - started,
        started=True,
    )
    return result
