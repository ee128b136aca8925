"""A bounded soak: 300 mixed hostile and benign calls, more in flight than there are containers.

One run (a module fixture, about a minute on two cores) feeds four checks:

- no call is lost: every call comes back with a result, within a generous deadline;
- no benign call gets a wrong answer: each prints a value computed from its index
  (some read it from stdin, some only if ``/tmp`` and ``/dev/shm`` are empty, as a
  reset must leave them) and must get exactly that, with outcome ``success``;
- no call that only hits its own limits (wall clock, memory, fork bomb, output
  flood, ``os._exit``, a signal to itself) or leaves work for the reset (orphans, a
  child holding stdout, zombies, a full ``/tmp``, sockets in flight, signals ignored,
  a stopped process group) is reported as ``sandbox_error``: such calls get the
  code's own outcome, under load too (docs/security.md);
- nothing is left behind: after ``close()`` no container with this run's label exists.

The Docker backend runs with the reuse policy and a pool of 2, with 8 calls in
flight, so calls queue, and containers are reset or replaced after hostile calls
while the next calls wait for them.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from retool_exec import DockerConfig, ExecResult, Outcome, Sandbox
from tests.conftest import LABELS, require_docker

pytestmark = [pytest.mark.docker, pytest.mark.slow]

CALLS = int(os.environ.get("RETOOL_EXEC_SOAK_CALLS", "300"))
"""How many calls the soak makes (the environment variable runs a longer one by hand)."""
IN_FLIGHT = 8
POOL_SIZE = 2
TIMEOUT = 1.0
"""Each call's wall-clock limit (kept short: the soak's runtime is mostly hostile calls'
time limits)."""
CALL_DEADLINE = 60.0
"""A call not back after this long counts as lost."""
SOAK_LABEL = "retool-exec-tests.soak-run"
SEED = 20_260_512


@dataclass(frozen=True)
class Kind:
    name: str
    code: Callable[[int], str]
    benign: bool
    stdin: Callable[[int], str] | None = None
    timeout: float | None = None
    """The call's own limit; None: the sandbox's ``TIMEOUT``."""


def expected(index: int) -> str:
    """What a benign call with this index must print."""
    return f"{index * 7919 % 100_003}\n"


BENIGN = [
    Kind("print", lambda i: f"print({i} * 7919 % 100_003)", benign=True),
    Kind(
        "stdin",
        lambda _i: "print(int(input()) * 7919 % 100_003)",
        benign=True,
        stdin=lambda i: f"{i}\n",
    ),
    Kind(
        "clean-room",
        lambda i: (
            "import os\n"
            "left = os.listdir('/tmp') + os.listdir('/dev/shm')\n"
            f"print({i} * 7919 % 100_003 if not left else left)"
        ),
        benign=True,
    ),
    Kind(
        "compute",
        lambda i: (
            "import hashlib\n"
            f"n = sum(range({i} + 1)) - sum(range({i}))\n"
            "hashlib.sha256(b'x' * 100_000).hexdigest()\n"
            "print(n * 7919 % 100_003)"
        ),
        benign=True,
    ),
]
HOSTILE = [
    Kind("spin", lambda _i: "while True:\n    pass", benign=False),
    Kind("sleep", lambda _i: "import time\ntime.sleep(100)", benign=False),
    Kind(
        "memory-bomb",
        lambda _i: "chunks = []\nwhile True:\n    chunks.append(bytearray(32 << 20))",
        benign=False,
    ),
    Kind("big-alloc", lambda _i: "block = bytearray(8 << 30)", benign=False),
    Kind(
        "fork-bomb",
        lambda _i: (
            "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
        ),
        benign=False,
        timeout=3.0,  # longer: a fork bomb that lasts starves the container's agent most
    ),
    Kind(
        "output-flood",
        lambda _i: "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)",
        benign=False,
    ),
    Kind("os-exit", lambda _i: "import os\nos._exit(3)", benign=False),
    Kind(
        "sigkill-self",
        lambda _i: "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
        benign=False,
    ),
    Kind("segfault", lambda _i: "import ctypes\nctypes.string_at(0)", benign=False),
    Kind(
        "orphan",
        lambda _i: "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(100)",
        benign=False,
    ),
    Kind(
        "holds-stdout",
        lambda _i: "import os, time\nif os.fork() == 0:\n    time.sleep(100)\nprint('gone')",
        benign=False,
    ),
    Kind("stops-itself", lambda _i: "import os, signal\nos.kill(0, signal.SIGSTOP)", benign=False),
    Kind(
        "ignores-signals",
        lambda _i: (
            "import signal\n"
            "for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGXCPU):\n"
            "    signal.signal(s, signal.SIG_IGN)\n"
            "while True:\n    pass"
        ),
        benign=False,
    ),
    Kind(
        "fills-tmp",
        lambda i: (
            f"import os\nfor n in range(100_000):\n"
            f"    with open(f'/tmp/{i}-{{n}}', 'wb') as f:\n"
            "        f.write(os.urandom(65536))"
        ),
        benign=False,
    ),
    Kind(
        "sockets-in-flight",
        lambda _i: (
            "import socket\n"
            "for _ in range(50):\n"
            "    a, b = socket.socketpair()\n"
            "    socket.send_fds(a, [b'x'], [a.fileno(), b.fileno()])\n"
            "print('held')"
        ),
        benign=False,
    ),
    Kind(
        "zombies",
        lambda _i: "import os\nfor _ in range(30):\n    if os.fork() == 0:\n        os._exit(0)",
        benign=False,
    ),
]


@dataclass
class Record:
    index: int
    kind: Kind
    result: ExecResult | None
    error: str = ""


@dataclass
class Soak:
    records: list[Record]
    leftovers: list[str]
    seconds: float


def plan() -> list[Kind]:
    """60% benign, 40% hostile (every hostile kind equally often), in a fixed random order."""
    hostile = CALLS * 2 // 5
    kinds = [HOSTILE[i % len(HOSTILE)] for i in range(hostile)]
    kinds += [BENIGN[i % len(BENIGN)] for i in range(CALLS - hostile)]
    random.Random(SEED).shuffle(kinds)
    return kinds


def containers_labelled(label: str) -> list[str]:
    import docker

    client = docker.from_env()
    try:
        found = client.api.containers(all=True, filters={"label": label})
        return [f"{c['Id'][:12]} {c.get('State')}" for c in found]
    finally:
        client.close()


async def run_soak(sandbox: Sandbox) -> list[Record]:
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(index: int, kind: Kind) -> Record:
        async with gate:
            stdin = kind.stdin(index) if kind.stdin else None
            try:
                result = await asyncio.wait_for(
                    sandbox.arun_code(kind.code(index), stdin=stdin, timeout=kind.timeout),
                    CALL_DEADLINE,
                )
            except Exception as exc:  # a lost call: recorded, never raised
                return Record(index, kind, None, f"{type(exc).__name__}: {exc}")
            return Record(index, kind, result)

    return list(await asyncio.gather(*(one(i, kind) for i, kind in enumerate(plan()))))


@pytest.fixture(scope="module")
def soak() -> Soak:
    require_docker()
    run_id = uuid.uuid4().hex[:12]
    config = DockerConfig(
        timeout=TIMEOUT,
        policy="reuse",
        pool_size=POOL_SIZE,
        memory_mb=256,
        labels={**LABELS, SOAK_LABEL: run_id},
    )
    started = time.monotonic()
    sandbox = Sandbox(config)
    try:
        records = asyncio.run(run_soak(sandbox))
    finally:
        sandbox.close()
    seconds = time.monotonic() - started
    return Soak(records, containers_labelled(f"{SOAK_LABEL}={run_id}"), seconds)


def describe(record: Record) -> str:
    result = record.result
    if result is None:
        return f"#{record.index} {record.kind.name}: lost ({record.error})"
    return (
        f"#{record.index} {record.kind.name}: {result.outcome.value} rc={result.returncode} "
        f"stdout={result.stdout[:40]!r} detail={result.detail!r}"
    )


def test_no_call_is_lost(soak: Soak) -> None:
    lost = [describe(r) for r in soak.records if r.result is None]
    assert len(soak.records) == CALLS
    assert not lost, f"{len(lost)} of {CALLS} calls lost:\n" + "\n".join(lost[:20])


def test_every_benign_call_gets_exactly_its_answer(soak: Soak) -> None:
    benign = [r for r in soak.records if r.kind.benign and r.result is not None]
    wrong = [
        describe(r)
        for r in benign
        if r.result is None
        or r.result.outcome is not Outcome.SUCCESS
        or r.result.stdout != expected(r.index)
    ]
    assert len(benign) >= CALLS // 2
    assert not wrong, f"{len(wrong)} of {len(benign)} benign calls wrong:\n" + "\n".join(wrong[:20])


def test_calls_that_hit_their_own_limits_are_never_sandbox_errors(soak: Soak) -> None:
    hostile = [r for r in soak.records if not r.kind.benign and r.result is not None]
    failed = [
        describe(r)
        for r in hostile
        if r.result is not None and r.result.outcome is Outcome.SANDBOX_ERROR
    ]
    assert len(hostile) >= CALLS // 4
    assert not failed, f"{len(failed)} of {len(hostile)} limit-hitting calls:\n" + "\n".join(
        failed[:20]
    )


def test_nothing_is_left_behind(soak: Soak) -> None:
    assert not soak.leftovers, soak.leftovers
    print(f"soak: {CALLS} calls in {soak.seconds:.1f} s")
