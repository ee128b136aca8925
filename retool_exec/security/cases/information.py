"""Information: nothing of the host (environment, name, files, processes) is visible.

The host plants what must not leak: a canary variable in its own environment
and a world-readable secret file; the attack code searches for them and
reports only whether it found them, never their contents.
"""

from __future__ import annotations

from retool_exec.backends.docker.hardening import BASE_ENV
from retool_exec.security.model import (
    Case,
    CaseClass,
    Expect,
    Inconclusive,
    Observation,
    Severity,
)
from retool_exec.security.snippets import all_denied, code

__all__ = ["CASES"]

ALLOWED_ENV = frozenset({*BASE_ENV, "HOSTNAME"})


def _hostname_neutral(obs: Observation) -> bool:
    facts = obs.facts()
    host = obs.ctx.host.hostname
    return bool(facts["hostname"] != host and facts["nodename"] != host)


SOCKET_MEMORY_MOVE = 128
"""Pages (512 KiB) by which ``UDP: mem`` must rise while the neighbour holds its data for
the attack to have seen it: the neighbour holds about 5 MiB, the host's per-CPU caches of
socket memory hide up to 1 MiB each, and an idle host moves it by a few pages at most."""


def _socket_memory_unseen(obs: Observation) -> bool:
    facts = obs.facts()
    if facts["path"] is None:
        return True  # no file gave it: nothing to read the channel through
    neighbour = obs.neighbour_facts()
    if not neighbour["receivers"]:
        return True  # no socket could hold data: nothing moves it
    start, end = neighbour["held"]
    before = [pages for at, pages in facts["samples"] if at < start]
    during = [pages for at, pages in facts["samples"] if start <= at <= end]
    if not before or not during:
        raise Inconclusive("the attack's readings did not span the neighbour's hold")
    return bool(max(during) - min(before) < SOCKET_MEMORY_MOVE)


EVENTFD_HELD = 200
"""Event counters the neighbour holds while the attack reads the id of a new one of its own."""


def _eventfd_ids_unmoved(obs: Observation) -> bool:
    """The ids the attack's own event counters got did not rise by what the neighbour held."""
    facts, neighbour = obs.facts(), obs.neighbour_facts()
    if neighbour["held"] is None or not facts["samples"]:
        return True  # one side could make no event counter, or none shows an id
    start, end = neighbour["held"]
    before = [ident for at, ident in facts["samples"] if at < start]
    during = [ident for at, ident in facts["samples"] if start <= at <= end]
    if not before or not during:
        raise Inconclusive("the attack's readings did not span the neighbour's hold")
    return bool(min(during) - min(before) < EVENTFD_HELD // 2)


LOCK_MARK = 0x2E7EC5A5E
"""Where the neighbour's lock starts (a byte offset no tool code locks at)."""
HOST_COUNTER_FILES = (
    "/proc/locks",
    "/proc/diskstats",
    "/sys/kernel/mm/transparent_hugepage/hugepages-2048kB/stats/anon_fault_alloc",
    "/sys/kernel/mm/transparent_hugepage/khugepaged/pages_collapsed",
    "/sys/devices/system/node/node0/vmstat",
    "/sys/devices/system/node/node0/numastat",
)
"""Host-wide files that red-team round fifteen moved from one container and read in
another: the host's file locks, disk reads, huge-page faults and a node's memory counts."""


def _route_lookups_unseen(obs: Observation) -> bool:
    """No lookup could be asked, or the counters did not rise by half of those asked."""
    facts = obs.facts()
    if not isinstance(facts["asked"], int):
        return True  # refused: no netlink socket
    return bool((facts["moved"] or 0) < facts["asked"] // 2)


def _only_own_processes(obs: Observation) -> bool:
    return bool(obs.facts()["strangers"] == [])


CASES: tuple[Case, ...] = (
    Case(
        id="info-env-canary",
        klass=CaseClass.INFORMATION,
        title="a canary in the host's environment is absent inside (os.environ, /proc/*/environ)",
        code=code("""
            value = "__CANARY_VALUE__"
            found = []
            if "__CANARY_NAME__" in os.environ or any(value in v for v in os.environ.values()):
                found.append("os.environ")
            for pid in sorted({1, AGENT, os.getpid()}):
                try:
                    with open(f"/proc/{pid}/environ", "rb") as handle:
                        if value.encode() in handle.read():
                            found.append(f"/proc/{pid}/environ")
                except OSError:
                    pass
            report(found=found)
        """),
        contained=lambda obs: obs.facts()["found"] == [],
        severity=Severity.CRITICAL,
        reference="codejail env-leak test; SandboxFusion copies os.environ (secrets) to the child",
        catalogue=(37,),
    ),
    Case(
        id="info-env-allowlist",
        klass=CaseClass.INFORMATION,
        title="the environment holds only the sandbox's own allowlisted variables",
        code=code("""
            report(names=sorted(os.environ))
        """),
        contained=lambda obs: set(obs.facts()["names"]) <= ALLOWED_ENV,
        severity=Severity.HIGH,
        reference="isolate/nsjail scrubbed environment (isolate --env, nsjail --keep_env off)",
        catalogue=(37,),
    ),
    Case(
        id="info-hostname",
        klass=CaseClass.INFORMATION,
        title="the hostname is neutral, not the host's",
        code=code("""
            import socket
            report(hostname=socket.gethostname(), nodename=os.uname().nodename)
        """),
        contained=_hostname_neutral,
        severity=Severity.LOW,
        reference="CIS Docker 5.21 (no host UTS namespace)",
        catalogue=(38,),
    ),
    Case(
        id="info-host-files",
        klass=CaseClass.INFORMATION,
        title="no host file is readable (a planted secret, the checkout, /etc/shadow, ~/.ssh)",
        code=code("""
            import glob

            def read(path):
                try:
                    with open(path, "rb") as handle:
                        handle.read(1)
                    return "ok"
                except OSError as exc:
                    return why(exc)

            def listing(path):
                try:
                    os.listdir(path)
                    return "ok"
                except OSError as exc:
                    return why(exc)

            attempts = {
                "planted secret": read("__SECRET_FILE__"),
                "project checkout": read("__PACKAGE_DIR__/__init__.py"),
                "/etc/shadow": read("/etc/shadow"),
                "/root": listing("/root"),
            }
            for ssh in glob.glob("/home/*/.ssh") + ["/root/.ssh"]:
                attempts[ssh] = listing(ssh)
            report(attempts=attempts)
        """),
        contained=lambda obs: all_denied(obs.facts()["attempts"].values()),
        severity=Severity.CRITICAL,
        reference="codejail file-read tests; CIS Docker 5.5 (no sensitive host mounts)",
        catalogue=(39,),
    ),
    Case(
        id="info-proc-listing",
        klass=CaseClass.INFORMATION,
        title="/proc lists only the agent and the call's own processes",
        code=code("""
            parents, names = {}, {}
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    try:
                        with open(f"/proc/{entry}/stat") as handle:
                            stat = handle.read()
                    except OSError:
                        continue
                    names[int(entry)] = stat[stat.find("(") + 1:stat.rfind(")")]
                    parents[int(entry)] = int(stat.rpartition(")")[2].split()[2])

            def mine(pid):
                for _ in range(64):
                    if pid == os.getpid():
                        return True
                    pid = parents.get(pid, 0)
                    if pid <= 1:
                        return False
                return False

            def uid(pid):
                try:
                    with open(f"/proc/{pid}/status") as handle:
                        return next(int(line.split()[1]) for line in handle
                                    if line.startswith("Uid:"))
                except (OSError, StopIteration):
                    return None

            agent = {1} if IN_AGENT_SANDBOX else set()  # the supervisor (the call's parent)
            if IN_AGENT_SANDBOX:  # and its zygotes: its children of a uid not the calls'
                agent |= {pid for pid in names
                          if parents.get(pid) == 1 and uid(pid) not in (None, os.getuid())}
            strangers = sorted(pid for pid in names if pid not in agent and not mine(pid))
            report(strangers=[names[pid] for pid in strangers][:10], count=len(strangers))
        """),
        contained=_only_own_processes,
        severity=Severity.HIGH,
        reference="CIS Docker 5.16 (no host PID namespace); codejail 'can't see other sandboxes'",
        catalogue=(40,),
    ),
    Case(
        id="info-neighbour-call",
        klass=CaseClass.INFORMATION,
        title="a call running at the same time is invisible",
        code=code("""
            seen, started = [], time.monotonic()
            while not seen and time.monotonic() - started < 1.5:
                seen = named_processes()
                time.sleep(0.05)
            report(seen=seen)
        """),
        companion=code("""
            if os.fork() == 0:  # a named child: the call's own process keeps its name
                name_process()
                time.sleep(2.0)
                os._exit(0)
            os.wait()
            report(done=True)
        """),
        contained=lambda obs: obs.facts()["seen"] == [],
        severity=Severity.HIGH,
        reference="codejail test 'can't see other sandboxes'; one process tree per run (isolate)",
        catalogue=(40,),
    ),
    Case(
        id="info-host-file-counts",
        klass=CaseClass.INFORMATION,
        title="the host's counts of open files, inodes and dentries are not readable",
        code=code("""
            PATHS = ("/proc/sys/fs/file-nr", "/proc/sys/fs/inode-nr",
                     "/proc/sys/fs/inode-state", "/proc/sys/fs/dentry-state",
                     "/proc/sys/fs/aio-nr")

            def counts():
                found = {}
                for path in PATHS:
                    try:
                        with open(path) as handle:
                            found[path] = handle.read().split()
                    except OSError as exc:
                        found[path] = why(exc)
                return found

            before = counts()
            held = [os.open("/dev/null", os.O_RDONLY) for _ in range(200)]
            during = counts()
            for fd in held:
                os.close(fd)
            readable = sorted(path for path, value in during.items() if isinstance(value, list)
                              and value and value[0].isdigit())
            moved = readable and "/proc/sys/fs/file-nr" in readable and (
                int(during["/proc/sys/fs/file-nr"][0]) - int(before["/proc/sys/fs/file-nr"][0]))
            report(readable=readable, moved=moved)
        """),
        contained=lambda obs: obs.facts()["readable"] == [],
        severity=Severity.LOW,
        reference="retool_exec red-team round of 2026-12-04 (eighth): under runc two calls "
        "in different containers moved 10 bits of 10 through the host's open file count",
        note="Masked under runc (read as empty); gVisor has none of these files. Other "
        "host-wide figures stay shared under runc: docs/security.md, what is not promised.",
    ),
    Case(
        id="info-host-memory-counters",
        klass=CaseClass.INFORMATION,
        title="the host's memory-manager counts are not readable, and no page can be locked "
        "to move them",
        code=code("""
            import mmap
            readable = readable_counts(
                ("/proc/vmstat", "/proc/zoneinfo", "/proc/buddyinfo", "/proc/pagetypeinfo"))
            page = mmap.mmap(-1, 4096)
            page[0:1] = b"x"
            address = ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(page)))
            if libc.mlock(address, ctypes.c_size_t(4096)) == 0:
                libc.munlock(address, ctypes.c_size_t(4096))
                lock = "ok"
            else:
                lock = last_error()
            report(readable=readable, lock=lock)
        """),
        contained=lambda obs: obs.facts()["readable"] == [] and obs.facts()["lock"] != "ok",
        severity=Severity.MEDIUM,
        reference="retool_exec red-team round of 2026-12-04 (eleventh): under runc a call set "
        "the host's unevictable_pgs_mlocked count to a 16-bit value with mlock and a call in "
        "another container read it later from /proc/vmstat",
        note="Masked under runc (read as empty), and calls get RLIMIT_MEMLOCK 0, which also "
        "keeps them from moving Mlocked in /proc/meminfo; gVisor has none of these files.",
    ),
    Case(
        id="info-host-socket-memory",
        klass=CaseClass.INFORMATION,
        title="a call in another container holding socket memory does not move a figure "
        "this call can read (the host's UDP mem in /proc/net/sockstat)",
        code=code("""
            def udp_pages(path):
                with open(path) as handle:
                    for line in handle:
                        if line.startswith("UDP:"):
                            fields = line.split()
                            return int(fields[fields.index("mem") + 1])
                raise ValueError("no UDP line")

            me = os.getpid()
            path = None
            for candidate in ("/proc/net/sockstat", "/proc/self/net/sockstat",
                              f"/proc/{me}/task/{me}/net/sockstat", "/proc/1/net/sockstat"):
                try:
                    udp_pages(candidate)
                    path = candidate
                    break
                except (OSError, ValueError):
                    pass
            samples, give_up = [], time.monotonic() + 5.0
            while path and time.monotonic() < give_up:
                samples.append([time.time(), udp_pages(path)])
                time.sleep(0.05)
            report(path=path, samples=samples)
        """),
        neighbour=code("""
            import socket
            receivers = []
            try:
                sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                for _ in range(24):  # each queues up to its receive buffer (~208 KiB)
                    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                    receiver.bind(("127.0.0.1", 0))  # its own listener, nothing else
                    receivers.append(receiver)
                    for _ in range(300):
                        sender.sendto(b"x" * 1024, receiver.getsockname())
                error = None
            except OSError as exc:
                error = why(exc)
            held = [time.time()]
            time.sleep(2.0)
            held.append(time.time())
            for receiver in receivers:
                receiver.close()
            report(receivers=len(receivers), held=held, error=error)
        """),
        contained=_socket_memory_unseen,
        severity=Severity.MEDIUM,
        reference="retool_exec red-team round of 2026-12-04 (fourteenth): under runc two "
        "calls in different containers moved 48 bits of 48 through the host-wide UDP mem "
        "of /proc/net/sockstat; path masks do not cover /proc/<pid>/net",
        timeout=10.0,
        exclusive=True,
        note="Contained when the neighbour can hold no socket memory (under runc calls get no "
        "IP socket unless DockerConfig(loopback_ip=True)), when no path gives the figure, or "
        "when it does not rise while the neighbour holds its data (gVisor's figures are each "
        "sandbox's own). With loopback_ip=True under runc it is exposed: the trade written "
        "in docs/security.md.",
    ),
    Case(
        id="info-host-eventfd-ids",
        klass=CaseClass.INFORMATION,
        title="a call in another container holding event counters does not move the id "
        "this call's own event counter gets (eventfd-id in /proc/self/fdinfo)",
        code=code("""
            def new_id():  # ctypes: os.eventfd is Python 3.10's, images may have 3.9
                fd = libc.eventfd(0, 0)
                if fd < 0:
                    raise OSError(ctypes.get_errno(), "eventfd")
                try:
                    with open(f"/proc/self/fdinfo/{fd}") as handle:
                        for line in handle:
                            if line.startswith("eventfd-id:"):
                                return int(line.split()[1])
                    return None
                finally:
                    os.close(fd)

            try:
                samples, give_up = [], time.monotonic() + 4.0
                while new_id() is not None and time.monotonic() < give_up:
                    samples.append([time.time(), new_id()])
                    time.sleep(0.05)
                error = None
            except OSError as exc:
                samples, error = [], why(exc)
            report(samples=samples, error=error)
        """),
        neighbour=code(f"""
            try:
                counters = [libc.eventfd(0, 0) for _ in range({EVENTFD_HELD})]
                if min(counters) < 0:
                    raise OSError(ctypes.get_errno(), "eventfd")
                held = [time.time()]
                time.sleep(2.0)
                held.append(time.time())
                error = None
            except OSError as exc:
                held, error = None, why(exc)
            report(held=held, error=error)
        """),
        contained=_eventfd_ids_unmoved,
        severity=Severity.MEDIUM,
        reference="retool_exec red-team round of 2026-12-05 (fifteenth): under runc an "
        "eventfd's id comes from one lowest-free allocator for the whole host, so a call "
        "holding 200 of them moved the id a call in another container got by exactly 200",
        timeout=10.0,
        exclusive=True,
        note="Contained when either side can make no event counter (calls' eventfd and "
        "eventfd2 are refused with ENOSYS), when the id is not shown (gVisor), or when it "
        "does not rise while the neighbour holds its counters.",
    ),
    Case(
        id="info-host-lock-table",
        klass=CaseClass.INFORMATION,
        title="a file lock a call in another container holds is not listed to this call "
        "(/proc/locks shows open file description locks of every pid namespace)",
        code=code(f"""
            samples, seen, give_up = 0, False, time.monotonic() + 3.0
            while not seen and time.monotonic() < give_up:
                try:
                    with open("/proc/locks") as handle:
                        seen = any(line.split()[-2:-1] == ["{LOCK_MARK}"] for line in handle)
                    samples += 1
                except OSError as exc:
                    samples = why(exc)
                    break
                time.sleep(0.05)
            report(samples=samples, seen=seen)
        """),
        neighbour=code(f"""
            import fcntl, struct, tempfile
            try:
                locked = tempfile.TemporaryFile()  # nameless: nothing left in a shared cwd
                handle = locked.fileno()
                lock = struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, {LOCK_MARK}, 1, 0)
                fcntl.fcntl(handle, 37, lock)  # F_OFD_SETLK: an open file description's lock
                time.sleep(2.0)
                error = None
            except OSError as exc:
                error = why(exc)
            report(error=error)
        """),
        contained=lambda obs: not obs.facts()["seen"],
        severity=Severity.HIGH,
        reference="retool_exec red-team round of 2026-12-05 (fifteenth): under runc the range "
        "of a call's open file description lock carried 62 bits of 62 to a call in another "
        "container through /proc/locks",
        timeout=10.0,
        exclusive=True,
        note="Masked under runc (read as empty); gVisor has no /proc/locks.",
    ),
    Case(
        id="info-host-counter-files",
        klass=CaseClass.INFORMATION,
        title="the host's file locks, disk reads, huge-page and NUMA node counts are not readable",
        code=code(f"""
            report(readable=readable_counts({HOST_COUNTER_FILES!r}))
        """),
        contained=lambda obs: obs.facts()["readable"] == [],
        severity=Severity.MEDIUM,
        reference="retool_exec red-team round of 2026-12-05 (fifteenth): under runc calls in "
        "different containers moved 12-16 bits exactly through the huge-page fault count, "
        "and read another's evictions from the page cache in /proc/diskstats",
        note="Masked under runc (read as empty or absent); gVisor has none of these files.",
        local=Expect.HOST_DEPENDENT,
    ),
    Case(
        id="info-host-key-users",
        klass=CaseClass.INFORMATION,
        title="no call reads the host's per-uid key counts (/proc/key-users: under runc, "
        "root's line counts every container's session keyring on the host)",
        code=code("""
            report(readable=readable_counts(["/proc/key-users"]))
        """),
        contained=lambda obs: obs.facts()["readable"] == [],
        severity=Severity.LOW,
        reference="retool_exec red-team round of 2026-12-05 (seventeenth): under runc a call "
        "read root's key count go 10 -> 13 -> 10 as three containers started and ended "
        "elsewhere on the host: other tenants' churn, and a slow channel between calls",
        note="Masked under runc (read as empty); gVisor has no /proc/key-users.",
        local=Expect.HOST_DEPENDENT,
    ),
    Case(
        id="info-host-disk-counts",
        klass=CaseClass.INFORMATION,
        title="no call reads the host's disk and file-system I/O counts, wherever sysfs keeps "
        "them, nor moves them with sync()",
        code=code("""
            import glob
            def disks():  # each disk's own counts, found the long way: any device directory
                found, level = [], ["/sys/devices"]  # that has both a stat and a queue
                for _depth in range(10):
                    below = []
                    for directory in level:
                        try:
                            entries = list(os.scandir(directory))
                        except OSError:
                            continue
                        names = {entry.name for entry in entries}
                        if {"stat", "queue"} <= names:
                            found.append(directory + "/stat")
                        below += [entry.path for entry in entries
                                  if entry.is_dir(follow_symlinks=False)]
                    level = below[:50000]
                return found
            paths = ["/proc/sys/fs/quota/syncs", *glob.glob("/sys/block/*/stat"),
                     *glob.glob("/sys/class/block/*/stat"), *glob.glob("/sys/dev/block/*/stat"),
                     *glob.glob("/sys/fs/*/*/lifetime_write_kbytes"), *disks()]
            before = {path: readable_counts([path]) and open(path).read() for path in paths}
            for _ in range(3):
                os.sync()
                try:
                    with open("/etc/hostname", "rb") as handle:
                        os.fsync(handle.fileno())  # a clean file on the host's disk: a flush
                except OSError:
                    pass
            moved = sorted(path for path in before
                           if before[path] and open(path).read() != before[path])
            report(readable=sorted(path for path in before if before[path])[:8], moved=moved[:8])
        """),
        contained=lambda obs: obs.facts()["readable"] == [],
        severity=Severity.MEDIUM,
        reference="retool_exec red-team round of 2026-12-05 (eighteenth): under runc each "
        "sync() moved the quota code's sync count by two and the disk's flush and write counts "
        "(/sys/block/vda/stat, a copy of the masked /proc/diskstats) by one: 7 bits a round "
        "between calls of different containers, fresh included",
        timeout=20.0,
        note="Masked under runc (hardening.HOST_DISK_PATHS, and each disk's own directory "
        "through host_sys_paths); "
        "the calls' filter makes sync and syncfs do nothing. gVisor has none of these files.",
        local=Expect.HOST_DEPENDENT,
    ),
    Case(
        id="info-host-extent-cache",
        klass=CaseClass.INFORMATION,
        title="no call reads the host file system's own statistics (/proc/fs), which one "
        "lseek() of an image file moves by one",
        code=code("""
            import glob, re
            def hits():
                found = {}
                for path in glob.glob("/proc/fs/*/*/*"):
                    try:
                        text = open(path).read(65536)
                    except OSError:
                        continue
                    match = re.search(r"(\\d+)/(\\d+) cache hits/misses", text)
                    if match:
                        found[path] = int(match.group(1))
                return found
            before = hits()
            fd = os.open(os.path.realpath("/usr/bin/python3"), os.O_RDONLY)
            for _ in range(1000):
                os.lseek(fd, 0, os.SEEK_DATA)  # overlay asks the host's ext4: one hit each
            after = hits()
            readable = sorted(readable_counts(glob.glob("/proc/fs/*/*/*")))
            report(readable=readable[:8],
                   moved={path: after[path] - before[path] for path in before if path in after})
        """),
        contained=lambda obs: obs.facts()["readable"] == [],
        severity=Severity.MEDIUM,
        reference="retool_exec red-team round of 2026-12-06 (nineteenth): under runc "
        "/proc/fs/ext4/<disk>/es_shrinker_info counts the host disk's extent-cache hits, "
        "and each lseek(SEEK_DATA) of an image file adds one: 16 bits per 0.35 s between "
        "calls of different containers, fresh included",
        note="Masked under runc (hardening.host_proc_paths masks every top-level /proc entry "
        "outside PROC_VISIBLE); gVisor has no /proc/fs.",
        local=Expect.HOST_DEPENDENT,
    ),
    Case(
        id="info-host-proc-entries",
        klass=CaseClass.INFORMATION,
        title="of /proc's top level, a call reads only its own processes and the reviewed "
        "entries, whatever the kernel adds",
        code=code("""
            reviewed = {"cpuinfo", "meminfo", "stat", "uptime", "loadavg", "version",
                        "filesystems", "swaps", "sys", "sysvipc", "mounts", "net", "self",
                        "thread-self"}
            gvisor = os.path.exists("/proc/sentry-meminfo")  # the Sentry's own, not the host's
            shown = []
            for name in sorted(os.listdir("/proc")):
                path = "/proc/" + name
                if name.isdigit() or name in reviewed or os.path.islink(path):
                    continue
                try:
                    if os.path.isdir(path):
                        content = os.listdir(path)
                    else:
                        with open(path, "rb") as handle:
                            content = handle.read(4096)
                except OSError:
                    continue
                if content:
                    shown.append(name)
            report(shown=shown, gvisor=gvisor)
        """),
        contained=lambda obs: obs.facts()["gvisor"] or obs.facts()["shown"] == [],
        severity=Severity.LOW,
        reference="retool_exec red-team round of 2026-12-06 (nineteenth): masking host-wide "
        "/proc entries one by one missed /proc/fs (info-host-extent-cache); the interrupt, "
        "softirq and pressure counts, the host's cgroup count and its devices were shown too",
        note="Masked under runc: every top-level entry outside hardening.PROC_VISIBLE. "
        "This list is the audit's own, so a change to PROC_VISIBLE shows here. Under gVisor "
        "/proc is the Sentry's own (its cgroups and cmdline are made up), so it passes.",
        local=Expect.HOST_DEPENDENT,
    ),
    Case(
        id="info-host-sys-entries",
        klass=CaseClass.INFORMATION,
        title="of /sys, a call reads only the CPUs' and memory nodes' descriptions and its own "
        "cgroup, whatever the kernel adds",
        code=code("""
            allowed = ("/sys/devices/system/cpu/", "/sys/devices/system/node/", "/sys/fs/cgroup/",
                       "/sys/class/net/", "/sys/devices/virtual/net/")  # the container's own
            gvisor = os.path.exists("/proc/sentry-meminfo")  # the Sentry's own, not the host's
            shown, stack, visited = [], [("/sys", 0)], 0
            while stack and visited < 20000:
                directory, depth = stack.pop()
                visited += 1
                try:
                    entries = list(os.scandir(directory))
                except OSError:
                    continue
                for entry in entries:
                    path = entry.path
                    inside = path.startswith(allowed) and not {"cpuidle", "cpufreq"} & set(
                        path.split("/"))
                    if entry.is_symlink():
                        continue
                    if entry.is_dir():
                        if depth < 6:
                            stack.append((path, depth + 1))
                        continue
                    if inside:
                        continue
                    try:
                        with open(path, "rb") as handle:
                            if handle.read(64).strip():
                                shown.append(path)
                    except OSError:
                        pass
            report(shown=sorted(shown)[:8], count=len(shown), gvisor=gvisor)
        """),
        contained=lambda obs: obs.facts()["gvisor"] or obs.facts()["count"] == 0,
        severity=Severity.LOW,
        reference="retool_exec red-team round of 2026-12-06 (nineteenth): /sys/kernel/irq held "
        "each device's interrupt counts (the disk's among them), /sys/kernel/uevent_seqnum the "
        "host's device events and cpuidle how often each CPU slept; sysfs was masked path by "
        "path",
        timeout=20.0,
        note="Masked under runc: every entry outside hardening.SYS_VISIBLE. This list is the "
        "audit's own. Under gVisor /sys is the Sentry's own, so it passes.",
        local=Expect.HOST_DEPENDENT,
    ),
    Case(
        id="info-host-rename-cookie",
        klass=CaseClass.INFORMATION,
        title="no call reads the host's count of renames (the cookie of inotify's move events)",
        code=code("""
            import struct
            def cookies(fd):
                os.rename("watched", "moved")
                os.rename("moved", "watched")
                data, found, at = os.read(fd, 4096), [], 0
                while at < len(data):
                    _wd, _mask, cookie, length = struct.unpack_from("iIII", data, at)
                    found.append(cookie)
                    at += 16 + length
                return found

            fd = libc.inotify_init1(0)
            if fd < 0:
                report(inotify=last_error(), moved=None)
            else:
                import tempfile
                with tempfile.TemporaryDirectory() as own:  # not the cwd: local runs share it
                    os.chdir(own)
                    open("watched", "w").close()
                    os.mkdir("unwatched")
                    open("unwatched/a", "w").close()
                    libc.inotify_add_watch(fd, own.encode(), 0x40 | 0x80)  # IN_MOVED_*
                    before = cookies(fd)
                    for _ in range(50):  # renames no one watches move the counter too
                        os.rename("unwatched/a", "unwatched/b")
                        os.rename("unwatched/b", "unwatched/a")
                    after = cookies(fd)
                report(inotify="ok", moved=after[0] - before[-1])
        """),
        contained=lambda obs: obs.facts()["moved"] is None,
        severity=Severity.MEDIUM,
        reference="retool_exec red-team round of 2026-12-05 (fifteenth): the cookie counts "
        "every rename on the host; under runc a call's renames moved the cookie a call in "
        "another container read by exactly what was sent (14 bits of 14)",
        note="The calls' filter refuses inotify_init and inotify_init1 (ENOSYS); gVisor's "
        "cookies are its own, but the filter refuses them there too.",
    ),
    Case(
        id="info-host-audit-session",
        klass=CaseClass.INFORMATION,
        title="a call cannot set its audit login uid (each setting takes a new audit session "
        "id from one counter for the host)",
        code=code("""
            def attempt():
                try:
                    with open("/proc/self/loginuid", "wb", buffering=0) as handle:
                        handle.write(b"0")
                    return "ok"
                except OSError as exc:
                    return why(exc)

            read, write = os.pipe()
            child = os.fork()
            if child == 0:  # a new process: the write is allowed once per process, if unset
                os.write(write, attempt().encode())
                os._exit(0)
            os.waitpid(child, 0)
            report(child=os.read(read, 100).decode(), own=attempt())
        """),
        contained=lambda obs: "ok" not in (obs.facts()["child"], obs.facts()["own"]),
        severity=Severity.MEDIUM,
        reference="retool_exec red-team round of 2026-12-05 (fifteenth): under runc the "
        "agent's login uid was unset, so every call process could set it once, moving the "
        "host's audit session counter that a call in another container read exactly",
        local=Expect.HOST_DEPENDENT,
        note="The agent sets the login uid as root at start (the calls' uid); changing it "
        "then needs CAP_AUDIT_CONTROL. gVisor refuses the write.",
    ),
    Case(
        id="info-host-socket-cookie",
        klass=CaseClass.INFORMATION,
        title="a socket's cookie (one counter for the host) is not given to calls",
        code=code("""
            import socket, struct
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                try:
                    cookie = struct.unpack("Q", sock.getsockopt(socket.SOL_SOCKET, 57, 8))[0]
                except OSError as exc:
                    cookie = why(exc)
            report(cookie=cookie)
        """),
        contained=lambda obs: not isinstance(obs.facts()["cookie"], int),
        severity=Severity.LOW,
        reference="retool_exec red-team round of 2026-12-05 (fifteenth): under runc two calls "
        "in different containers pinned to one CPU moved the socket cookie counter exactly",
        note="The calls' filter refuses getsockopt's SO_COOKIE (ENOPROTOOPT); gVisor has none.",
    ),
    Case(
        id="info-host-page-cache-drop",
        klass=CaseClass.INFORMATION,
        title="a call cannot drop a file's pages from the host's shared page cache",
        code=code("""
            fd = os.open(sys.executable, os.O_RDONLY)  # a file of the image, shared by all
            try:
                os.posix_fadvise(fd, 0, 4096, os.POSIX_FADV_DONTNEED)
                dropped = "ok"
            except OSError as exc:
                dropped = why(exc)
            finally:
                os.close(fd)
            report(dropped=dropped)
        """),
        contained=lambda obs: obs.facts()["dropped"] != "ok",
        severity=Severity.LOW,
        reference="retool_exec red-team round of 2026-12-05 (fifteenth): under runc a call "
        "evicted image files with POSIX_FADV_DONTNEED and read them again; a call in another "
        "container counted the disk reads (about 99% of what was sent)",
        note="The calls' filter refuses POSIX_FADV_DONTNEED (EPERM); other advice stays. "
        "Locally it drops one page of the interpreter's file from the host's cache.",
    ),
    Case(
        id="info-host-route-lookups",
        klass=CaseClass.INFORMATION,
        title="route lookups a call asks netlink for do not move the host's route counters "
        "it can read (in_martian_* of /proc/<pid>/net/stat/rt_cache)",
        code=code("""
            import socket, struct
            LOOKUPS = 200

            def martians():
                with open(f"/proc/{os.getpid()}/net/stat/rt_cache") as handle:
                    names, *cpus = [line.split() for line in handle]
                wanted = [names.index(name) for name in ("in_martian_dst", "in_martian_src")]
                return sum(int(cpu[index], 16) for cpu in cpus for index in wanted)

            try:
                before = martians()
            except (OSError, ValueError) as exc:
                before = why(exc)
            try:
                with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as sock:
                    attributes = (struct.pack("=HH4s", 8, 1, socket.inet_aton("127.0.0.1"))
                                  + struct.pack("=HH4s", 8, 2, bytes(4))  # from the zero address
                                  + struct.pack("=HHi", 8, 3, 1))  # arriving on lo
                    body = struct.pack("=BBBBBBBBI", socket.AF_INET, 32, 32, 0, 0, 0, 0, 0, 0)
                    for number in range(LOOKUPS):  # RTM_GETROUTE: a lookup, no packet
                        sock.send(struct.pack("=IHHII", 16 + len(body + attributes), 26, 1,
                                              number, 0) + body + attributes)
                        sock.recv(65536)
                asked = LOOKUPS
            except OSError as exc:
                asked = why(exc)
            try:
                after = martians()
            except (OSError, ValueError) as exc:
                after = why(exc)
            moved = after - before if isinstance(before, int) and isinstance(after, int) else None
            report(asked=asked, before=before, moved=moved)
        """),
        contained=_route_lookups_unseen,
        severity=Severity.MEDIUM,
        reference="retool_exec red-team round of 2026-12-05 (fifteenth): under runc route and "
        "neighbour lookups on lo moved host-wide counters that calls in other containers read "
        "exactly (12-16 bits of 12-16)",
        note="Under runc calls get no netlink socket unless DockerConfig(loopback_ip=True), "
        "which brings the channel back; gVisor keeps its own figures (its file is absent).",
        local=Expect.HOST_DEPENDENT,
    ),
)
