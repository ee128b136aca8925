"""Every random generator a zygote's modules made, reseeded before each fork.

Why: a call's process is a copy of its zygote, so a generator object that a
preloaded module made at import starts every call of a container in the same
state. The global ones (``random``'s and numpy's) were reseeded by name, but
sympy alone holds four more (``sympy.core.random.rng``, the one behind its
assumptions, ``sympy.ntheory.ecm.rgen``, ``sympy.ntheory.qs.rgen``): one call
could replay the draws of any later call of its container, a key made by
``sympy.crypto`` with no seed, the test points of ``Expr.equals``. So the
generators are found by class, not by name: every ``random.Random`` (but
``SystemRandom``, which has no state) and every numpy generator in the
zygote's heap or in a module's namespace, once, after the preload and the
rehearsal; and each gets a state from ``os.urandom`` in the zygote just
before each fork, where the child does not pay for it.
"""

from __future__ import annotations

import _random
import gc
import os
import random
import sys
from typing import Any

MT19937_WORDS = 624


def find() -> list[Any]:
    """The generators in this process now (see the module docstring)."""
    numpy_kinds = _numpy_kinds()
    kinds = (_random.Random, *numpy_kinds)
    found: dict[int, Any] = {}
    frozen = gc.get_freeze_count() > 0
    if frozen:
        gc.unfreeze()  # frozen objects are not listed; frozen again below
    try:
        candidates = [obj for obj in gc.get_objects() if isinstance(obj, kinds)]
    finally:
        if frozen:
            gc.freeze()
    for module in list(sys.modules.values()):  # a bare _random.Random is not tracked by gc
        for value in list(getattr(module, "__dict__", {}).values()):
            if isinstance(value, kinds):
                candidates.append(value)
    for obj in candidates:
        if not isinstance(obj, random.SystemRandom):
            found[id(obj)] = obj
    owned = {id(_owned_bit_generator(obj)) for obj in found.values()}
    return [obj for key, obj in found.items() if key not in owned]  # reseeded by their owner


def reseed(generators: list[Any]) -> None:
    """A state from ``os.urandom`` for each of ``generators``."""
    for generator in generators:
        try:
            _reseed_one(generator)
        except Exception:  # a generator a library broke must not stop every fork
            pass


def _reseed_one(generator: Any) -> None:
    if isinstance(generator, random.Random):
        random.Random.seed(generator, int.from_bytes(os.urandom(32), "little"))
    elif isinstance(generator, _random.Random):
        _random.Random.seed(generator, int.from_bytes(os.urandom(32), "little"))
    elif hasattr(generator, "set_state"):  # numpy's RandomState (the global one among them)
        numpy = sys.modules["numpy"]
        bit_generator = generator._bit_generator
        if type(bit_generator).__name__ == "MT19937":
            # What seed() ends in, without its SeedSequence machinery: ~40 pages written
            # against ~120 (each copied while a child shares them).
            key = numpy.frombuffer(os.urandom(MT19937_WORDS * 4), dtype=numpy.uint32)
            generator.set_state(("MT19937", key, MT19937_WORDS, 0, 0.0))
        else:
            _reseed_bit_generator(bit_generator)
            generator.set_state(bit_generator.state)  # clears its cached normal deviate
    else:
        _reseed_bit_generator(_owned_bit_generator(generator) or generator)


def _reseed_bit_generator(bit_generator: Any) -> None:
    fresh = type(bit_generator)(int.from_bytes(os.urandom(16), "little"))
    bit_generator.state = fresh.state


def _numpy_kinds() -> tuple[type, ...]:
    numpy = sys.modules.get("numpy")
    if numpy is None:
        return ()
    try:
        kinds = numpy.random.RandomState, numpy.random.Generator, numpy.random.BitGenerator
    except AttributeError:
        return ()
    return tuple(kind for kind in kinds if isinstance(kind, type))


def _owned_bit_generator(obj: Any) -> Any:
    """The bit generator of a numpy Generator or RandomState; None for anything else."""
    if isinstance(obj, _random.Random):
        return None
    return getattr(obj, "bit_generator", None) or getattr(obj, "_bit_generator", None)
