"""Page faults and CPU of one call's child, forked from a real zygote in the sandbox image.

    python benchmarks/child_faults.py --code 'print(2+3)' --children 200
    python benchmarks/child_faults.py --runtime runsc --children 100
    python benchmarks/child_faults.py --agent /tmp/old-checkout/retool_exec/backends/docker
    python benchmarks/child_faults.py --runtime runsc --timed

Runs the agent's own code (``zygote.preload``, ``prepare_std_streams``,
``forking.choose``, ``child_main``) in a container of the sandbox image (as
root, no network), forks children that each run one request as the
supervisor sends it, and prints their mean page faults (``ru_minflt``) and
CPU. Why: a reuse call's cost is mostly its child's copies of the zygote's
pages (each first write to a page they share), and this counts them without
the supervisor, Docker's attach stream or the host in the way. ``--agent``
points at another checkout's ``retool_exec/backends/docker`` (a worktree of
an older commit) to compare agents in the same image. ``--timed`` adds the
medians of each fork and of each child's request to the end of its output
(what a call waits for): under gVisor, which counts no page faults, the time
is the measure.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import docker

from retool_exec.backends.docker.image import ensure_image
from retool_exec.backends.docker.image_spec import ImageSpec

INSIDE = r"""
import json, os, resource, socket, statistics, sys, time
sys.path.insert(0, "/agent-src")
from agent import identity, wire, zygote

code, children, modules = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
program = identity.syscall_filter(os.uname().machine)
if hasattr(identity, "SandboxDrop"):
    machine = os.uname().machine
    extra = [identity.parent_filter(machine)] if hasattr(identity, "parent_filter") else []
    zygote.Setup.drop = identity.SandboxDrop(
        identity.Identity(wire.DEFAULT_SANDBOX_USER), identity.last_capability(), program, *extra)
else:  # an agent older than 2026-12-01
    zygote.Setup.last_cap, zygote.Setup.syscall_program = identity.last_capability(), program
os.makedirs(wire.WORKDIR, exist_ok=True)
getattr(zygote, "lock_zygote", lambda: None)()  # as the agent's zygotes do (2026-12-02)
try:
    from agent import forking
except ImportError:  # an older agent: os.fork() only
    forking = None
registered = []
if forking is not None:
    with forking.recording_hooks(registered):
        zygote.preload(modules, True)
else:
    zygote.preload(modules, True)
getattr(zygote, "prepare_std_streams", lambda: None)()
getattr(zygote, "warm_zygote", lambda: None)()  # as the agent does (2026-12-02)
plain = forking is not None and forking.choose(registered)
if hasattr(zygote.Setup, "warm_child"):  # as the agent sets it (under gVisor only)
    from agent import reset
    zygote.Setup.warm_child = reset._in_gvisor()
fork = forking.fork if forking is not None else os.fork
if forking is not None and hasattr(forking, "_fork_twice"):
    # Since 2026-12-05 the agent's fork makes the child its parent's (the supervisor's),
    # which this harness could not wait for: time the same single fork as its own child.
    import ctypes
    libc_fork = ctypes.PyDLL(None, use_errno=True).fork
    fork = (lambda: int(libc_fork())) if plain else os.fork
encode = getattr(wire, "encode_for_call", wire.encode_frame)

gated = hasattr(zygote, "STARTED_FD")  # the started gate (2026-12-02): a fifth descriptor

def one():
    events_r, events_w = os.pipe(); out_r, out_w = os.pipe(); err_r, err_w = os.pipe()
    started_r, started_w = os.pipe()
    ours, theirs = socket.socketpair()
    forking_at = time.monotonic()
    pid = fork()
    if pid == 0:
        ours.close()
        fds = [events_w, theirs.fileno(), out_w, err_w] + ([started_w] if gated else [])
        zygote.child_main(*fds)
    for fd in (events_w, out_w, err_w, started_w):
        os.close(fd)
    theirs.close()
    forked = time.monotonic() - forking_at
    time.sleep(0.05)  # as a spare child waits for its call
    sent_at = time.monotonic()
    ours.sendall(encode({"type": "request", "code": code, "cpu_seconds": 10}))
    ours.close()
    out = b"".join(iter(lambda: os.read(out_r, 65536), b""))
    answered = time.monotonic() - sent_at
    _, status, usage = os.wait4(pid, 0)
    for fd in (events_r, out_r, err_r, started_r):
        os.close(fd)
    return usage.ru_minflt, usage.ru_utime + usage.ru_stime, out, forked, answered

for _ in range(5):
    one()
faults = cpu = 0
forks, answers = [], []
for _ in range(children):
    minflt, seconds, out, forked, answered = one()
    faults += minflt
    cpu += seconds
    forks.append(forked)
    answers.append(answered)
print(json.dumps({"plain_fork": plain, "faults": faults / children,
                  "cpu_ms": 1000 * cpu / children, "stdout": out.decode(errors="replace"),
                  "fork_ms": 1000 * statistics.median(forks),
                  "answer_ms": 1000 * statistics.median(answers)}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", default="print(2+3)")
    parser.add_argument("--children", type=int, default=200)
    parser.add_argument("--preload", default="numpy,sympy,scipy,mpmath")
    parser.add_argument(
        "--agent",
        type=Path,
        default=Path(__file__).resolve().parent.parent / "retool_exec" / "backends" / "docker",
        help="the retool_exec/backends/docker directory whose agent is measured",
    )
    parser.add_argument("--runtime", default="runc", help="runc, or runsc for gVisor")
    parser.add_argument(
        "--timed", action="store_true", help="also the median fork and request-to-output times"
    )
    args = parser.parse_args()
    client = docker.from_env()
    image = ensure_image(client, ImageSpec()).tag
    output = client.containers.run(
        image,
        ["-c", INSIDE, args.code, str(args.children), args.preload],
        entrypoint="python3",
        user="0",
        network_mode="none",
        runtime=args.runtime,
        volumes={str(args.agent.resolve()): {"bind": "/agent-src", "mode": "ro"}},
        labels={"org.retool_exec.test": "child-faults"},
        remove=True,
    )
    report = json.loads(output.decode().strip().splitlines()[-1])
    print(
        f"{report['faults']:.0f} page faults and {report['cpu_ms']:.2f} ms of CPU per child "
        f"({'fork(2)' if report['plain_fork'] else 'os.fork()'}; the last printed "
        f"{report['stdout']!r})"
    )
    if args.timed:
        print(
            f"median fork {report['fork_ms']:.2f} ms; request to end of output "
            f"{report['answer_ms']:.2f} ms ({args.runtime})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
