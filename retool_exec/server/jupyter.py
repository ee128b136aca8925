"""``/run_jupyter`` without a Jupyter kernel: the backend's notebook mode, in SandboxFusion's shape.

Our calls are stateless, so a notebook request is ONE call in notebook mode
(``RunRequest.cells``): the backend runs the cells in order in one
interpreter sharing ``__main__``, captures each cell's stdout and stderr
apart (on the cell's own file descriptors, so subprocesses and C extensions
are attributed too), shows the value of a final expression as
``{"text/plain": repr}`` (as a kernel's ``execute_result`` would), records an
exception as ``{"ename", "evalue", "traceback"}`` and goes on with the next
cell (as SandboxFusion's driver does).

Which cells ran, and how each ended, is the backend's own record
(``CellResult.finished``/``timed_out``), never something the code printed.
The cells that finished are reported; the cell in which the interpreter
ended (``os._exit``, a kill, ``total_timeout``) is reported with a
``TimeoutError`` or ``DeadKernelError`` entry; the cells after it did not
run and are left out, and ``message`` says how many did not finish.
"""

from __future__ import annotations

from typing import Any

from retool_exec._formatting import within
from retool_exec._models import CellResult, ExecResult
from retool_exec.server.results import cut_stream, outcome_message
from retool_exec.server.schemas import CellRunResult

__all__ = ["DEAD_KERNEL", "TIMEOUT", "display_entry", "error_entry", "notebook_cells"]

TIMEOUT = "TimeoutError"
"""``ename`` of a cell stopped by ``cell_timeout`` or ``total_timeout``."""
DEAD_KERNEL = "DeadKernelError"
"""``ename`` of the cell in which the interpreter ended (as nbclient names it)."""


def notebook_cells(
    result: ExecResult,
    total: int,
    *,
    cell_chars: int,
    cell_timeout: float,
    total_timeout: float,
) -> tuple[list[CellRunResult], int, str]:
    """The cells to report, how many finished, and a note on those that did not."""
    cells = [
        _cell(cell, result, cell_chars, cell_timeout, total_timeout)
        for cell in result.cells[:total]
    ]
    finished = sum(1 for cell in result.cells[:total] if cell.finished)
    note = f"{total - finished} of {total} cell(s) did not finish" if finished < total else ""
    return cells, finished, note


def _cell(
    cell: CellResult, result: ExecResult, chars: int, cell_timeout: float, total_timeout: float
) -> CellRunResult:
    stdout, _ = cut_stream(_text(cell.stdout), cell.stdout_dropped_chars, chars)
    stderr, _ = cut_stream(_text(cell.stderr), cell.stderr_dropped_chars, chars)
    display = [entry for item in cell.display if (entry := display_entry(item, chars)) is not None]
    errors = [error_entry(item, chars) for item in cell.error]
    if cell.timed_out:
        trace = [line for error in errors for line in error["traceback"]]
        errors = [
            {
                "ename": TIMEOUT,
                "evalue": f"the cell ran longer than its {cell_timeout:g} s limit"
                + ("" if cell.finished else " and was killed"),
                "traceback": trace,
            }
        ]
    elif not cell.finished:
        if result.timed_out:
            ename, evalue = TIMEOUT, f"the notebook ran longer than its {total_timeout:g} s limit"
        else:
            how = outcome_message(result) or f"exit status {result.returncode}"
            ename, evalue = DEAD_KERNEL, f"the interpreter ended during this cell ({how})"
        errors.append({"ename": ename, "evalue": evalue, "traceback": []})
    return CellRunResult(stdout=stdout, stderr=stderr, display=display, error=errors)


def error_entry(item: dict[str, Any], chars: int) -> dict[str, Any]:
    """A cell's exception record, its value and traceback cut to ``chars`` characters."""
    trace = item.get("traceback")
    lines = [
        _text(line) for line in (trace if isinstance(trace, list) else []) if isinstance(line, str)
    ]
    return {
        "ename": _text(str(item.get("ename", ""))),
        "evalue": within(_text(str(item.get("evalue", ""))), chars),
        "traceback": _tail_lines(lines, chars),
    }


def _tail_lines(lines: list[str], chars: int) -> list[str]:
    """The last lines that fit in ``chars`` characters, marked when some were cut."""
    kept: list[str] = []
    size = 0
    for line in reversed(lines):
        if size + len(line) > chars:
            break
        kept.append(line)
        size += len(line)
    kept.reverse()
    dropped = sum(len(line) for line in lines) - size
    if dropped:
        kept.insert(0, f"[... truncated {dropped} chars ...]\n")
    return kept


def display_entry(item: dict[str, str], chars: int) -> dict[str, str] | None:
    """A cell's ``{"text/plain": ...}`` display, cut to ``chars`` (``within``: the backend
    cut it to the request's ``cell_output_chars`` already); None if it has no text."""
    text = item.get("text/plain")
    if not isinstance(text, str):
        return None
    return {"text/plain": within(_text(text), chars)}


def _text(value: str) -> str:
    """Lone surrogates (JSON allows them, UTF-8 does not) replaced."""
    return value.encode("utf-8", "replace").decode("utf-8")
