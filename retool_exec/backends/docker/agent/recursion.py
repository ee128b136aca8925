"""The code's recursion budget as ``python3 -c`` gives it: its module frame at depth one.

Why: a call's code runs under the agent's own frames (the zipapp's start, the
supervisor, the zygote's loop and fork: 11 of them, plus ``exec``), and each counts
against ``sys.getrecursionlimit()``. A recursion python3 takes 999 deep stopped at
987, so a correct program that recursed 990 deep was a ``RecursionError`` (thirty-
second red-team round), and a traceback's "[Previous line repeated N more times]"
differed. The limit itself cannot be raised to make room: the code reads it
(``sys.getrecursionlimit()``) and sets it, and both must be python3's.

So the interpreter's own count of the thread's depth is set, for the code, to where
python3 -c starts it. The count is a C ``int`` in the thread's state that CPython
does not export: ``find`` locates it by watching which one moves by one per Python
call (3.11+: the calls left, ``recursion_remaining``; 3.9-3.10: the depth), then
calibrates the setting with a probe run exactly as the code runs, and keeps it only
if the probe then recurses as deep as python3 does. Anything unexpected leaves the
count alone (the agent's frames count, as before). ``sys.setrecursionlimit`` in the
code reads the depth from the same count, so it behaves as in python3 too.
"""

from __future__ import annotations

import ctypes
import sys
import types
from collections.abc import Callable
from typing import Any

SCANNED_INTS = 64
"""How many C ints of the thread state are looked through (the count is among the
first dozen fields in every CPython from 3.9 to 3.13)."""

SETTLING_PROBES, CHECKING_PROBES = 4, 3
"""Probes run before the count is calibrated, and after. CPython specializes a
function's calls once it has run a few times (3.11+), and a call not yet specialized
counts one more (a probe reached 997 at first, 998 later). The agent's function that
runs a call's code runs once in each call's process, never specialized, so every
probe is run by a fresh copy of the runner, as cold; the settling probes warm the rest
(``Counter.enter``, the probe's compilation). A few ms, once, at the zygote's start."""

PROBE = """
def deepest(n):
    try:
        return deepest(n + 1)
    except RecursionError:
        return n
reached = deepest(1)
"""
"""The deepest call a module's recursion reaches: ``limit - 1`` under ``python3 -c``."""


class Counter:
    """Where the thread's depth count is, and the value that starts the code at depth one."""

    def __init__(self, address: int, falls: bool) -> None:
        self.cell = ctypes.c_int.from_address(address)
        self.falls = falls
        """True where the count is of the calls left (3.11+), false where of the depth."""
        self.offset = 0
        """Set by calibration: what the value at depth zero must be moved by."""
        self.kept = 0
        """The count as ``enter`` found it."""

    def start_value(self) -> int:
        """The value the count has in python3 -c just before the module frame is entered."""
        return (sys.getrecursionlimit() if self.falls else 0) + self.offset

    def enter(self) -> None:
        """Set the count as for a module at the top (the caller then calls ``exec``)."""
        self.kept = self.cell.value
        self.cell.value = self.start_value()

    def leave(self) -> None:
        """Put the count back (once the code's trace and profile functions are off: a
        frame of the agent's between the code's end and them would be theirs to see)."""
        self.cell.value = self.kept


def _thread_ints(base: int) -> list[int]:
    return list((ctypes.c_int * SCANNED_INTS).from_address(base))


def _one_deeper(base: int) -> list[int]:
    return _thread_ints(base)


def _two_deeper(base: int) -> list[int]:
    return _one_deeper(base)


def _locate(base: int) -> Counter | None:
    here, deeper, deepest = _thread_ints(base), _one_deeper(base), _two_deeper(base)
    found = []
    for index in range(SCANNED_INTS):
        step = deeper[index] - here[index]
        if step in (1, -1) and deepest[index] - deeper[index] == step:
            found.append(Counter(base + index * ctypes.sizeof(ctypes.c_int), falls=step < 0))
    return found[0] if len(found) == 1 else None


Runner = Callable[[Counter, Any, dict[str, Any]], None]
"""``run(counter, code, globals)``: ``counter.enter()``, ``exec(code, globals)`` in the
same frame, ``counter.leave()``, as the agent runs a call's code."""


def _probe(counter: Counter, run: Runner) -> int:
    """How deep ``PROBE`` reaches run by a fresh copy of ``run`` (see ``SETTLING_PROBES``)."""
    namespace: dict[str, Any] = {}
    code = compile(PROBE, "<recursion-probe>", "exec", dont_inherit=True)
    cold = types.FunctionType(run.__code__.replace(), run.__globals__, run.__name__)
    cold(counter, code, namespace)
    return int(namespace["reached"])


def find(run: Runner) -> Counter | None:
    """The main thread's depth count, calibrated for code run by ``run``, shaped as the
    agent runs the calls' code; None when it cannot be trusted."""
    try:
        get_state = ctypes.pythonapi.PyThreadState_Get
        get_state.restype = ctypes.c_void_p
        base = get_state()
        if not base:
            return None
        counter = _locate(base)
        if counter is None:
            return None
        for _ in range(SETTLING_PROBES):
            reached = _probe(counter, run)
        wanted = sys.getrecursionlimit() - 1
        counter.offset = (wanted - reached) * (1 if counter.falls else -1)
        if any(_probe(counter, run) != wanted for _ in range(CHECKING_PROBES)):
            return None
        return counter
    except Exception:
        return None
