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
from collections.abc import Callable
from typing import Any

SCANNED_INTS = 64
"""How many C ints of the thread state are looked through (the count is among the
first dozen fields in every CPython from 3.9 to 3.13)."""

SETTLING_PROBES, CHECKING_PROBES = 12, 3
"""Probes run before the count is calibrated, and after: CPython specializes a call site
after some runs (3.11+), and a call through one not yet specialized counts one more
(the first probe reached 997, the next ones 998). The calls' processes are forks of
the zygote, so each runs the agent's frames as calibration left them, settled.
Together ~10 ms, once, at the zygote's start."""

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

    def start_value(self) -> int:
        """The value the count has in python3 -c just before the module frame is entered."""
        return (sys.getrecursionlimit() if self.falls else 0) + self.offset

    def run(
        self, execute: Callable[[Any, dict[str, Any]], None], code: Any, namespace: dict[str, Any]
    ) -> None:
        """``execute(code, namespace)`` with the count set as for a module at the top; put
        back after."""
        kept = self.cell.value
        self.cell.value = self.start_value()
        try:
            execute(code, namespace)
        finally:
            self.cell.value = kept


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


def _probe(counter: Counter, execute: Callable[[Any, dict[str, Any]], None]) -> int:
    namespace: dict[str, Any] = {}
    code = compile(PROBE, "<recursion-probe>", "exec", dont_inherit=True)
    counter.run(execute, code, namespace)
    return int(namespace["reached"])


def find(execute: Callable[[Any, dict[str, Any]], None]) -> Counter | None:
    """The main thread's depth count, calibrated for code run by ``execute(code, globals)``
    from the function that will run the calls' code; None when it cannot be trusted."""
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
            reached = _probe(counter, execute)
        wanted = sys.getrecursionlimit() - 1
        counter.offset = (wanted - reached) * (1 if counter.falls else -1)
        if any(_probe(counter, execute) != wanted for _ in range(CHECKING_PROBES)):
            return None
        return counter
    except Exception:
        return None
