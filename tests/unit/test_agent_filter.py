"""The calls' seccomp program and the agent's identities, checked without Docker.

The program is run by a small classic-BPF interpreter over every architecture
and syscall number, so a wrong jump offset shows up here rather than as a
syscall quietly allowed in a container.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retool_exec.backends.docker.agent import identity as agent
from retool_exec.backends.docker.agent import supervisor

ALLOW, DENY = agent.SECCOMP_RET_ALLOW, agent.SECCOMP_RET_ERRNO | agent.ENOSYS
REFUSE = agent.SECCOMP_RET_ERRNO | agent.EPERM
NO_FAMILY = agent.SECCOMP_RET_ERRNO | agent.EAFNOSUPPORT
NO_IP = agent.SECCOMP_RET_ERRNO | agent.EACCES
READ = {"x86_64": 0, "aarch64": 63}
EVENTFD_SYSCALLS = {"x86_64": (284, 290), "aarch64": (19,)}
"""eventfd and eventfd2 by number (from the kernel's syscall tables, not the agent's)."""
INOTIFY_SYSCALLS = {"x86_64": (253, 294), "aarch64": (26,)}
NO_OPTION = agent.SECCOMP_RET_ERRNO | agent.ENOPROTOOPT
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_PACKET, AF_ALG, AF_VSOCK = 1, 2, 10, 16, 17, 38, 40


def run_bpf(
    program: bytes,
    *,
    arch: int,
    nr: int,
    arg0: int = 0,
    arg1: int = 0,
    arg2: int = 0,
    arg3: int = 0,
) -> int:
    """Evaluate a seccomp program over ``seccomp_data`` holding ``nr``, ``arch`` and the
    first four arguments (64 bits each, little-endian as on both architectures)."""
    data = struct.pack("=IIQQQQQ", nr, arch, 0, arg0, arg1, arg2, arg3) + bytes(16)
    instructions = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    accumulator, pc = 0, 0
    for _ in range(len(instructions)):
        code, jt, jf, k = instructions[pc]
        if code == 0x20:  # ld [k]
            (accumulator,) = struct.unpack_from("=I", data, k)
            pc += 1
        elif code == 0x15:  # jeq k
            pc += 1 + (jt if accumulator == k else jf)
        elif code == 0x45:  # jset k
            pc += 1 + (jt if accumulator & k else jf)
        elif code == 0x54:  # and k
            accumulator &= k
            pc += 1
        elif code == 0x06:  # ret k
            return k
        else:
            raise AssertionError(f"unexpected BPF opcode {code:#x}")
    raise AssertionError("the program ran off its end")


def expected(
    machine: str, nr: int, arg0: int, arg1: int, *, arg2: int = 0, arg3: int = 0, ip: bool = True
) -> int:
    """What the filter must answer on ``machine``'s native ABI, from the tables."""
    low = 0xFFFFFFFF
    if nr == agent.SOCKET_OPTION_SYSCALLS[machine]:
        cookie = arg1 & low == agent.SOL_SOCKET and arg2 & low == agent.SO_COOKIE
        return NO_OPTION if cookie else ALLOW
    if nr == agent.FADVISE_SYSCALLS[machine]:
        return REFUSE if arg3 & low == agent.POSIX_FADV_DONTNEED else ALLOW
    if nr == agent.PTRACE_SYSCALLS[machine]:
        return REFUSE if arg0 & low == agent.PTRACE_TRACEME else ALLOW
    clone, clone3 = agent.CLONE_SYSCALLS[machine]
    if nr in agent.DENIED_SYSCALLS[machine] or nr == clone3:
        return DENY
    if nr in agent.NAMESPACE_SYSCALLS[machine]:
        return REFUSE
    if nr in agent.HOST_SYNC_SYSCALLS[machine]:
        return agent.SECCOMP_RET_ERRNO  # errno 0: done, nothing done
    if nr == clone:
        return REFUSE if arg0 & agent.CLONE_REFUSED else ALLOW
    if nr in agent.SOCKET_SYSCALLS[machine]:
        family = arg0 & 0xFFFFFFFF
        if not ip and family in agent.NO_IP_FAMILIES:
            return NO_IP
        return ALLOW if family in agent.ALLOWED_FAMILIES else NO_FAMILY
    for number, argument in agent.OWN_PROCESS_SYSCALLS[machine]:
        if nr == number:
            return ALLOW if (arg0, arg1)[argument] & 0xFFFFFFFF == 0 else REFUSE
    return ALLOW


@pytest.mark.parametrize("machine", sorted(agent.AUDIT_ARCH))
def test_io_uring_aio_mq_open_and_eventfd_are_refused_with_enosys(machine: str) -> None:
    program, arch = agent.syscall_filter(machine), agent.AUDIT_ARCH[machine]
    for nr in agent.DENIED_SYSCALLS[machine]:
        assert run_bpf(program, arch=arch, nr=nr) == DENY
    added = (*EVENTFD_SYSCALLS[machine], *INOTIFY_SYSCALLS[machine])
    assert set(added) <= set(agent.DENIED_SYSCALLS[machine])
    assert len(agent.DENIED_SYSCALLS[machine]) == 10 + len(added)  # io_uring x3, mq_open, AIO x6
    assert run_bpf(program, arch=arch, nr=READ[machine]) == ALLOW
    assert run_bpf(program, arch=arch, nr=424) == ALLOW  # the neighbours of io_uring
    assert run_bpf(program, arch=arch, nr=428) == ALLOW


@pytest.mark.parametrize("machine", sorted(agent.AUDIT_ARCH))
def test_socket_cookies_and_dropping_cached_pages_are_refused(machine: str) -> None:
    program, arch = agent.syscall_filter(machine), agent.AUDIT_ARCH[machine]
    option, advise = agent.SOCKET_OPTION_SYSCALLS[machine], agent.FADVISE_SYSCALLS[machine]
    assert run_bpf(program, arch=arch, nr=option, arg1=1, arg2=57) == NO_OPTION  # SO_COOKIE
    assert run_bpf(program, arch=arch, nr=option, arg1=1, arg2=7) == ALLOW  # SO_SNDBUF
    assert run_bpf(program, arch=arch, nr=option, arg1=6, arg2=57) == ALLOW  # another level
    assert run_bpf(program, arch=arch, nr=advise, arg3=4) == REFUSE  # POSIX_FADV_DONTNEED
    for advice in (0, 1, 2, 3, 5):
        assert run_bpf(program, arch=arch, nr=advise, arg3=advice) == ALLOW


@pytest.mark.parametrize("machine", sorted(agent.AUDIT_ARCH))
def test_sockets_of_other_families_than_unix_inet_and_netlink_are_refused(machine: str) -> None:
    program, arch = agent.syscall_filter(machine), agent.AUDIT_ARCH[machine]
    for nr in agent.SOCKET_SYSCALLS[machine]:
        for family in (AF_UNIX, AF_INET, AF_INET6, AF_NETLINK):
            assert run_bpf(program, arch=arch, nr=nr, arg0=family) == ALLOW
            assert run_bpf(program, arch=arch, nr=nr, arg0=family | 1 << 40) == ALLOW  # int
        for family in (0, AF_PACKET, AF_ALG, AF_VSOCK, 45, 0xFFFFFFFF, AF_VSOCK | 1 << 32):
            assert run_bpf(program, arch=arch, nr=nr, arg0=family) == NO_FAMILY
    assert run_bpf(program, arch=arch, nr=READ[machine], arg0=AF_VSOCK) == ALLOW


@pytest.mark.parametrize("machine", sorted(agent.AUDIT_ARCH))
def test_without_ip_there_is_no_inet_or_netlink_socket_of_any_type(machine: str) -> None:
    """``DockerConfig(loopback_ip=False)``: no TCP, UDP, ping, SCTP..., no netlink,
    whatever flags ride in the type; unix sockets of every type stay."""
    sock_stream, sock_dgram, nonblock_cloexec = 1, 2, 0x800 | 0x80000
    arch = agent.AUDIT_ARCH[machine]
    for ip, want in ((True, ALLOW), (False, NO_IP)):
        program = agent.syscall_filter(machine, ip=ip)
        for nr in agent.SOCKET_SYSCALLS[machine]:
            for family in (AF_INET, AF_INET6, AF_INET | 1 << 40):
                for kind in (sock_stream, sock_stream | nonblock_cloexec, sock_dgram, 3, 5, 6):
                    assert run_bpf(program, arch=arch, nr=nr, arg0=family, arg1=kind) == want
            for kind in (sock_stream, sock_dgram, sock_dgram | nonblock_cloexec, 5):
                assert run_bpf(program, arch=arch, nr=nr, arg0=AF_UNIX, arg1=kind) == ALLOW
            for protocol in (0, 4, 16):  # route, sock_diag, generic
                netlink = run_bpf(program, arch=arch, nr=nr, arg0=AF_NETLINK, arg1=3, arg2=protocol)
                assert netlink == want, protocol
            assert run_bpf(program, arch=arch, nr=nr, arg0=AF_VSOCK, arg1=1) == NO_FAMILY


@pytest.mark.parametrize("machine", sorted(agent.AUDIT_ARCH))
def test_no_namespace_and_no_other_process_s_priority_or_cpus(machine: str) -> None:
    program, arch = agent.syscall_filter(machine), agent.AUDIT_ARCH[machine]
    clone, clone3 = agent.CLONE_SYSCALLS[machine]
    for nr in agent.NAMESPACE_SYSCALLS[machine]:
        assert run_bpf(program, arch=arch, nr=nr, arg0=0x10000000) == REFUSE
    assert run_bpf(program, arch=arch, nr=clone3) == DENY
    thread, fork = 0x003D0F00, 0x01200011  # glibc's pthread_create and fork flags
    for flags in (thread, fork, 0x01200011 | 1 << 40):
        assert run_bpf(program, arch=arch, nr=clone, arg0=flags) == ALLOW
    for namespace in (0x20000, 0x2000000, 0x4000000, 0x8000000, 0x10000000, 0x40000000):
        assert run_bpf(program, arch=arch, nr=clone, arg0=fork | namespace) == REFUSE
    clone_parent = 0x8000  # a child of the zygote, outside the call's tree
    assert run_bpf(program, arch=arch, nr=clone, arg0=fork | clone_parent) == REFUSE
    assert run_bpf(program, arch=arch, nr=clone, arg0=0x4111 | clone_parent) == REFUSE
    for number, argument in agent.OWN_PROCESS_SYSCALLS[machine]:
        own = {"arg0": 0, "arg1": 0}
        assert run_bpf(program, arch=arch, nr=number, **own) == ALLOW
        other = {f"arg{argument}": 1}
        assert run_bpf(program, arch=arch, nr=number, **other) == REFUSE
        assert run_bpf(program, arch=arch, nr=number, **{f"arg{1 - argument}": 1}) == ALLOW
    assert len(agent.OWN_PROCESS_SYSCALLS[machine]) == 6


PTRACE_NUMBERS = {"x86_64": 101, "aarch64": 117}
"""ptrace by number (from the kernel's syscall tables, not the agent's)."""


@pytest.mark.parametrize("machine", sorted(agent.AUDIT_ARCH))
def test_a_call_may_not_make_its_parent_its_tracer(machine: str) -> None:
    """PTRACE_TRACEME made the supervisor the tracer of a call's process, and its stops
    read as its exit (finding 54); tracing its own processes by attaching stays."""
    program, arch = agent.syscall_filter(machine), agent.AUDIT_ARCH[machine]
    zygote = agent.syscall_filter(machine, zygote=True)
    nr = PTRACE_NUMBERS[machine]
    assert agent.PTRACE_SYSCALLS[machine] == nr
    for held in (program, zygote):
        assert run_bpf(held, arch=arch, nr=nr, arg0=0) == REFUSE  # PTRACE_TRACEME
        for request in (16, 0x4206, 7, 17):  # ATTACH, SEIZE, CONT, DETACH
            assert run_bpf(held, arch=arch, nr=nr, arg0=request, arg1=5) == ALLOW
    assert run_bpf(program, arch=arch, nr=READ[machine], arg0=0) == ALLOW


@pytest.mark.parametrize("machine", sorted(agent.AUDIT_ARCH))
def test_the_sync_family_succeeds_and_does_nothing(machine: str) -> None:
    """Each sync() moved the host's disk counts exactly, and an fsync of a clean file on
    the host's disk flushed it (eighteenth red-team round): all six do nothing."""
    program, arch = agent.syscall_filter(machine), agent.AUDIT_ARCH[machine]
    for number in agent.HOST_SYNC_SYSCALLS[machine]:
        assert run_bpf(program, arch=arch, nr=number) == agent.SECCOMP_RET_ERRNO  # errno 0
    assert run_bpf(program, arch=arch, nr=READ[machine]) == ALLOW


@pytest.mark.parametrize("machine", sorted(agent.AUDIT_ARCH))
def test_the_zygote_may_fork_for_its_parent_and_a_call_may_not(machine: str) -> None:
    """The zygote's program lets clone ask for CLONE_PARENT (its copies are the
    supervisor's children); each child adds ``parent_filter``, so a call still may not."""
    zygote = agent.syscall_filter(machine, zygote=True)
    child = agent.parent_filter(machine)
    arch, (clone, _clone3) = agent.AUDIT_ARCH[machine], agent.CLONE_SYSCALLS[machine]
    fork, thread, clone_parent = 0x01200011, 0x003D0F00, 0x8000
    assert run_bpf(zygote, arch=arch, nr=clone, arg0=fork | clone_parent) == ALLOW
    assert run_bpf(child, arch=arch, nr=clone, arg0=fork | clone_parent) == REFUSE
    for flags in (fork, thread):
        assert run_bpf(child, arch=arch, nr=clone, arg0=flags) == ALLOW
    assert run_bpf(child, arch=arch, nr=READ[machine], arg0=clone_parent) == ALLOW
    assert run_bpf(zygote, arch=arch, nr=clone, arg0=fork | 0x10000000) == REFUSE  # namespaces


@pytest.mark.parametrize("machine", sorted(agent.AUDIT_ARCH))
@given(
    nr=st.integers(0, (1 << 32) - 1),
    arch_choice=st.sampled_from(["native", "other", "i386", "none"]),
    arg0=st.integers(0, (1 << 64) - 1),
    arg1=st.integers(0, (1 << 64) - 1),
)
def test_only_the_native_abi_and_allowed_calls_pass(
    machine: str, nr: int, arch_choice: str, arg0: int, arg1: int
) -> None:
    program = agent.syscall_filter(machine)
    native_arch = agent.AUDIT_ARCH[machine]
    other = next(value for key, value in agent.AUDIT_ARCH.items() if key != machine)
    arch = {"native": native_arch, "other": other, "i386": 0x40000003, "none": 0}[arch_choice]
    if arch != native_arch or nr & agent.X32_SYSCALL_BIT:
        want = DENY
    else:
        want = expected(machine, nr, arg0, arg1)
    assert run_bpf(program, arch=arch, nr=nr, arg0=arg0, arg1=arg1) == want


@pytest.mark.parametrize("machine", sorted(agent.AUDIT_ARCH))
@given(data=st.data())
def test_every_listed_call_is_judged_by_its_own_rule(machine: str, data: st.DataObject) -> None:
    """The random numbers above rarely hit a listed syscall: draw from the lists."""
    listed = [
        *agent.DENIED_SYSCALLS[machine],
        *agent.NAMESPACE_SYSCALLS[machine],
        *agent.CLONE_SYSCALLS[machine],
        *agent.SOCKET_SYSCALLS[machine],
        *(number for number, _ in agent.OWN_PROCESS_SYSCALLS[machine]),
        agent.SOCKET_OPTION_SYSCALLS[machine],
        agent.FADVISE_SYSCALLS[machine],
        agent.PTRACE_SYSCALLS[machine],
        *agent.HOST_SYNC_SYSCALLS[machine],
    ]
    nr = data.draw(st.sampled_from(listed))
    arg0 = data.draw(
        st.sampled_from([0, 1, 2, 10, 16, 40, 0x10000000, 0x01200011]) | st.integers(0)
    )
    arg1 = data.draw(
        st.sampled_from([0, 1, 2, 3, 0x80801, 1 << 32]) | st.integers(0, (1 << 64) - 1)
    )
    arg2 = data.draw(st.sampled_from([0, 57, 58, (1 << 32) | 57]) | st.integers(0, (1 << 64) - 1))
    arg3 = data.draw(st.sampled_from([0, 3, 4, 5, (1 << 32) | 4]) | st.integers(0, (1 << 64) - 1))
    arg0 &= (1 << 64) - 1
    ip = data.draw(st.booleans())
    program = agent.syscall_filter(machine, ip=ip)
    got = run_bpf(
        program, arch=agent.AUDIT_ARCH[machine], nr=nr, arg0=arg0, arg1=arg1, arg2=arg2, arg3=arg3
    )
    assert got == expected(machine, nr, arg0, arg1, arg2=arg2, arg3=arg3, ip=ip)


def test_the_program_fits_seccomp_limits() -> None:
    for ip in (True, False):
        program = agent.syscall_filter("x86_64", ip=ip)
        assert len(program) % 8 == 0 and len(program) // 8 < 4096


def test_identities_must_be_non_root() -> None:
    assert (agent.Identity("65533:65533").uid, agent.Identity("7").gid) == (65533, 7)
    for bad in ("0:0", "1000:0", "nobody", ""):
        with pytest.raises(ValueError):
            agent.Identity(bad)


def test_agent_options_are_exact() -> None:
    options = supervisor.parse_options(["agent.py", "--agent-user", "1:1", "--preload", "numpy"])
    assert options == {"agent-user": "1:1", "preload": "numpy"}
    with pytest.raises(ValueError):
        supervisor.parse_options(["agent.py", "--preload"])
    with pytest.raises(ValueError):
        supervisor.parse_options(["agent.py", "numpy"])


def test_start_refuses_unknown_options_and_shared_uids() -> None:
    with pytest.raises(ValueError, match="unknown"):
        supervisor.start(["agent.py", "--bogus", "1"])
    with pytest.raises(ValueError, match="yes or no"):
        supervisor.start(["agent.py", "--huge-pages", "maybe"])
    with pytest.raises(ValueError, match="different uids"):
        supervisor.start(["agent.py", "--agent-user", "5:5", "--sandbox-user", "5:5"])
    with pytest.raises(ValueError, match="different uids"):
        supervisor.start(["agent.py", "--zygote-user", "6:6", "--sandbox-user", "6:6"])
