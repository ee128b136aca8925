"""Prove the isolation on this host: probes that run in a real sandbox container.

Used by ``retool-exec doctor``. Each probe is code plus a predicate over its
result; a probe passes only when the container actually behaves isolated.
No probe sends a packet anywhere: the network checks read interfaces and
routes, and connect to the container's own loopback.
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from dataclasses import dataclass

from retool_exec._errors import RetoolExecError
from retool_exec._models import ExecResult, Outcome
from retool_exec._sandbox import Sandbox
from retool_exec.backends.config import DockerConfig
from retool_exec.backends.docker.hardening import BASE_ENV

__all__ = ["PROBES", "Check", "Probe", "run_doctor"]


@dataclass(frozen=True)
class Probe:
    name: str
    code: str
    passed: Callable[[ExecResult], bool]


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


_ENV_ALLOWED = sorted({*BASE_ENV, "HOSTNAME"})

PROBES: tuple[Probe, ...] = (
    Probe(
        "network: only loopback, no routes",
        "import os\nprint(sorted(os.listdir('/sys/class/net')))\n"
        "print(len(open('/proc/net/route').read().splitlines()) - 1)",
        lambda r: r.stdout == "['lo']\n0\n",
    ),
    Probe(
        "root filesystem is read-only",
        "try:\n    open('/usr/lib/retool_probe', 'w')\nexcept OSError as e:\n    print(e.errno)",
        lambda r: r.stdout.strip() in ("30", "13"),  # EROFS, EACCES
    ),
    Probe(
        "not root",
        "import os\nprint(os.getuid(), os.geteuid(), os.getgid())",
        lambda r: r.ok and "0" not in r.stdout.split(),
    ),
    Probe(
        "no capabilities, no new privileges, seccomp on",
        "s = dict(l.split(':\\t') for l in open('/proc/self/status').read().splitlines() "
        "if ':\\t' in l)\n"
        "print(s['CapEff'], s['CapBnd'], s['CapPrm'], s.get('NoNewPrivs', '?'), "
        "s.get('Seccomp', '?'))",
        # gVisor's /proc shows neither NoNewPrivs nor Seccomp (its own kernel filters).
        lambda r: (
            r.ok
            and r.stdout.split()[:3] == ["0000000000000000"] * 3
            and (r.stdout.split()[3:] == ["1", "2"] or r.stdout.split()[3] == "?")
        ),
    ),
    Probe(
        "environment comes from the allowlist only",
        "import os\nprint(sorted(os.environ))",
        lambda r: r.ok and set(eval(r.stdout)) <= set(_ENV_ALLOWED),  # noqa: S307 - our own list repr
    ),
    Probe(
        "memory limit enforced (OOM reported as OOM)",
        "x = bytearray(512 * 1024 * 1024)\nx[::4096] = b'x' * len(x[::4096])\nprint('survived')",
        lambda r: r.outcome is Outcome.OOM,
    ),
    Probe(
        "process limit enforced",
        "import threading, time\nthreading.stack_size(64 * 1024)\nn = 0\ntry:\n"
        "    for _ in range(10000):\n"
        "        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "        n += 1\nexcept RuntimeError as e:\n    print('limited', n, flush=True)",
        lambda r: r.stdout.startswith("limited ") and int(r.stdout.split()[1]) <= 64,  # pids=64
    ),
    Probe(
        "the agent is out of reach (own uid: no signal, no /proc/1/fd)",
        "import os\nfor attempt in (lambda: os.kill(1, 0), lambda: os.listdir('/proc/1/fd/1')):\n"
        "    try:\n        attempt()\n        print('reached')\n"
        "    except OSError as e:\n        print(e.errno)",
        lambda r: r.ok and "reached" not in r.stdout and r.stdout.split() != [],
    ),
    Probe(
        "io_uring and POSIX message queues refused (the agent's seccomp layer)",
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.syscall(425, 4, ctypes.create_string_buffer(120))\nprint(ctypes.get_errno())\n"
        "libc.mq_open(b'/doctor', os.O_CREAT | os.O_RDWR, 0o600, None)\nprint(ctypes.get_errno())",
        lambda r: r.stdout.split() == ["38", "38"],  # ENOSYS, ENOSYS
    ),
    Probe(
        "no Docker socket",
        "import glob\nprint(glob.glob('/var/run/*.sock') + glob.glob('/run/*.sock') "
        "+ glob.glob('/var/run/docker*') + glob.glob('/run/docker*'))",
        lambda r: r.stdout == "[]\n",
    ),
    Probe(
        "neutral hostname",
        f"import socket\nprint(socket.gethostname() != {platform.node()!r}, socket.gethostname())",
        lambda r: r.stdout.startswith("True "),
    ),
)


def run_doctor(
    runtime: str | None = None,
    *,
    image: str | None = None,
    report: Callable[[Check], None] | None = None,
) -> list[Check]:
    """Run every probe in real containers; returns one Check per probe (plus set-up checks)."""
    checks: list[Check] = []

    def add(check: Check) -> None:
        checks.append(check)
        if report is not None:
            report(check)

    config = DockerConfig(
        runtime=runtime,
        image=image,
        policy="fresh",
        pool_size=1,
        memory_mb=256,
        pids=64,
        timeout=20.0,
        auto_build=False,
    )
    try:
        sandbox = Sandbox(config, max_workers=1)
        sandbox.start()
    except RetoolExecError as exc:
        add(Check(f"start a sandbox (runtime {runtime or 'default'})", False, str(exc)))
        return checks
    try:
        add(Check(f"start a sandbox (runtime {runtime or 'default'})", True, ""))
        for probe in PROBES:
            result = sandbox.run_code(probe.code)
            try:
                ok = probe.passed(result)
            except Exception:
                ok = False
            shown = result.stdout or result.stderr or result.detail or result.outcome.value
            add(
                Check(probe.name, ok, shown.strip().splitlines()[-1][:100] if shown.strip() else "")
            )
    finally:
        sandbox.close()
    return checks
