"""A Sandbox used after fork() fails at once with a clear error; configs pickle (issue 12.9)."""

from __future__ import annotations

import os
import pickle

from retool_exec import DockerConfig, LocalConfig, Sandbox, SandboxForkedError
from retool_exec.backends.fake import FakeBackend


def test_a_forked_child_gets_a_clear_error_not_a_hang() -> None:
    sandbox = Sandbox(FakeBackend(lambda _request: "parent\n"))
    assert sandbox.run_code("x").stdout == "parent\n"  # the parent's loop thread exists
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        status = 1
        try:
            try:
                sandbox.run_code("x")
            except SandboxForkedError as exc:
                os.write(write_end, str(exc).encode())
                sandbox.close()  # must return at once: the loop and the backend are the parent's
                status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    message = os.read(read_end, 4096).decode()
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, message
    assert "after fork()" in message
    assert sandbox.run_code("x").stdout == "parent\n"  # the parent is unaffected
    sandbox.close()


def test_configs_pickle_so_each_worker_builds_its_own_sandbox() -> None:
    for config in (DockerConfig(policy="reuse", runtime="runsc", pool_size=2), LocalConfig()):
        assert pickle.loads(pickle.dumps(config)) == config
