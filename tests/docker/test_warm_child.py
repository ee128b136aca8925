"""The rehearsal of a call (``zygote.warm_up``): once in every zygote, before any fork
(``zygote.warm_zygote``), and under gVisor in each spare child before its request.

The rehearsal must leave the call exactly what a fresh ``python3`` would have:
its own std streams, ``__main__``, tracebacks that start at its code, and the
at-exit functions of everything preloaded, run once at its end.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from retool_exec import DockerConfig, Outcome, Sandbox
from tests.conftest import LABELS, require_docker

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module", params=["runsc", "runc"])
def gvisor_with_logging(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    """gVisor (the zygote's and the child's rehearsals) and runc (the zygote's only), with
    ``logging`` preloaded: its at-exit ``shutdown`` is the zygote's."""
    require_docker()
    config = DockerConfig(
        runtime=request.param,
        policy="reuse",
        pool_size=1,
        timeout=20,
        preload=("logging",),
        labels=LABELS,
    )
    with Sandbox(config, max_workers=1) as sandbox:
        yield sandbox


def test_the_preloaded_modules_at_exit_functions_still_run_at_the_calls_end(
    gvisor_with_logging: Sandbox,
) -> None:
    """A buffered log record reaches stdout only through ``logging.shutdown`` at exit,
    registered when the zygote imported ``logging``: a rehearsal that ran the at-exit
    functions would have used it up, and the record would be lost."""
    code = (
        "import logging, logging.handlers, sys\n"
        "handler = logging.handlers.MemoryHandler(100, target=logging.StreamHandler(sys.stdout))\n"
        "logging.getLogger().addHandler(handler)\n"
        "logging.getLogger().warning('flushed at exit')\n"
        "print('before exit')\n"
    )
    for _ in range(3):
        result = gvisor_with_logging.run_code(code)
        assert result.outcome is Outcome.SUCCESS, result
        assert result.stdout == "before exit\nflushed at exit\n", result


def test_the_call_gets_a_fresh_interpreters_streams_main_and_tracebacks(
    gvisor_with_logging: Sandbox,
) -> None:
    state = gvisor_with_logging.run_code(
        "import sys\n"
        "main = sys.modules['__main__'].__dict__\n"
        "print(sys.stdout is sys.__stdout__, sys.stdout.fileno(), sys.stderr.fileno(),\n"
        "      sys.stderr.line_buffering, __name__, main is globals(),\n"
        "      '__warm_up__' in sys.modules, 'total' in globals(), sys.exc_info())\n"
    )
    assert state.stdout == "True 1 2 True __main__ True False False (None, None, None)\n", state
    error = gvisor_with_logging.run_code("x = 1\n1 / 0\n")
    assert error.outcome is Outcome.ERROR, error
    assert error.stderr.startswith("Traceback (most recent call last):\n"), error.stderr
    assert 'File "<sandbox>", line 2' in error.stderr, error.stderr
    assert "warm-up" not in error.stderr and "ZeroDivisionError" in error.stderr, error.stderr
