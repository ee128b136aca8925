"""Which zygote a plain call forks from: the light one, when its code needs nothing preloaded.

Why: a child forked from the zygote holding numpy, sympy, scipy and mpmath
copies more page tables and pages than one forked from a bare interpreter;
measured in the image (``benchmarks/child_faults.py --timed --preload P``), a
``print`` child forked in 0.70 ms instead of 1.35 and answered 1 ms sooner
with 1.2 ms less CPU. Most tool calls import only the standard library.

The choice is read from the code's text, before it runs, and errs towards the
full zygote: any word naming a preloaded module (in a comment or a string
too), any import of a module outside the standard library (a package that
may import numpy itself), a dynamic import, or a code too long to scan
cheaply sends the call to the full zygote. A wrong choice costs only time
(an import the full zygote had done), never a different outcome: both
zygotes are the same interpreter with the same isolation, and neither ever
holds call data. The code chooses nothing it could not have chosen by
importing, or not importing, a module.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata

LIGHT_PRELOAD = (
    "math", "itertools", "collections", "functools", "fractions",
    "decimal", "re", "random", "json",
)  # fmt: skip
"""What the light zygote imports once: the standard modules tool calls use most (as
cheap to fork from as a bare interpreter: 0.70 ms fork and 2.57 ms to output, measured)."""

SCAN_LIMIT = 1 << 14
"""Characters of code scanned at most (~0.05 ms for that many); longer code forks from the
full zygote."""

_IMPORT = re.compile(r"import\s+([^\n;]+)")
"""Every ``import`` and what follows it on its line (or up to a ``;``); unanchored, so an
import in a string (``exec``) counts too. No ``\\b``: it would defeat the literal scan."""
_FROM_CLAUSE = re.compile(r"from\s+([\w.]+)\s+$")
"""``from X`` just before an ``import``: then X is the module, and what follows are names."""
DYNAMIC_IMPORTS = ("__import__", "import_module", "importlib", "find_spec", "run_module")

STANDARD_MODULES = frozenset(getattr(sys, "stdlib_module_names", ()))
"""Empty before Python 3.10: then every call forks from the full zygote."""


@functools.lru_cache(maxsize=8)
def _heavy_names(preloaded: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(sorted({module.split(".")[0] for module in preloaded} | set(DYNAMIC_IMPORTS)))


def runs_light(source: str, preloaded: tuple[str, ...]) -> bool:
    """Whether ``source`` can fork from the light zygote (see the module docstring)."""
    if not STANDARD_MODULES or len(source) > SCAN_LIMIT:
        return False
    if not source.isascii():
        source = unicodedata.normalize("NFKC", source)  # as Python reads identifiers
    # Substrings, not words: "numpy_like" sends a call to the full zygote too (only time).
    if any(name in source for name in _heavy_names(preloaded)):
        return False
    for match in _IMPORT.finditer(source):
        line_start = source.rfind("\n", 0, match.start()) + 1
        clause = _FROM_CLAUSE.search(source, line_start, match.start())
        modules = [clause.group(1)] if clause else match.group(1).split(",")
        for name in modules:
            parts = name.split()
            top = parts[0].split(".")[0] if parts else ""
            if top not in STANDARD_MODULES:
                return False  # a package, a relative import, a name the scan cannot read
    return True
