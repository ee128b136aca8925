"""The CLI's pure helpers: terminal escaping, exit statuses, reading the program to run."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from retool_exec import ConfigError, ExecResult, Outcome
from retool_exec._text import escape_controls
from retool_exec.cli import _terminal
from retool_exec.cli._common import UsageError
from retool_exec.cli._terminal import write_untrusted
from retool_exec.cli.cmd_run import exit_status, read_code


def test_escape_controls_escapes_esc() -> None:
    assert escape_controls("\x1b[31m") == "\\x1b[31m"


def test_escape_controls_keeps_newline_and_tab() -> None:
    assert escape_controls("a\nb\tc") == "a\nb\tc"


def test_escape_controls_escapes_c1_csi() -> None:
    assert escape_controls("\x9b2J") == "\\x9b2J"


@pytest.mark.parametrize(
    ("char", "shown"),
    [("\x00", "\\x00"), ("\r", "\\x0d"), ("\x07", "\\x07"), ("\x7f", "\\x7f"), ("\x0b", "\\x0b")],
)
def test_escape_controls_escapes_other_controls(char: str, shown: str) -> None:
    assert escape_controls(char) == shown


def test_escape_controls_keeps_printable_unicode() -> None:
    text = "héllo 漢字 😀 \xa0"
    assert escape_controls(text) == text


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_write_untrusted_escapes_on_a_terminal() -> None:
    stream = _Tty()
    write_untrusted("\x1b]0;pwned\x07", stream)
    assert stream.getvalue() == "\\x1b]0;pwned\\x07\n"


def test_write_untrusted_is_raw_when_piped() -> None:
    stream = io.StringIO()
    write_untrusted("\x1b[31mred\n", stream)
    assert stream.getvalue() == "\x1b[31mred\n"


@pytest.mark.parametrize(
    ("result", "status"),
    [
        (ExecResult(True, "5\n", "", 0, False, 0.03), 0),
        (ExecResult(False, "", "Traceback ...", 1, False, 0.03), 1),
        (ExecResult(False, "", "", None, True, 30.0), 124),
        (ExecResult(False, "", "", -11, False, 0.1), 139),
        (ExecResult(False, "", "", -9, False, 0.1), 137),
        (ExecResult(False, "", "", -24, False, 0.1), 126),
        (ExecResult(False, "", "", -9, False, 0.1, outcome=Outcome.OOM), 125),
        (ExecResult(False, "", "", None, False, 0.1), 70),
        (ExecResult(False, "", "", None, False, 0.0, outcome=Outcome.REJECTED), 65),
    ],
    ids=["success", "error", "timeout", "sigsegv", "sigkill", "cpu", "oom", "sandbox", "reject"],
)
def test_exit_status(result: ExecResult, status: int) -> None:
    assert exit_status(result) == status


def test_exit_status_for_a_huge_signal_number_stays_in_range() -> None:
    assert exit_status(ExecResult(False, "", "", -500, False, 0.1)) == 255


def test_every_outcome_has_an_exit_status() -> None:
    for outcome in Outcome:
        result = ExecResult(False, "", "", 1, False, 0.1, outcome=outcome)
        assert 0 <= exit_status(result) <= 255


def test_escape_controls_lives_in_the_library_and_the_cli_reuses_it() -> None:
    assert _terminal.escape_controls is escape_controls


def test_read_code_takes_dash_c_as_code_never_as_a_file() -> None:
    assert read_code(None, "README.md") == "README.md"


def test_read_code_reads_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "code.py"
    path.write_text("x = 'é'\n", encoding="utf-8")
    assert read_code(str(path), None) == "x = 'é'\n"


def test_read_code_strips_a_utf8_bom(tmp_path: Path) -> None:
    path = tmp_path / "bom.py"
    path.write_bytes(b"\xef\xbb\xbfprint('hi')\n")
    assert read_code(str(path), None) == "print('hi')\n"


def test_read_code_refuses_a_missing_file_instead_of_running_it_as_code() -> None:
    with pytest.raises(UsageError, match=r"no such file: 'print\(1\)'.*-c CODE"):
        read_code("print(1)", None)


def test_read_code_refuses_text_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.py"
    path.write_bytes(b"print('\xe9')\n")
    with pytest.raises(UsageError, match="not UTF-8"):
        read_code(str(path), None)


def test_read_code_reads_stdin_for_dash() -> None:
    assert read_code("-", None, io.BytesIO(b"\xef\xbb\xbfprint(2)\n")) == "print(2)\n"


def test_read_code_refuses_a_directory(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read"):
        read_code(str(tmp_path), None)


@pytest.mark.parametrize(("file", "code"), [(None, None), ("x.py", "print(1)")])
def test_read_code_needs_exactly_one_program(file: str | None, code: str | None) -> None:
    with pytest.raises(UsageError):
        read_code(file, code)


def test_usage_errors_are_config_errors() -> None:
    assert issubclass(UsageError, ConfigError)


def test_commands_work_without_the_server_extra() -> None:
    """``serve`` imported the server package at its top: without fastapi every command,
    ``run`` too, failed with a traceback. Now only ``serve`` says what to install."""
    run = _cli_without_fastapi(["run", "-c", "print(2 + 3)"])
    assert (run.returncode, run.stdout) == (0, "5\n"), run.stderr
    serve = _cli_without_fastapi(["serve", "--port", "1"])
    assert serve.returncode == 2
    assert "pip install 'retool_exec[server]'" in serve.stderr
    assert "Traceback" not in serve.stderr


def _cli_without_fastapi(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``retool-exec ARGV`` in a fresh interpreter where fastapi cannot be imported."""
    program = (
        "import sys; sys.modules['fastapi'] = None; from retool_exec.cli import main; "
        f"sys.exit(main({argv!r}))"
    )
    return subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False
    )
