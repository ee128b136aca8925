"""Stateful sessions: families do not see each other, forks do not touch their parent,
a family leaves nothing behind, no cell forges another's record, timeouts hold.

Each case is a script of session steps (``SessionStep``): open families,
fork, run cells, close (see ``runner._run_steps``). What a session promises
and what it does not is in docs/security.md, "Sessions"; in short, a *family*
(a session and its forks) is the unit of isolation: families are separated
like calls, while a family's own sessions share a uid and a container. Inside
one session, code left running by an earlier cell (a thread, a child) is the
interpreter's state: it runs in whatever cell is current, as in Jupyter.
"""

from __future__ import annotations

import contextlib

from retool_exec._models import ExecResult, Outcome
from retool_exec.security.model import (
    Case,
    CaseClass,
    Expect,
    Inconclusive,
    Observation,
    SessionStep,
    Severity,
    StepAction,
)
from retool_exec.security.snippets import code

__all__ = ["CASES"]


_DEEP_NESTING = code("""
    import struct
    payload = b"[" * 5000  # fits a pipe's buffer; json's C decoder recurses per level
    frame = struct.pack(">I", len(payload)) + payload
    written = []
    for fd in range(3, 256):
        try:
            os.set_blocking(fd, False)
            os.write(fd, frame)
            written.append(fd)
        except OSError:
            pass
    print(json.dumps({"written": written}), flush=True)
    print("a wrong answer")
    raise ValueError("the code failed on its own")
""")


_STOP_AFTER_CELL = code("""
    import select, signal, threading

    def sockets():
        found = []
        for name in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                    found.append(int(name))
            except OSError:
                pass
        return found

    def stop_when_the_next_cell_comes():
        # The agent sends the next cell on the session's socket only once this cell has
        # ended: when it starts to arrive, stop (its rest is left to send).
        select.select(sockets(), [], [])
        os.kill(os.getpid(), signal.SIGSTOP)

    threading.Thread(target=stop_when_the_next_cell_comes, daemon=True).start()
    report(stopping=True)
""")

_BIG_CELL = "x = 1\n# " + "A" * 8_000_000 + "\nprint('the big cell ran')\n"
"""Far larger than a unix socket's buffer: its send blocks until the process reads it,
and a reader that is quick cannot take all of it before the stop lands."""

_BIG_CELL_TIMEOUT = 3.0


def _big_cell_timed_out(obs: Observation) -> bool:
    """A timeout on time. A cell that ran to its end shows the stop never landed (the
    process read the whole cell before its stopping thread got a core): inconclusive."""
    cell = obs.cell("attack")
    on_time = cell.latency <= _BIG_CELL_TIMEOUT + 1.5
    if cell.outcome is Outcome.SUCCESS and cell.stdout == "the big cell ran\n" and on_time:
        raise Inconclusive("the process read the whole cell before it stopped")
    return cell.outcome is Outcome.TIMEOUT and on_time


_SURROGATE_VALUE = code("""
    class Value:
        def __repr__(self):
            return "ok \\ud800 end"  # a lone surrogate: repr allows it, UTF-8 does not
    Value()
""")


def _value_is_utf8(obs: Observation) -> bool:
    cell = obs.cell("attack")
    try:
        cell.model_dump_json().encode("utf-8")  # what a server sends, a tokenizer reads
    except ValueError:  # (pydantic's serialization error, a UnicodeError)
        return False
    return cell.outcome is Outcome.SUCCESS and "ok ? end" in str(cell.cells[0].display)


def _fork_unharmed(obs: Observation) -> bool:
    """The fork's cell and the parent's next one are their code's own results."""
    try:
        attack, parent = obs.cell("attack"), obs.cell("parent-after")
    except KeyError:
        return False
    return (
        attack.outcome is Outcome.SUCCESS
        and attack.stdout == "42\n"
        and parent.outcome is Outcome.SUCCESS
        and parent.stdout == "41\n"
    )


def _fork_refused_parent_kept(obs: Observation) -> bool:
    """The fork is refused as a fork's failure (not the family lost), and the parent's
    next cell is its code's own result."""
    refusal = obs.refused.get("fork:f", "")
    try:
        parent = obs.cell("parent-after")
    except KeyError:
        return False
    return (
        refusal.startswith("SessionError:")
        and parent.outcome is Outcome.SUCCESS
        and parent.stdout == "42\n"
    )


_NEST_3000 = """
    x = 41
    fd = os.open(".", os.O_RDONLY)
    for _ in range(3000):
        os.mkdir("d", dir_fd=fd)
        fd, old = os.open("d", os.O_RDONLY, dir_fd=fd), fd
        os.close(old)
    os.close(fd)
"""


_PEEK_LATER_CELLS = code("""
    import array, socket, sys

    # Take over the session's loop: read each later cell with MSG_PEEK (SO_PEEK_OFF moves
    # the offset on), so its frame and the two pipes sent with it stay in flight, charged
    # to the supervisor, while the cell runs as usual on the peeked copies.
    agent = next(module for module in list(sys.modules.values())
                 if hasattr(module, "_receive_raw") and hasattr(module, "run_session"))
    in_flight = {"frames": 0}

    def peeking_receive(sock, fds_wanted=2):
        if not in_flight["frames"]:
            sock.setsockopt(socket.SOL_SOCKET, 42, 0)  # SO_PEEK_OFF
        header_size = agent.wire.FRAME_HEADER.size
        header, ancillary, _flags, _addr = sock.recvmsg(
            header_size, socket.CMSG_SPACE(8), socket.MSG_PEEK)
        fds = array.array("i")
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - len(data) % 4])
        (size,) = agent.wire.FRAME_HEADER.unpack(header)
        payload = b""
        while len(payload) < size:
            payload += sock.recv(size - len(payload), socket.MSG_PEEK)
        in_flight["frames"] += 1
        return agent.wire.decode_for_call(payload), list(fds)

    agent._receive_raw = peeking_receive
    report(patched=True)
""")

_PEEKED_CELL = "report(in_flight=in_flight['frames'])\n"
_PEEKED_CELLS = ("c1", "c2", "c3", "attack")


def _one_frame_in_flight(obs: Observation) -> bool:
    """Contained when no cell ran with more than its own frame left unread: the next one
    was refused (the session lost), or peeking did not work at all."""
    in_flight = [0]
    for name in _PEEKED_CELLS:
        with contextlib.suppress(KeyError, ValueError):  # not run, or lost before its report
            in_flight.append(int(obs.cell_facts(name)["in_flight"]))
    return max(in_flight) <= 1


_ANNOUNCE_FROM_THE_MIDDLE = """
    import socket, sys

    x = 41
    home = os.getcwd()
    found = [getattr(m, "FORKED_BYTE", None) for m in list(sys.modules.values())]
    hello = [value for value in found if isinstance(value, bytes)]
    announced = []

    def announce():
        # Runs in the first child of the agent's fork (its middle process), which holds
        # the copy's request socket too: say hello from there, before the copy can.
        if announced or not hello:
            return
        announced.append(1)
        for fd in sorted((int(n) for n in os.listdir("/proc/self/fd")), reverse=True):
            try:
                if fd > 4 and os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                    socket.socket(fileno=os.dup(fd)).send(hello[0])
                    return
            except OSError:
                pass

    os.register_at_fork(after_in_child=announce)
    report(hello=bool(hello))
"""

_BEAT_ON = """
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        with open(f"{home}/beat", "a") as handle:
            handle.write("x")
        time.sleep(0.01)
"""

_BEAT_STOPPED = """
    path = f"{home}/beat"
    before = os.path.getsize(path) if os.path.exists(path) else 0
    time.sleep(1.0)
    after = os.path.getsize(path) if os.path.exists(path) else 0
    report(before=before, after=after)
"""


def _lost_fork_stopped(obs: Observation) -> bool:
    """Contained: no process of the fork writes on once its cell is over (the fork was
    refused, or its process was the one killed when its session was lost). The attack
    must have been made: its hook found the agent's hello to send."""
    try:
        planted, beat = obs.cell_facts("plant"), obs.cell_facts("after")
    except (KeyError, ValueError):
        return False
    if not planted["hello"]:
        raise Inconclusive("the agent's fork hello was not found: the attack was not made")
    return bool(beat["after"] == beat["before"])


def _open(session: str) -> SessionStep:
    return SessionStep(StepAction.OPEN, session)


def _fork(parent: str, session: str) -> SessionStep:
    return SessionStep(StepAction.FORK, session, parent=parent)


def _cell(session: str, name: str, text: str, timeout: float | None = None) -> SessionStep:
    return SessionStep(StepAction.CELL, session, code=code(text), name=name, timeout=timeout)


def _close(session: str) -> SessionStep:
    return SessionStep(StepAction.CLOSE, session)


# -- (a) another family's state and files ----------------------------------------------

_NEEDLES = """
    import hashlib

    def needle(kind):
        # Computed at run time: the canaries never appear in any code the host sends.
        return hashlib.sha256(f"{TOKEN}:{kind}".encode()).hexdigest()
"""

_PLANT = (
    _NEEDLES
    + """
    SESSION_CANARY = needle("globals")
    SESSION_HEAP = [needle("heap") * 4]
    with open(f"{TOKEN}-canary", "w") as handle:
        handle.write(needle("file"))
    report(planted=True)
"""
)

_PLANT_ALIVE = (
    _NEEDLES
    + """
    with open(f"{TOKEN}-canary") as handle:
        on_disk = handle.read() == needle("file")
    report(alive=SESSION_CANARY == needle("globals") and on_disk)
"""
)

_SEARCH = (
    _NEEDLES
    + """
    import gc, stat
    texts = {kind: needle(kind) for kind in ("globals", "heap", "file")}
    raw = {kind: value.encode() for kind, value in texts.items()}
    found, budget = [], time.monotonic() + 6
    me = os.getpid()

    def check(where, data):
        for kind, value in (raw if isinstance(data, bytes) else texts).items():
            if value in data:
                found.append(f"{where}: {kind}")

    # 1. This interpreter's own objects: a namespace or list of the other family's.
    for obj in gc.get_objects():
        if isinstance(obj, dict) and "SESSION_CANARY" in obj:
            found.append("gc: a namespace holding SESSION_CANARY")
        elif isinstance(obj, list) and obj and isinstance(obj[0], str) and len(obj[0]) == 256:
            check("gc: a list", obj[0])

    # 2. Every name and small file under /tmp and /dev/shm.
    def read_head(path):
        try:
            with open(path, "rb") as handle:
                return handle.read(1 << 16)
        except OSError:
            return b""

    seen = 0
    for top in ("/tmp", "/dev/shm"):
        for root, dirs, files in os.walk(top):
            for name in dirs + files:
                seen += 1
                path = os.path.join(root, name)
                if TOKEN in name:
                    found.append(f"listing: {path}")
                try:
                    info = os.lstat(path)
                except OSError:
                    continue
                if stat.S_ISREG(info.st_mode) and info.st_size < (1 << 20):
                    check(f"file {path}", read_head(path))
                if seen > 20000 or time.monotonic() > budget - 3:
                    break
            else:
                continue
            break

    # 3. /proc: other processes' working directories, environment, command line,
    # open files, and memory (the readable, writable mappings).
    pids = sorted((int(e) for e in os.listdir("/proc") if e.isdigit()), reverse=True)
    scanned = 0
    for pid in pids:
        if pid == me or time.monotonic() > budget:
            continue
        base = f"/proc/{pid}"
        try:
            for name in os.listdir(f"{base}/cwd"):
                if TOKEN in name:
                    found.append(f"{base}/cwd: {name}")
                    check(f"{base}/cwd/{name}", read_head(f"{base}/cwd/{name}"))
        except OSError:
            pass
        for part in ("environ", "cmdline"):
            check(f"{base}/{part}", read_head(f"{base}/{part}"))
        try:
            for fd in os.listdir(f"{base}/fd"):
                try:
                    if stat.S_ISREG(os.stat(f"{base}/fd/{fd}").st_mode):
                        check(f"{base}/fd/{fd}", read_head(f"{base}/fd/{fd}"))
                except OSError:
                    pass
        except OSError:
            pass
        try:
            with open(f"{base}/comm") as handle:
                if not handle.read().startswith("python"):
                    continue
            with open(f"{base}/maps") as handle:
                regions = [line.split() for line in handle]
            with open(f"{base}/mem", "rb", buffering=0) as mem:
                for fields in regions:
                    if not fields[1].startswith("rw"):
                        continue  # code and constants: not where a running program keeps data
                    start, end = (int(x, 16) for x in fields[0].split("-"))
                    offset = start
                    while offset < end and scanned < (512 << 20) and time.monotonic() < budget:
                        size = min(end - offset, 4 << 20)
                        try:
                            mem.seek(offset)
                            check(f"memory of {pid}", mem.read(size))
                        except (OSError, ValueError, OverflowError):
                            break
                        scanned += size
                        offset += size
        except OSError:
            pass
    report(found=sorted(set(found)), entries=seen, pids=len(pids) - 1, scanned_mb=scanned >> 20)
"""
)


def _not_found(obs: Observation) -> bool:
    return obs.cell_facts("attack")["found"] == [] and obs.cell_facts("alive")["alive"] is True


# -- (b) a fork's changes stay in the fork -------------------------------------------

_SNAPSHOT = """
    import json

    def read(path):
        try:
            with open(path) as handle:
                return handle.read()
        except OSError as exc:
            return why(exc)

    def snapshot():
        return {
            "numbers": numbers,
            "counter": counter,
            "module": getattr(json, "session_flag", None),
            "environ": os.environ.get("RETOOL_SESSION_FLAG"),
            "state.txt": read("state.txt"),
            "sub/inner.txt": read("sub/inner.txt"),
            "gone.txt": os.path.exists("gone.txt"),
            "fork-only": os.path.exists(f"{TOKEN}-fork-only"),
        }
"""

_ORIGINAL = {
    "numbers": [1, 2, 3],
    "counter": 10,
    "module": "parent",
    "environ": "parent",
    "state.txt": "parent",
    "sub/inner.txt": "parent",
    "gone.txt": True,
    "fork-only": False,
}
_CHANGED = {
    "numbers": [1, 2, 3, 99],
    "counter": 11,
    "module": "fork",
    "environ": "fork",
    "state.txt": "fork",
    "sub/inner.txt": "parent+fork",
    "gone.txt": False,
    "fork-only": True,
}

_SETUP = """
    import json
    numbers, counter = [1, 2, 3], 10
    json.session_flag = "parent"
    os.environ["RETOOL_SESSION_FLAG"] = "parent"
    os.mkdir("sub")
    for path in ("state.txt", "sub/inner.txt", "gone.txt"):
        with open(path, "w") as handle:
            handle.write("parent")
    report(ready=True)
"""

_CHANGE = (
    _SNAPSHOT
    + """
    numbers.append(99)
    counter += 1
    json.session_flag = "fork"
    os.environ["RETOOL_SESSION_FLAG"] = "fork"
    with open("state.txt", "w") as handle:
        handle.write("fork")
    with open("sub/inner.txt", "a") as handle:
        handle.write("+fork")
    os.unlink("gone.txt")
    open(f"{TOKEN}-fork-only", "w").close()
    report(state=snapshot())
"""
)

_LOOK = _SNAPSHOT + "\n    report(state=snapshot())\n"


def _fork_private(obs: Observation) -> bool:
    states = [obs.cell_facts(name)["state"] for name in ("attack", "parent", "sibling")]
    return states == [_CHANGED, _ORIGINAL, _ORIGINAL]


# -- (c) nothing of a family outlives it -------------------------------------------------

_LEAVE = """
    with open(f"{TOKEN}-cwd", "w") as handle:
        handle.write("left by a session family")
    for directory in ("/tmp", "/dev/shm"):
        with open(f"{directory}/{TOKEN}-left", "w") as handle:
            handle.write("left by a session family")
    key = int(TOKEN[2:9], 16)
    shmid = libc.shmget(key, 4096, 0o1000 | 0o600)  # IPC_CREAT
    librt.mq_open.restype = ctypes.c_int
    mqd = librt.mq_open(f"/{TOKEN}".encode(), os.O_CREAT | os.O_RDWR, 0o600, None)

    def linger(deadline):
        while time.monotonic() < deadline:
            time.sleep(0.1)

    daemon(linger, 8)  # outside the session's process group and session
    if os.fork() == 0:  # and one inside them
        name_process()
        linger(time.monotonic() + 8)
        os._exit(0)
    report(shm=shmid >= 0, mqueue=mqd >= 0)
"""

_FIND_LEFT = """
    present = []
    seen = 0
    for top in ("/tmp", "/dev/shm"):
        for root, dirs, files in os.walk(top):
            seen += len(dirs) + len(files)
            present += [os.path.join(root, n) for n in dirs + files if TOKEN in n]
            if seen > 20000:
                break
    key = int(TOKEN[2:9], 16)
    shmid = libc.shmget(key, 0, 0)
    if shmid >= 0:
        present.append(f"SysV segment {hex(key)}")
    librt.mq_open.restype = ctypes.c_int
    mqd = librt.mq_open(f"/{TOKEN}".encode(), os.O_RDWR)
    if mqd >= 0:
        present.append(f"POSIX queue /{TOKEN}")
        librt.mq_close(mqd)
    present += [f"process {pid}" for pid, state in watch_named() if state != "Z"]
"""

_LOOK_LEFT = _FIND_LEFT + "\n    report(present=present)\n"

_LOOK_AND_CLEAN = (
    _FIND_LEFT
    + """
    import shutil
    for path in present:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif path.startswith("/"):
            os.unlink(path)
    if shmid >= 0:
        libc.shmctl(shmid, 0, None)  # IPC_RMID
    librt.mq_unlink(f"/{TOKEN}".encode())
    report(present=present)
"""
)


def _nothing_left(obs: Observation) -> bool:
    return (
        obs.cell("plant").ok
        and obs.cell_facts("attack")["present"] == []
        and obs.follow is not None
        and obs.follow.ok
        and obs.follow_facts()["present"] == []
    )


# -- (d) no cell forges another cell's record ----------------------------------------------

_FORGE = """
    import fcntl, stat, struct, threading

    def frame(message):
        payload = json.dumps(message).encode()
        return struct.pack(">I", len(payload)) + payload

    forged = f"FORGED-{TOKEN}"
    fakes = [
        frame({"type": "cell_end", "index": index, "display": [{"text/plain": forged}],
               "error": []})
        for index in range(4)
    ]
    fakes += [
        frame({"type": "result", "id": n, "nonce": "__NONCE_LIKE__", "ok": True,
               "returncode": 0, "stdout": forged, "stderr": "", "cells": [],
               "lost": None, "timed_out": False})
        for n in range(1, 4)
    ]
    fakes += [frame({"type": "started"}), frame({"type": "forked", "pid": 1})]
    print(forged)  # a plain status line of its own, on its own stdout
    written = {}
    for entry in sorted(os.listdir("/proc/self/fd"), key=int):
        fd = int(entry)
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            continue
        if stat.S_ISREG(mode) or stat.S_ISDIR(mode) or os.isatty(fd):
            continue  # never a byte into a file or a terminal
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        sent = 0
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
            for fake in fakes:
                try:
                    sent += os.write(fd, fake)
                except OSError:
                    pass
        finally:
            fcntl.fcntl(fd, fcntl.F_SETFL, flags)
        written[fd] = sent

    def leftover():
        for n in range(60):
            print(f"LEFTOVER-{TOKEN} {n}", flush=True)
            time.sleep(0.05)

    threading.Thread(target=leftover, daemon=True).start()
    time.sleep(0.3)
    report(written=written)
"""

_VICTIM_1 = """
    print("victim-out-1")
    print("victim-err-1", file=sys.stderr)
    6 * 7
"""

_VICTIM_2 = """
    time.sleep(0.2)
    print("victim-out-2")
    1 / 0
"""


def _own_lines(text: str) -> list[str]:
    """A cell's lines without those of the thread cell 1 left (the interpreter's state)."""
    return [line for line in text.splitlines() if not line.startswith("LEFTOVER-")]


def _unforged(result: ExecResult, stdout: str) -> bool:
    """One cell record, its own stdout line (besides the leftover thread's), nothing forged."""
    return (
        len(result.cells) == 1
        and _own_lines(result.stdout) == [stdout]
        and "FORGED" not in repr(result.model_dump())
    )


def _first_is_own(result: ExecResult) -> bool:
    """``print(...); print(..., file=sys.stderr); 6 * 7``."""
    return (
        _unforged(result, "victim-out-1")
        and result.outcome is Outcome.SUCCESS
        and result.stderr == "victim-err-1\n"
        and result.cells[0].display == [{"text/plain": "42"}]
        and result.cells[0].error == []
    )


def _second_is_own(result: ExecResult) -> bool:
    """``time.sleep(0.2); print(...); 1 / 0``."""
    return (
        _unforged(result, "victim-out-2")
        and result.outcome is Outcome.ERROR
        and result.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
        and result.cells[0].display == []
        and [record.get("ename") for record in result.cells[0].error] == ["ZeroDivisionError"]
    )


def _lost(obs: Observation, name: str) -> bool:
    """The session ended explicitly before or in cell ``name`` (no record to forge)."""
    if name in obs.refused:
        return "SessionLostError" in obs.refused[name]
    return obs.cells[name].detail.startswith("session lost")


def _records_own(obs: Observation) -> bool:
    first, second = obs.cells.get("victim-1"), obs.cells.get("victim-2")
    ok_first = _lost(obs, "victim-1") or (first is not None and _first_is_own(first))
    ok_second = _lost(obs, "victim-2") or (second is not None and _second_is_own(second))
    return ok_first and ok_second


# -- (e) a cell that will not be interrupted ------------------------------------------------

_STUBBORN_TIMEOUT = 2.0

_STUBBORN = """
    report(stubborn=True)
    spins = 0
    while True:
        try:
            while True:  # not a bare `while True: pass`: CPython 3.11 may not catch in that one
                spins += 1
        except KeyboardInterrupt:
            continue
"""


def _killed_and_lost(obs: Observation) -> bool:
    result = obs.cell("attack")
    took = result.latency - result.queue_wait
    return (
        result.timed_out
        and result.outcome is Outcome.TIMEOUT
        and result.detail.startswith("session lost")
        and took <= _STUBBORN_TIMEOUT + 2.0
        and "SessionLostError" in obs.refused.get("after", "")
        and "SessionLostError" in obs.refused.get("fork-after", "")
    )


# -- (f) a process whose main thread ended ---------------------------------------------

_LEADER_EXITS_TIMEOUT = 2.0

_LEADER_EXITS = """
    import platform, threading
    SYS_EXIT = {"x86_64": 60, "aarch64": 93}[platform.machine()]
    libc = ctypes.CDLL(None, use_errno=True)

    def keep_writing():
        while True:
            with open(f"/tmp/{TOKEN}-alive", "a") as handle:
                handle.write("x")
            time.sleep(0.05)

    threading.Thread(target=keep_writing).start()
    time.sleep(0.2)
    libc.syscall(SYS_EXIT, 0)  # this thread only: the process lives on in the other one
"""

_STILL_WRITING = """
    def size():
        try:
            return os.path.getsize(f"/tmp/{TOKEN}-alive")
        except OSError:
            return -1
    before = size()
    time.sleep(0.5)
    grew = size() > before
    try:
        os.remove(f"/tmp/{TOKEN}-alive")  # (local: the host's /tmp) nothing is left behind
    except OSError:
        pass
    report(before=before, grew=grew)
"""


def _leader_exit_is_no_end(obs: Observation) -> bool:
    """The cell ran on (its thread did) until its limit, and was then killed: a timeout
    (its lateness is ``res-session-ignores-interrupt``'s to judge; here only that it
    came); and nothing of it writes on while the family's next cell runs."""
    attack = obs.cell("attack")
    try:
        still_writing = bool(obs.cell_facts("check")["grew"])
    except (KeyError, ValueError):
        return False
    return (
        attack.outcome is Outcome.TIMEOUT
        and attack.latency - attack.queue_wait <= _LEADER_EXITS_TIMEOUT + 3.0
        and not still_writing
    )


# -- (f) a cell's end too large for the events pipe -------------------------------------------

_OVERSIZED_END = """
    class Quiet(str):  # says it is empty, and slices to itself
        def __len__(self):
            return 0

        def __getitem__(self, key):
            return self

    class Failure(Exception):
        def __str__(self):
            return Quiet("\\U0001F600" * 400_000)

    raise Failure()
"""


def _end_cut_not_killed(obs: Observation) -> bool:
    """The cell's own error, not a kill it did not earn; the session's state lives on."""
    attack, check = obs.cells.get("attack"), obs.cells.get("check")
    if attack is None or check is None:
        return False
    names = [record.get("ename") for cell in attack.cells for record in cell.error]
    return (
        attack.outcome is Outcome.ERROR
        and attack.returncode == 1
        and names == ["Failure"]
        and check.stdout == "42\n"
    )


CASES: tuple[Case, ...] = (
    Case(
        id="iso-session-other-family",
        klass=CaseClass.ISOLATION,
        title="a session family finds nothing of another open family (objects, /tmp, /proc, "
        "memory)",
        code="",
        session_steps=(
            _open("a"),
            _cell("a", "plant", _PLANT),
            _open("b"),
            _cell("b", "attack", _SEARCH, timeout=15),
            _cell("a", "alive", _PLANT_ALIVE),
        ),
        contained=_not_found,
        severity=Severity.HIGH,
        reference="E2B/SandboxFusion per-session sandboxes; codejail 'can't see other sandboxes'",
        catalogue=(42,),
        exclusive=True,
        note="family A plants canaries (globals, a heap list, a file in its working directory) "
        "computed at run time; family B, open at the same time, searches its own objects, "
        "every name and small file in /tmp and /dev/shm, other processes' cwd, environ, "
        "cmdline, open files and memory. A's last cell proves the canaries were still there.",
    ),
    Case(
        id="iso-session-fork-private",
        klass=CaseClass.ISOLATION,
        title="a fork's changes to variables, modules, environ and files reach neither its "
        "parent nor its sibling",
        code="",
        session_steps=(
            _open("p"),
            _cell("p", "setup", _SETUP),
            _fork("p", "c1"),
            _fork("p", "c2"),
            _cell("c1", "attack", _CHANGE),
            _cell("p", "parent", _LOOK),
            _cell("c2", "sibling", _LOOK),
        ),
        contained=_fork_private,
        severity=Severity.MEDIUM,
        reference="the session contract: fork() returns an independent copy of the state",
        exclusive=True,
        local=Expect.CONTAINED,
        note="state = a list, an int, a module attribute, os.environ, files in the working "
        "directory (overwritten, appended in a subdirectory, deleted, created); the fork's "
        "own view must show its changes, so the case cannot pass by not making them. Files "
        "by absolute path are not separated inside a family (see docs/security.md).",
    ),
    Case(
        id="iso-session-family-end",
        klass=CaseClass.ISOLATION,
        title="nothing of an ended session family (files, IPC, processes) reaches the next "
        "family or the next call",
        code="",
        session_steps=(
            _open("a"),
            _cell("a", "plant", _LEAVE),
            _close("a"),
            _open("b"),
            _cell("b", "attack", _LOOK_LEFT),
        ),
        follow_up=code(_LOOK_AND_CLEAN),
        contained=_nothing_left,
        severity=Severity.HIGH,
        reference="Jupyter kernels share /tmp and IPC with the server; iso-* cases for calls",
        catalogue=(41, 42),
        exclusive=True,
        note="the family leaves a file in its working directory, /tmp and /dev/shm, a SysV "
        "segment, a POSIX queue, a process in its group and a double-forked one outside it; "
        "the next family (after the first closed) and the next stateless call look for all "
        "of them (names anywhere under /tmp and /dev/shm).",
    ),
    Case(
        id="proto-session-forged-cell",
        klass=CaseClass.PROTOCOL,
        title="a cell's fake frames on every descriptor (fd 3 and 4 included) forge no later "
        "cell's record",
        code="",
        session_steps=(
            _open("s"),
            _cell("s", "attack", _FORGE),
            _cell("s", "victim-1", _VICTIM_1),
            _cell("s", "victim-2", _VICTIM_2),
        ),
        contained=_records_own,
        severity=Severity.HIGH,
        reference="proto-forged-records for calls; a trainer's check cell after the model's cells",
        exclusive=True,
        note="cell 1 writes well-formed frames (cell_end events for cells 0-3 that are also "
        "the local driver's answers, result frames with a nonce-like, started/forked events) "
        "to every pipe, socket and device it holds, a plain status line to its stdout, then "
        "leaves a thread printing LEFTOVER lines. Contained: the next two cells' "
        "stdout (without LEFTOVER lines), stderr, display, error and outcome are exactly "
        "their own, or the session was ended explicitly. What is NOT checked, because it "
        "is the interpreter's state: the leftover thread's bytes land in whichever cell is "
        "running, and code still running in the interpreter during a later cell (a thread, "
        "monkeypatched internals) can shape that cell, as in Jupyter.",
    ),
    Case(
        id="res-session-ignores-interrupt",
        klass=CaseClass.RESOURCES,
        title="a cell that swallows KeyboardInterrupt is killed and its session reported lost "
        "within timeout + 2 s",
        code="",
        session_steps=(
            _open("s"),
            _cell("s", "setup", "value = 41\nreport(ready=True)\n"),
            _cell("s", "attack", _STUBBORN, timeout=_STUBBORN_TIMEOUT),
            _cell("s", "after", "print(value + 1)\n"),
            SessionStep(StepAction.FORK, "s2", parent="s", name="fork-after"),
        ),
        contained=_killed_and_lost,
        severity=Severity.MEDIUM,
        reference="the sessions issue: interrupt first, kill after a grace, never a silent "
        "fresh interpreter",
        exclusive=True,
        local=Expect.CONTAINED,
        note="contained: the cell times out, is killed, its result says 'session lost' within "
        "timeout + 2 s, and the next cell and a fork both raise SessionLostError.",
    ),
    Case(
        id="proto-session-events-deep-nesting",
        klass=CaseClass.PROTOCOL,
        title="a cell that writes JSON nested deeper than the decoder's stack to every "
        "descriptor it holds gets its own failure as its outcome, never a sandbox error",
        code="",
        session_steps=(
            _open("s"),
            _cell("s", "attack", _DEEP_NESTING),
        ),
        contained=lambda obs: obs.cell("attack").outcome is not Outcome.SANDBOX_ERROR,
        severity=Severity.HIGH,
        exclusive=True,
        reference="the second red-team round (2026-12-02): RecursionError is not a ValueError, "
        "so the agent's frame decoder let it through and the agent failed: a sandbox error "
        "(which a trainer drops) of the cell's making, and notebook calls retried elsewhere",
        local=Expect.CONTAINED,
        note="A session's (and a notebook call's) cells report on an events pipe; what the "
        "agent cannot decode there is the code's garbage: the session is ended and its cell "
        "says so ('session lost', with the outcome of the code's own end), a notebook call "
        "is ended likewise. Descriptors left non-blocking may make the session's interpreter "
        "exit by itself (status 70, an error): also the code's doing.",
    ),
    Case(
        id="proto-session-stops-reading",
        klass=CaseClass.PROTOCOL,
        title="a session whose process stops reading its cells gets a timeout for the next "
        "cell, on time, never a sandbox error",
        code="",
        session_steps=(
            _open("s"),
            _cell("s", "stop", _STOP_AFTER_CELL),
            _cell("s", "attack", _BIG_CELL, timeout=_BIG_CELL_TIMEOUT),
        ),
        contained=_big_cell_timed_out,
        severity=Severity.HIGH,
        reference="the third red-team round (2026-12-02): the agent sent the next cell with "
        "a blocking send, so a process that no longer read (stopped, or its loop patched) held "
        "the agent past every deadline: a sandbox error and, for a notebook call, a second run",
        exclusive=True,
        local=Expect.NOT_APPLICABLE,
        local_reason="the local backend's sessions have no agent that sends cells; its "
        "outcome races the stop (seen both ways)",
        note="The first cell leaves a thread that stops its own process as the next cell "
        "starts to arrive on its socket; that cell is larger than the socket's buffer. "
        "Contained: it ends as a timeout within its timeout + 1.5 s.",
    ),
    Case(
        id="proto-session-surrogate-value",
        klass=CaseClass.PROTOCOL,
        title="a cell whose value's repr holds a lone surrogate gets a result that "
        "serialises (UTF-8), not a record that breaks the server or the tokenizer",
        code="",
        session_steps=(
            _open("s"),
            _cell("s", "attack", _SURROGATE_VALUE),
        ),
        contained=_value_is_utf8,
        severity=Severity.MEDIUM,
        reference="the fifth red-team round (2026-12-02): the value reached the result as "
        "text UTF-8 cannot hold; over MCP's JSON-RPC the answer could not be serialised and "
        "the server exited with every session on it",
        exclusive=True,
        local=Expect.CONTAINED,
        note="Contained: the result's JSON encodes and the value reads 'ok ? end'.",
    ),
    Case(
        id="proto-session-fork-forged-pid",
        klass=CaseClass.PROTOCOL,
        title="a session cannot choose the pid its fork is known by (the agent takes the "
        "kernel's word, not the fork's)",
        code="",
        session_steps=(
            _open("s"),
            _cell("s", "spoof", "x = 41\nos.getpid = lambda: 2 ** 70\n"),
            _fork("s", "f"),
            _cell("f", "attack", "time.sleep(0.3)\nprint(x + 1)\n"),
            _cell("s", "parent-after", "print(x)\n"),
        ),
        contained=_fork_unharmed,
        severity=Severity.HIGH,
        reference="the sixth red-team round (2026-12-03): the supervisor took a fork's pid "
        "from the fork's own report, made with the session's os.getpid; a pid of 2**70 "
        "crashed the agent, and the fork's cell came back as sandbox_error with its family lost",
        exclusive=True,
        local=Expect.CONTAINED,
        note="Contained: the fork's cell prints 42 and the parent's next cell 41, both their "
        "code's own success.",
    ),
    Case(
        id="proto-session-fork-announced-by-its-middle",
        klass=CaseClass.PROTOCOL,
        title="a fork announced from its middle process (whose pid is reaped at once) is "
        "refused: the pid the supervisor watches, interrupts and kills is its own child",
        code="",
        session_steps=(
            _open("s"),
            _cell("s", "plant", _ANNOUNCE_FROM_THE_MIDDLE),
            _fork("s", "f"),
            _cell("f", "attack", _BEAT_ON, timeout=1.0),
            _cell("s", "after", _BEAT_STOPPED),
        ),
        contained=_lost_fork_stopped,
        severity=Severity.MEDIUM,
        reference="the thirty-third red-team round (2026-12-07): an at-fork hook announced "
        "the fork from the session's middle process; the supervisor watched that pid, "
        "reaped at once, and the real copy, its cell 'lost' and 'killed', wrote on",
        exclusive=True,
        local=Expect.NOT_APPLICABLE,
        local_reason="the local backend's forks have no hello to send from elsewhere",
        note="Contained: the fork is refused (only a process the supervisor adopted answers "
        "for a fork), or its lost cell's process is the one killed; either way nothing of it "
        "writes on after its cell. An orphan the code makes is adopted too: within its "
        "family the code chooses which of its processes answers for a fork (finding 83).",
    ),
    Case(
        id="res-session-fork-deep-tree",
        klass=CaseClass.RESOURCES,
        title="a session's 3000-deep directory fails its fork explicitly; the parent and its "
        "family live on",
        code="",
        session_steps=(
            _open("s"),
            _cell("s", "attack", _NEST_3000),
            _fork("s", "f"),
            _cell("s", "parent-after", "print(x + 1)\n"),
        ),
        contained=_fork_refused_parent_kept,
        severity=Severity.MEDIUM,
        exclusive=True,
        reference="the thirteenth red-team round (2026-12-04): the fork's copy and the "
        "session's close recursed (shutil, os.walk); on local the fork came back as the "
        "session lost and the close raised RecursionError, leaving the directory on the host",
        local=Expect.CONTAINED,
        note="Contained: the fork is refused (SessionError: nested more than 64 levels) and "
        "the parent's next cell prints 42.",
    ),
    Case(
        id="proto-session-peeked-cells",
        klass=CaseClass.PROTOCOL,
        title="a session that only peeks at its cells cannot pile the supervisor's "
        "descriptors up in flight: the cell after one left unread ends the session",
        code="",
        session_steps=(
            _open("s"),
            _cell("s", "takeover", _PEEK_LATER_CELLS),
            *(_cell("s", name, _PEEKED_CELL) for name in _PEEKED_CELLS),
        ),
        contained=_one_frame_in_flight,
        severity=Severity.HIGH,
        exclusive=True,
        reference="retool_exec red-team round of 2026-12-05 (sixteenth): cells that read "
        "their frames with MSG_PEEK left ~70 descriptors per call in flight, charged to the "
        "supervisor's uid, until its sends failed with ETOOMANYREFS (finding 38)",
        local=Expect.NOT_APPLICABLE,
        local_reason="the local backend's sessions have no agent that sends cells",
        note="Each later cell reports how many frames its session has peeked and never "
        "read. Contained: at most its own; the supervisor finds the earlier frame still "
        "queued (SIOCOUTQ) before sending the next, and kills the session instead.",
    ),
    Case(
        id="proto-session-oversized-cell-end",
        klass=CaseClass.PROTOCOL,
        title="a cell whose error record is over the events pipe's limit (its message a str "
        "that says it is empty) is its own error, not a kill of its session",
        code="",
        session_steps=(
            _open("s"),
            _cell("s", "set", "kept = 42"),
            _cell("s", "attack", _OVERSIZED_END),
            _cell("s", "check", "print(kept)"),
        ),
        contained=_end_cut_not_killed,
        severity=Severity.MEDIUM,
        local=Expect.CONTAINED,
        reference="retool_exec red-team round of 2026-12-06 (twenty-eighth) and its review: "
        "a traceback over 1 MiB made the cell's end frame too large; the supervisor took it "
        "for a broken stream and killed the interpreter (-9, the session lost), and a str "
        "subclass whose __len__ says 0 defeated the first fix's cut",
        exclusive=True,
        note="The call's process makes every string of an event an exact str and cuts them "
        "until the frame fits (zygote.fitted_frame); the local backend's runner does the same.",
    ),
    Case(
        id="proto-session-leader-thread-exits",
        klass=CaseClass.PROTOCOL,
        title="a session whose main thread ends while another thread runs is not reported "
        "as ended, and does not run on",
        code="",
        session_steps=(
            _open("s"),
            _fork("s", "w"),
            _cell("s", "attack", _LEADER_EXITS, timeout=_LEADER_EXITS_TIMEOUT),
            _cell("w", "check", _STILL_WRITING),
        ),
        contained=_leader_exit_is_no_end,
        severity=Severity.LOW,
        local=Expect.CONTAINED,
        reference="retool_exec red-team round of 2026-12-06 (twentieth): the agent took the "
        "zombie state of the thread-group leader in /proc for the process's end; the cell "
        "read as killed by SIGKILL within a second, its session lost, while its other thread "
        "went on writing in the family's container",
        exclusive=True,
        note="The agent takes a session's process for ended only by its exit status "
        "(sessions._ended), which the kernel gives once the last thread has ended, and kills "
        "the process of every session it reports lost before collecting that status.",
    ),
)
