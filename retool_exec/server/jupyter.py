"""``/run_jupyter`` without a Jupyter kernel: cells as one program, one record per cell.

Our calls are stateless, so a notebook request runs as ONE program in one
sandbox: ``_inbox.run_cells`` executes each cell in a shared ``__main__``
namespace, redirecting ``sys.stdout``/``sys.stderr`` into a per-cell tail
buffer, shows the value of a final expression as ``{"text/plain": repr}``
(as a kernel's ``execute_result`` would), records an exception as
``{"ename", "evalue", "traceback"}`` and goes on with the next cell (as
SandboxFusion's driver does), and writes each cell's record as soon as the
cell ends, so a ``total_timeout`` kill keeps the cells that finished.

Limits of this design, documented in ``docs/server.md``: output written to
file descriptors directly (subprocesses, C extensions) is not attributed to a
cell and appears in ``driver.stdout``; ``cell_timeout`` is a ``SIGALRM`` in the
cell, so code that catches every exception can swallow it (``total_timeout``
still kills the whole program); a cell's output is cut to its share of the
budget, and records pushed out of the sandbox's stdout tail are reported as
lost.
"""

from __future__ import annotations

from typing import Any

from retool_exec.server.files import FileSpec
from retool_exec.server.programs import Records
from retool_exec.server.schemas import CellRunResult

__all__ = ["LOST_CELL", "cells_from_records", "cells_spec"]

LOST_CELL = "OutputLost"
"""``ename`` of the placeholder for a cell whose record did not come back."""


def cells_spec(
    cells: list[str],
    *,
    cell_timeout: float,
    cell_chars: int,
    files: FileSpec,
    nonce: str,
    fetch_budget: int,
) -> dict[str, Any]:
    """The spec for ``_inbox.run_cells``."""
    return {
        "cells": list(cells),
        "cell_timeout": cell_timeout,
        "cell_chars": cell_chars,
        "files": dict(files.uploads),
        "fetch": [[name, path] for name, path in files.fetch],
        "fetch_budget": fetch_budget,
        "marker": nonce,
    }


def cells_from_records(records: Records, total: int) -> tuple[list[CellRunResult], str]:
    """Cell results in order, and a note on cells that are missing (empty if none).

    Cells up to the last one that reported are listed; one whose record is
    missing before that gets an ``OutputLost`` placeholder. Cells after it did
    not finish (the program was killed or exited) and are left out.
    """
    by_index: dict[int, CellRunResult] = {}
    for record in records.of_kind("cell"):
        index = record.get("index")
        if not isinstance(index, int) or not 0 <= index < total:
            continue
        try:
            by_index[index] = CellRunResult.model_validate(_clean(record))
        except ValueError:
            continue
    reported = max(by_index, default=-1) + 1
    cells = [by_index.get(index) or _lost_cell() for index in range(reported)]
    notes = []
    lost = reported - len(by_index)
    if lost:
        notes.append(f"the output of {lost} cell(s) did not fit in the sandbox's output budget")
    if reported < total:
        notes.append(f"{total - reported} of {total} cell(s) did not finish")
    return cells, "; ".join(notes)


def _lost_cell() -> CellRunResult:
    return CellRunResult(
        stdout="",
        stderr="",
        display=[],
        error=[
            {
                "ename": LOST_CELL,
                "evalue": "this cell's output did not fit in the sandbox's output budget",
                "traceback": [],
            }
        ],
    )


def _clean(value: Any) -> Any:
    """Replace lone surrogates (JSON allows them, UTF-8 does not) in every string."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, list):
        return [_clean(item) for item in value]
    if isinstance(value, dict):
        return {_clean(key): _clean(item) for key, item in value.items()}
    return value
