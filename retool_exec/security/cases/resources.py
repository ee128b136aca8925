"""Resources: bombs, floods, runaway loops and leftovers, each stopped by a limit.

The numbers assume the audit's sandbox limits (``runner.AUDIT_LIMITS``:
256 MB of memory, 64 processes, a 16 MB ``/tmp`` with 4096 inodes, 8 MB
``/dev/shm``, 8 MB files, 256 descriptors). Bombs that would really hurt this
shared machine are never run on the local backend (``Expect.HARMFUL``); the
bounded ones (2 x 160 MB, 1000 threads, one 16 MB file) are, to show that a
subprocess has no limit there.
"""

from __future__ import annotations

import resource

from retool_exec._models import Outcome
from retool_exec.security.model import (
    Case,
    CaseClass,
    Expect,
    Inconclusive,
    Observation,
    Severity,
)
from retool_exec.security.snippets import code, late_enough, on_time, outcome_in

__all__ = ["CASES"]

MIB = 1024 * 1024


def _memory_reported(obs: Observation) -> bool:
    result = obs.result
    memory_error = result.outcome is Outcome.ERROR and "MemoryError" in result.stderr
    return (result.outcome is Outcome.OOM or memory_error) and on_time(obs)


def _uids_apart(obs: Observation) -> bool:
    """Contained when no uid this call sees (its own included) is one its neighbour in
    another container sees."""
    ours, theirs = set(obs.facts()["uids"]), set(obs.neighbour_facts()["uids"])
    return not ours & theirs


_SEEN_UIDS = code("""
    uids = {os.getuid()}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/status") as handle:
                    for line in handle:
                        if line.startswith("Uid:"):
                            uids.update(int(value) for value in line.split()[1:])
            except OSError:
                pass
    report(uids=sorted(uids))
""")


SLOW_RESET_WAIT = 5.0
"""Seconds the next call may wait for a container a call left with a long reset."""


def _next_call_not_held_up(obs: Observation) -> bool:
    follow = obs.follow
    if follow is None:
        return False
    return follow.ok and follow.queue_wait < SLOW_RESET_WAIT


_LONG_RESET = code("""
    # Make the reset's work large: SysV ids swept by number where none are listed
    # (gVisor), and many files (gVisor does not count tmpfs inodes).
    give_up = time.monotonic() + 20.0
    made = {}
    calls = {"shm": (libc.shmget, libc.shmctl), "msg": (libc.msgget, libc.msgctl),
             "sem": (libc.semget, libc.semctl)}
    for kind, (get, control) in calls.items():
        made[kind] = 0
        while made[kind] < 65000 and time.monotonic() < give_up:
            ipc_id = get(0, 1, 0o1600) if kind != "msg" else get(0, 0o1600)
            if ipc_id < 0:
                break
            if kind == "sem":
                control(ipc_id, 0, 0)
            else:
                control(ipc_id, 0, None)
            made[kind] += 1
    files = 0
    try:
        os.mkdir("many")
        while files < 40000 and time.monotonic() < give_up:
            os.close(os.open(f"many/{files}", os.O_CREAT | os.O_WRONLY, 0o600))
            files += 1
    except OSError:
        pass
    report(made=made, files=files)
""")


GVISOR_TMPFS = (
    "gVisor does not enforce tmpfs nr_inodes; its /tmp lives in the Sentry's memory, charged "
    "to the container (measured: 40,000 empty files = +77 MiB), so the memory limit bounds it"
)


def _inodes_bounded(obs: Observation) -> bool:
    facts = obs.facts()
    if facts["error"] == "ENOSPC" and facts["created"] <= 4096:
        return True
    # gVisor: files never reach a host filesystem if /tmp is the Sentry's own tmpfs.
    return obs.ctx.gvisor and facts["on_tmpfs"] is True and obs.result.ok


def _stopped_by_timeout(obs: Observation) -> bool:
    return outcome_in(obs, Outcome.TIMEOUT) and on_time(obs) and late_enough(obs)


def _nothing_named_left(obs: Observation, *, zombies: bool = False) -> bool:
    """No process of the attack is still running in the follow-up (nor, if asked, a zombie)."""
    if obs.follow is None or not obs.follow.ok:
        return False
    left = [state for _, state in obs.follow_facts()["alive"] if zombies or state != "Z"]
    return left == []


def _local_fd_limit() -> Expect:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return Expect.CONTAINED if 0 <= soft < 4000 else Expect.EXPOSED


def _local_fsize_limit() -> Expect:
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return Expect.CONTAINED if 0 <= soft < 16 * MIB else Expect.EXPOSED


def _local_core_limit() -> Expect:
    _, hard = resource.getrlimit(resource.RLIMIT_CORE)
    return Expect.CONTAINED if hard == 0 else Expect.EXPOSED


ALIVE = code("""
    report(alive=watch_named())
""")
"""Follow-up: which processes named after the token still exist."""


def _aio_budget_kept(obs: Observation) -> bool:
    if not obs.result.ok:
        return False
    if obs.facts()["contexts"] == 0:
        return True
    start, end = obs.facts()["held"]
    attempts = obs.neighbour_facts()["attempts"]
    if any(outcome == "EAGAIN" for _, outcome in attempts):
        return False  # refused during the hold or after it: either way the budget leaked
    if not any(start <= at <= end for at, _ in attempts):
        raise Inconclusive("the neighbour's attempts did not overlap the attack's hold")
    return True


CASES: tuple[Case, ...] = (
    Case(
        id="res-fork-bomb",
        klass=CaseClass.RESOURCES,
        title="a fork bomb hits the process limit (EAGAIN) and the next call is fine",
        code=code("""
            forked, error = 0, None
            try:
                for _ in range(5000):
                    if os.fork() == 0:
                        time.sleep(2)
                        os._exit(0)
                    forked += 1
            except OSError as exc:
                error = why(exc)
            report(forked=forked, error=error)
        """),
        contained=lambda obs: (
            (obs.result.ok and obs.facts()["error"] == "EAGAIN" and obs.facts()["forked"] < 200)
            or (obs.ctx.gvisor and obs.result.outcome is Outcome.OOM)
        ),
        severity=Severity.HIGH,
        reference="snekbox test_nsjail fork bomb; CIS Docker 5.29 (pids limit)",
        catalogue=(16,),
        exclusive=True,
        local=Expect.HARMFUL,
        note="under gVisor each forked interpreter is charged to the memory limit, which "
        "stops the bomb first: OOM, the container killed whole, the next call fine",
    ),
    Case(
        id="res-thread-bomb",
        klass=CaseClass.RESOURCES,
        title="a thread bomb gets 'can't start new thread' well before 1000 threads",
        code=code("""
            import threading
            threading.stack_size(64 * 1024)
            started, error = 0, None
            try:
                for _ in range(1000):
                    threading.Thread(target=time.sleep, args=(1,), daemon=True).start()
                    started += 1
            except RuntimeError as exc:
                error = str(exc)
            report(started=started, error=error)
        """),
        contained=lambda obs: (
            obs.facts()["error"] is not None and obs.facts()["started"] < 1000 and on_time(obs)
        ),
        severity=Severity.MEDIUM,
        reference="codejail fork/thread limits; CIS Docker 5.29 (pids limit)",
        catalogue=(17,),
        exclusive=True,
    ),
    Case(
        id="res-memory-one-block",
        klass=CaseClass.RESOURCES,
        title="one 1 GB allocation is reported as OOM",
        code=code("""
            block = bytearray(1 << 30)
            block[::4096] = b"x" * len(range(0, 1 << 30, 4096))
            report(survived=len(block))
        """),
        contained=_memory_reported,
        severity=Severity.HIGH,
        reference="codejail memory test; snekbox test_memory_limit; CIS Docker 5.10",
        catalogue=(18,),
        exclusive=True,
        local=Expect.HARMFUL,
    ),
    Case(
        id="res-memory-many-blocks",
        klass=CaseClass.RESOURCES,
        title="memory grown in 1 MB steps is reported as OOM",
        code=code("""
            blocks = []
            while True:
                blocks.append(b"x" * (1 << 20))
        """),
        contained=_memory_reported,
        severity=Severity.HIGH,
        reference="snekbox test_memory_limit; CIS Docker 5.10 (memory limit)",
        catalogue=(18,),
        exclusive=True,
        local=Expect.HARMFUL,
    ),
    Case(
        id="res-memory-children",
        klass=CaseClass.RESOURCES,
        title="two child processes share one memory budget (2 x 160 MB > 256 MB)",
        code=code("""
            children = []
            for _ in range(2):
                pid = os.fork()
                if pid == 0:
                    try:
                        block = bytearray(160 * 1024 * 1024)
                        block[::4096] = b"x" * len(range(0, len(block), 4096))
                        time.sleep(0.5)
                        os._exit(0)
                    except MemoryError:
                        os._exit(3)
                children.append(pid)
            report(statuses=[os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children])
        """),
        contained=lambda obs: (
            obs.result.outcome is Outcome.OOM or any(s != 0 for s in obs.facts()["statuses"])
        ),
        severity=Severity.HIGH,
        reference="cgroup memory accounting is per container, not per process (CIS Docker 5.10)",
        catalogue=(18,),
        exclusive=True,
    ),
    Case(
        id="res-infinite-loop",
        klass=CaseClass.RESOURCES,
        title="an infinite loop times out at the wall-clock limit",
        code=code("""
            while True:
                pass
        """),
        contained=_stopped_by_timeout,
        severity=Severity.MEDIUM,
        reference="codejail real-time limit; the seed's wall-clock timeout",
        catalogue=(19,),
        timeout=2.0,
        exclusive=True,
        local=Expect.CONTAINED,
    ),
    Case(
        id="res-signals-blocked",
        klass=CaseClass.RESOURCES,
        title="a busy loop that ignores and blocks every signal is still killed on time",
        code=code("""
            import signal
            for number in signal.valid_signals():
                try:
                    signal.signal(number, signal.SIG_IGN)
                except (OSError, ValueError):
                    pass
            signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
            while True:
                pass
        """),
        contained=_stopped_by_timeout,
        severity=Severity.MEDIUM,
        reference="trio _posix_deliver_cancel (go straight to SIGKILL for untrusted code)",
        catalogue=(20,),
        timeout=2.0,
        exclusive=True,
        local=Expect.CONTAINED,
    ),
    Case(
        id="res-catastrophic-regex",
        klass=CaseClass.RESOURCES,
        title="catastrophic regex backtracking (C code, no signal checks) times out on time",
        code=code("""
            import re
            re.match(r"(a+)+$", "a" * 64 + "b")
        """),
        contained=_stopped_by_timeout,
        severity=Severity.MEDIUM,
        reference="ReDoS; a signal-based timeout never fires inside the regex engine",
        catalogue=(21,),
        timeout=2.0,
        exclusive=True,
        local=Expect.CONTAINED,
    ),
    Case(
        id="res-segfault",
        klass=CaseClass.RESOURCES,
        title="a C-stack overflow is reported as a crash, and no core file can be written",
        code=code("""
            import resource
            limits = resource.getrlimit(resource.RLIMIT_CORE)
            report(core_limit=limits)
            resource.setrlimit(resource.RLIMIT_CORE, (0, limits[1]))  # never dump on the host
            sys.setrecursionlimit(10 ** 8)
            nested = []
            for _ in range(200_000):  # deeper than any 8 MB C stack can recurse in repr()
                nested = [nested]
            repr(nested)
        """),
        contained=lambda obs: (
            obs.result.outcome is Outcome.SIGNAL and obs.facts()["core_limit"] == [0, 0]
        ),
        severity=Severity.LOW,
        reference="codejail/snekbox crash handling; core dumps leak memory to disk",
        catalogue=(22,),
        exclusive=True,
        local=_local_core_limit,
    ),
    Case(
        id="res-fill-tmp",
        klass=CaseClass.RESOURCES,
        title="filling /tmp stops with ENOSPC at the tmpfs cap",
        code=code("""
            written, error = 0, None
            try:
                for index in range(100):
                    with open(f"/tmp/{TOKEN}-fill{index}", "wb") as handle:
                        for _ in range(4):
                            handle.write(b"x" * (1 << 20))
                            written += 1
            except OSError as exc:
                error = why(exc)
            report(written_mb=written, error=error)
        """),
        contained=lambda obs: obs.facts()["error"] == "ENOSPC" and obs.facts()["written_mb"] <= 17,
        severity=Severity.MEDIUM,
        reference="codejail file-write limit; the seed's unbounded temporary files",
        catalogue=(23,),
        exclusive=True,
        local=Expect.HARMFUL,
        local_reason="would fill this host's /tmp: the seed's sandbox has no limit here",
    ),
    Case(
        id="res-tmp-inodes",
        klass=CaseClass.RESOURCES,
        title="creating endless empty files stops at the inode cap (gVisor: the memory limit)",
        code=code("""
            os.mkdir(f"/tmp/{TOKEN}-many")
            created, error, started = 0, None, time.monotonic()
            try:
                while created < 20000 and time.monotonic() - started < 4:
                    open(f"/tmp/{TOKEN}-many/{created}", "w").close()
                    created += 1
            except OSError as exc:
                error = why(exc)
            statfs = ctypes.create_string_buffer(120)
            libc.statfs(b"/tmp", statfs)
            on_tmpfs = int.from_bytes(statfs.raw[:8], "little") == 0x01021994  # TMPFS_MAGIC
            report(created=created, error=error, on_tmpfs=on_tmpfs)
        """),
        contained=_inodes_bounded,
        severity=Severity.MEDIUM,
        reference="tmpfs nr_inodes; inode exhaustion DoS (snekbox sparse-file/file-count tests)",
        note=GVISOR_TMPFS,
        catalogue=(23,),
        timeout=8.0,
        exclusive=True,
        local=Expect.HARMFUL,
        local_reason="would create 20000 files in this host's /tmp",
    ),
    Case(
        id="res-fill-shm",
        klass=CaseClass.RESOURCES,
        title="filling /dev/shm stops with ENOSPC at its cap",
        code=code("""
            written, error = 0, None
            try:
                for index in range(64):
                    with open(f"/dev/shm/{TOKEN}-{index}", "wb") as handle:
                        handle.write(b"x" * (1 << 20))
                    written += 1
            except OSError as exc:
                error = why(exc)
            report(written_mb=written, error=error)
        """),
        contained=lambda obs: obs.facts()["error"] == "ENOSPC" and obs.facts()["written_mb"] <= 9,
        severity=Severity.MEDIUM,
        reference="snekbox test_shared_memory; Docker --shm-size",
        catalogue=(24,),
        exclusive=True,
        local=Expect.HARMFUL,
        local_reason="would fill this host's /dev/shm (half its RAM)",
    ),
    Case(
        id="res-shared-memory",
        klass=CaseClass.RESOURCES,
        title="a 64 MB SharedMemory segment fails cleanly (beyond /dev/shm and file-size caps)",
        code=code("""
            from multiprocessing import shared_memory
            segment = shared_memory.SharedMemory(name=f"{TOKEN}-shm", create=True,
                                                 size=64 * 1024 * 1024)
            try:
                for offset in range(0, segment.size, 4096):
                    segment.buf[offset] = 1
                report(wrote=segment.size)
            finally:
                segment.close()
                segment.unlink()
        """),
        contained=lambda obs: (
            obs.result.outcome in (Outcome.SIGNAL, Outcome.ERROR, Outcome.OOM)
            and "wrote" not in obs.result.stdout
            and on_time(obs)
        ),
        severity=Severity.MEDIUM,
        reference="snekbox test_shared_memory (SIGBUS beyond the shm size)",
        catalogue=(24,),
        exclusive=True,
    ),
    Case(
        id="res-file-descriptors",
        klass=CaseClass.RESOURCES,
        title="opening endless descriptors stops with EMFILE at a small limit",
        code=code("""
            opened, error = 0, None
            try:
                while opened < 4096:
                    os.open("/dev/null", os.O_RDONLY)
                    opened += 1
            except OSError as exc:
                error = why(exc)
            report(opened=opened, error=error)
        """),
        contained=lambda obs: obs.facts()["error"] == "EMFILE" and obs.facts()["opened"] < 4096,
        severity=Severity.LOW,
        reference="CIS Docker 5.28 (ulimits); isolate/nsjail RLIMIT_NOFILE",
        catalogue=(25,),
        local=_local_fd_limit,
    ),
    Case(
        id="res-file-size",
        klass=CaseClass.RESOURCES,
        title="a file beyond the size limit fails with EFBIG/SIGXFSZ",
        code=code("""
            path = f"/tmp/{TOKEN}-big"
            written = 0
            try:
                with open(path, "wb") as handle:
                    for _ in range(16):
                        handle.write(b"x" * (1 << 20))
                        handle.flush()
                        written += 1
                report(written_mb=written)
            except OSError as exc:
                report(written_mb=written, error=why(exc))
            finally:
                if os.path.exists(path):
                    os.unlink(path)
        """),
        contained=lambda obs: (
            (obs.result.outcome is Outcome.SIGNAL and obs.result.returncode == -25)
            or obs.facts().get("error") == "EFBIG"
        ),
        severity=Severity.MEDIUM,
        reference="codejail file-size limit; isolate RLIMIT_FSIZE",
        catalogue=(26,),
        local=_local_fsize_limit,
    ),
    Case(
        id="res-urandom-hoard",
        klass=CaseClass.RESOURCES,
        title="hoarding /dev/urandom into memory ends in OOM or a timeout, contained",
        code=code("""
            hoard = []
            with open("/dev/urandom", "rb") as source:
                while True:
                    hoard.append(source.read(1 << 20))
        """),
        contained=lambda obs: (
            (obs.result.outcome in (Outcome.OOM, Outcome.TIMEOUT) or _memory_reported(obs))
            and on_time(obs)
        ),
        severity=Severity.MEDIUM,
        reference="codejail /dev/random read test",
        catalogue=(27,),
        timeout=3.0,
        exclusive=True,
        local=Expect.HARMFUL,
    ),
    Case(
        id="res-background-process",
        klass=CaseClass.RESOURCES,
        title="a setsid/double-fork process holding the pipes neither delays the call nor survives",
        code=code("""
            def linger(deadline):
                while time.monotonic() < deadline:
                    time.sleep(0.1)
            daemon(linger, 6)
            report(started=True)
        """),
        follow_up=ALIVE,
        contained=lambda obs: (
            obs.result.ok
            and obs.result.latency - obs.result.queue_wait < 2.5
            and _nothing_named_left(obs)
        ),
        severity=Severity.HIGH,
        reference="the seed killed the process group only on timeout; judge0 leftover workers",
        catalogue=(28,),
    ),
    Case(
        id="res-zombies",
        klass=CaseClass.RESOURCES,
        title="zombies left by a call are reaped before the next call",
        code=code("""
            def never_wait(deadline):
                for _ in range(20):
                    if os.fork() == 0:
                        os._exit(0)
                time.sleep(max(0.0, deadline - time.monotonic()))
            daemon(never_wait, 5)
            for _ in range(10):
                if os.fork() == 0:
                    name_process()
                    os._exit(0)
            time.sleep(0.3)
            report(zombies=sum(1 for _, state in named_processes() if state == "Z"))
        """),
        follow_up=ALIVE,
        contained=lambda obs: (
            ((obs.ctx.gvisor and obs.result.outcome is Outcome.OOM) or obs.facts()["zombies"] >= 10)
            and _nothing_named_left(obs, zombies=True)
        ),
        severity=Severity.LOW,
        reference="zombie accumulation exhausts the pid limit; docker --init / tini",
        catalogue=(29,),
        note="under gVisor 30 forked interpreters can reach the corpus's 256 MB (each is "
        "charged to the memory limit): then the container is killed whole, and the "
        "follow-up must still find nothing left",
    ),
    Case(
        id="res-zombie-of-the-reset",
        klass=CaseClass.RESOURCES,
        title="processes that die while the reset ends them leave no zombie for the next call",
        code=code("""
            import threading

            def hold(deadline):
                # No end of the call's pipes: the call ends with its own process, and what
                # ends these is the reset's kill, just before it lists what is left. A
                # process of many threads turns zombie only once the last of them is gone.
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                for _ in range(6):
                    threading.Thread(target=time.sleep, args=(8,), daemon=True).start()
                # Between the result and the reset it is still running: it leaves empty
                # files in /tmp (the sandbox's working directory) for the next call.
                for n in range(50):
                    open(f"/tmp/{TOKEN}-late-{os.getpid()}-{n}", "w").close()
                    time.sleep(0.02)
                time.sleep(max(0.0, deadline - time.monotonic()))
            for _ in range(6):  # 42 of the corpus's 64 pids
                daemon(hold, 8)
            time.sleep(0.1)
            report(started=True)
        """),
        follow_up=code("""
            report(alive=watch_named(), late=sum(TOKEN in name for name in os.listdir("/tmp")))
        """),
        contained=lambda obs: (
            obs.result.ok
            and _nothing_named_left(obs, zombies=True)
            and obs.follow_facts()["late"] == 0
        ),
        severity=Severity.MEDIUM,
        reference="found in this project (2026-12-02): the reset counted a zombie as gone",
        note="a zombie is dead, but until reaped the next call reads its name (16 bytes the "
        "attack chose), ids and times in /proc: a channel between calls. The reset killed, "
        "reaped, then listed the live processes; one that turned zombie between the reaping "
        "and the listing was let through. The daemons also write files while the result "
        "goes back (a call whose pipes are all closed is left to the reset's kill): none may "
        "reach the next call",
    ),
    Case(
        id="res-huge-source",
        klass=CaseClass.RESOURCES,
        title="10 MB of source code gives a clear result",
        code=lambda: 'text = "' + "a" * (10 * MIB) + '"\nprint(len(text))\n',
        contained=lambda obs: obs.result.ok and obs.result.stdout == f"{10 * MIB}\n",
        severity=Severity.LOW,
        reference="the seed passed code in argv (E2BIG for large code)",
        catalogue=(30,),
        timeout=10.0,
        raw=True,
        local=Expect.CONTAINED,
    ),
    Case(
        id="res-nul-in-code",
        klass=CaseClass.RESOURCES,
        title="NUL bytes in the code give a clear error",
        code="print('before')\x00print('after')\n",
        contained=lambda obs: (
            obs.result.outcome is Outcome.ERROR and "null bytes" in obs.result.stderr
        ),
        severity=Severity.LOW,
        reference="compile() rejects NUL; a C string boundary must not truncate the code",
        catalogue=(30,),
        raw=True,
        local=Expect.CONTAINED,
    ),
    Case(
        id="res-surrogates-in-code",
        klass=CaseClass.RESOURCES,
        title="lone surrogates (invalid UTF-8) in the code give a clear result",
        code="lone = '\ud800'  # \udcff\nprint(len(lone), ascii(lone))\n",
        contained=lambda obs: (
            obs.result.outcome in (Outcome.SUCCESS, Outcome.ERROR) and obs.result.detail == ""
        ),
        severity=Severity.LOW,
        reference="str from a model may hold surrogates; encoding it must not crash the host",
        catalogue=(30,),
        raw=True,
        local=Expect.CONTAINED,
    ),
    Case(
        id="res-aio-host-budget",
        klass=CaseClass.RESOURCES,
        title="a call cannot take the host's Linux AIO budget (fs.aio-max-nr) from a neighbour",
        code=code("""
            contexts, size = [], 65536
            while size >= 1 and len(contexts) < 64:  # gVisor keeps a budget of its own
                context = ctypes.c_ulong(0)
                if libc.syscall(206, size, ctypes.byref(context)) == 0:  # io_setup
                    contexts.append(context)
                else:
                    size //= 2
            held = [time.time()]
            time.sleep(2.5)
            held.append(time.time())
            report(contexts=len(contexts), held=held)
        """),
        neighbour=code("""
            attempts, give_up = [], time.monotonic() + 1.5
            while time.monotonic() < give_up:
                context = ctypes.c_ulong(0)
                done = libc.syscall(206, 1, ctypes.byref(context))
                attempts.append([time.time(), "ok" if done == 0 else last_error()])
                if done == 0:
                    libc.syscall(207, context)  # io_destroy
                time.sleep(0.1)
            report(attempts=attempts)
        """),
        contained=_aio_budget_kept,
        severity=Severity.MEDIUM,
        reference="retool_exec red-team round of 2026-12-03: fs/aio.c's aio_nr is one counter "
        "for the whole host; Docker's profile allows io_setup",
        local=Expect.HARMFUL,
        local_reason="would take this host's AIO budget",
        note="Contained when the attack could take no AIO context at all (the agent's filter "
        "refuses AIO with ENOSYS), or when its neighbour never ran out (EAGAIN) meanwhile.",
    ),
    Case(
        id="res-agent-uids-per-container",
        klass=CaseClass.RESOURCES,
        title="no process of a container, the agent's or the call's, runs as a uid of "
        "another container's (no per-uid kernel limit is shared between containers)",
        code=_SEEN_UIDS,
        neighbour=_SEEN_UIDS,
        contained=_uids_apart,
        severity=Severity.HIGH,
        reference="retool_exec red-team round of 2026-12-05 (sixteenth): every container's "
        "supervisor ran as uid 65533, and the kernel charges descriptors in flight and pipe "
        "pages to it: four calls held enough in flight that every supervisor on the host "
        "failed its descriptor-passing sends (ETOOMANYREFS), and a call in another Sandbox "
        "came back sandbox_error (findings 38, 39)",
        exclusive=True,
        note="Each side lists the uids of the processes it can see, its own included; "
        "under Docker those are its container's calls', supervisor's and zygotes'. "
        "Contained when no uid is on both lists.",
    ),
    Case(
        id="res-reset-made-long",
        klass=CaseClass.RESOURCES,
        title="a call that leaves its container a long reset (65,000 SysV ids of each kind, "
        "40,000 files) does not hold up the next call",
        code=_LONG_RESET,
        follow_up="print('next')\n",
        contained=_next_call_not_held_up,
        severity=Severity.MEDIUM,
        reference="retool_exec red-team round of 2026-12-05 (sixteenth): under gVisor the "
        "reset swept every SysV id made since the last one, with no deadline: ~6 s, 8.4 s "
        "with 60,000 files, and the next caller of a one-container pool waited 5.9-11.5 s "
        "for a 1 s call (finding 40)",
        timeout=30.0,
        exclusive=True,
        local=Expect.NOT_APPLICABLE,
        local_reason="the local backend has no container to reset (and its files would "
        "land in the caller's working directory)",
        note=f"Contained when the follow-up call waited less than {SLOW_RESET_WAIT:g} s for "
        "its container (its queue_wait): the reset is short, or the container is retired "
        "and replaced. Under runc the kernel lists SysV objects and /tmp has 4096 inodes, "
        "so the reset stays short; the case is about gVisor.",
    ),
    Case(
        id="res-orphan-flood",
        klass=CaseClass.RESOURCES,
        title="orphans made and ended as fast as a call can do not hold the agent past the "
        "call's timeout, nor leave their ends for the next call",
        code=code("""
            name_process()
            while True:
                try:
                    middle = os.fork()
                except OSError:
                    continue
                if middle == 0:
                    if os.fork() == 0:
                        os._exit(7)  # an orphan the supervisor adopts, ended at once
                    os._exit(0)
                os.waitpid(middle, 0)
        """),
        follow_up=code("""
            report(genuine=TOKEN)
        """),
        contained=lambda obs: (
            obs.result.outcome is Outcome.TIMEOUT
            and on_time(obs, grace=1.0)
            and obs.follow_facts() == {"genuine": obs.ctx.token}
        ),
        severity=Severity.MEDIUM,
        reference="retool_exec red-team round of 2026-12-05 (eighteenth): each call's process "
        "is the supervisor's child, which reaps every child on SIGCHLD (at most "
        "supervisor.REAPS_PER_WAKE a look) and keeps the statuses of its own calls only",
        timeout=2.0,
        exclusive=True,
        local=Expect.HARMFUL,
        note="An orphan's end is reaped and forgotten: no status of it can be taken for a "
        "later process's, and no flood of them delays the deadline.",
    ),
)
