"""Limits in, container-create arguments out: every hardening decision in one pure function.

Nothing reaches Docker except what this function writes, and it writes no
bind, device, host namespace, privileged mode or Docker socket, ever. The
only capabilities it grants (``wire.CONTAINER_CAPABILITIES``) are the agent's;
every call drops them before user code runs. Unit-tested
without Docker (tests/unit/test_hardening.py); docs/security.md gives the
reason for each setting.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from retool_exec.backends.config import DockerConfig, is_gvisor
from retool_exec.backends.docker.agent import wire
from retool_exec.backends.docker.bootstrap import bootstrap_command
from retool_exec.backends.docker.image_inputs import ENTRYPOINT

__all__ = [
    "AGENT_CAPABILITIES",
    "AGENT_PATH",
    "AGENT_USER",
    "BASE_ENV",
    "CONTAINER_USER",
    "SANDBOX_HOSTNAME",
    "SANDBOX_USER",
    "ContainerSpec",
    "agent_role",
    "container_spec",
    "is_gvisor",
    "with_sandbox_uid",
]

SANDBOX_USER = wire.DEFAULT_SANDBOX_USER
"""The calls' uid when none is allocated per container (nobody:nogroup)."""
AGENT_USER = wire.AGENT_USER
ZYGOTE_USER = wire.ZYGOTE_USER
CONTAINER_USER = wire.CONTAINER_USER
AGENT_CAPABILITIES = wire.CONTAINER_CAPABILITIES
"""All a container gets: the supervisor's (act as the calls' uid) and the zygote's (make
each child the calls' uid with an empty bounding set). Calls hold none of them."""
SANDBOX_HOSTNAME = "sandbox"
AGENT_PATH = wire.AGENT_PATH
BASE_ENV: Mapping[str, str] = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "HOME": "/tmp",
    "PYTHONDONTWRITEBYTECODE": "1",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "VECLIB_MAXIMUM_THREADS": "1",
}
"""The whole environment of a sandbox, before the config's allowlisted extras."""


GVISOR_PIDS_HEADROOM = 4096
"""Host threads gVisor's sentry may need beyond the sandbox's own processes, at least.
Why this many: the sentry's host threads grow with the sandbox's runnable tasks, not
with its processes alone; at 1024 a call of 40 processes of 8 busy threads each took the
pids cgroup to its limit, the sentry died and the call read as ``sandbox_error``, a
failure of ours the call chose (eighteenth red-team round). Measured peaks since: 562-2128
host threads for such calls (``pids`` 128), each then ending as its own ``timeout``."""
GVISOR_HOST_TASKS_PER_TASK = 8
"""Host tasks of gVisor's Sentry allowed for each task the sandbox may run
(``gvisor_pids_limit``). Why: each live process costs about 7 (300 sleeping processes
took 2162 host tasks, 600 took 4280), so with ``pids=1024`` a call of 800 processes,
within its own limit, killed the Sentry at 1024 + 4096 (the thirty-fourth round's
review). With 8 a call's live tasks stay under the limit; only churn (a fork bomb)
passes it, which the host then charges to the call (``host_cgroup.TaskLimitHits``)."""


def gvisor_pids_limit(pids: int) -> int:
    """The container's pids cgroup limit under gVisor: the sandbox's ``pids`` and room
    for the Sentry's host tasks, ``GVISOR_HOST_TASKS_PER_TASK`` each, at least
    ``GVISOR_PIDS_HEADROOM``."""
    return pids + max(GVISOR_PIDS_HEADROOM, GVISOR_HOST_TASKS_PER_TASK * pids)


NODE_COUNTERS = ("vmstat", "numastat")
"""Each NUMA node's files of the memory manager's counts (its share of ``/proc/vmstat``)."""
DOCKER_MASKED_PATHS = (
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
)
"""Docker's own default masked paths (20.10's, and 25's powercap): a container's
``MaskedPaths`` replaces Docker's list, so it is repeated here."""
HOST_COUNTER_PATHS = (
    "/proc/sys/fs/file-nr",
    "/proc/sys/fs/inode-nr",
    "/proc/sys/fs/inode-state",
    "/proc/sys/fs/dentry-state",
    "/proc/sys/fs/aio-nr",
    "/proc/vmstat",
    "/proc/zoneinfo",
    "/proc/buddyinfo",
    "/proc/pagetypeinfo",
    "/proc/locks",
    "/proc/diskstats",
    "/proc/key-users",
    "/sys/kernel/mm/transparent_hugepage",
    *(f"/sys/devices/system/node/node{node}/{name}" for node in range(8) for name in NODE_COUNTERS),
)
"""The host kernel's exact counts that under runc every container reads and a call can
move by one at will: open files, inodes, dentries and AIO requests (one ``open()``:
two cooperating calls in different containers moved 10 bits of 10 through the open
file count, eighth red-team round), and the memory manager's event and page counts
(an ``mlock`` of one page, an OOM kill in the call's own cgroup: 16 bits through
``unevictable_pgs_mlocked``, which stays until read, eleventh round). Masked (read as
empty); gVisor has none of them. What stays shared under runc is in docs/security.md
("What is not promised"). Fifteenth round: ``/proc/locks`` lists every open file
description lock of the host, whatever its container (they have no pid to filter by), so
a call's lock range carried 62 bits to a call in another container; the huge-page
counters under ``/sys/kernel/mm/transparent_hugepage`` and each NUMA node's copy of
``/proc/vmstat`` are moved by one 2 MiB fault; ``/proc/diskstats`` counts every read the
host's disk serves (a call reading files it evicted from the shared page cache).
Seventeenth: ``/proc/key-users`` counts keys per uid for the whole host, and root's line
counts runc's session keyring of every live container. A path the host lacks (an eighth
NUMA node) is skipped by the runtime."""

HOST_DISK_PATHS = (
    "/proc/sys/fs/quota",
    "/sys/block",
    "/sys/class/block",
    "/sys/dev/block",
    "/sys/devices/virtual/block",
    "/sys/devices/virtual/bdi",
    *(f"/sys/fs/{kind}" for kind in ("ext4", "btrfs", "xfs", "f2fs", "erofs")),
)
"""The host's disk and file-system I/O counts, which under runc every container reads
and a call moves exactly: each ``sync()`` moved the quota code's sync count by two and
the disk's flush and write counts (``/sys/block/vda/stat``, the copy of the masked
``/proc/diskstats``) by one, in any container, ``fresh`` included: 7 bits a round
between calls of different containers (eighteenth red-team round). The calls' filter
refuses ``sync`` and ``syncfs``; reading a file the page cache does not hold still moves
the read counts, so they are masked: these generic places, and each block device's own
directory, wherever its bus puts it, through ``host_sys_paths`` (every ``/sys/devices``
entry but the CPUs, the nodes and the network interfaces). gVisor has none of them."""
PROC_VISIBLE = (
    "cpuinfo",  # CPU model and features: numpy, BLAS and the standard library read it
    "meminfo",  # the host's memory, as sysinfo() gives it anyway (docs/security.md)
    "stat",  # CPU times and the process count, what psutil and others read (documented)
    "uptime",  # as sysinfo() gives it
    "loadavg",  # as sysinfo() gives it
    "version",  # as uname() gives it
    "filesystems",  # static: which file systems the kernel knows
    "swaps",  # static here: the host's swap areas, read by psutil
    "sys",  # read-only; its host-wide counts are masked one by one (HOST_COUNTER_PATHS)
    "sysvipc",  # the container's own IPC namespace
    "mounts",  # a link to self/mounts: the container's own
    "net",  # a link to self/net: the container's own namespace
    "self",
    "thread-self",
)
"""The top-level ``/proc`` entries besides processes that a call may read: what code in
the wild reads, each either the container's own or a host figure already documented.
Every other entry is masked (``host_proc_paths``): the list of what the kernel shows
grows with its version and configuration, and a denylist missed ``/proc/fs``, whose ext4
statistics count the host disk's extent-cache hits, moved by one per ``lseek(SEEK_DATA)``
of any image file: 16 bits per 0.35 s between calls of different containers, ``fresh``
included (nineteenth red-team round)."""
HOST_PROC_PATHS = (
    "/proc/fs",
    "/proc/interrupts",
    "/proc/softirqs",
    "/proc/pressure",
    "/proc/cgroups",
    "/proc/crypto",
    "/proc/partitions",
    "/proc/devices",
    "/proc/cmdline",
    "/proc/config.gz",
    "/proc/kallsyms",
    "/proc/modules",
    "/proc/schedstat",
    "/proc/slabinfo",
)
"""Host-wide ``/proc`` entries masked even when this machine's ``/proc`` cannot be read
(a Docker daemon on another machine): ``host_proc_paths`` masks every entry outside
``PROC_VISIBLE`` that this machine has, and these whatever it has."""
PROCFS = "/proc"


@functools.cache
def host_proc_paths(procfs: str = PROCFS) -> tuple[str, ...]:
    """Every top-level ``/proc`` entry of this machine that is neither a process nor in
    ``PROC_VISIBLE``, and ``HOST_PROC_PATHS``: masked, so an entry a newer kernel adds
    is hidden until someone reviews it, not shown until someone notices it.

    Links are left alone (``self``, ``mounts``, ``net``: each the reader's own); a path
    the container's kernel lacks is skipped by the runtime.
    """
    try:
        names = sorted(os.listdir(procfs))
    except OSError:
        names = []
    found = [
        f"{PROCFS}/{name}"
        for name in names
        if not name.isdigit()
        and name not in PROC_VISIBLE
        and not os.path.islink(os.path.join(procfs, name))
    ]
    return tuple(sorted({*found, *HOST_PROC_PATHS}))


SYSFS = "/sys"


SYS_VISIBLE = {
    "": ("class", "devices", "fs"),
    "class": ("net",),
    "devices": ("system", "virtual"),
    "devices/virtual": ("net",),
    "devices/system": ("cpu", "node"),
    "fs": ("cgroup",),
}
"""Where in ``/sys`` a call may read, level by level: the CPUs (their number, caches and
topology: glibc, BLAS and numpy read them), the memory nodes (their per-node counts are
masked: ``NODE_COUNTERS``), the container's own cgroup and its own network namespace's
interfaces (``class/net`` links into ``devices/virtual/net``: only ``lo``). Every other
entry of these levels is masked (``host_sys_paths``), so what a newer kernel adds is hidden until
reviewed: ``/sys/kernel/irq`` held each device's interrupt counts (the disk's among
them), ``/sys/kernel/uevent_seqnum`` the host's device events, and the per-CPU
``cpuidle`` directories how often each CPU slept (nineteenth red-team round)."""
CPU_HIDDEN = ("cpuidle", "cpufreq")
"""Host-wide counts in ``/sys/devices/system/cpu`` and in each CPU's own directory."""
HOST_SYS_PATHS = (
    *(f"/sys/{name}" for name in ("block", "bus", "dev", "firmware", "kernel")),
    *(f"/sys/{name}" for name in ("hypervisor", "module", "power")),
    "/sys/devices/virtual/block",
    "/sys/devices/system/memory",
    *(f"/sys/devices/system/cpu/{name}" for name in CPU_HIDDEN),
)
"""``/sys`` entries masked even when this machine's ``/sys`` cannot be read."""


@functools.cache
def host_sys_paths(sysfs: str = SYSFS) -> tuple[str, ...]:
    """Every entry of this machine's ``/sys`` outside ``SYS_VISIBLE``, each CPU's
    ``CPU_HIDDEN`` directories, and ``HOST_SYS_PATHS``: masked (a path the container's
    kernel lacks is skipped by the runtime). Read from this machine's ``/sys``: with a
    Docker daemon on another machine, that machine's entries are masked only where they
    have the same names (``HOST_SYS_PATHS`` holds without any)."""
    found = set(HOST_SYS_PATHS)
    for parent, kept in SYS_VISIBLE.items():
        try:
            names = os.listdir(os.path.join(sysfs, parent))
        except OSError:
            continue
        found.update(
            f"{SYSFS}/{parent}/{name}".replace("//", "/") for name in names if name not in kept
        )
    cpus = os.path.join(sysfs, "devices", "system", "cpu")
    try:
        names = os.listdir(cpus)
    except OSError:
        names = []
    for name in names:
        if name.startswith("cpu") and name[3:].isdigit():
            found.update(
                f"{SYSFS}/devices/system/cpu/{name}/{hidden}"
                for hidden in CPU_HIDDEN
                if os.path.isdir(os.path.join(cpus, name, hidden))
            )
    return tuple(sorted(found))


NETWORK_SYSCTLS = {"net.ipv4.tcp_no_metrics_save": "1", "net.ipv4.tcp_fastopen": "0"}
"""Caches of the container's network namespace that outlive every process and that the
kernel does not list: a closed TCP connection's metrics (keyed by the address, which a
call picks among 127.0.0.0/8) and Fast Open cookies. A call could write them and the
next call read them back by netlink; the reset cannot count what it cannot list, so
they are never kept. Both are per namespace; gVisor accepts them too."""


def agent_arguments(
    preload_modules: tuple[str, ...] | list[str],
    sandbox_user: str = SANDBOX_USER,
    *,
    many_calls: bool = True,
    light_zygote: bool = False,
    ip: bool = True,
    machine_memory: int | None = None,
) -> list[str]:
    """The agent's command line: who it becomes, who the calls become, what it imports.

    ``many_calls`` is false for a container that serves one call (``fresh``):
    its zygote then skips the huge-page collapse, which costs ~15-30 ms of CPU
    at start and saves ~1 ms per fork. ``light_zygote``: a second zygote for
    the calls that need nothing preloaded (``DockerConfig.light_zygote``).
    ``ip``: ``DockerConfig.loopback_ip``. ``machine_memory``: the bytes of memory of
    the machine Docker runs on, past which an allocation fails under gVisor as Linux
    fails it under runc (``zygote.child_main``, through ``_limit_address_space``).
    """
    arguments = [
        "--agent-user", AGENT_USER,
        "--zygote-user", ZYGOTE_USER,
        "--sandbox-user", sandbox_user,
    ]  # fmt: skip
    if preload_modules:
        arguments += ["--preload", ",".join(preload_modules)]
    if not many_calls:
        arguments += ["--huge-pages", "no"]
    if light_zygote and many_calls and preload_modules:
        arguments += ["--light-zygote", "yes"]
    if not ip:
        arguments += ["--ip", "no"]
    if machine_memory:
        arguments += ["--machine-memory-mb", str(machine_memory >> 20)]
    return arguments


@dataclass(frozen=True)
class ContainerSpec:
    """Arguments for docker-py's low-level ``create_container`` and ``create_host_config``."""

    create: dict[str, Any] = field(default_factory=dict)
    host_config: dict[str, Any] = field(default_factory=dict)
    host_config_fields: dict[str, Any] = field(default_factory=dict)
    """HostConfig fields of Docker's API that ``create_host_config`` has no argument for."""


def container_spec(
    config: DockerConfig,
    *,
    image: str,
    labels: Mapping[str, str],
    send_agent: bytes | None = None,
    image_path: str | None = None,
    machine_memory: int | None = None,
) -> ContainerSpec:
    """The hardened container for ``config``; the only place container options are decided.

    ``send_agent``: the image does not hold this agent, so the container starts the
    bootstrap (``bootstrap.py``) and the host sends this zipapp in first; ``image_path``
    is then the image's own ``PATH`` (where its ``python3`` is). ``machine_memory``:
    see ``agent_arguments``.
    """
    mib = 1024 * 1024
    memory = config.memory_mb * mib
    host_config: dict[str, Any] = {
        "network_mode": "none",
        "read_only": True,
        "tmpfs": {
            "/tmp": _tmpfs_options(config.tmpfs_mb * mib, config.tmpfs_inodes),
            # Mounted here rather than left to Docker, whose /dev/shm has no inode cap
            # (3 million under runc): a call's millions of hard links there made the
            # next call wait on the reset's removal (seventeenth red-team round).
            "/dev/shm": _tmpfs_options(config.shm_mb * mib, config.tmpfs_inodes),
            **DEVICE_MOUNTS,
        },
        "mem_limit": memory,
        "memswap_limit": memory,
        "pids_limit": config.pids,
        "nano_cpus": int(config.cpus * 1e9),
        "ulimits": [
            {"Name": "nofile", "Soft": config.nofile, "Hard": config.nofile},
            {"Name": "fsize", "Soft": config.fsize_mb * mib, "Hard": config.fsize_mb * mib},
            {"Name": "core", "Soft": 0, "Hard": 0},
        ],
        "cap_drop": ["ALL"],
        "cap_add": list(AGENT_CAPABILITIES),
        "security_opt": ["no-new-privileges"],
        "privileged": False,
        "ipc_mode": "private",
        "shm_size": config.shm_mb * mib,
        "log_config": {"Type": "none", "Config": {}},
        "init": False,  # the supervisor is PID 1: it reaps, and unlike docker-init is undumpable
        "oom_kill_disable": False,
        "auto_remove": False,
        "sysctls": dict(NETWORK_SYSCTLS),
    }
    if config.runtime:
        host_config["runtime"] = config.runtime
    if is_gvisor(config.runtime):
        # gVisor's own host threads live in the container's pids cgroup, so the
        # cgroup limit must leave room for them; inside, the sandbox's kernel
        # enforces RLIMIT_NPROC per sandbox (under runc it would count every
        # process of the uid on the host, so it is only set here).
        host_config["pids_limit"] = gvisor_pids_limit(config.pids)
        host_config["ulimits"].append({"Name": "nproc", "Soft": config.pids, "Hard": config.pids})
    environment = {**config.env, **config.spec.env, **BASE_ENV}
    entrypoint = list(ENTRYPOINT)
    if send_agent is not None:
        if image_path:
            environment["PATH"] = image_path
        entrypoint = bootstrap_command(send_agent, environment)
    create: dict[str, Any] = {
        "image": image,
        "entrypoint": entrypoint,
        "command": agent_arguments(
            config.preload_modules,
            many_calls=config.policy != "fresh",
            light_zygote=config.light_zygote,
            ip=config.ip_allowed,
            machine_memory=machine_memory,
        ),
        "user": CONTAINER_USER,
        "hostname": SANDBOX_HOSTNAME,
        "working_dir": "/tmp",
        "environment": environment,
        "labels": dict(labels),
        "stdin_open": True,
        "tty": False,
        # An image's HEALTHCHECK would exec a process into the sandbox now and then.
        "healthcheck": {"test": ["NONE"]},
    }
    _without_a_network(create, host_config, own_image=send_agent is None)
    fields = {
        "MaskedPaths": list(
            dict.fromkeys(  # once each: a path on two lists would be mounted over twice
                [
                    *DOCKER_MASKED_PATHS,
                    *HOST_COUNTER_PATHS,
                    *HOST_DISK_PATHS,
                    *host_proc_paths(),
                    *host_sys_paths(),
                ]
            )
        )
    }
    return ContainerSpec(create=create, host_config=host_config, host_config_fields=fields)


def _without_a_network(
    create: dict[str, Any], host_config: dict[str, Any], *, own_image: bool
) -> None:
    """No network either way; for our own image, without Docker's network machinery too.

    The runtime gives every container a network namespace of its own holding
    only ``lo`` (up): that is the isolation. ``NetworkDisabled`` also skips
    Docker's network hook, a re-exec of the whole dockerd binary per container
    (~30% of the CPU of starting one, measured with ``perf record -a`` under
    ``docker-fresh``), and the files Docker would mount over ``/etc/hosts`` and
    ``/etc/resolv.conf`` (the host's name server among them): ``/etc/hosts`` is
    then empty, and our image resolves ``localhost`` through nss-myhostname
    (code written for SandboxFusion binds or connects to it; build-rootfs.sh).
    A brought image may not, so there Docker writes its standard
    ``/etc/hosts``, asked for by one host mapping, and names no name server
    but the sandbox's own loopback (where nothing answers).
    """
    if own_image:
        create["network_disabled"] = True
    else:
        create["network_disabled"] = False
        host_config["extra_hosts"] = {"localhost": "127.0.0.1"}
        host_config["dns"] = ["127.0.0.1"]


DEVICE_MOUNTS = {
    "/dev": "rw,nosuid,noexec,dev,noatime,mode=755,size=65536k",
    "/dev/pts": "ro,nosuid,noexec,nodev,noatime,mode=755,size=4k",
}
"""``/dev`` mounted by us, as Docker mounts it but ``noatime``, and an empty read-only
``/dev/pts``. Why: Docker's ``/dev`` is ``strictatime``, so a read of any of its entries
(``stat`` through ``/dev/stdin``, a listing) stamps it with the reader's time, which the
next call reads back: 48 bits a call under runc and 64 under gVisor, through inodes
the reset does not own (eighteenth red-team round); gVisor's ``/dev/pts`` did the same.
With a ``/dev`` of its own Docker mounts none of its own below it: ptys (shared with
the host, locked before) and the POSIX queue directory (refused before) are gone; the
runtime still makes the device nodes and ``/dev/fd``."""


def _tmpfs_options(size: int, inodes: int) -> str:
    """A scratch tmpfs: capped in bytes and inodes, nothing on it executes or is a device."""
    return f"rw,nosuid,nodev,noexec,size={size},nr_inodes={inodes},mode=1777"


def with_sandbox_uid(spec: ContainerSpec, uid: int, label: str) -> ContainerSpec:
    """``spec`` for one container whose calls run as ``uid`` (recorded in ``label``), and
    whose supervisor and zygotes run as the uids derived from it (``wire.agent_users``).

    The uid is allocated per container (``wire.SANDBOX_UID_RANGE``), so per-uid
    kernel limits are never shared between two live containers on a host, neither
    the calls' nor the agent's.
    """
    low, high = wire.SANDBOX_UID_RANGE
    if not low <= uid <= high:
        raise ValueError(f"sandbox uid {uid} is outside {low}..{high}")
    command = list(spec.create["command"])
    agent, zygote = wire.agent_users(uid)
    users = {"--sandbox-user": f"{uid}:{uid}", "--agent-user": agent, "--zygote-user": zygote}
    for option, user in users.items():
        command[command.index(option) + 1] = user
    create = {
        **spec.create,
        "command": command,
        "labels": {**spec.create["labels"], label: str(uid)},
    }
    return ContainerSpec(
        create=create, host_config=spec.host_config, host_config_fields=spec.host_config_fields
    )


def agent_role(uid: int) -> str | None:
    """ "supervisor" or "zygote" for an agent process's uid, seen from the host's /proc
    (benchmarks tell the agent's processes apart by it); None for any other uid."""
    low, high = wire.SANDBOX_UID_RANGE
    for role, offset, default in (
        ("supervisor", wire.AGENT_UID_OFFSET, AGENT_USER),
        ("zygote", wire.ZYGOTE_UID_OFFSET, ZYGOTE_USER),
    ):
        if low + offset <= uid <= high + offset or str(uid) == default.partition(":")[0]:
            return role
    return None
