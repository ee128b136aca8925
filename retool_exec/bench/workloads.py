"""The code the benchmark runs: small programs that each stress one thing.

Each workload says what a correct run looks like (its expected outcome and,
where cheap to check, a piece of its output), so a backend that is fast
because it fails is counted as failing, not as fast.
"""

from __future__ import annotations

from dataclasses import dataclass

from retool_exec._models import ExecResult, Outcome

__all__ = ["WORKLOADS", "Workload", "select_workloads"]


@dataclass(frozen=True, slots=True)
class Workload:
    """One program to benchmark and what a correct run of it returns."""

    name: str
    """Short id used on the command line, in tables and in the JSON."""
    title: str
    """One line for humans: what it measures."""
    code: str
    expected: Outcome
    """The outcome every call should have; any other outcome is a failure."""
    expect_stdout: str | None = None
    """A substring the stdout must contain (None: not checked)."""
    timeout: float | None = None
    """Per-call wall-clock limit; None uses the sandbox's."""
    slow: bool = False
    """Takes seconds per call by design, so it gets fewer calls (see the runner)."""
    needs: tuple[str, ...] = ()
    """Modules the code imports (the local baseline's interpreter must have them)."""

    def failure(self, result: ExecResult) -> str | None:
        """Why ``result`` is not a correct run of this workload, or None when it is."""
        if result.outcome is not self.expected:
            last_line = (result.stderr.strip().splitlines() or [""])[-1]
            detail = result.detail or last_line
            return f"outcome {result.outcome.value} (expected {self.expected.value}): {detail}"[
                :300
            ]
        if self.expect_stdout is not None and self.expect_stdout not in result.stdout:
            return f"stdout {result.stdout[-80:]!r} lacks {self.expect_stdout!r}"
        return None


_SYMPY = """\
import sympy as sp
x = sp.symbols("x")
print(sp.solve(x**2 - 5*x + 6, x))
"""

_NUMPY = """\
import numpy as np
a = np.arange(10000, dtype=np.float64).reshape(100, 100)
print(float((a @ a.T).trace()))
"""

_FLOOD = """\
import sys
line = "x" * 1023 + "\\n"
for _ in range(4096):
    sys.stdout.write(line)
print("done")
"""

TIMEOUT_WORKLOAD_LIMIT = 1.0
"""Seconds the timeout workload is allowed; it loops forever, so it always hits it."""

WORKLOADS: tuple[Workload, ...] = (
    Workload(
        "print",
        "print(2+3): the fixed cost of one call",
        "print(2+3)",
        Outcome.SUCCESS,
        expect_stdout="5",
    ),
    Workload(
        "numpy",
        "import numpy, multiply two 100x100 matrices",
        _NUMPY,
        Outcome.SUCCESS,
        expect_stdout="333283335000.0",
        needs=("numpy",),
    ),
    Workload(
        "sympy",
        "import sympy, solve x**2 - 5x + 6 = 0",
        _SYMPY,
        Outcome.SUCCESS,
        expect_stdout="[2, 3]",
        needs=("sympy",),
    ),
    Workload(
        "error",
        "a runtime error: 1/0 (traceback in stderr)",
        "x = 1\nprint(x / 0)",
        Outcome.ERROR,
    ),
    Workload(
        "sleep",
        "time.sleep(2): shows how many calls really run at once",
        "import time\ntime.sleep(2)\nprint('slept')",
        Outcome.SUCCESS,
        expect_stdout="slept",
        slow=True,
    ),
    Workload(
        "timeout",
        f"`while True: pass` with a {TIMEOUT_WORKLOAD_LIMIT:g} s limit: how fast a kill returns",
        "while True:\n    pass",
        Outcome.TIMEOUT,
        timeout=TIMEOUT_WORKLOAD_LIMIT,
        slow=True,
    ),
    Workload(
        "flood",
        "an output flood: 4 MiB to stdout (only a 4096-char tail is kept)",
        _FLOOD,
        Outcome.SUCCESS,
        expect_stdout="done",
    ),
)
"""Every workload, in the order tables show them."""


def select_workloads(names: list[str] | None) -> tuple[Workload, ...]:
    """The workloads named (in table order), or all of them for None."""
    if not names:
        return WORKLOADS
    known = {w.name: w for w in WORKLOADS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(
            f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(known)}"
        )
    return tuple(w for w in WORKLOADS if w.name in names)
