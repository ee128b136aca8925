"""Opt-in auto-print: show the value of a final expression, as a REPL would.

The seed ships a line-based ``ensure_trailing_print`` that would turn ``x = 3``
into ``print(x = 3)`` and break indented or multi-line code. This one works on
the AST: only when the last top-level statement is an expression (and not
already a ``print(...)`` call) is exactly that expression's source wrapped, so
line numbers in tracebacks stay true. If anything about the rewrite is in
doubt, the code is returned unchanged: valid code never becomes invalid.

``Sandbox(auto_print=True)`` does not call this: the sandbox does the same where the
code runs (``agent/auto_print.py``), so the host never parses model-written code,
whose parse costs time and memory in proportion to its size. This function is for
code a user rewrites on purpose, and costs the caller that time.
"""

from __future__ import annotations

import ast
import warnings

from retool_exec.backends.docker.agent.auto_print import WRAPPER, is_print_call

__all__ = ["add_auto_print"]

_WRAP_OPEN = WRAPPER + "(("
_WRAP_CLOSE = "))"


def add_auto_print(code: str) -> str:
    """Return ``code`` with its final expression's value printed (``None`` is skipped)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarnings belong to the run, not to us
            tree = ast.parse(code, filename="<sandbox>", mode="exec")
        source = code.encode("utf-8")
    except (SyntaxError, ValueError, UnicodeEncodeError, RecursionError, MemoryError):
        return code
    if not tree.body:
        return code
    last = tree.body[-1]
    if not isinstance(last, ast.Expr) or is_print_call(last.value):
        return code
    value = last.value
    if value.end_lineno is None or value.end_col_offset is None:
        return code
    start = _byte_offset(source, value.lineno, value.col_offset)
    end = _byte_offset(source, value.end_lineno, value.end_col_offset)
    if start is None or end is None or end < start:
        return code
    rewritten = (
        source[:start]
        + _WRAP_OPEN.encode()
        + source[start:end]
        + _WRAP_CLOSE.encode()
        + source[end:]
    ).decode("utf-8")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ast.parse(rewritten, filename="<sandbox>", mode="exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return code
    return rewritten


def _byte_offset(source: bytes, lineno: int, col_offset: int) -> int | None:
    """Offset into ``source`` of a (1-based line, UTF-8 byte column) position from ``ast``."""
    offset = 0
    for _ in range(lineno - 1):
        newline = _next_line_end(source, offset)
        if newline is None:
            return None
        offset = newline
    if offset + col_offset > len(source):
        return None
    return offset + col_offset


def _next_line_end(source: bytes, offset: int) -> int | None:
    """Start of the line after ``offset``, splitting lines the way the tokenizer does."""
    for index in range(offset, len(source)):
        byte = source[index]
        if byte == 0x0A:
            return index + 1
        if byte == 0x0D:
            if index + 1 < len(source) and source[index + 1] == 0x0A:
                return index + 2
            return index + 1
    return None
