"""The light zygote: plain calls that need nothing preloaded fork from a bare interpreter.

What must hold: a call's interpreter depends only on its own code, never on
which zygote the previous call of the container wanted (that would tell it
something of that call's code); a change of kind costs a fork, not a failed
reset or a retired container; and ``light_zygote=False`` keeps one zygote.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from retool_exec import DockerConfig, Outcome, Sandbox
from retool_exec.backends.docker.backend import DockerBackend
from tests.conftest import LABELS, require_docker
from tests.docker.pool_probes import record_containers

pytestmark = pytest.mark.docker

PROBE = "import sys\nname = 'nu' + 'mpy'\nprint(name in sys.modules, 'fractions' in sys.modules)\n"
"""Light code (it names no preloaded module) that tells which zygote its process came from."""
FULL_PROBE = PROBE + "# numpy\n"
"""The same, sent to the full zygote by the comment alone."""


def _sandbox(**config: object) -> Sandbox:
    require_docker()
    settings = {"policy": "reuse", "pool_size": 1, "preload": ("numpy",), "labels": LABELS}
    return Sandbox(DockerConfig.model_validate({**settings, **config}), max_workers=1)


@pytest.fixture(scope="module")
def two_zygotes() -> Iterator[Sandbox]:
    with _sandbox() as sandbox:
        yield sandbox


def test_a_calls_interpreter_does_not_depend_on_the_previous_calls_code(
    two_zygotes: Sandbox,
) -> None:
    """After a call that wanted the full zygote, the next light call still gets a light
    child: taking the full spare would show it numpy, that is, what the previous call's
    code named. Every order of the two kinds, on one container."""
    seen = record_containers(two_zygotes)
    for kind in "FLFFLLFLF":
        result = two_zygotes.run_code(FULL_PROBE if kind == "F" else PROBE)
        assert result.outcome is Outcome.SUCCESS, result
        assert result.stdout == ("True False\n" if kind == "F" else "False True\n"), (kind, result)
    assert len(set(seen)) == 1, "a change of kind retired the container"


def test_a_session_and_a_notebook_fork_from_the_full_zygote(two_zygotes: Sandbox) -> None:
    assert two_zygotes.run_code(PROBE).stdout == "False True\n"
    with two_zygotes.session() as session:
        assert session.run_code(PROBE).stdout == "True False\n"
    assert two_zygotes.run_code(PROBE).stdout == "False True\n"


def test_a_wrong_choice_only_costs_an_import(two_zygotes: Sandbox) -> None:
    """A dynamic import the scan cannot read runs light, and works: the light child
    simply lacks the module until the code imports it."""
    hidden = "import sys\nprint('nu' 'mpy' in sys.modules)\n"
    assert two_zygotes.run_code(hidden).stdout == "False\n"
    result = two_zygotes.run_code(
        "import builtins\n"
        "m = getattr(builtins, '__imp' 'ort__')('nu' 'mpy')\n"
        "print(m.arange(4).sum())\n"
    )
    assert result.stdout == "6\n", result


def test_an_uploaded_module_sends_the_call_to_the_full_zygote(two_zygotes: Sandbox) -> None:
    """``import helper`` is not the standard library: helper may import anything."""
    result = two_zygotes.run_code("import helper\n", files={"helper.py": PROBE})
    assert result.stdout == "True False\n", result


def test_one_zygote_when_asked(two_zygotes: Sandbox) -> None:
    with _sandbox(light_zygote=False) as sandbox:
        for _ in range(2):
            assert sandbox.run_code(PROBE).stdout == "True False\n"
        backend = sandbox.backend
        assert isinstance(backend, DockerBackend)
        stats = backend.pool_stats()
        assert stats is not None and stats.started == 1
