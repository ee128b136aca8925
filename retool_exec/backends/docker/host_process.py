"""What the host reads of a runc container's agent in ``/proc``: whether it is waiting
for its next request.

Why: the host hears the agent only through Docker's attach stream, which the daemon and
the container's shim copy. On a loaded host that copy stalled for seconds while the
agent had long answered: its container idle, the call past its deadline, a right answer
(an ``8 << 30`` allocation's ``MemoryError``, a spin loop's timeout) came back as
``sandbox_error``, "the agent was silent past the deadline" (a soak beside a review's
test runs). An agent blocked reading its standard input has answered what it was sent
(or never got it): the silence is the stream's, not the agent's, and the host waits for
the stream a while longer (``backend.ANSWER_IN_TRANSIT``).

Read only where the host sees the agent as a process of its own (runc: the container's
PID 1); under gVisor, Docker's pid is the sandbox's kernel, and the readers give None.
"""

from __future__ import annotations

import platform

READ_SYSCALL = {"x86_64": 0, "amd64": 0, "aarch64": 63, "arm64": 63}
"""The ``read`` system call's number, by machine (``/proc/PID/syscall`` names calls by
number)."""


def waits_to_read_stdin(pid: int) -> bool | None:
    """Whether process ``pid`` is blocked in ``read`` on its descriptor 0 (None where the
    host cannot tell: another machine, no access to the process, or it is gone)."""
    number = READ_SYSCALL.get(platform.machine().lower())
    if number is None:
        return None
    state = _state(pid)
    if state is None:
        return None
    try:
        with open(f"/proc/{pid}/syscall", encoding="ascii") as file:
            fields = file.read(256).split()
    except (OSError, ValueError):
        return None
    # Sleeping in the call: a process stopped (by a signal, a tracer) shows the call it
    # was in too, and answers nothing until it runs again.
    return state == "S" and syscall_reads_stdin(fields, number)


def has_ended(pid: int) -> bool:
    """Whether process ``pid`` is a zombie: a container whose first process is has
    stopped, whatever Docker says yet (a dying gVisor sandbox showed as a zombie while
    Docker still had it running). False where the host cannot tell (the pid is not in
    this host's view, or gone): Docker's word stands there."""
    return _state(pid) in {"Z", "X"}


def _state(pid: int) -> str | None:
    """Process ``pid``'s state letter in ``/proc/PID/stat`` (None: not readable here)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as file:
            fields = file.read(4096).rpartition(")")[2].split()
    except OSError:
        return None
    return fields[0] if fields else None


def syscall_reads_stdin(fields: list[str], read_number: int) -> bool | None:
    """``/proc/PID/syscall``'s fields read: the call's number and its arguments in hex
    ("running" while on a CPU, "-1 ..." blocked outside a call)."""
    if not fields or fields[0] == "running":
        return False
    try:
        number = int(fields[0])
        first_argument = int(fields[1], 16) if len(fields) > 1 else None
    except ValueError:
        return None
    return number == read_number and first_argument == 0
