"""The zygote's random generators, found by class and reseeded, checked without Docker.

Each check runs in a fresh interpreter: ``find`` lists every generator of the
process, and pytest's own may hold any number.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import _random, json, pickle, random, sys, types
    import numpy
    from retool_exec.backends.docker.agent import generators

    # A library's generators, made at import as sympy's are: in a namespace, in an
    # object only (tracked by the collector), and a bare C one (not tracked).
    library = types.ModuleType("some_library")
    library.rng = random.Random(1)
    library.holder = {"inner": random.Random(2)}
    library.bare = _random.Random(3)
    library.system = random.SystemRandom()
    library.legacy = numpy.random.RandomState(4)
    library.modern = numpy.random.default_rng(5)
    library.pcg_state = numpy.random.RandomState(numpy.random.PCG64(6))
    library.standalone = numpy.random.PCG64(7)
    sys.modules["some_library"] = library
    entropies = {numpy.random.mtrand._rand._bit_generator._seed_seq.entropy,
                 library.modern.bit_generator._seed_seq.entropy, 7}

    def state(obj):
        if isinstance(obj, _random.Random):
            return obj.getstate()
        if hasattr(obj, "get_state"):
            return obj.get_state(legacy=False)
        return getattr(obj, "bit_generator", obj).state

    watched = {"rng": library.rng, "inner": library.holder["inner"], "bare": library.bare,
               "legacy": library.legacy, "modern": library.modern,
               "pcg_state": library.pcg_state, "global random": random._inst,
               "global numpy": numpy.random.mtrand._rand, "standalone": library.standalone}
    found = generators.find()
    before = {name: pickle.dumps(state(obj)) for name, obj in watched.items()}
    generators.reseed(found)
    after = {name: pickle.dumps(state(obj)) for name, obj in watched.items()}
    print(json.dumps({
        "found": sorted(name for name, obj in watched.items()
                        if any(obj is generator for generator in found)),
        "system found": any(g is library.system for g in found),
        "bit generators of owners listed": any(
            g is library.modern.bit_generator or g is library.legacy._bit_generator
            for g in found),
        "unchanged": sorted(name for name in watched if before[name] == after[name]),
        "draws": [library.rng.random(), library.modern.random(), float(library.legacy.rand())],
        "same seed sequences": [name for name, bits in (
            ("global numpy", numpy.random.mtrand._rand._bit_generator),
            ("modern", library.modern.bit_generator), ("standalone", library.standalone))
            if bits._seed_seq.entropy in entropies],
    }))
    """
)


@pytest.fixture(scope="module")
def report() -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=True
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_every_generator_is_found_by_class_wherever_it_is_held(report: dict) -> None:
    assert report["found"] == sorted(
        [
            "rng", "inner", "bare", "legacy", "modern", "pcg_state", "global random",
            "global numpy", "standalone",
        ]
    )  # fmt: skip


def test_stateless_and_owned_generators_are_not_listed_twice(report: dict) -> None:
    assert report["system found"] is False
    assert report["bit generators of owners listed"] is False


def test_the_reseed_changes_every_state_and_they_still_draw(report: dict) -> None:
    assert report["unchanged"] == []
    assert report["same seed sequences"] == []  # spawn() gives new child streams too
    assert all(isinstance(value, float) for value in report["draws"])  # type: ignore[union-attr]


def test_two_reseeds_give_different_states() -> None:
    import random

    from retool_exec.backends.docker.agent import generators

    generator = random.Random(0)
    generators.reseed([generator])
    first = generator.getstate()
    generators.reseed([generator])
    assert generator.getstate() != first
