"""A call's interpreter starts as ``python3 -c CODE`` (or ``python3 SCRIPT``) would.

Until 2026-12-02 the first entry of ``sys.path`` in a call was the agent's own
archive, not the code's directory: a module uploaded with the call could not be
imported, where the local backend (a real ``python3 -c``) imported it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from retool_exec import DockerConfig, LocalConfig, Sandbox
from retool_exec.backends.local import LocalSubprocessBackend
from tests.conftest import LABELS, require_docker

PATHS = "import sys\nprint(repr(sys.path[0]), sys.argv, any('agent' in p for p in sys.path))\n"


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("local"),
        pytest.param("reuse", marks=pytest.mark.docker),
        pytest.param("fresh", marks=pytest.mark.docker),
    ],
)
def sandbox(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    if request.param == "local":
        config: LocalConfig | DockerConfig = LocalConfig()
    else:
        require_docker()
        config = DockerConfig(policy=request.param, pool_size=1, labels=LABELS)
    with Sandbox(config, max_workers=1) as sb:
        yield sb


def test_a_module_uploaded_with_the_call_imports(sandbox: Sandbox) -> None:
    result = sandbox.run_code(
        "import helper\nprint(helper.twice(21))\n",
        files={"helper.py": "def twice(x):\n    return 2 * x\n"},
    )
    assert result.stdout == "42\n", result


def test_sys_path_and_argv_are_those_of_python3_c(sandbox: Sandbox) -> None:
    assert sandbox.run_code(PATHS).stdout == "'' ['-c'] False\n"


SIGNALS = """
import signal
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
print(*(int(status[key], 16) for key in ("SigBlk", "SigIgn", "SigCgt")))
print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)
"""
SETTABLE = sum(1 << signal_number - 1 for signal_number in signal.valid_signals())
"""The signals Python can set. glibc keeps 32 and 33 for itself (no Python code can
set or reset them); in a container the runtime starts PID 1 with 32 ignored, which a
``python3`` there inherits as well."""
IGNORED = (1 << signal.SIGPIPE - 1) | (1 << signal.SIGXFSZ - 1)


def _dispositions(stdout: str) -> tuple[int, int, int, bool]:
    masks, default_int_handler = stdout.splitlines()
    blocked, ignored, caught = (int(mask) & SETTABLE for mask in masks.split())
    return blocked, ignored, caught, default_int_handler == "True"


def test_signal_dispositions_are_those_of_python3(sandbox: Sandbox) -> None:
    """Nothing blocked, SIGPIPE and SIGXFSZ ignored, SIGINT caught (KeyboardInterrupt),
    as a fresh ``python3`` has them: a zygote's child resets every disposition its
    zygote set (a zygote ignores nearly every signal and catches SIGCHLD). The local
    backend's ``python3`` also inherits what this process ignores (under ``nohup``,
    SIGHUP): there the reference is a ``python3`` started from here."""
    result = sandbox.run_code(SIGNALS)
    if isinstance(sandbox.backend, LocalSubprocessBackend):
        reference = subprocess.run(
            [sys.executable, "-c", SIGNALS], capture_output=True, text=True, check=True
        )
        expected = _dispositions(reference.stdout)
    else:
        expected = (0, IGNORED, 1 << signal.SIGINT - 1, True)
    assert _dispositions(result.stdout) == expected, result
