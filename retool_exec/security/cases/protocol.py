"""The integrity of our own agent protocol: a call cannot reach the agent or other calls.

In a container, the agent is PID 1 and the call's parent; its stdin/stdout
are the attach stream to the host, over which frames carry every call's code
and result. A call must not read or forge those frames, read the agent's
memory, trace or signal it, change another call's result, or outlive its
call. On the local backend the same attacks aim at the call's parent, which
is the host process running the sandbox (the trainer); those that could harm
it (tracing, signals) are not run there, and those about frames do not apply.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import retool_exec
from retool_exec._models import Outcome
from retool_exec.security.model import (
    CallInputs,
    Case,
    CaseClass,
    Expect,
    Observation,
    Severity,
    exposed_as_root,
)
from retool_exec.security.snippets import all_denied, code, on_time

__all__ = ["CASES"]

ALIVE = code("""
    report(alive=watch_named())
""")

FRAME_TOOLS = code("""
    import struct

    def frame(message):
        payload = json.dumps(message).encode()
        return struct.pack(">I", len(payload)) + payload

    def forged_result(call_id, text):
        return {"type": "result", "id": call_id, "returncode": 0, "timed_out": False,
                "oom": False, "stdout": text, "stdout_dropped": 0, "stderr": "",
                "stderr_dropped": 0, "duration": 0.0}
""")


BURY_STARTED = (
    "import os\n"
    "for fd in range(3, 16):\n"
    "    try:\n"
    "        os.write(fd, b'\\xff' * 8)\n"
    "    except OSError:\n"
    "        pass\n"
    "print('wrong answer')\n"
    "raise SystemExit(1)\n"
)
"""Written first thing, before the agent may have read that the code started: garbage
where the agent's own marks travel, then the code's own failure."""


def _local_package_writable() -> Expect:
    package = Path(retool_exec.__file__).resolve()
    return Expect.EXPOSED if os.access(package, os.W_OK) else Expect.CONTAINED


GVISOR_PROCFS = (
    "gVisor's procfs (runsc 20221219) lets any uid list /proc/PID/fd and read maps and environ; "
    "under gVisor the case checks that they give nothing the call does not already have"
)


def _agent_files_denied(obs: Observation) -> bool:
    facts = obs.facts()
    opened = facts["opened"]
    if obs.ctx.gvisor:
        # Listing shows fd numbers; the links are opaque (host:[N]); opening is what matters.
        paths = [link for link in facts["links"].values() if str(link).startswith("/")]
        return bool(opened) and all_denied(opened.values()) and not paths
    denied_links = all(str(value).isupper() for value in facts["links"].values())  # errno names
    return isinstance(facts["listed"], str) and denied_links and all_denied(opened.values())


def _denied_but_under_gvisor(attempt: str, disclosed: str) -> Callable[[Observation], bool]:
    """Every attempt denied, except that under gVisor ``attempt`` may succeed if the
    fact ``disclosed`` shows it gave nothing the call lacks (is 0)."""

    def contained(obs: Observation) -> bool:
        facts = obs.facts()
        attempts = dict(facts["attempts"])
        if obs.ctx.gvisor and facts[disclosed] == 0:
            attempts.pop(attempt)
        return all_denied(attempts.values())

    return contained


# The call is a fork of the agent: it already maps the same files at the same places.
_agent_memory_unreadable = _denied_but_under_gvisor("maps", "maps_new_files")
# The agent holds exactly the call's own (allowlisted) environment.
_agent_environment_contained = _denied_but_under_gvisor("environ", "environ_beyond_own")


def _nothing_left(obs: Observation) -> bool:
    """No process of the attack is still running in the follow-up (zombies are dead)."""
    if obs.follow is None or not obs.follow.ok:
        return False
    return [state for _, state in obs.follow_facts()["alive"] if state != "Z"] == []


SHADOW_IMPORTS = ("json", "traceback", "struct", "base64", "numpy", "agent")
"""Uploads the code imports: python3 imports none of them before the code, so it gets the
uploads (the zygote has imported every one; ``agent`` was the agent's package's own name,
finding 106)."""
SHADOW_UPLOADS = (
    *SHADOW_IMPORTS,
    *("select", "selectors", "signal", "hmac", "secrets", "socket", "io", "codecs", "abc"),
    *("wire", "zygote", "supervisor", "reset", "identity", "forking", "sessions", "trees"),
    *("result_fit", "auto_print", "light_calls", "generators", "sitecustomize"),
)
"""Modules named like what the agent itself imports (the standard ones, then its own)."""


def _shadow_upload(name: str) -> tuple[str, str]:
    path = f"{name}/__init__.py" if name == "numpy" else f"{name}.py"
    return path, f"import sys\nsys.stderr.write('IMPORTED-{name}-__TOKEN__\\n')\n"


IMPORT_UPLOADS = (
    "import os, sys\n"
    f"found = []\nfor name in {SHADOW_IMPORTS!r}:\n"
    "    path = getattr(__import__(name), '__file__', None) or '/'\n"
    "    if os.path.relpath(path).split(os.sep)[0] in (name + '.py', name):\n"
    "        found.append(name)\n"
    "print('UPLOADS', *found, flush=True)\n"
    "1 / 0\n"
)
"""Imports its uploads (python3 gives it them, its working directory first on sys.path),
then fails: the failure, and only the code's imports, are what the call shows."""

SHADOWS_GONE = code(
    f"    UPLOADED = {sorted(SHADOW_UPLOADS)!r}\n"
    + """
    import base64, select, signal, struct, traceback
    names = ("json", "traceback", "struct", "base64", "select", "signal")
    found = {name: getattr(sys.modules[name], "__file__", None) or "/" for name in names}
    here = sorted(n for n, path in found.items() if not os.path.relpath(path).startswith(".."))
    left = sorted(entry for entry in os.listdir(".") if entry.partition(".")[0] in UPLOADED)
    report(uploaded=here, left=left)
"""
)
"""The next call: which of those modules it imports from its working directory, and
which of the uploads are still there (the local backend runs in the host's directory,
so only the uploads' names are looked for)."""


def _uploads_the_codes_alone(obs: Observation) -> bool:
    """The call is the code's failure, with the code's uploads and only its imports of
    them; the next call has neither the modules nor the files."""
    marks = re.findall(rf"IMPORTED-(\w+)-{obs.ctx.token}", obs.result.stderr)
    follow = obs.follow
    return (
        obs.result.outcome is Outcome.ERROR
        and obs.result.stdout == "UPLOADS " + " ".join(SHADOW_IMPORTS) + "\n"
        and marks == list(SHADOW_IMPORTS)
        and obs.result.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
        and follow is not None
        and follow.outcome is Outcome.SUCCESS
        and obs.ctx.token not in follow.stdout + follow.stderr
        and obs.follow_facts() == {"uploaded": [], "left": []}
    )


CASES: tuple[Case, ...] = (
    Case(
        id="proto-agent-descriptors",
        klass=CaseClass.PROTOCOL,
        title="the agent's descriptors (the host's frame stream) can be neither listed nor opened",
        code=code("""
            try:
                listed = len(os.listdir(f"/proc/{AGENT}/fd"))
            except OSError as exc:
                listed = why(exc)
            links = {}
            for fd in ("0", "1", "2"):
                try:
                    links[fd] = os.readlink(f"/proc/{AGENT}/fd/{fd}")
                except OSError as exc:
                    links[fd] = why(exc)
            opened = {}
            if IN_AGENT_SANDBOX:  # never open the host process's descriptors
                opened["fd 0 for reading"] = try_open("/proc/1/fd/0", os.O_RDONLY | os.O_NONBLOCK)
                opened["fd 1 for writing"] = try_open("/proc/1/fd/1", os.O_WRONLY)
            report(listed=listed, links=links, opened=opened)
        """),
        contained=_agent_files_denied,
        severity=Severity.CRITICAL,
        reference="the agent's own uid; CVE-2024-21626 (leaked descriptors, runc)",
        note=GVISOR_PROCFS,
    ),
    Case(
        id="proto-agent-memory",
        klass=CaseClass.PROTOCOL,
        title="the agent's memory cannot be read (/proc/1/mem, maps, process_vm_readv)",
        code=code("""
            class IOVec(ctypes.Structure):
                _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

            with open("/proc/self/maps") as handle:
                address = int(handle.readline().split("-")[0], 16)  # same layout as a fork
            buffer = ctypes.create_string_buffer(8)
            local = IOVec(ctypes.cast(buffer, ctypes.c_void_p), 8)
            remote = IOVec(address, 8)
            got = libc.syscall(310, AGENT, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
            attempts = {
                "mem": try_open(f"/proc/{AGENT}/mem", os.O_RDONLY),
                "maps": try_open(f"/proc/{AGENT}/maps", os.O_RDONLY),
                # EFAULT means the permission check passed (only the address was wrong)
                "process_vm_readv": "ok" if got >= 0 else last_error().replace("EFAULT", "ok"),
            }

            def mapped_files(path):
                with open(path) as handle:
                    return {line.split()[-1] for line in handle if line.split()[-1].startswith("/")}

            new_files = None
            if attempts["maps"] == "opened":  # which files it maps that this call does not
                theirs = mapped_files(f"/proc/{AGENT}/maps")
                new_files = sorted(theirs - mapped_files("/proc/self/maps"))
            report(attempts=attempts, maps_new_files=None if new_files is None else len(new_files),
                   first_new_files=(new_files or [])[:3])
        """),
        contained=_agent_memory_unreadable,
        severity=Severity.CRITICAL,
        reference="ptrace access mode checks (ptrace(2)); the agent's own uid",
        catalogue=(11,),
        local=exposed_as_root,  # without root, Yama's ptrace_scope decides
        note=GVISOR_PROCFS,
    ),
    Case(
        id="proto-every-agent-process",
        klass=CaseClass.PROTOCOL,
        title="no other process the call can see (the supervisor, every zygote) can be "
        "signalled or have its memory read",
        code=code("""
            class IOVec(ctypes.Structure):
                _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

            parents = {}
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    try:
                        with open(f"/proc/{entry}/stat") as handle:
                            parents[int(entry)] = int(handle.read().rpartition(")")[2].split()[1])
                    except (OSError, IndexError, ValueError):
                        continue

            def mine(pid):
                for _ in range(64):
                    if pid == os.getpid():
                        return True
                    pid = parents.get(pid, 0)
                    if pid <= 0:
                        return False
                return False

            with open("/proc/self/maps") as handle:
                address = int(handle.readline().split("-")[0], 16)  # same layout as a fork
            buffer = ctypes.create_string_buffer(8)
            local = IOVec(ctypes.cast(buffer, ctypes.c_void_p), 8)
            remote = IOVec(address, 8)
            attempts = {}
            for pid in sorted(pid for pid in parents if not mine(pid))[:200]:
                try:
                    os.kill(pid, 0)  # signal 0: only the permission check, nothing is sent
                    signal = "ok"
                except OSError as exc:
                    signal = why(exc)
                got = libc.syscall(310, pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
                attempts[pid] = {
                    "signal": signal,
                    "mem": try_open(f"/proc/{pid}/mem", os.O_RDONLY),
                    # EFAULT means the permission check passed (only the address was wrong)
                    "process_vm_readv": "ok" if got >= 0 else last_error().replace("EFAULT", "ok"),
                }
            report(targets=len(attempts), attempts=list(attempts.values())[:20])
        """),
        contained=lambda obs: (
            obs.facts()["targets"] >= 2
            and all(all_denied(tried.values()) for tried in obs.facts()["attempts"])
        ),
        severity=Severity.CRITICAL,
        reference="kill(2) and ptrace(2) access checks: every agent process has its own uid "
        "and is non-dumpable (the light zygote of 2026-12-02 included)",
        catalogue=(11,),
    ),
    Case(
        id="proto-agent-ptrace",
        klass=CaseClass.PROTOCOL,
        title="the agent cannot be traced (PTRACE_ATTACH, PTRACE_SEIZE)",
        code=code("""
            attempts = {}
            if IN_AGENT_SANDBOX:
                libc.ptrace.restype = ctypes.c_long
                for name, request in (("PTRACE_ATTACH", 16), ("PTRACE_SEIZE", 0x4206)):
                    rc = libc.ptrace(request, 1, None, None)
                    attempts[name] = "ok" if rc == 0 else last_error()
                    if rc == 0:
                        libc.ptrace(17, 1, None, None)  # PTRACE_DETACH
            report(attempts=attempts)
        """),
        contained=lambda obs: (
            bool(obs.facts()["attempts"]) and all_denied(obs.facts()["attempts"].values())
        ),
        severity=Severity.CRITICAL,
        reference="CVE-2019-13272 (ptrace); moby: CAP_SYS_PTRACE dropped",
        catalogue=(11,),
        local=Expect.HARMFUL,
        local_reason="would stop the host process that runs the sandbox",
    ),
    Case(
        id="proto-agent-signals",
        klass=CaseClass.PROTOCOL,
        title="every signal sent to the agent (SIGKILL and SIGSTOP included) leaves it serving",
        code=code("""
            sent, errors = 0, {}
            if IN_AGENT_SANDBOX:
                for number in range(1, 65):
                    if number == 17:  # SIGCHLD: the agent's own wake-up, harmless
                        continue
                    try:
                        os.kill(1, number)
                        sent += 1
                    except OSError as exc:
                        errors[number] = why(exc)
                time.sleep(0.3)
            report(sent=sent, errors=errors)
        """),
        follow_up=code("""
            report(agent_alive=True)
        """),
        contained=lambda obs: (
            obs.result.ok
            and obs.facts()["sent"] + len(obs.facts()["errors"]) >= 63
            and obs.follow is not None
            and obs.follow.ok
        ),
        severity=Severity.CRITICAL,
        reference="pid_namespaces(7): init ignores signals it has no handler for",
        local=Expect.HARMFUL,
        local_reason="would kill the host process that runs the sandbox",
    ),
    Case(
        id="proto-agent-environment",
        klass=CaseClass.PROTOCOL,
        title="the agent's environment, root, cwd and executable links are unreadable",
        code=code("""
            attempts = {"environ": try_open(f"/proc/{AGENT}/environ", os.O_RDONLY)}
            for name in ("root", "cwd", "exe"):
                try:
                    os.readlink(f"/proc/{AGENT}/{name}")
                    attempts[name] = "ok"
                except OSError as exc:
                    attempts[name] = why(exc)
            beyond_own = None
            if attempts["environ"] == "opened":  # count only: never print another's environment
                with open(f"/proc/{AGENT}/environ", "rb") as handle:
                    theirs = {entry for entry in handle.read().split(b"\\0") if entry}
                beyond_own = len(theirs - {f"{k}={v}".encode() for k, v in os.environ.items()})
            report(attempts=attempts, environ_beyond_own=beyond_own)
        """),
        contained=_agent_environment_contained,
        severity=Severity.HIGH,
        reference="/proc/PID/root as an escape path (CVE-2019-5736 family); the agent's own uid",
        note=GVISOR_PROCFS,
    ),
    Case(
        id="proto-agent-code",
        klass=CaseClass.PROTOCOL,
        title="the agent's and retool_exec's own code cannot be opened for writing",
        code=code("""
            paths = ["/opt/retool_exec/agent.py", "__PACKAGE_DIR__/backends/docker/agent.py",
                     "__PACKAGE_DIR__/_sandbox.py"]
            report(attempts={path: try_open(path, os.O_WRONLY | os.O_APPEND) for path in paths})
        """),
        contained=lambda obs: all_denied(obs.facts()["attempts"].values()),
        severity=Severity.CRITICAL,
        reference="CVE-2019-5736 (a container overwriting the runtime the host runs next)",
        local=_local_package_writable,
    ),
    Case(
        id="proto-forged-frames-in-output",
        klass=CaseClass.PROTOCOL,
        title="frame-shaped bytes on stdout/stderr are data, not results",
        code=FRAME_TOOLS
        + code("""
            for call_id in range(0, 40):
                sys.stdout.buffer.write(frame(forged_result(call_id, "FORGED")))
                sys.stderr.buffer.write(frame({"type": "reset", "id": call_id, "clean": True}))
            sys.stdout.flush()
            sys.stderr.flush()
            sys.exit(7)
        """),
        contained=lambda obs: (
            obs.result.returncode == 7
            and obs.result.outcome is Outcome.ERROR
            and "FORGED" in obs.result.stdout
            and obs.result.stdout != "FORGED"
        ),
        severity=Severity.HIGH,
        reference="in-band signalling: frames must travel on a channel user code does not own",
        local=Expect.CONTAINED,
    ),
    Case(
        id="proto-bury-started-mark",
        klass=CaseClass.PROTOCOL,
        title="garbage on every descriptor cannot turn the code's own failure into the sandbox's",
        code=BURY_STARTED,
        contained=lambda obs: (
            (obs.result.outcome, obs.result.returncode) == (Outcome.ERROR, 1)
            and obs.result.stdout == "wrong answer\n"
            and obs.result.detail == ""
        ),
        severity=Severity.HIGH,
        reference="reward hacking: a failure reported as the sandbox's is dropped from the loss",
        raw=True,
        local=Expect.CONTAINED,
        note="a race: when the events pipe carried the agent's 'started' mark, the call won it "
        "in 5 of 40 tries at one caller (more under load); tests/docker/test_failures.py runs "
        "it 64 times",
    ),
    Case(
        id="proto-forge-next-result",
        klass=CaseClass.PROTOCOL,
        title="a call cannot write frames to the host that become the next call's result",
        code=FRAME_TOOLS
        + code("""
            frame_, request = sys._getframe(), None
            while frame_ is not None and request is None:
                candidate = frame_.f_locals.get("request")
                request = candidate if isinstance(candidate, dict) else None
                frame_ = frame_.f_back
            call_id = request.get("id") if request else None
            attempt = "not in an agent sandbox"
            if IN_AGENT_SANDBOX and isinstance(call_id, int):
                try:
                    fd = os.open("/proc/1/fd/1", os.O_WRONLY)
                    os.write(fd, frame(forged_result(call_id, "FORGED-THIS"))
                             + frame({"type": "reset", "id": call_id, "clean": True, "reason": ""})
                             + frame(forged_result(call_id + 1, "FORGED-NEXT")))
                    os.close(fd)
                    attempt = "written"
                except OSError as exc:
                    attempt = why(exc)
            report(call_id=call_id, attempt=attempt)
        """),
        follow_up=code("""
            report(genuine=TOKEN)
        """),
        contained=lambda obs: (
            obs.follow is not None
            and "FORGED" not in obs.result.stdout
            and "FORGED" not in obs.follow.stdout
            and obs.follow.ok
            and obs.ctx.token in obs.follow.stdout
        ),
        severity=Severity.CRITICAL,
        reference="the agent protocol's own threat model (agent.py docstring)",
        local=Expect.NOT_APPLICABLE,
    ),
    Case(
        id="proto-descriptors-and-stdin",
        klass=CaseClass.PROTOCOL,
        title="the call holds only its stdio pipes (+ status pipe); stdin is /dev/null",
        code=code("""
            import stat
            kinds = {}
            for entry in sorted(os.listdir("/proc/self/fd"), key=int):
                try:
                    mode = os.fstat(int(entry)).st_mode
                except OSError:
                    continue  # the directory listing's own descriptor, closed by now
                kinds[entry] = ("socket" if stat.S_ISSOCK(mode) else "dir" if stat.S_ISDIR(mode)
                                else "pipe" if stat.S_ISFIFO(mode) else "char" if stat.S_ISCHR(mode)
                                else "file")
            null = os.stat("/dev/null")
            stdin = os.fstat(0)
            same = (stdin.st_dev, stdin.st_ino) == (null.st_dev, null.st_ino)
            report(kinds=kinds, stdin_is_null=same, stdin_data=len(sys.stdin.read()))
        """),
        contained=lambda obs: (
            set(obs.facts()["kinds"]) <= {"0", "1", "2", "3"}
            and not {"socket", "dir"} & set(obs.facts()["kinds"].values())
            and obs.facts()["stdin_is_null"] is True
            and obs.facts()["stdin_data"] == 0
        ),
        severity=Severity.HIGH,
        reference="CVE-2024-21626 (runc leaked a host directory descriptor); codejail",
        local=Expect.CONTAINED,
    ),
    Case(
        id="proto-tamper-next-call",
        klass=CaseClass.PROTOCOL,
        title="a process left by call N cannot write into call N+1's output",
        code=code("""
            def tamper(deadline):
                victim_file = f"/tmp/{TOKEN}-victim"
                while time.monotonic() < deadline:
                    try:
                        with open(victim_file) as handle:
                            victim = int(handle.read())
                    except (OSError, ValueError):
                        time.sleep(0.02)
                        continue
                    for fd in (1, 2):
                        try:
                            with open(f"/proc/{victim}/fd/{fd}", "w") as out:
                                out.write(f"TAMPERED-{TOKEN}\\n")
                        except OSError:
                            pass
                    return
            daemon(tamper, 6)
            report(armed=True)
        """),
        follow_up=code("""
            victim_file = f"/tmp/{TOKEN}-victim"
            with open(victim_file, "w") as handle:
                handle.write(str(os.getpid()))
            time.sleep(1.0)
            os.unlink(victim_file)
            report(intact=True)
        """),
        contained=lambda obs: (
            obs.follow is not None
            and obs.follow.ok
            and "TAMPERED" not in obs.follow.stdout + obs.follow.stderr
        ),
        severity=Severity.CRITICAL,
        reference="cross-sample reward tampering in RL: one rollout rewriting another's result",
    ),
    Case(
        id="proto-outlive-pid-hopping",
        klass=CaseClass.PROTOCOL,
        title="a process hopping pids (fork, exit, setsid) does not outlive its call",
        code=code("""
            def hop(deadline):
                while time.monotonic() < deadline:
                    if os.fork() != 0:
                        os._exit(0)  # the parent leaves; a child carries on under a new pid
                    os.setsid()
                    time.sleep(0.05)
            daemon(hop, 5)
            report(hopping=True)
        """),
        follow_up=ALIVE,
        contained=_nothing_left,
        severity=Severity.HIGH,
        reference="kill-by-pid races; the agent's kill(-1, SIGKILL) ends all at once",
    ),
    Case(
        id="proto-outlive-timeout",
        klass=CaseClass.PROTOCOL,
        title="on timeout, every process of the call dies, including ones outside its session",
        code=code("""
            def linger(deadline):
                while time.monotonic() < deadline:
                    time.sleep(0.1)
            daemon(linger, 6)
            while True:
                pass
        """),
        follow_up=ALIVE,
        contained=lambda obs: (
            obs.result.outcome is Outcome.TIMEOUT and on_time(obs) and _nothing_left(obs)
        ),
        severity=Severity.HIGH,
        reference="the seed killed only the process group on timeout",
        timeout=2.0,
        exclusive=True,
    ),
    Case(
        id="proto-forged-cpu-limit",
        klass=CaseClass.PROTOCOL,
        title="a call that sends itself SIGXCPU is not reported as out of CPU time",
        code=code("""
            import signal
            print("a wrong answer")
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGXCPU)
        """),
        contained=lambda obs: obs.result.outcome is Outcome.SIGNAL and obs.result.returncode == -24,
        severity=Severity.MEDIUM,
        reference="retool_exec red-team round of 2026-12-04 (eighth): 3 ms after its start a "
        "call read as cpu_limit, which the server answers as TimeLimitExceeded",
        local=Expect.EXPOSED,
        note="The outcome names a limit only when the process used it: the agent reads the "
        "CPU time a SIGXCPU death used itself (its zombie's /proc/PID/stat).",
    ),
    Case(
        id="proto-traced-stop-read-as-exit",
        klass=CaseClass.PROTOCOL,
        title="a call that makes its parent its tracer and stops is not reported as exited",
        code=code("""
            import signal
            libc = ctypes.CDLL(None, use_errno=True)
            libc.ptrace.restype = ctypes.c_long
            libc.ptrace.argtypes = [ctypes.c_long] * 2 + [ctypes.c_void_p] * 2
            signal.signal(signal.SIGUSR1, lambda *_: None)
            traced = libc.ptrace(0, 0, None, None) == 0  # PTRACE_TRACEME
            failed = 0 if traced else ctypes.get_errno()
            os.kill(os.getpid(), signal.SIGUSR1)  # traced: a stop its tracer must resume
            report(traced=traced, errno=failed, reached="the end")
            sys.exit(3)
        """),
        contained=lambda obs: (
            obs.result.outcome is Outcome.ERROR
            and obs.result.returncode == 3
            and '"reached": "the end"' in obs.result.stdout
        ),
        severity=Severity.LOW,
        reference="retool_exec red-team round of 2026-12-05 (nineteenth): under runc the "
        "call read as exited with the signal's number (SIGUSR1: 10) while it lived on in a "
        "tracing stop of the supervisor, its parent",
        local=Expect.NOT_APPLICABLE,
        local_reason="the tracer would be the host process that runs the sandbox, which "
        "never resumes the stopped process",
        note="The calls' filter refuses ptrace(PTRACE_TRACEME) with EPERM "
        "(identity.PTRACE_SYSCALLS), and the supervisor's wait takes only real ends "
        "(supervisor.REAL_ENDS). gVisor refused the request already.",
    ),
    Case(
        id="proto-end-runs-the-codes-methods",
        klass=CaseClass.PROTOCOL,
        title="a call's end runs none of its methods on sys.modules: it cannot end as oom or "
        "timeout after its code finished",
        code=code("""
            class Name(str):
                def __eq__(self, other):
                    while True:
                        pass
                __hash__ = str.__hash__

            class Modules(dict):
                def __reversed__(self):
                    while True:
                        yield "x" * 4096
                def get(self, *args):
                    while True:
                        pass

            sys.modules[Name("planted")] = sys.modules["os"]
            sys.modules = Modules(sys.modules)
            report(reached="the end")
        """),
        contained=lambda obs: (
            obs.result.outcome is Outcome.SUCCESS
            and obs.result.returncode == 0
            and '"reached": "the end"' in obs.result.stdout
        ),
        severity=Severity.LOW,
        reference="retool_exec red-team round of 2026-12-06 (twenty-seventh): the agent's "
        "end, emulating python3's finalization, ran a sys.modules subclass's __reversed__ "
        "(a list grown until the container's memory ran out: oom) and keys' __eq__ (a "
        "timeout), for a program python3 ends with status 0",
        local=Expect.CONTAINED,
        note="The end reads the interpreter's own dict, as items, exact str names only "
        "(zygote.ModulesAtStart; docs/security.md finding 64).",
    ),
    Case(
        id="proto-child-of-the-agent",
        klass=CaseClass.PROTOCOL,
        title="a call cannot make a process whose parent is the agent (clone's CLONE_PARENT)",
        code=code("""
            import platform
            CLONE_PARENT, SIGCHLD = 0x8000, 17
            number = {"x86_64": 56, "aarch64": 220}[platform.machine()]
            libc = ctypes.CDLL(None, use_errno=True)
            read_end, write_end = os.pipe()
            pid = libc.syscall(number, CLONE_PARENT | SIGCHLD, 0, 0, 0, 0)
            if pid == 0:  # a copy of this process, like fork: say whose child it is
                with open("/proc/self/status") as status:
                    parent = [line for line in status if line.startswith("PPid:")][0]
                os.write(write_end, parent.split()[1].encode())
                os._exit(0)
            failed = ctypes.get_errno() if pid < 0 else 0
            os.close(write_end)
            parent = os.read(read_end, 64).decode() if pid > 0 else ""
            report(cloned=pid > 0, errno=failed, own=os.getpid(), own_parent=os.getppid(),
                   its_parent=int(parent or 0))
        """),
        contained=lambda obs: (
            not obs.facts()["cloned"] or obs.facts()["its_parent"] != obs.facts()["own_parent"]
        ),
        severity=Severity.CRITICAL,
        reference="retool_exec red-team round of 2026-12-04 (tenth): the zygote reported such "
        "processes' exit statuses as its children's, and a later call whose child drew one of "
        "those pids (the pid counter wraps) took a status the planting call chose",
        local=Expect.NOT_APPLICABLE,
        local_reason="the new process would be a child of the host process that runs the "
        "sandbox, left there as a zombie",
        note="Refused with EPERM by the filter each call's process adds to its zygote's "
        "(identity.parent_filter). The supervisor reaps every call's process, and a status "
        "recorded for a pid is forgotten when a new process with that pid is forked.",
    ),
    Case(
        id="proto-uploads-named-like-the-agents-modules",
        klass=CaseClass.PROTOCOL,
        title="uploads named like the modules the agent runs on are the code's alone: the "
        "call ends as the code's failure and the next call meets none of them",
        code=IMPORT_UPLOADS,
        raw=True,
        inputs=CallInputs(files=dict(_shadow_upload(name) for name in SHADOW_UPLOADS)),
        follow_up=SHADOWS_GONE,
        contained=_uploads_the_codes_alone,
        severity=Severity.MEDIUM,
        reference="retool_exec red-team round of 2026-12-07 (thirty-first): the zygote's "
        "modules hid uploads of their names, and taking them out for the code must not hand "
        "them to the agent's own end of the call (json, traceback, its own modules); the "
        "thirty-seventh: an upload named agent.py lost to the agent's package, named agent",
        local=Expect.CONTAINED,
        note="The agent binds what it needs when it is imported; the uploads a call shadows "
        "are taken out of its own process's modules only (zygote.forget_shadowed_preloads).",
    ),
)
