"""Privilege and escape: capabilities, uid, kernel attack surface, writable host paths.

Every attempt is made so that it is harmless when it succeeds: files are
opened for writing and closed without a byte written, a mount is undone at
once, kernel objects are created and closed. That is what lets the local
backend, which really runs as the host user, show that it is exposed.

Under gVisor some syscalls succeed that fail under runc (raw sockets,
``io_uring``): they reach gVisor's own kernel (the Sentry), never the
host's, which is the promise gVisor makes; those predicates accept success
there and say so in the case's ``note``.
"""

from __future__ import annotations

from retool_exec.security.model import Case, CaseClass, Observation, Severity
from retool_exec.security.model import exposed_as_root as as_root
from retool_exec.security.snippets import all_denied, code

__all__ = ["CASES"]

ZERO = "0000000000000000"
GVISOR_ONLY = "under gVisor the call reaches the Sentry's implementation, not the host kernel"


def _caps_contained(obs: Observation) -> bool:
    facts = obs.facts()
    caps = facts["caps"]
    required = all(caps.get(name) == ZERO for name in ("CapPrm", "CapEff", "CapBnd"))
    optional = all(caps.get(name) in (ZERO, None) for name in ("CapInh", "CapAmb"))
    seccomp = facts["seccomp"] == 2 or obs.ctx.gvisor
    return required and optional and facts["no_new_privs"] == 1 and seccomp


def _uid_contained(obs: Observation) -> bool:
    facts = obs.facts()
    ids = [*facts["resuid"], *facts["resgid"], *facts["groups"]]
    return bool(facts["resuid"]) and 0 not in ids


def _mounts_contained(obs: Observation) -> bool:
    facts = obs.facts()
    return facts["root_read_only"] is True and facts["host_disk_mounts"] == []


def _devices_contained(obs: Observation) -> bool:
    facts = obs.facts()
    unexpected = set(facts["char"]) - set(facts["standard"])
    if obs.ctx.gvisor:
        unexpected -= {"fuse", "net/tun"}  # the Sentry's own devices
    return facts["block"] == [] and not unexpected


def _kernel_info_contained(obs: Observation) -> bool:
    facts = obs.facts()
    syslog_ok = facts["syslog"] != "ok" or obs.ctx.gvisor  # gVisor's log is its own
    return facts["kcore"] != "opened" and not facts["kallsyms_addresses"] and syslog_ok


def _cap_operations_denied(obs: Observation) -> bool:
    attempts = dict(obs.facts()["attempts"])
    if obs.ctx.gvisor:
        for sentry_only in ("CAP_MKNOD", "CAP_SYS_NICE"):
            attempts.pop(sentry_only, None)
    return all_denied(attempts.values())


def _all_attempts_denied(obs: Observation) -> bool:
    return all_denied(obs.facts()["attempts"].values())


def _gvisor_or_all_denied(obs: Observation) -> bool:
    return obs.ctx.gvisor or all_denied(obs.facts()["attempts"].values())


CASES: tuple[Case, ...] = (
    Case(
        id="priv-capabilities",
        klass=CaseClass.PRIVILEGE,
        title="no capabilities, no new privileges, seccomp filter on",
        code=code("""
            status = dict(
                line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines()
                if ":\\t" in line
            )
            caps = {name: status[name].strip() for name in
                    ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb") if name in status}
            report(caps=caps, no_new_privs=libc.prctl(39, 0, 0, 0, 0),
                   seccomp=libc.prctl(21, 0, 0, 0, 0))
        """),
        contained=_caps_contained,
        severity=Severity.CRITICAL,
        reference="CIS Docker 5.3/5.25 (caps, no-new-privileges); moby TestContainerCapabilities",
        catalogue=(1,),
        note="seccomp mode 2 is required under runc; gVisor's Sentry is itself the filter",
    ),
    Case(
        id="priv-uid",
        klass=CaseClass.PRIVILEGE,
        title="the code does not run as root (uid, gid or supplementary group 0)",
        code=code("""
            report(resuid=os.getresuid(), resgid=os.getresgid(), groups=os.getgroups())
        """),
        contained=_uid_contained,
        severity=Severity.HIGH,
        reference="CIS Docker 4.1 (container user); epicbox runs as a non-root user",
        catalogue=(2,),
        local=as_root,
    ),
    Case(
        id="priv-setuid-binaries",
        klass=CaseClass.PRIVILEGE,
        title="no setuid/setgid binary exists, and no-new-privileges would stop one",
        code=code("""
            import stat
            found, seen, deadline = [], 0, time.monotonic() + 2.5
            for top in ("/bin", "/sbin", "/usr/bin", "/usr/sbin", "/usr/local/bin",
                        "/usr/local/sbin", "/usr/libexec", "/usr/lib", "/opt"):
                for root, dirs, files in os.walk(top):
                    if time.monotonic() > deadline:
                        break
                    for name in files:
                        seen += 1
                        try:
                            mode = os.lstat(os.path.join(root, name)).st_mode
                        except OSError:
                            continue
                        if stat.S_ISREG(mode) and mode & (stat.S_ISUID | stat.S_ISGID):
                            found.append(os.path.join(root, name))
            report(setuid=sorted(found)[:10], count=len(found), scanned=seen,
                   no_new_privs=libc.prctl(39, 0, 0, 0, 0))
        """),
        contained=lambda obs: obs.facts()["count"] == 0 and obs.facts()["no_new_privs"] == 1,
        severity=Severity.HIGH,
        reference="moby integration test: setuid binary under no-new-privileges keeps the EUID",
        catalogue=(3,),
    ),
    Case(
        id="priv-mount",
        klass=CaseClass.PRIVILEGE,
        title="mount(2) is refused",
        code=code("""
            target = f"/tmp/{TOKEN}-mnt"
            os.makedirs(target, exist_ok=True)
            rc = libc.mount(b"none", target.encode(), b"tmpfs", 0, b"size=64k")
            error = None if rc == 0 else last_error()
            if rc == 0:
                libc.umount2(target.encode(), 2)  # undo at once (MNT_DETACH)
            os.rmdir(target)
            report(attempts={"mount tmpfs": "ok" if rc == 0 else error})
        """),
        contained=lambda obs: all_denied(obs.facts()["attempts"].values()),
        severity=Severity.CRITICAL,
        reference="Docker seccomp profile (mount needs CAP_SYS_ADMIN); CVE-2022-0492",
        catalogue=(4,),
        local=as_root,
    ),
    Case(
        id="priv-unshare",
        klass=CaseClass.PRIVILEGE,
        title="new user/mount/pid/net namespaces are refused",
        code=code("""
            def attempt(flags):
                pid = os.fork()
                if pid == 0:
                    os._exit(0 if libc.unshare(flags) == 0 else min(ctypes.get_errno(), 250))
                status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
                return "ok" if status == 0 else errno.errorcode.get(status, str(status))
            report(attempts={
                "user+mount": attempt(0x10000000 | 0x00020000),
                "user": attempt(0x10000000),
                "pid": attempt(0x20000000),
                "net": attempt(0x40000000),
            })
        """),
        contained=_all_attempts_denied,
        severity=Severity.CRITICAL,
        reference="CVE-2022-0185 (fsconfig heap overflow reached through a user namespace)",
        catalogue=(4,),
        local=as_root,
        note="Refused by the calls' filter under both runtimes: gVisor's own checks let "
        "a call's user namespace change the container's network (security.md, finding 24).",
    ),
    Case(
        id="priv-keyctl",
        klass=CaseClass.PRIVILEGE,
        title="the kernel keyring is out of reach (keyctl, add_key, /proc/keys)",
        code=code("""
            def attempt(number, *args):
                pid = os.fork()
                if pid == 0:
                    ok = libc.syscall(number, *args) >= 0
                    os._exit(0 if ok else min(ctypes.get_errno(), 250))
                status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
                return "ok" if status == 0 else errno.errorcode.get(status, str(status))
            try:
                keys = "readable: %d bytes" % len(open("/proc/keys").read())
            except OSError as exc:
                keys = why(exc)
            report(attempts={
                # KEYCTL_JOIN_SESSION_KEYRING with no name: a new anonymous keyring
                "keyctl join": attempt(250, 1, None),
                # add_key to this process's own keyring (gone when it exits)
                "add_key": attempt(248, b"user", TOKEN.encode(), b"x", 1, ctypes.c_long(-2)),
            }, proc_keys=keys)
        """),
        contained=lambda obs: (
            all_denied(obs.facts()["attempts"].values())
            and obs.facts()["proc_keys"] in ("readable: 0 bytes", "ENOENT", "EACCES", "EPERM")
        ),
        severity=Severity.HIGH,
        reference="CVE-2016-0728 (keyring refcount overflow); Docker seccomp blocks keyctl",
        catalogue=(5,),
    ),
    Case(
        id="priv-proc-sys-write",
        klass=CaseClass.PRIVILEGE,
        title="kernel knobs under /proc cannot be opened for writing",
        code=code("""
            paths = ["/proc/sysrq-trigger", "/proc/sys/kernel/core_pattern",
                     "/proc/sys/kernel/modprobe", "/proc/sys/vm/panic_on_oom",
                     "/proc/sys/kernel/randomize_va_space"]
            report(attempts={path: try_open(path, os.O_WRONLY) for path in paths})
        """),
        contained=lambda obs: all_denied(obs.facts()["attempts"].values()),
        severity=Severity.CRITICAL,
        reference="CIS Docker 5.x (read-only /proc paths); core_pattern container escapes",
        catalogue=(6,),
        local=as_root,
    ),
    Case(
        id="priv-sysfs-write",
        klass=CaseClass.PRIVILEGE,
        title="/sys cannot be opened for writing (uevent_helper, power state)",
        code=code("""
            paths = ["/sys/kernel/uevent_helper", "/sys/power/state",
                     "/sys/kernel/mm/transparent_hugepage/enabled", "/sys/class/net/lo/mtu"]
            report(attempts={path: try_open(path, os.O_WRONLY) for path in paths})
        """),
        contained=lambda obs: all_denied(obs.facts()["attempts"].values()),
        severity=Severity.CRITICAL,
        reference="uevent_helper container escape; Docker mounts /sys read-only",
        catalogue=(6,),
        local=as_root,
    ),
    Case(
        id="priv-cgroup-write",
        klass=CaseClass.PRIVILEGE,
        title="cgroup files (release_agent, limits, cgroup.procs) cannot be opened for writing",
        code=code("""
            import glob
            names = ("release_agent", "notify_on_release", "cgroup.procs", "memory.max",
                     "memory.limit_in_bytes", "pids.max", "cgroup.subtree_control")
            paths = sorted({p for name in names for pattern in
                            ("/sys/fs/cgroup/" + name, "/sys/fs/cgroup/*/" + name)
                            for p in glob.glob(pattern)})[:40]
            report(attempts={path: try_open(path, os.O_WRONLY) for path in paths})
        """),
        contained=lambda obs: all_denied(obs.facts()["attempts"].values()),
        severity=Severity.CRITICAL,
        reference="CVE-2022-0492 (cgroup v1 release_agent escape); CIS Docker 5.x",
        catalogue=(6,),
        local=as_root,
    ),
    Case(
        id="priv-raw-socket",
        klass=CaseClass.PRIVILEGE,
        title="raw and packet sockets are refused",
        code=code("""
            import socket
            attempts = {}
            for name, args in (("AF_INET raw", (socket.AF_INET, socket.SOCK_RAW, 1)),
                               ("AF_INET6 raw", (socket.AF_INET6, socket.SOCK_RAW, 58)),
                               ("AF_PACKET", (socket.AF_PACKET, socket.SOCK_RAW, 0))):
                try:
                    socket.socket(*args).close()
                    attempts[name] = "ok"
                except OSError as exc:
                    attempts[name] = why(exc)
            report(attempts=attempts)
        """),
        contained=_gvisor_or_all_denied,
        severity=Severity.HIGH,
        reference="CVE-2020-14386 (AF_PACKET memory corruption); CIS Docker 5.3 (NET_RAW)",
        catalogue=(7,),
        local=as_root,
        note=GVISOR_ONLY + " (gVisor's netstack, which has only loopback here)",
    ),
    Case(
        id="priv-readonly-system",
        klass=CaseClass.PRIVILEGE,
        title="the interpreter, shell, libraries and /etc cannot be written",
        code=code("""
            import json as json_module, site
            files = [os.path.realpath(sys.executable), "/bin/sh", "/usr/bin/env",
                     json_module.__file__, "/etc/passwd", "/etc/ld.so.cache"]
            dirs = ["/usr/lib", "/usr/bin", "/etc", "/opt", *site.getsitepackages()]
            attempts = {path: try_open(path, os.O_WRONLY | os.O_APPEND) for path in files}
            attempts.update({path + "/": "ok" if os.access(path, os.W_OK) else "denied"
                             for path in dirs if os.path.isdir(path)})
            report(attempts=attempts)
        """),
        contained=lambda obs: all_denied(obs.facts()["attempts"].values()),
        severity=Severity.CRITICAL,
        reference="CVE-2019-5736 (overwriting the runtime binary); CIS Docker 5.12 read-only root",
        catalogue=(8,),
        local=as_root,
    ),
    Case(
        id="priv-docker-socket",
        klass=CaseClass.PRIVILEGE,
        title="no container-runtime socket (docker.sock, containerd) is reachable",
        code=code("""
            import stat
            sockets = []
            for top in ("/run", "/var/run", "/tmp", "/"):
                for root, dirs, files in os.walk(top):
                    if root.count("/") > 3 or root.startswith(("/proc", "/sys")):
                        dirs[:] = []
                        continue
                    for name in files:
                        path = os.path.join(root, name)
                        try:
                            if stat.S_ISSOCK(os.lstat(path).st_mode):
                                sockets.append(path)
                        except OSError:
                            pass
                    if top == "/":
                        dirs[:] = [d for d in dirs if d not in ("proc", "sys", "usr", "dev")]
            named = [p for p in ("/var/run/docker.sock", "/run/docker.sock",
                                 "/run/containerd/containerd.sock") if os.path.exists(p)]
            report(sockets=sorted(set(sockets))[:10], named=named,
                   docker_host=os.environ.get("DOCKER_HOST"))
        """),
        contained=lambda obs: obs.facts()["sockets"] == [] and obs.facts()["named"] == [],
        severity=Severity.CRITICAL,
        reference="CIS Docker 5.31 (Docker socket not mounted): whoever reaches it is root",
        catalogue=(9,),
    ),
    Case(
        id="priv-host-mounts",
        klass=CaseClass.PRIVILEGE,
        title="the root is read-only and no host disk is mounted (beyond Docker's /etc files)",
        code=code("""
            disk = {"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "vfat", "ntfs", "9p",
                    "virtiofs", "nfs", "nfs4", "cifs", "fuse", "fuseblk"}
            allowed = {"/etc/hosts", "/etc/hostname", "/etc/resolv.conf"}
            root_ro, flagged = None, []
            for line in open("/proc/self/mountinfo"):
                left, _, right = line.partition(" - ")
                fields, fstype = left.split(), right.split()[0]
                point, options = fields[4], fields[5].split(",")
                if point == "/":
                    root_ro = "ro" in options
                elif (fstype in disk or fstype.startswith("fuse.")) and point not in allowed:
                    flagged.append(f"{point} ({fstype})")
            report(root_read_only=root_ro, host_disk_mounts=flagged[:10])
        """),
        contained=_mounts_contained,
        severity=Severity.CRITICAL,
        reference="CIS Docker 5.5/5.12 (no sensitive host mounts, read-only root)",
        catalogue=(10,),
    ),
    Case(
        id="priv-other-process-memory",
        klass=CaseClass.PRIVILEGE,
        title="no other process's memory can be opened (ptrace access)",
        code=code("""
            def user_space(pid):  # kernel threads have an empty command line
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as handle:
                        return bool(handle.read(1))
                except OSError:
                    return False
            others = [pid for pid in sorted({AGENT, *(int(p) for p in os.listdir("/proc")
                                                      if p.isdigit())})
                      if pid != os.getpid() and user_space(pid)][:40]
            attempts = {pid: try_open(f"/proc/{pid}/mem", os.O_RDONLY) for pid in others}
            report(attempts=attempts, processes=len(others))
        """),
        contained=lambda obs: all_denied(obs.facts()["attempts"].values()),
        severity=Severity.CRITICAL,
        reference="CVE-2019-13272 (ptrace escalation); codejail 'can't see other sandboxes'",
        catalogue=(11,),
        local=as_root,  # without root, Yama's ptrace_scope decides
    ),
    Case(
        id="priv-cap-operations",
        klass=CaseClass.PRIVILEGE,
        title="each dropped capability's operation fails with EPERM",
        code=code("""
            base = f"/tmp/{TOKEN}-caps"
            open(base, "w").close()

            def in_child(action):
                pid = os.fork()
                if pid == 0:
                    try:
                        action()
                        os._exit(0)
                    except OSError as exc:
                        os._exit(min(exc.errno or 1, 250))
                    except BaseException:
                        os._exit(251)  # not an OSError: reported by number
                status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
                return "ok" if status == 0 else errno.errorcode.get(status, str(status))

            attempts = {
                "CAP_CHOWN": in_child(lambda: os.chown(base, 0, 0)),
                "CAP_MKNOD": in_child(lambda: os.mknod(base + "-dev", 0o600 | 0o020000,
                                                       os.makedev(1, 3))),
                "CAP_SETUID": in_child(lambda: os.setresuid(0, 0, 0)),
                "CAP_SETGID": in_child(lambda: os.setgroups([0])),
                "CAP_SYS_CHROOT": in_child(lambda: os.chroot("/tmp")),
                "CAP_SYS_NICE": in_child(lambda: os.setpriority(os.PRIO_PROCESS, 0, -5)),
                "CAP_DAC_OVERRIDE": try_open("/etc/shadow", os.O_RDONLY).replace("opened", "ok"),
            }
            for leftover in (base, base + "-dev"):
                if os.path.lexists(leftover):
                    os.unlink(leftover)
            report(attempts=attempts)
        """),
        contained=_cap_operations_denied,
        severity=Severity.HIGH,
        reference="moby integration tests: EPERM for each dropped capability; CIS Docker 5.3",
        catalogue=(1, 4),
        local=as_root,
        note="under gVisor, mknod and setpriority act only inside the Sentry (its own tmpfs "
        "node, its own scheduler) and are accepted there",
    ),
    Case(
        id="priv-kernel-info",
        klass=CaseClass.PRIVILEGE,
        title="kernel memory, symbol addresses and the kernel log are hidden",
        code=code("""
            try:
                with open("/proc/kallsyms") as handle:
                    lines = [next(handle, "") for _ in range(50)]
                addresses = any(line and int(line.split()[0], 16) for line in lines)
            except OSError:
                addresses = False
            buf = ctypes.create_string_buffer(4096)
            # SYSLOG_ACTION_READ_ALL: reads the log without consuming it
            syslog = "ok" if libc.klogctl(3, buf, 4096) >= 0 else last_error()
            report(kcore=try_open("/proc/kcore", os.O_RDONLY), kallsyms_addresses=addresses,
                   syslog=syslog)
        """),
        contained=_kernel_info_contained,
        severity=Severity.MEDIUM,
        reference="Docker's masked /proc paths (kcore, timer_list); KASLR leaks help exploits",
        catalogue=(6,),
        local=as_root,
        note="gVisor's kernel log is gVisor's own (no host message can appear in it)",
    ),
    Case(
        id="priv-devices",
        klass=CaseClass.PRIVILEGE,
        title="/dev holds only the standard pseudo-devices (no disks, no /dev/mem, no kmsg)",
        code=code("""
            import stat
            standard = ["null", "zero", "full", "random", "urandom", "tty", "ptmx", "console"]
            block, char = [], []
            for root, dirs, files in os.walk("/dev"):
                dirs[:] = [d for d in dirs if d not in ("pts", "shm", "mqueue")]
                for name in files + dirs:
                    path = os.path.join(root, name)
                    try:
                        mode = os.lstat(path).st_mode
                    except OSError:
                        continue
                    rel = path[len("/dev/"):]
                    if stat.S_ISBLK(mode):
                        block.append(rel)
                    elif stat.S_ISCHR(mode):
                        char.append(rel)
            report(block=sorted(block)[:10], char=sorted(char), standard=standard)
        """),
        contained=_devices_contained,
        severity=Severity.CRITICAL,
        reference="CIS Docker 5.17 (no host devices); /dev/mem and block-device escapes",
        catalogue=(10,),
        note="gVisor's own /dev/fuse and /dev/net/tun are Sentry devices",
    ),
    Case(
        id="priv-io-uring",
        klass=CaseClass.PRIVILEGE,
        title="io_uring (a large kernel attack surface that bypasses seccomp) is refused",
        code=code("""
            params = ctypes.create_string_buffer(120)
            fd = libc.syscall(425, 4, params)  # io_uring_setup(4 entries)
            result = "ok" if fd >= 0 else last_error()
            if fd >= 0:
                os.close(fd)
            report(attempts={"io_uring_setup": result})
        """),
        contained=_gvisor_or_all_denied,
        severity=Severity.HIGH,
        reference="CVE-2023-2598, CVE-2022-29582 (io_uring escapes); moby#46762 blocks io_uring",
        local=as_root,
        note=GVISOR_ONLY,
    ),
    Case(
        id="priv-bpf",
        klass=CaseClass.PRIVILEGE,
        title="bpf(2) is refused",
        code=code("""
            attr = ctypes.create_string_buffer(72)
            # BPF_MAP_CREATE: type ARRAY, key 4 bytes, value 4 bytes, one entry
            ctypes.memmove(attr, (2).to_bytes(4, "little") + (4).to_bytes(4, "little")
                           + (4).to_bytes(4, "little") + (1).to_bytes(4, "little"), 16)
            fd = libc.syscall(321, 0, attr, 72)
            result = "ok" if fd >= 0 else last_error()
            if fd >= 0:
                os.close(fd)
            report(attempts={"bpf map create": result})
        """),
        contained=lambda obs: all_denied(obs.facts()["attempts"].values()),
        severity=Severity.HIGH,
        reference="CVE-2021-3490 (eBPF verifier escape); Docker seccomp blocks bpf",
        local=as_root,
    ),
    Case(
        id="priv-perf-event",
        klass=CaseClass.PRIVILEGE,
        title="perf_event_open(2) is refused",
        code=code("""
            attr = ctypes.create_string_buffer(128)
            # type PERF_TYPE_SOFTWARE, size 128, config CPU_CLOCK; this process, any cpu
            ctypes.memmove(attr, (1).to_bytes(4, "little") + (128).to_bytes(4, "little"), 8)
            fd = libc.syscall(298, attr, 0, -1, -1, 0)
            result = "ok" if fd >= 0 else last_error()
            if fd >= 0:
                os.close(fd)
            report(attempts={"perf_event_open": result})
        """),
        contained=lambda obs: all_denied(obs.facts()["attempts"].values()),
        severity=Severity.HIGH,
        reference="CVE-2013-2094 (perf_swevent_init); Docker seccomp blocks perf_event_open",
        local=as_root,
    ),
    Case(
        id="priv-userfaultfd",
        klass=CaseClass.PRIVILEGE,
        title="userfaultfd(2), the kernel-exploit race widener, is refused",
        code=code("""
            fd = libc.syscall(323, 0o2000000)  # userfaultfd(O_CLOEXEC)
            result = "ok" if fd >= 0 else last_error()
            if fd >= 0:
                os.close(fd)
            report(attempts={"userfaultfd": result})
        """),
        contained=lambda obs: all_denied(obs.facts()["attempts"].values()),
        severity=Severity.MEDIUM,
        reference="CVE-2021-22555 exploitation; Docker seccomp allows it only with CAP_SYS_PTRACE",
        local=as_root,
    ),
)
