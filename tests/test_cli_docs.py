"""The README and the Makefile say what the code does: the backend table is the registry's,
"Where things live" lists every folder, and every `retool-exec run` shown is valid."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from retool_exec.backends.registry import BUILTIN_BACKENDS
from retool_exec.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
MAKEFILE = (ROOT / "Makefile").read_text(encoding="utf-8")


def backend_table() -> str:
    """The README's backend table, rendered from ``BUILTIN_BACKENDS``."""
    rows = ["| name | what it is | what it needs |", "|---|---|---|"]
    for spec in BUILTIN_BACKENDS:
        what = spec.description + (f"; same as `{spec.alias_of}`" if spec.alias_of else "")
        rows.append(f"| `{spec.name}` | {what} | {spec.install} |")
    return "\n".join(rows)


def test_the_readme_backend_table_is_the_registry() -> None:
    match = re.search(r"<!-- backends:begin[^>]*-->\n(.*?)\n<!-- backends:end -->", README, re.S)
    assert match, "the README lost its backends:begin/end markers"
    expected = backend_table()
    assert match.group(1) == expected, f"paste this into README.md:\n{expected}"


def _where_things_live() -> list[str]:
    section = README.split("## Where things live", 1)[1]
    block = section.split("```", 2)[1]
    return [line.split()[0] for line in block.splitlines() if line.strip()]


def test_where_things_live_lists_existing_folders_one_per_line() -> None:
    listed = _where_things_live()
    assert len(listed) == len(set(listed))
    for folder in listed:
        assert folder.endswith("/"), folder
        assert (ROOT / folder).is_dir(), folder


def test_where_things_live_lists_every_source_and_test_folder() -> None:
    listed = {folder.rstrip("/") for folder in _where_things_live()}
    for top in ("retool_exec", "tests"):
        for path in [ROOT / top, *(ROOT / top).rglob("*")]:
            if not path.is_dir() or path.name == "__pycache__":
                continue
            if top == "tests" and path == ROOT / "tests":
                continue  # its subfolders are listed one by one
            assert path.relative_to(ROOT).as_posix() in listed, path


def test_the_readme_has_the_three_recipes() -> None:
    for recipe in ("**Add a backend.**", "**Add a security case.**", "**Add a server endpoint.**"):
        assert recipe in README


def _run_commands(text: str) -> list[list[str]]:
    """Each ``retool-exec run ...`` shown: in a code block up to its comment, inline up to
    the closing backtick."""
    commands = []
    for raw in text.splitlines():
        index = raw.find("retool-exec run ")
        if index < 0:
            continue
        shown = raw[index:]
        if index > 0 and raw[index - 1] == "`":
            shown = shown.split("`", 1)[0]
        elif "   # " in shown:
            shown = shown.split("   # ", 1)[0]
        commands.append(shlex.split(shown)[1:])
    return commands


def test_every_run_command_shown_is_valid_and_names_a_file_or_dash_c() -> None:
    commands = _run_commands(README) + _run_commands(MAKEFILE.replace("$(BIN)/", ""))
    assert len(commands) >= 4
    parser = build_parser()
    for argv in commands:
        args = parser.parse_args(argv)
        assert args.command == "run"
        assert args.code is not None or (args.file and "(" not in args.file), argv


def test_make_demo_runs_code_with_dash_c() -> None:
    demo = MAKEFILE.split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    assert "retool-exec run --backend docker -c '" in demo
