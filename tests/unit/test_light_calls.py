"""Which zygote a plain call forks from (``agent/light_calls.py``): pure, no Docker.

The one thing that must never happen is a call whose code needs a module the
light zygote lacks (a preloaded one, or any package) being sent to it; the other
way round only costs time. The properties check that direction against what
``ast`` reads as the code's imports.
"""

from __future__ import annotations

import ast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retool_exec.backends.docker.agent.light_calls import (
    LIGHT_PRELOAD,
    SCAN_LIMIT,
    STANDARD_MODULES,
    runs_light,
)

PRELOADED = ("numpy", "sympy", "scipy", "mpmath")


@pytest.mark.parametrize(
    ("source", "light"),
    [
        ("print(2 + 3)", True),
        ("1 / 0", True),
        ("import math, itertools as it\nprint(math.pi)", True),
        ("from fractions import Fraction\nfrom collections import (\n  deque,\n  Counter)\n", True),
        ("from __future__ import annotations\nx = 1; from os.path import join as j", True),
        ("import numpy as np", False),
        ("from sympy import *", False),
        ("print('sympy')", False),  # a string counts: it may be imported dynamically
        ("x = 1  # uses scipy later", False),
        ("import scipy.linalg", False),
        ("import pandas", False),  # a package may import numpy itself
        ("x = 1; import pandas", False),
        ("exec('import pandas')", False),
        ("from . import helper", False),
        ("from .helper import f", False),
        ("import helper", False),  # an uploaded module: it may import anything
        ("__import__('os')", False),
        ("import importlib", False),
        ("print('\uff4e\uff55\uff4d\uff50\uff59')", False),  # fullwidth letters read as numpy
        ("a = 1\n" * (SCAN_LIMIT // 6 + 1), False),  # too long to scan: the full zygote
    ],
)
def test_examples(source: str, light: bool) -> None:
    assert runs_light(source, PRELOADED) is light


def test_the_light_zygotes_own_modules_are_standard() -> None:
    assert set(LIGHT_PRELOAD) <= STANDARD_MODULES
    assert not set(LIGHT_PRELOAD) & set(PRELOADED)


def test_the_preloaded_names_come_from_the_config() -> None:
    """Only what the full zygote preloads (top-level names) makes a call heavy by name."""
    assert runs_light("print('sympy')", ("numpy",))
    assert not runs_light("import numpy.linalg", ("numpy.linalg",))
    assert not runs_light("print('numpy')", ("numpy.linalg",))


_identifiers = st.text(alphabet="abcmnpsyz_", min_size=1, max_size=8)
_standard = st.sampled_from(sorted(m for m in STANDARD_MODULES if not m.startswith("_")))
_modules = st.one_of(_standard, _identifiers, st.sampled_from(PRELOADED))
_dotted = st.builds(
    lambda head, tail: ".".join([head, *tail]), _modules, st.lists(_identifiers, max_size=2)
)


@st.composite
def _import_statement(draw: st.DrawFn) -> str:
    names = draw(st.lists(_dotted, min_size=1, max_size=3))
    aliases = [f"{name} as {draw(_identifiers)}" if draw(st.booleans()) else name for name in names]
    if draw(st.booleans()):
        return "import " + ", ".join(aliases)
    level = "." * draw(st.integers(min_value=0, max_value=1))
    what = ", ".join(draw(st.lists(_identifiers, min_size=1, max_size=3)))
    if draw(st.booleans()):
        what = f"(\n    {what},\n)"
    return f"from {level}{names[0]} import {what}"


_other_lines = st.sampled_from(["x = 1", "print(x)", "def f():\n    return 2", "pass", ""])


@given(st.lists(st.one_of(_import_statement(), _other_lines), max_size=8), st.booleans())
def test_code_importing_anything_but_the_standard_library_never_runs_light(
    lines: list[str], one_line: bool
) -> None:
    source = "; ".join(line for line in lines if "\n" not in line) if one_line else "\n".join(lines)
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return  # not code the property is about (a keyword as a name, say)
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add("." if node.level else (node.module or "").split(".")[0])
    if imported - STANDARD_MODULES:
        assert not runs_light(source, PRELOADED), source


@given(st.text(max_size=200), st.sampled_from(PRELOADED), st.integers(min_value=0))
def test_a_preloaded_name_anywhere_sends_the_call_to_the_full_zygote(
    text: str, name: str, where: int
) -> None:
    cut = where % (len(text) + 1)
    assert not runs_light(text[:cut] + name + text[cut:], PRELOADED)


@given(st.lists(_standard, min_size=1, max_size=5))
def test_standard_imports_alone_run_light(modules: list[str]) -> None:
    source = "import " + ", ".join(modules) + "\nprint(1)\n"
    if any(name in source for name in PRELOADED) or "importlib" in source:
        return
    assert runs_light(source, PRELOADED), source
