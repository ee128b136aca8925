"""Code shared by the attack cases: the in-sandbox prelude and host-side predicate helpers.

Every case's code runs after :data:`PRELUDE` (unless the case is ``raw``).
The prelude is the attacker's toolbox, written for both sides of the
comparison: it must do the same thing in a hardened container and in a plain
local subprocess, and never harm the host when the local backend runs it.
Processes an attack leaves running name themselves with the run's token
(``name_process``) and end by themselves after a few seconds, so the host can
find them and nothing outlives the audit.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable

from retool_exec._models import Outcome
from retool_exec.backends.docker.agent import wire
from retool_exec.security.model import Observation

__all__ = [
    "PRELUDE",
    "all_denied",
    "code",
    "late_enough",
    "on_time",
    "outcome_in",
]

PRELUDE = '''\
import ctypes, errno, json, os, sys, time
TOKEN = "__TOKEN__"
# In a container the agent's supervisor is PID 1 and the call's parent;
# elsewhere the call's parent is the host process that runs the sandbox.
# The agent runs each container's calls as a uid of its own range; the image may
# not be ours (a bring-your-own image has no /opt/retool_exec).
IN_AGENT_SANDBOX = (os.path.isdir("/opt/retool_exec")
                    or __UID_LOW__ <= os.getuid() <= __UID_HIGH__)
AGENT = 1 if IN_AGENT_SANDBOX else os.getppid()
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
try:
    libc.mq_open
    librt = libc
except AttributeError:  # glibc < 2.34 keeps the POSIX queue calls in librt
    librt = ctypes.CDLL("librt.so.1", use_errno=True)


def report(**facts):
    print(json.dumps(facts, default=repr), flush=True)


def why(exc):
    number = getattr(exc, "errno", None)
    return errno.errorcode.get(number, type(exc).__name__) if number else type(exc).__name__


def last_error():
    number = ctypes.get_errno()
    return errno.errorcode.get(number, str(number))


def readable_counts(paths):
    """The paths whose start (4 KiB) holds a digit: a count this call can read."""
    readable = []
    for path in paths:
        try:
            with open(path) as handle:
                if any(char.isdigit() for char in handle.read(4096)):
                    readable.append(path)
        except OSError:
            pass
    return readable


def name_process():
    """Name this process after the run's token, so the host can find it if it is left."""
    libc.prctl(15, TOKEN.encode(), 0, 0, 0)


def try_open(path, flags):
    """'opened' (closed again at once, nothing written) or why not."""
    try:
        os.close(os.open(path, flags))
        return "opened"
    except OSError as exc:
        return why(exc)


def named_processes():
    """(pid, state) of every other process named after this run's token."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/comm") as handle:
                if handle.read().strip() != TOKEN:
                    continue
            with open(f"/proc/{entry}/stat") as handle:
                state = handle.read().rpartition(")")[2].split()[0]
        except OSError:
            continue
        found.append((int(entry), state))
    return found


def watch_named(seconds=0.5):
    """Every named process seen during ``seconds``: a pid hopper is caught between hops."""
    seen, deadline = {}, time.monotonic() + seconds
    while True:
        for pid, state in named_processes():
            if state != "Z" or pid not in seen:
                seen[pid] = state
        if time.monotonic() >= deadline:
            return sorted(seen.items())
        time.sleep(0.01)


def daemon(body, seconds):
    """Double-fork a named process outside this call's session; it ends by itself."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            if os.fork() == 0:
                name_process()
                body(time.monotonic() + seconds)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


'''
PRELUDE = PRELUDE.replace("__UID_LOW__", str(wire.SANDBOX_UID_RANGE[0])).replace(
    "__UID_HIGH__", str(wire.SANDBOX_UID_RANGE[1])
)

"""The attacker's toolbox, prepended to every non-raw case."""


def code(text: str) -> str:
    """Dedent a case's code (so cases can be written indented in their module)."""
    return textwrap.dedent(text).strip() + "\n"


def outcome_in(obs: Observation, *outcomes: Outcome) -> bool:
    """The attack call ended with one of ``outcomes``."""
    return obs.result.outcome in outcomes


def on_time(obs: Observation, grace: float = 1.5) -> bool:
    """The call returned within its limit plus ``grace`` (queueing excluded)."""
    return obs.result.latency - obs.result.queue_wait <= obs.ctx.timeout + grace


def late_enough(obs: Observation) -> bool:
    """The call ran (nearly) to its wall-clock limit: it was stopped by the limit."""
    return obs.result.latency - obs.result.queue_wait >= obs.ctx.timeout * 0.9


def all_denied(values: Iterable[object], allowed: Iterable[str] = ("opened", "ok")) -> bool:
    """None of the attempts succeeded (an attempt's value is ``"opened"``/``"ok"`` on success)."""
    bad = set(allowed)
    return not any(str(value) in bad for value in values)
