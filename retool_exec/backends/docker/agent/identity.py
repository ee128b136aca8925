"""Who each agent process is: uids, capabilities, and the calls' syscall filter.

Three identities share a container (see ``wire``): the supervisor (PID 1,
holds call data), the zygote (forks calls, holds none) and the calls. The
container starts as root with only ``wire.CONTAINER_CAPABILITIES``; the
supervisor and the zygote each keep just what they need, and each call's
child drops to the calls' uid with no capability at all (bounding set
included) and a seccomp filter on top of Docker's, before any call data
reaches it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import struct
from typing import TYPE_CHECKING

from . import wire

_libc = ctypes.CDLL(None, use_errno=True)

PR_SET_DUMPABLE = 4
PR_SET_KEEPCAPS = 8
PR_SET_SECCOMP = 22
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_GET_NO_NEW_PRIVS = 39
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2
_CAPABILITY_VERSION_3 = 0x20080522
EINVAL = 22

UNIGNORABLE = {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD}
IGNORED_SIGNALS = tuple(sorted(set(signal.valid_signals()) - UNIGNORABLE))
"""Every signal the agent's processes can ignore. Under runc PID 1 is shielded
anyway, but gVisor gives no such shield, and the zygote is not PID 1."""


class Identity:
    """A non-root ``uid:gid``."""

    def __init__(self, spec: str) -> None:
        uid, _, gid = spec.partition(":")
        self.uid, self.gid = int(uid), int(gid or uid)
        if min(self.uid, self.gid) <= 0:
            raise ValueError(f"identity {spec!r} must be a non-root uid:gid")

    def __repr__(self) -> str:
        return f"{self.uid}:{self.gid}"


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def prctl(option: int, arg: int = 0) -> None:
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


def harden_self() -> None:
    """Non-dumpable (no /proc/PID/mem, no ptrace for other uids) and deaf to signals."""
    prctl(PR_SET_DUMPABLE, 0)
    for signum in IGNORED_SIGNALS:
        try:
            signal.signal(signum, signal.SIG_IGN)
        except (OSError, ValueError):
            pass  # a runtime may refuse some (e.g. real-time signals it uses itself)


def become(who: Identity, capabilities: tuple[int, ...]) -> None:
    """From root, become ``who`` keeping exactly ``capabilities``; verified from /proc."""
    if os.getuid() != 0:
        raise PermissionError(f"the agent must start as root (it runs as uid {os.getuid()})")
    prctl(PR_SET_KEEPCAPS, 1)
    os.setgroups([])
    os.setresgid(who.gid, who.gid, who.gid)
    os.setresuid(who.uid, who.uid, who.uid)
    prctl(PR_SET_KEEPCAPS, 0)
    set_capabilities(capabilities)
    sets, wanted = capability_sets(), capability_mask(capabilities)
    if os.getresuid() != (who.uid,) * 3 or sets.get("CapEff") != wanted:
        raise PermissionError(f"could not become {who}: {os.getresuid()} {sets}")


AUDIT_UID_UNSET = 4294967295


def set_login_uid(uid: int) -> None:
    """As root, at start: set the audit login uid, once for the container's every process.

    Any process whose login uid is unset may set it, once, without a capability, and
    each write takes a new audit session id from one counter for the host, shown in
    ``/proc/self/sessionid``: calls forking K children that each wrote it moved the id
    a call in another container read by exactly K (fifteenth red-team round), and set
    the login uid the host's audit log names. Set here, it is inherited, and changing
    it needs CAP_AUDIT_CONTROL. Best effort: a kernel without audit has no such file,
    gVisor refuses the write and keeps no host-wide counter; an id set already stays.
    """
    try:
        with open("/proc/self/loginuid", "rb") as handle:
            if int(handle.read() or AUDIT_UID_UNSET) != AUDIT_UID_UNSET:
                return
        with open("/proc/self/loginuid", "wb", buffering=0) as handle:
            handle.write(str(uid).encode())
    except (OSError, ValueError):
        pass


def last_capability() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as handle:
            return int(handle.read())
    except (OSError, ValueError):
        return 63  # PR_CAPBSET_DROP of an unknown one is EINVAL, which is ignored


class SandboxDrop:
    """How a forked child becomes the calls' uid with no capability at all: built once.

    Why built ahead: a child's first write to any page it shares with the
    zygote copies that page, so every object it creates or touches costs a
    page fault. Building ctypes structures, trying all 64 capabilities and
    parsing ``/proc/self/status`` in each child cost ~100 such copies (about
    0.4 ms of CPU per call). Built in the supervisor before the zygote is
    forked, the structures are shared; the child only makes the syscalls.
    """

    def __init__(
        self, sandbox: Identity, last_cap: int, syscall_program: bytes, child_program: bytes
    ) -> None:
        self.sandbox = sandbox
        bounding = capability_sets().get("CapBnd")  # the bounding set only ever shrinks
        self.bounding = tuple(
            capability
            for capability in range(last_cap + 1)
            if bounding is None or bounding >> capability & 1
        )
        self._none = (_CapData * 2)()
        self._none_header = ctypes.pointer(_CapHeader(_CAPABILITY_VERSION_3, 0))
        self._read = (_CapData * 2)()
        self._read_header = ctypes.pointer(_CapHeader(_CAPABILITY_VERSION_3, 0))
        # What the check compares with: every set empty, and the uids, made here.
        self._cleared = bytes(ctypes.sizeof(self._read))
        self._ids = (self.sandbox.uid,) * 3
        self._prctl, self._capset, self._capget = _libc.prctl, _libc.capset, _libc.capget
        self._program = ctypes.create_string_buffer(syscall_program, len(syscall_program))
        self._fprog = ctypes.pointer(
            _SockFprog(len(syscall_program) // 8, ctypes.addressof(self._program))
        )
        self._child_program = ctypes.create_string_buffer(child_program, len(child_program))
        self._child_fprog = ctypes.pointer(
            _SockFprog(len(child_program) // 8, ctypes.addressof(self._child_program))
        )

    def lock_zygote(self, serving_capabilities: tuple[int, ...]) -> None:
        """In a zygote, once, before its first fork: what every child inherits; or raise.

        The empty bounding set, ``no_new_privs`` and the syscall filter pass to
        every child across fork and can never be undone, so they are made once
        here instead of in each child. Why: a child's every step before its
        request runs in its pages copied from the zygote (an off-path cost each
        call pays in CPU); measured in the image with the light zygote's
        modules, these three cost a child ~0.14 ms of CPU and ~18 page copies.
        Then the zygote keeps only ``serving_capabilities``: CAP_SETPCAP was
        needed for the bounding set alone.
        """
        for capability in self.bounding:
            failed = self._prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0
            if failed and ctypes.get_errno() != EINVAL:  # EINVAL: one this kernel lacks
                raise OSError(ctypes.get_errno(), f"PR_CAPBSET_DROP {capability}")
        if self._prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
        if self._prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, self._fprog, 0, 0) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"installing the seccomp filter: {os.strerror(errno)}")
        set_capabilities(serving_capabilities)
        sets = capability_sets()
        if sets.get("CapBnd", 0) or sets.get("CapEff") != capability_mask(serving_capabilities):
            raise PermissionError(f"the zygote could not lock itself down: {sets}")
        if self._prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1:
            raise PermissionError("no_new_privs did not hold")

    def apply(self) -> None:
        """In a child: the calls' uid and no capability at all; or raise.

        The bounding set, ``no_new_privs`` and the syscall filter are the zygote's
        (``lock_zygote``), inherited: a zygote serves no fork before it holds them.
        The child adds what the zygote may do and a call may not (``parent_filter``).
        """
        if self._prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, self._child_fprog, 0, 0) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"installing the child's seccomp filter: {os.strerror(errno)}")
        sandbox = self.sandbox
        os.setgroups([])
        os.setresgid(sandbox.gid, sandbox.gid, sandbox.gid)
        os.setresuid(sandbox.uid, sandbox.uid, sandbox.uid)
        self._prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)  # EINVAL where unsupported
        if self._capset(self._none_header, self._none) != 0:
            raise OSError(ctypes.get_errno(), "capset")
        if self._capget(self._read_header, self._read) != 0:
            raise OSError(ctypes.get_errno(), "capget")
        # The raw sets, not the structures' fields: each field read builds objects in
        # the child (pages it copies); the sets were all asked empty, so all must be.
        if os.getresuid() != self._ids or bytes(self._read) != self._cleared:
            raise PermissionError(f"could not become the sandbox user: {os.getresuid()}")


class acting_as:
    """Context manager: the supervisor's effective ids are ``who``'s for the block.

    What a call leaves (files, queues, SysV objects, processes) belongs to the
    calls' uid, which can remove or kill all of it, and nothing else: killing
    with ``kill(-1)`` as that uid spares the zygote. The real and saved ids
    stay the supervisor's, so no process of the calls' uid can signal it.
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
    # io_uring_setup, io_uring_enter, io_uring_register (one number on every arch), mq_open,
    # then Linux AIO: io_setup, io_destroy, io_getevents, io_submit, io_cancel, io_pgetevents,
    # then eventfd and eventfd2, inotify_init and inotify_init1 (aarch64: the second of each)
    "x86_64": (425, 426, 427, 240, 206, 207, 208, 209, 210, 333, 284, 290, 253, 294),
    "aarch64": (425, 426, 427, 180, 0, 1, 4, 2, 3, 292, 19, 26),
}
"""Refused with ENOSYS, as a kernel built without them would. io_uring: the source of
most kernel exploits in Google's kCTF, allowed by Docker's profile before Engine 25.
mq_open: queue space is per uid (security.md, finding 3). AIO: ``aio-nr`` is one budget
for the whole host (``fs.aio-max-nr``), which one call took whole for the host and every
other container, and whose count any container can read (a channel across containers,
``fresh`` included); no tool code uses Linux AIO. eventfd: each one's id (in
``/proc/self/fdinfo``) comes from one lowest-free allocator for the whole host, so a call
holding 200 moved the id a call in another container got by exactly 200 (fifteenth
red-team round); Python's stdlib and the image's libraries use none (asyncio wakes itself
with a socket pair). inotify: the cookie of a rename's two events counts every rename
the host has made, in any container, watched or not, so a call renaming files K times
moved the cookie a call in another container read by exactly K (the same round); its
only users are file watchers (watchdog), which tool code does not need."""
HOST_SYNC_SYSCALLS = {
    "x86_64": (162, 306, 74, 75, 26, 277),
    "aarch64": (81, 267, 82, 83, 227, 84),
}
"""sync, syncfs, fsync, fdatasync, msync and sync_file_range: done at once, with nothing
done (a return of 0). Every file a call can write is in memory (``/tmp``, ``/dev/shm``),
so there is nothing of its own to flush; what they did was flush the host's disks: each
``sync()`` moved the host's quota sync count by two and the disk's flush and write
counts by one, exact counts any container read (eighteenth red-team round), and an
``fsync`` of a clean file the host's disk holds (Docker's ``/etc/hostname``) still
makes ext4 flush the disk. The counts are masked too (``hardening.HOST_DISK_PATHS``)."""
SOCKET_OPTION_SYSCALLS = {"x86_64": 55, "aarch64": 209}
"""getsockopt: ``SOL_SOCKET``'s ``SO_COOKIE`` fails with ENOPROTOOPT, as on a kernel before
4.12. A socket's cookie comes from one counter for the host, handed to each CPU in
batches: two calls in different containers pinned to one CPU moved it exactly (fifteenth
round)."""
SOL_SOCKET, SO_COOKIE, ENOPROTOOPT = 1, 57, 92
FADVISE_SYSCALLS = {"x86_64": 221, "aarch64": 223}
"""fadvise64: ``POSIX_FADV_DONTNEED`` fails with EPERM. It drops a file's pages from the
host's page cache, which every container shares: a call evicted image files and read
them again, and another call counted the disk reads it caused (fifteenth round), or
timed its own reads; it also slows every other container. Other advice stays."""
POSIX_FADV_DONTNEED = 4
SOCKET_SYSCALLS = {"x86_64": (41, 53), "aarch64": (198, 199)}
"""socket and socketpair, whose first argument is the address family."""
ALLOWED_FAMILIES = (1, 2, 10, 16)
"""AF_UNIX, AF_INET, AF_INET6, AF_NETLINK (the last three where IP is on). Any other
family is refused with EAFNOSUPPORT: AF_VSOCK, which Docker's profile allows before
Engine 23, is not namespaced at all (every container shares one port space, a channel
across containers, and it reaches the hypervisor's host where there is one); the rest
are kernel surface no tool code needs."""
INET_FAMILIES = (2, 10)
"""AF_INET and AF_INET6, refused with EACCES where IP is off (``DockerConfig.loopback_ip``,
off under runc by default): under runc both reach figures the host kernel keeps for
every container at once. A TCP connect draws its source port from a table shared by
every network namespace (``inet_hash_connect``'s perturbation table) and moves it:
calls in different containers, at any time apart, moved bytes exactly through it (ninth
red-team round, finding 30). A socket's buffered data counts in the host's ``UDP: mem``
or ``TCP: mem``, which ``/proc/net/sockstat`` shows in every container, and no path
mask covers (``/proc/net`` is each process's own): two calls running at once in
different containers moved 48 bits of 48 through it with unread loopback UDP data
(fourteenth round, finding 36). Without IP sockets a call moves none of these.
Unix sockets and resolving ``localhost`` stay."""
NETLINK_FAMILY = 16
"""AF_NETLINK, refused with EACCES where IP is off, as IP is. Under runc some of its
requests move counters the host keeps for all containers, which its dumps and
``/proc/<pid>/net/stat`` show in every container: a neighbour lookup on ``lo`` moves the
ARP table's ``lookups``, a route lookup from ``lo`` to or from 0.0.0.0 ``in_martian_*``;
calls in different containers moved 12-16 bits exactly through each (fifteenth red-team
round). A seccomp filter cannot read the messages, so the family goes. glibc's
``getaddrinfo`` asks netlink only which address families are configured and assumes
both without it; ``socket.if_nameindex`` and listing interfaces fail (there is only
``lo``)."""
NO_IP_FAMILIES = (*INET_FAMILIES, NETLINK_FAMILY)
"""The families refused with EACCES where IP is off."""
NAMESPACE_SYSCALLS = {"x86_64": (272, 308), "aarch64": (97, 268)}
"""unshare and setns, refused with EPERM (as to a process without the capability). Under
gVisor a call could make a user namespace of its own and then held, in gVisor's checks,
the network-admin capability over the container's network namespace: addresses it added
to ``lo`` outlived it, read back by the next call (seventh red-team round); runc's Docker
profile refused it already. No tool code makes namespaces."""
CLONE_SYSCALLS = {"x86_64": (56, 435), "aarch64": (220, 435)}
"""clone, whose flags (its first argument) may not ask for a new namespace or another
parent (``CLONE_REFUSED``), and clone3,
refused with ENOSYS since its flags are behind a pointer: glibc falls back to clone."""
CLONE_NEW_NAMESPACES = 0x7E020000
"""CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET (all the low
32 bits the kernel reads; CLONE_NEWTIME's bit is clone's exit signal, unshare's only)."""
CLONE_PARENT = 0x8000
"""A new process whose parent is the caller's parent: for a call's own process, the
supervisor. Such a process is outside the call's tree; when the zygote was the calls'
parent, it reaped such processes and reported their statuses as its children's, and a
call planted statuses that later calls, once the pid counter came round to those pids,
took for their own (tenth red-team round). No tool code needs it. The zygote itself
forks with it (``forking``), so its filter allows it and each child adds
``parent_filter``, which refuses it."""
CLONE_REFUSED = CLONE_NEW_NAMESPACES | CLONE_PARENT
"""The flags of clone that are refused with EPERM (to a call: ``syscall_filter`` and
``parent_filter`` together)."""
OWN_PROCESS_SYSCALLS = {
    "x86_64": ((141, 1), (251, 1), (142, 0), (144, 0), (203, 0), (314, 0)),
    "aarch64": ((140, 1), (30, 1), (118, 0), (119, 0), (122, 0), (274, 0)),
}
"""(syscall, argument) pairs that act on the process that argument names: setpriority and
ioprio_set (``who``), sched_setparam, sched_setscheduler, sched_setaffinity and
sched_setattr (``pid``). Only 0, the caller itself (its group, its uid), is allowed,
else EPERM. gVisor checks no uid for setpriority or sched_setaffinity: a call reniced
the supervisor and the zygotes and moved them to other CPUs, values the next calls read
back and inherited (seventh red-team round); runc refused, as the agents are other uids.
A thread's affinity set by its tid is refused too (``os.sched_setaffinity(0, ...)``
works)."""
PTRACE_SYSCALLS = {"x86_64": 101, "aarch64": 117}
"""ptrace, whose request (its first argument) may not be ``PTRACE_TRACEME`` (EPERM).

Why: ``PTRACE_TRACEME`` makes the caller's parent its tracer, and a call's process (a
session's too) is the supervisor's child. Its stops then reached the supervisor's wait
as if the process had ended: a call that traced itself and sent itself a signal read
as exited with that signal's number, while it lived on in a tracing stop (nineteenth
red-team round, finding 54). A call may still trace its own processes with
``PTRACE_ATTACH`` or ``PTRACE_SEIZE``: the tracer is then the call's own process.
gVisor refused the request already. The request is read from its low 32 bits: one whose
low half is 0 and high half is not is no request the kernel knows either."""
PTRACE_TRACEME = 0
X32_SYSCALL_BIT = 0x40000000
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
EPERM = 1
ENOSYS = 38
EAFNOSUPPORT = 97
EACCES = 13
SECCOMP_DATA_ARG0 = 16
"""Offset of the first argument's low 32 bits in ``seccomp_data`` (little-endian); each
next argument is 8 bytes further."""
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_JSET_K, _BPF_RET_K = 0x20, 0x15, 0x45, 0x06
if TYPE_CHECKING:  # (``int | str`` is not an expression the agent's Python 3.9 can run)
    _Instruction = tuple[str, int, int | str, int | str, int]
    """(label, code, jump-if-true, jump-if-false, k): a jump names a later label, or 0."""


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def syscall_filter(machine: str, *, ip: bool = True, zygote: bool = False) -> bytes:
    """The classic-BPF seccomp program for ``machine`` (see the tables above).

    Only on the native ABI (x32 and other architectures are refused); an ``int``
    argument (a family, a pid, clone's flags) is read from its low 32 bits, all the
    kernel reads of it. ``ip`` false: no socket of ``NO_IP_FAMILIES``, EACCES.
    ``zygote``: the program a zygote holds, which lets clone ask for ``CLONE_PARENT``
    (each child adds ``parent_filter``).
    """
    to_inet: list[_Instruction] = []
    inet: list[_Instruction] = []
    if not ip:
        to_inet = [("", _BPF_JEQ_K, "inet", 0, family) for family in NO_IP_FAMILIES]
        inet = [("inet", _BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | EACCES)]
    arch, denied = AUDIT_ARCH[machine], DENIED_SYSCALLS[machine]
    clone, clone3 = CLONE_SYSCALLS[machine]
    clone_refused = CLONE_NEW_NAMESPACES if zygote else CLONE_REFUSED
    program: list[_Instruction] = [
        ("", _BPF_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        ("", _BPF_JEQ_K, 0, "deny", arch),
        ("", _BPF_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
        ("", _BPF_JSET_K, "deny", 0, X32_SYSCALL_BIT),
        *(("", _BPF_JEQ_K, "deny", 0, number) for number in (*denied, clone3)),
        *(("", _BPF_JEQ_K, "refuse", 0, number) for number in NAMESPACE_SYSCALLS[machine]),
        *(("", _BPF_JEQ_K, "done", 0, number) for number in HOST_SYNC_SYSCALLS[machine]),
        ("", _BPF_JEQ_K, "clone", 0, clone),
        ("", _BPF_JEQ_K, "option", 0, SOCKET_OPTION_SYSCALLS[machine]),
        ("", _BPF_JEQ_K, "advice", 0, FADVISE_SYSCALLS[machine]),
        ("", _BPF_JEQ_K, "ptrace", 0, PTRACE_SYSCALLS[machine]),
        *(("", _BPF_JEQ_K, "family", 0, number) for number in SOCKET_SYSCALLS[machine]),
        *(
            ("", _BPF_JEQ_K, f"self{argument}", 0, number)
            for number, argument in OWN_PROCESS_SYSCALLS[machine]
        ),
        ("", _BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
        ("family", _BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_ARG0),
        *to_inet,
        *(("", _BPF_JEQ_K, "allow", 0, family) for family in ALLOWED_FAMILIES),
        ("", _BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | EAFNOSUPPORT),
        *inet,
        ("clone", _BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_ARG0),
        ("", _BPF_JSET_K, "refuse", "allow", clone_refused),
        ("option", _BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_ARG0 + 8),  # level
        ("", _BPF_JEQ_K, 0, "allow", SOL_SOCKET),
        ("", _BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_ARG0 + 16),  # optname
        ("", _BPF_JEQ_K, "no_option", "allow", SO_COOKIE),
        ("advice", _BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_ARG0 + 24),
        ("", _BPF_JEQ_K, "refuse", "allow", POSIX_FADV_DONTNEED),
        ("ptrace", _BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_ARG0),  # request
        ("", _BPF_JEQ_K, "refuse", "allow", PTRACE_TRACEME),
        ("self0", _BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_ARG0),
        ("", _BPF_JEQ_K, "allow", "refuse", 0),
        ("self1", _BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_ARG0 + 8),
        ("", _BPF_JEQ_K, "allow", "refuse", 0),
        ("allow", _BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
        ("refuse", _BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | EPERM),
        ("done", _BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | 0),
        ("no_option", _BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | ENOPROTOOPT),
        ("deny", _BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | ENOSYS),
    ]
    return _assemble(program)


def parent_filter(machine: str) -> bytes:
    """The program each call's child adds to its zygote's: clone may not ask for
    ``CLONE_PARENT`` (EPERM). Filters stack, and the stricter answer wins."""
    clone, _clone3 = CLONE_SYSCALLS[machine]
    return _assemble(
        [
            ("", _BPF_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch (the zygote's refuses others)
            ("", _BPF_JEQ_K, 0, "allow", AUDIT_ARCH[machine]),
            ("", _BPF_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
            ("", _BPF_JEQ_K, 0, "allow", clone),
            ("", _BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_ARG0),
            ("", _BPF_JSET_K, "refuse", "allow", CLONE_PARENT),
            ("allow", _BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
            ("refuse", _BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | EPERM),
        ]
    )


def _assemble(program: list[_Instruction]) -> bytes:
    where = {label: index for index, (label, *_rest) in enumerate(program) if label}

    def offset(index: int, target: int | str) -> int:
        if isinstance(target, int):
            return target
        jump = where[target] - index - 1
        if not 0 <= jump <= 255:
            raise ValueError(f"a BPF jump to {target!r} cannot reach it ({jump})")
        return jump

    return b"".join(
        struct.pack("=HBBI", code_, offset(index, true), offset(index, false), k)
        for index, (_label, code_, true, false, k) in enumerate(program)
    )


def lock_shared_devices() -> list[str]:
    """As root, at start: make ptys and POSIX queue files unusable by the calls.

    Both come from pools shared beyond the container: ptys from the host's
    ``kernel.pty.max``, queue space from the per-uid RLIMIT_MSGQUEUE. Root
    owns both entries, so it can chmod them without any capability. Returns
    what could not be locked (the host refuses such a container).
    """
    problems = []
    for path, mode in ((wire.PTY_MASTER, 0o000), (wire.MQUEUE_DIR, 0o755)):
        try:
            os.chmod(path, mode)
        except FileNotFoundError:
            continue
        except OSError as exc:
            problems.append(f"{path}: {exc.strerror}")
            continue
        if os.stat(path).st_mode & 0o7777 != mode:
            problems.append(f"{path}: mode did not change")
    return problems
