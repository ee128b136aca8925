"""What a zygote holds once it serves forks, and what every call inherits from it.

The bounding set, ``no_new_privs`` and the syscall filter are made once in each
zygote (``identity.SandboxDrop.lock_zygote``) and reach every call across fork,
instead of being made again in each child. So the zygotes themselves must hold
them, and keep only the two capabilities a child's uid change needs (no
CAP_SETPCAP, which only the bounding set needed). Read from the host's ``/proc``
(the tests run as root, as CI does); the call's side from inside the call.
"""

from __future__ import annotations

import time

import docker
import pytest

from retool_exec import DockerConfig, Outcome, Sandbox
from retool_exec.backends.docker.agent import identity, wire
from retool_exec.backends.docker.containers import LABEL_UID
from tests.conftest import LABELS, require_docker
from tests.docker.pool_probes import pool_containers

pytestmark = pytest.mark.docker

SERVING = identity.capability_mask(wire.ZYGOTE_SERVING_CAPABILITIES)

CALL_PROBE = f"""
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
no_new_privs = libc.prctl({identity.PR_GET_NO_NEW_PRIVS}, 0, 0, 0, 0)
seccomp = libc.prctl(21, 0, 0, 0, 0)  # PR_GET_SECCOMP
print(status["CapBnd"].strip(), status["CapEff"].strip(), no_new_privs, seccomp)
print(libc.syscall(425, 1, 0) == -1 and ctypes.get_errno() == errno.ENOSYS)  # io_uring_setup
"""
"""A call's bounding and effective sets, no_new_privs and seccomp mode (by prctl: gVisor's
status has neither), and whether io_uring_setup gets the agent's filter's ENOSYS."""


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as handle:
        return {key: value.strip() for key, _, value in (line.partition(":") for line in handle)}


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
def test_zygotes_hold_what_their_calls_inherit_and_no_more(runtime: str) -> None:
    require_docker()
    config = DockerConfig(policy="reuse", pool_size=1, runtime=runtime, labels=LABELS)
    with Sandbox(config, max_workers=1) as sandbox:
        result = sandbox.run_code(CALL_PROBE)
        assert result.outcome is Outcome.SUCCESS, result
        assert result.stdout == "0000000000000000 0000000000000000 1 2\nTrue\n", result
        if runtime == "runsc":
            return  # gVisor's processes are not the host's: the call's side is what shows
        (container_id,) = pool_containers(sandbox)
        client = docker.from_env()
        try:
            calls_uid = int(client.containers.get(container_id).labels[LABEL_UID])
            zygote_uid = wire.agent_users(calls_uid)[1].partition(":")[0]
            # A zygote's fork (its middle process, or the copy before it takes the calls'
            # uid) holds the zygote's uid for a moment: look again until it is gone.
            give_up = time.monotonic() + 10
            while True:
                top = client.api.top(container_id, ps_args="-eo pid,uid")
                zygotes = [int(pid) for pid, uid in top["Processes"] if uid.strip() == zygote_uid]
                if len(zygotes) <= 2 or time.monotonic() > give_up:
                    break
                time.sleep(0.05)
        finally:
            client.close()
        assert len(zygotes) == 2, top  # the full zygote and the light one
        for pid in zygotes:
            status = _status(pid)
            assert int(status["CapEff"], 16) == SERVING, status
            assert int(status["CapPrm"], 16) == SERVING, status
            assert int(status["CapBnd"], 16) == 0, status
            assert status["NoNewPrivs"] == "1", status
            assert status["Seccomp"] == "2", status
