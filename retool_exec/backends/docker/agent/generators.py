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

A numpy generator is made again (``__init__`` with a new bit generator), not
given a state: a bit generator keeps the ``SeedSequence`` it was made with,
which ``spawn`` (public from numpy 1.25: ``get_bit_generator().spawn``) turns
into the same child streams in every call otherwise. That costs ~56 us a fork
for numpy's global generator in the image, against ~24 us for a new state.

Decision: a generator a library seeded on purpose at import (``Random(42)``)
is reseeded too, so its draws differ from those of a fresh interpreter: its
state cannot tell it from one seeded from entropy, and a shared state is the
worse failure. The image's libraries seed none of theirs (sympy's, numpy's
and Python's are all ``Random()``-style, as a fresh interpreter has them).

A session's fork is a copy too: its copy reseeds the libraries' generators
(``OfASession``), as CPython's own at-fork hook reseeds ``random``'s, so that
branches of one session do not draw the same numbers (thirty-seventh round:
two forks and their parent drew alike from numpy and sympy). A generator the
session's code holds in ``__main__`` (``rng = default_rng(42)``) is its own
and keeps its state in every branch.
"""

from __future__ import annotations

import _random
import gc
import os
import random
import sys
from typing import Any


def find() -> list[Any]:
    """The generators in this process now (see the module docstring), each reseeded once.

    Raises RuntimeError for one that cannot be reseeded: a zygote whose calls would
    share a generator's state must not serve them.
    """
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
    generators = [obj for key, obj in found.items() if key not in owned]  # via their owner
    reseed(generators)  # once now: one that cannot be reseeded stops the zygote, named
    return generators


class OfASession:
    """The generators a session's forks reseed: ``known`` (the zygote's, ``find``) and
    those in the namespace of every module imported since, but ``__main__``'s.

    Looked for in the session's own process before each fork, each module once
    (``update``): the copy only reseeds. Why: scanned in every copy, the ~1,000
    modules of numpy and sympy imported by a cell took ~3 ms a fork, each namespace's
    values written (their reference counts) on pages the copy then had to copy.
    """

    def __init__(self, known: list[Any], modules_known: frozenset[str]) -> None:
        self.found = {id(generator): generator for generator in known}
        self.seen = set(modules_known)
        self.seen.add("__main__")

    def update(self) -> None:
        """Look in the modules imported since the last look."""
        kinds = (_random.Random, *_numpy_kinds())
        for name, module in list(sys.modules.items()):
            if type(name) is not str or name in self.seen:
                continue
            self.seen.add(name)
            namespace = getattr(module, "__dict__", None)
            if type(namespace) is not dict:
                continue
            for value in list(namespace.values()):  # by type: no ``__class__`` of the code's
                kind = type(value)
                if issubclass(kind, kinds) and not issubclass(kind, random.SystemRandom):
                    self.found.setdefault(id(value), value)

    def chosen(self) -> list[Any]:
        """What to reseed: each generator once (a numpy one, not its bit generator too)."""
        owned = {id(_owned_bit_generator(obj)) for obj in self.found.values()}
        return [obj for key, obj in self.found.items() if key not in owned]


def reseed(generators: list[Any]) -> None:
    """A state from ``os.urandom`` for each of ``generators``."""
    for generator in generators:
        _reseed_one(generator)


def _reseed_one(generator: Any) -> None:
    try:
        _new_state(generator)
    except Exception as exc:
        raise RuntimeError(f"cannot reseed the random generator {generator!r}: {exc}") from exc


def _new_state(generator: Any) -> None:
    seed = int.from_bytes(os.urandom(32), "little")
    if isinstance(generator, random.Random):
        random.Random.seed(generator, seed)
    elif isinstance(generator, _random.Random):
        _random.Random.seed(generator, seed)
    else:
        owned = _owned_bit_generator(generator)
        if owned is not None:  # a RandomState or a Generator: a new bit generator inside
            generator.__init__(type(owned)(seed))
        else:  # a bit generator of no owner: made again in place
            generator.__init__(seed)


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
