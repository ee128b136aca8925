"""The programs the server sends to the sandbox, and reading their records back.

A plain request (no stdin, no files) runs its code unchanged. Anything more
is done *inside* the sandbox, by ``_inbox.py``: the server sends one program
that executes the inbox's source in a private namespace and hands it a spec
(a literal of plain data, never code built from the request) plus the user's
code, which the inbox compiles on its own as ``<sandbox>`` so line numbers and
tracebacks read exactly as without the wrapper.

Records come back on stdout between markers that carry a per-request random
nonce. The code could forge them (it can read its own program), but it gains
nothing: a record only describes files it could write anyway, and a malformed
one is dropped, never trusted further.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from retool_exec.server.files import FileSpec

__all__ = ["Records", "build_program", "extract_records", "new_nonce"]

_INBOX = resources.files("retool_exec.server").joinpath("_inbox.py").read_text("utf-8")


def new_nonce() -> str:
    """A marker nonce the user's output will not contain by accident."""
    return secrets.token_hex(8)


def build_program(entry: str, spec: dict[str, Any]) -> str:
    """One statement that runs ``_inbox.<entry>(spec, globals())`` without leaking names.

    ``spec`` must hold only str/int/float/bool/None/list/dict: its ``repr`` is
    the literal the sandbox reads.
    """
    if entry not in {"run", "run_cells"}:
        raise ValueError(f"unknown inbox entry {entry!r}")
    return (
        "(lambda ns: (exec(compile("
        f"{_INBOX!r}, '<retool-exec>', 'exec'), ns), ns[{entry!r}]({spec!r}, globals())))"
        "({'__name__': '__retool_exec__'})\n"
    )


def code_spec(
    code: str, *, files: FileSpec, stdin: str | None, nonce: str, fetch_budget: int
) -> dict[str, Any]:
    """The spec for ``_inbox.run``."""
    return {
        "code": code,
        "stdin": stdin,
        "files": dict(files.uploads),
        "fetch": [[name, path] for name, path in files.fetch],
        "fetch_budget": fetch_budget,
        "marker": nonce,
    }


@dataclass
class Records:
    """What a program's stdout held: the user's text and the inbox's records."""

    text: str
    """stdout with every record removed."""
    records: list[dict[str, Any]] = field(default_factory=list)
    lost: bool = False
    """True when a record was cut by the output cap or could not be parsed."""

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        """The records whose ``kind`` is ``kind``, in order."""
        return [record for record in self.records if record.get("kind") == kind]


def extract_records(stdout: str, nonce: str) -> Records:
    """Split ``stdout`` into the user's text and the records marked with ``nonce``."""
    start, end = f"<<retool-exec:{nonce}>>", f"<<end:{nonce}>>"
    result = Records(text="")
    pieces: list[str] = []
    position = 0
    first_start = stdout.find(start)
    first_end = stdout.find(end)
    if first_end != -1 and (first_start == -1 or first_end < first_start):
        # The tail cap cut into a record: its remains (and the cap's marker) go.
        position = first_end + len(end)
        result.lost = True
    while True:
        begin = stdout.find(start, position)
        if begin == -1:
            pieces.append(stdout[position:])
            break
        pieces.append(stdout[position:begin])
        finish = stdout.find(end, begin + len(start))
        if finish == -1:
            result.lost = True
            break
        try:
            record = json.loads(stdout[begin + len(start) : finish])
        except ValueError:
            record = None
        if isinstance(record, dict):
            result.records.append(record)
        else:
            result.lost = True
        position = finish + len(end)
    result.text = "".join(pieces)
    return result
