"""Stateful sessions: the behaviour every backend with sessions must share, run for real.

One test class, parametrized over local, docker-fresh, docker-reuse and
docker+runsc through the ``sandbox`` fixture (see conftest.py), pins the
semantics of ``Sandbox.session()`` (docs/sessions.md): state persists between
cells; a result holds its own cell's output; an exception (``SystemExit``
too) is that cell's error and the interpreter lives on; a final expression
is displayed, not printed; a cell past its timeout is interrupted and the
session keeps its state, or is killed a second later and lost; the process
ending ends the session; ``fork()`` copies variables and files, and the
copies never meet again; ``close``, ``max_sessions`` and ``session_ttl``.

A second class checks what only the local backend can show from the host:
each session's processes and working directory are gone after ``close()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from retool_exec import (
    DockerConfig,
    ExecResult,
    LocalConfig,
    Outcome,
    Sandbox,
    Session,
    SessionError,
    SessionLimitError,
    SessionLostError,
)
from retool_exec.backends import local as local_module
from retool_exec.backends.local import LocalSubprocessBackend, _is_fork_copy, _kill_group
from tests.conftest import backend_config

INTERRUPT_GRACE = 1.0
"""Seconds a cell past its timeout has after the KeyboardInterrupt before the session is killed."""
SLACK = 3.0
"""Seconds of scheduling slack allowed on a loaded two-core machine."""


def shown(result: ExecResult) -> str | None:
    """The ``text/plain`` of the cell's displayed value (None: nothing displayed)."""
    assert len(result.cells) == 1, result
    display = result.cells[0].display
    return display[0]["text/plain"] if display else None


def value(session: Session, expression: str) -> Any:
    """Evaluate ``expression`` in the session (its repr must be a Python literal)."""
    import ast

    result = session.run_code(expression)
    assert result.outcome is Outcome.SUCCESS, result
    text = shown(result)
    assert text is not None, result
    return ast.literal_eval(text)


def still_running(pids: list[int]) -> str:
    """A cell whose value says, for each of ``pids``, whether it still runs (not a zombie)
    once none does or 5 s have passed (it imports ``os`` and ``time`` itself)."""
    return (
        "import time\n"
        "def running(pid):\n"
        "    try:\n"
        "        with open(f'/proc/{pid}/stat') as handle:\n"
        "            return handle.read().rpartition(')')[2].split()[0] not in 'ZX'\n"
        "    except OSError:\n"
        "        return False\n"
        "deadline = time.monotonic() + 5\n"
        f"while any(map(running, {pids!r})) and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        f"[running(pid) for pid in {pids!r}]"
    )


@contextlib.contextmanager
def own_sandbox(backend_id: str, **options: Any) -> Iterator[Sandbox]:
    """A Sandbox of its own (for settings the shared one must not change), closed after."""
    config = backend_config(backend_id)
    if isinstance(config, DockerConfig):
        config = config.model_copy(update={"pool_size": 1})
    sandbox = Sandbox(config, **options)
    try:
        yield sandbox
    finally:
        sandbox.close()


class TestSessionContract:
    # -- state between cells -------------------------------------------------------------

    def test_globals_modules_and_files_persist_between_cells(self, sandbox: Sandbox) -> None:
        with sandbox.session() as session:
            first = session.run_code(
                "import json\n"
                "x = 41\n"
                "def twice(n):\n"
                "    return 2 * n\n"
                "json.marker = 'kept'\n"
                "with open('notes.txt', 'w') as handle:\n"
                "    handle.write('hello')\n"
            )
            assert first.outcome is Outcome.SUCCESS, first
            second = session.run_code(
                "import sys\n"
                "print(x + 1, twice(4), sys.modules['json'].marker, open('notes.txt').read())"
            )
            assert (second.outcome, second.stdout) == (Outcome.SUCCESS, "42 8 kept hello\n")

    def test_every_cell_gets_the_same_std_streams(self, sandbox: Sandbox) -> None:
        # A process's first run may get streams built ahead of it (by the docker zygote),
        # later cells build their own: every one must look the same to the code. (A single
        # call's stdin is the seed's pipe on local, so only its output streams compare.)
        probe = (
            "import sys\n"
            "print([(s.encoding, s.errors, s.line_buffering, s.seekable(), s.isatty(), s.fileno())"
            " for s in (sys.stdin, sys.stdout, sys.stderr)][{}])"
        )
        single = sandbox.run_code(probe.format("1:"))
        assert single.outcome is Outcome.SUCCESS, single
        with sandbox.session() as session:
            cells = [session.run_code(probe.format(part)) for part in (":", ":", "1:")]
        assert cells[0].stdout == cells[1].stdout, cells
        assert cells[2].stdout == single.stdout, (cells[2], single)

    def test_sessions_do_not_share_state(self, sandbox: Sandbox) -> None:
        with sandbox.session() as one, sandbox.session() as two:
            one.run_code("secret = 1\nopen('mine.txt', 'w').write('one')")
            result = two.run_code(
                "import os\nprint('secret' in globals(), os.path.exists('mine.txt'))"
            )
            assert result.stdout == "False False\n", result

    def test_a_result_holds_only_its_own_cells_output(self, sandbox: Sandbox) -> None:
        with sandbox.session() as session:
            session.run_code(
                "import os, sys\n"
                "print('first out')\n"
                "print('first err', file=sys.stderr)\n"
                "os.write(1, b'raw first\\n')"
            )
            result = session.run_code(
                "import subprocess\n"
                "print('second', flush=True)\n"
                "subprocess.run([sys.executable, '-c', 'print(\"child\")'])\n"
                "os.write(2, b'raw err\\n')"
            )
            assert (result.stdout, result.stderr) == ("second\nchild\n", "raw err\n"), result
            [cell] = result.cells
            assert (cell.stdout, cell.stderr, cell.finished) == (result.stdout, result.stderr, True)
            quiet = session.run_code("y = 1")
            assert (quiet.ok, quiet.stdout, quiet.stderr) == (True, "", ""), quiet

    def test_a_cells_output_is_capped_to_its_tail(self, sandbox: Sandbox) -> None:
        limit = backend_config("local").max_output_chars
        with sandbox.session() as session:
            result = session.run_code(f"print('x' * {3 * limit} + 'END')")
            assert result.ok, result
            assert result.truncated and result.stdout_dropped_chars > 0
            assert result.stdout.endswith("END\n")
            assert len(result.stdout) < 2 * limit

    # -- errors --------------------------------------------------------------------------

    def test_an_exception_is_the_cells_error_and_the_session_lives_on(
        self, sandbox: Sandbox
    ) -> None:
        with sandbox.session() as session:
            session.run_code("kept = 'still here'")
            session.run_code("pass")
            result = session.run_code("print('before')\nraise ValueError('boom')")
            assert (result.ok, result.outcome, result.returncode) == (False, Outcome.ERROR, 1)
            assert not result.timed_out
            assert result.stdout == "before\n"
            assert 'File "<cell 3>", line 2' in result.stderr, result.stderr
            assert result.stderr.rstrip().endswith("ValueError: boom"), result.stderr
            [error] = result.cells[0].error
            assert (error["ename"], error["evalue"]) == ("ValueError", "boom")
            assert result.detail == ""
            assert value(session, "kept") == "still here"

    @pytest.mark.parametrize(
        "hostile",
        [
            "class M(type):\n    @property\n    def __name__(cls):\n        raise RuntimeError\n"
            "class E(Exception, metaclass=M): pass\n",
            "class E(Exception):\n    @property\n    def __traceback__(self):\n"
            "        raise SystemExit(0)\n",
            "class S(str):\n    def startswith(self, *a):\n        raise SystemExit(0)\n"
            "class E(Exception): pass\n"
            "exec(compile('raise E(\"boom\")', S('<mine>'), 'exec'))\n",
        ],
        ids=["metaclass-name", "traceback-property", "file-name-subclass"],
    )
    def test_an_exception_whose_class_answers_for_itself_is_the_cells_error(
        self, sandbox: Sandbox, hostile: str
    ) -> None:
        """An exception class with a ``__name__`` (metaclass) or ``__traceback__`` property
        that raises, or raised from code whose file name is a ``str`` subclass: the agent
        asked them as it recorded the cell's error, and the session's interpreter exited
        (status 70, the session lost; thirty-third red-team round). python3 prints the
        traceback from the exception's own slots: ``E: boom``, status 1."""
        with sandbox.session() as session:
            session.run_code("kept = 'still here'")
            result = session.run_code(hostile + "raise E('boom')")
            assert (result.outcome, result.returncode, result.detail) == (Outcome.ERROR, 1, "")
            assert result.stderr.endswith("E: boom\n"), result
            [error] = result.cells[0].error
            assert (error["ename"], error["evalue"]) == ("E", "boom"), error
            assert value(session, "kept") == "still here"

    def test_a_trace_function_sees_the_cells_and_one_that_raises_is_a_cells_error(
        self, sandbox: Sandbox, backend_id: str
    ) -> None:
        """A trace function a cell leaves on: the Docker agent's own frames between cells
        were traced (their names in the next cell's output), and one that raised there ended
        the interpreter with status 70: the session lost (twenty-ninth red-team round).
        The local backend's cell runner is Python its tracer sees, and a tracer that raises
        there ends its session (not a boundary: named here, not hidden)."""
        with sandbox.session() as session:
            tracer = "def t(f, e, a):\n    if e == 'call': print('T', f.f_code.co_name)\n"
            assert session.run_code("import sys\n" + tracer + "sys.settrace(t)").ok
            traced = session.run_code("def f():\n    return 1\nf()")
            assert traced.outcome is Outcome.SUCCESS, traced
            if backend_id == "local":
                return
            assert traced.stdout == "T <module>\nT <module>\nT f\n", traced
            raising = "def t(f, e, a):\n    raise RuntimeError('boom')\nsys.settrace(t)\n"
            assert session.run_code(raising).ok
            failed = session.run_code("print('x')")  # its tracer raises as the cell starts
            assert failed.outcome is Outcome.ERROR, failed
            assert failed.stderr.endswith("RuntimeError: boom\n"), failed
            assert session.run_code("print('alive')").stdout == "alive\n"

    def test_a_traceback_over_a_mebibyte_is_the_cells_error_and_the_session_lives_on(
        self, sandbox: Sandbox
    ) -> None:
        """A cell's end too large for its events pipe killed the interpreter: the state
        was lost, the cell reported killed by a signal (twenty-eighth red-team round)."""
        with sandbox.session() as session:
            session.run_code("kept = 'still here'")
            for code, name in (
                ("data = list(range(300_000))\nassert data == [], f'{data}'", "AssertionError"),
                ("y = '" + "a" * 1_200_000 + "' 2", "SyntaxError"),
            ):
                result = session.run_code(code)
                assert (result.outcome, result.returncode) == (Outcome.ERROR, 1), result.detail
                assert [error["ename"] for error in result.cells[0].error] == [name]
            assert value(session, "kept") == "still here"
            # A repr that is a str subclass saying it is empty was not cut (review).
            session.run_code(
                "class S(str):\n"
                "    def __len__(self): return 0\n"
                "    def __getitem__(self, k): return self\n"
                "class X:\n"
                "    def __repr__(self): return S('\\U0001F600' * 300_000)"
            )
            shown = session.run_code("X()")
            assert shown.ok, shown.detail
            assert len(shown.cells[0].display[0]["text/plain"]) < 1 << 17
            assert value(session, "kept") == "still here"

    def test_a_syntax_error_is_the_cells_error(self, sandbox: Sandbox) -> None:
        with sandbox.session() as session:
            result = session.run_code("x = (")
            assert (result.outcome, result.returncode) == (Outcome.ERROR, 1), result
            assert "SyntaxError" in result.stderr
            assert result.cells[0].error[0]["ename"] == "SyntaxError"
            assert value(session, "1 + 1") == 2

    def test_system_exit_is_a_cell_error_as_in_ipython(self, sandbox: Sandbox) -> None:
        with sandbox.session() as session:
            session.run_code("kept = 5")
            result = session.run_code("import sys\nsys.exit(3)")
            assert (result.ok, result.outcome, result.returncode) == (False, Outcome.ERROR, 1)
            assert 'File "<cell 2>"' in result.stderr, result.stderr
            assert "SystemExit: 3" in result.stderr
            assert result.cells[0].error[0]["ename"] == "SystemExit"
            assert result.detail == ""
            assert value(session, "kept") == 5

    # -- display -------------------------------------------------------------------------

    def test_cells_run_with_no_compiler_flags_of_the_runner(self, sandbox: Sandbox) -> None:
        """A cell is compiled as plain Python: the agent's own ``from __future__`` imports
        do not reach it (they once made every annotation a string)."""
        with sandbox.session() as session:
            session.run_code("def f(x: int) -> str: pass")
            assert shown(session.run_code("f.__annotations__")) == (
                "{'x': <class 'int'>, 'return': <class 'str'>}"
            )

    def test_a_file_named_ast_in_the_working_directory_does_not_compile_the_cells(
        self, sandbox: Sandbox
    ) -> None:
        """Cells are parsed with the standard library's ast even when a cell left an ast.py
        where the interpreter looks first (the working directory) and ast unloaded."""
        with sandbox.session() as session:
            session.run_code(
                "import sys\n"
                "with open('ast.py', 'w') as f:\n"
                "    f.write('raise SystemExit(\"the cell\\'s ast.py\")')\n"
                "sys.modules.pop('ast', None)"
            )
            result = session.run_code("6 * 7")
            assert (result.ok, shown(result)) == (True, "42"), result

    def test_a_long_value_keeps_its_end_with_the_count_cut(self, sandbox: Sandbox) -> None:
        """As a call's output: the seed's marker, the exact count, the tail (the Docker
        agent sent the first 65,536 characters, unmarked: the thirty-sixth round)."""
        cap = sandbox.backend.config.max_output_chars
        text = repr(list(range(100000)))
        with sandbox.session() as session:
            result = session.run_code("list(range(100000))")
            assert result.cells[0].display == [
                {"text/plain": f"[... truncated {len(text) - cap} chars ...]\n{text[-cap:]}"}
            ]
            # ... and so the observation (a value's head kept lost its end: red team C)
            assert session.value_text(result) == result.cells[0].display[0]["text/plain"]
            assert session.format_tool_content(result).rstrip().endswith("99999]")
            (error,) = session.run_code("raise ValueError('A' * 9000 + 'END')").cells[0].error
            assert error["evalue"] == f"[... truncated {9003 - cap} chars ...]\n" + (
                "A" * (cap - 3) + "END"
            )

    def test_a_final_expression_is_displayed_not_printed(self, sandbox: Sandbox) -> None:
        with sandbox.session() as session:
            result = session.run_code("x = 6\nx * 7")
            assert (result.ok, result.stdout) == (True, ""), result
            assert result.cells[0].display == [{"text/plain": "42"}]
            assert shown(session.run_code("'text'")) == "'text'"
            assert shown(session.run_code("None")) is None
            assert shown(session.run_code("print('only printed')")) is None
            assert shown(session.run_code("y = 1")) is None

    # -- time limits ---------------------------------------------------------------------

    def test_a_cell_past_its_timeout_is_interrupted_and_the_state_survives(
        self, sandbox: Sandbox
    ) -> None:
        with sandbox.session() as session:
            session.run_code("import time\ncounter = 7")
            started = time.monotonic()
            result = session.run_code(
                "counter += 1\nprint('start', flush=True)\ntime.sleep(30)", timeout=0.5
            )
            assert time.monotonic() - started < 0.5 + SLACK
            assert (result.timed_out, result.outcome, result.ok) == (True, Outcome.TIMEOUT, False)
            assert result.returncode is None
            assert result.stdout == "start\n"
            assert "KeyboardInterrupt" in result.stderr
            assert result.cells[0].timed_out and result.cells[0].finished
            assert result.detail == ""
            assert session.lost is None
            assert value(session, "counter") == 8
            again = session.run_code("time.sleep(0.7)\n'done'", timeout=5)
            assert (again.outcome, shown(again)) == (Outcome.SUCCESS, "'done'"), again

    def test_a_cell_that_ignores_the_interrupt_is_killed_and_the_session_lost(
        self, sandbox: Sandbox
    ) -> None:
        with sandbox.session() as session:
            session.run_code("x = 1")
            started = time.monotonic()
            result = session.run_code(
                "import signal, time\n"
                "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                "print('stubborn', flush=True)\n"
                "time.sleep(30)",
                timeout=0.5,
            )
            elapsed = time.monotonic() - started
            assert 0.5 + INTERRUPT_GRACE * 0.9 <= elapsed < 0.5 + INTERRUPT_GRACE + SLACK
            assert (result.timed_out, result.outcome, result.ok) == (True, Outcome.TIMEOUT, False)
            assert result.detail.startswith("session lost:"), result.detail
            assert session.lost is not None
            with pytest.raises(SessionLostError):
                session.run_code("x")
            with pytest.raises(SessionLostError):
                session.fork()

    # -- the process ending --------------------------------------------------------------

    def test_os_exit_ends_the_session(self, sandbox: Sandbox) -> None:
        with sandbox.session() as session:
            result = session.run_code("import os\nprint('bye', flush=True)\nos._exit(7)")
            assert (result.returncode, result.outcome, result.ok) == (7, Outcome.ERROR, False)
            assert not result.timed_out
            assert result.stdout == "bye\n"
            assert result.detail.startswith("session lost:"), result.detail
            assert session.lost is not None
            with pytest.raises(SessionLostError):
                session.run_code("print(1)")

    def test_a_signal_ends_the_session(self, sandbox: Sandbox) -> None:
        with sandbox.session() as session:
            result = session.run_code("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
            assert (result.returncode, result.outcome) == (-9, Outcome.SIGNAL), result
            assert result.detail.startswith("session lost:"), result.detail
            with pytest.raises(SessionLostError):
                session.run_code("print(1)")

    # -- forks ---------------------------------------------------------------------------

    def test_a_fork_copies_the_variables_and_the_copies_diverge(self, sandbox: Sandbox) -> None:
        with sandbox.session() as session:
            session.run_code("import json\nx = 1\nitems = [1]\njson.marker = 'before'")
            with session.fork() as branch:
                session.run_code("x = 2\nitems.append(2)\njson.marker = 'parent'\ny = 'parent'")
                assert value(branch, "x, items, json.marker, 'y' in globals()") == (
                    1,
                    [1],
                    "before",
                    False,
                )
                branch.run_code("x = 3\nitems.append(3)\njson.marker = 'branch'")
                assert value(session, "x, items, json.marker") == (2, [1, 2], "parent")
                assert value(branch, "x, items, json.marker") == (3, [1, 3], "branch")

    def test_a_fork_copies_the_files_and_the_copies_diverge(self, sandbox: Sandbox) -> None:
        with sandbox.session() as session:
            session.run_code(
                "import os\n"
                "os.makedirs('sub/deeper', exist_ok=True)\n"
                "for name, text in [('data.txt', 'base'), ('sub/deeper/n.txt', 'nested'),\n"
                "                   ('doomed.txt', 'x')]:\n"
                "    with open(name, 'w') as handle:\n"
                "        handle.write(text)\n"
                "def read(name):\n"
                "    if not os.path.exists(name):\n"
                "        return None\n"
                "    with open(name) as handle:\n"
                "        return handle.read()\n"
            )
            with session.fork() as branch:
                session.run_code(
                    "with open('data.txt', 'w') as handle:\n"
                    "    handle.write('parent')\n"
                    "with open('parent_only.txt', 'w') as handle:\n"
                    "    handle.write('p')\n"
                    "os.remove('doomed.txt')\n"
                )
                assert value(
                    branch,
                    "read('data.txt'), read('sub/deeper/n.txt'), read('doomed.txt'), "
                    "read('parent_only.txt')",
                ) == ("base", "nested", "x", None)
                branch.run_code(
                    "with open('sub/deeper/n.txt', 'w') as handle:\n"
                    "    handle.write('branch')\n"
                    "with open('branch_only.txt', 'w') as handle:\n"
                    "    handle.write('b')\n"
                )
                assert value(
                    session,
                    "read('data.txt'), read('sub/deeper/n.txt'), read('doomed.txt'), "
                    "read('branch_only.txt')",
                ) == ("parent", "nested", None, None)
                assert value(branch, "read('branch_only.txt'), read('data.txt')") == ("b", "base")

    def test_a_fork_copies_the_whole_directory_and_stays_where_the_cell_left_it(
        self, sandbox: Sandbox
    ) -> None:
        """Docker forks once copied only the current directory: a cell's chdir('/') made
        the fork copy the whole image into the family's memory."""
        with sandbox.session() as session:
            session.run_code(
                "import os\nos.makedirs('sub')\nopen('top.txt', 'w').close()\nos.chdir('sub')"
            )
            with session.fork() as branch:
                assert value(
                    branch, "os.path.basename(os.getcwd()), os.path.exists('../top.txt')"
                ) == ("sub", True)
            session.run_code("os.chdir('/')")
            with session.fork() as branch:
                assert value(branch, "sorted(os.listdir())") == ["sub", "top.txt"]

    def test_a_tree_too_deep_to_copy_fails_the_fork_not_the_session(self, sandbox: Sandbox) -> None:
        """os.walk and shutil recurse: 3000 nested directories raised RecursionError out of
        the local backend's fork and close, and left the directory on the host (thirteenth
        red-team round). Copies stop at trees.MAX_DEPTH levels; removal has no limit."""
        with sandbox.session() as session:
            session.run_code(
                "import os\n"
                "os.mkdir('d')\n"
                "fd = os.open('d', os.O_RDONLY)\n"
                "for _ in range(3000):\n"
                "    os.mkdir('d', dir_fd=fd)\n"
                "    fd, old = os.open('d', os.O_RDONLY, dir_fd=fd), fd\n"
                "    os.close(old)\n"
                "os.close(fd)\n"
                "kept = 41"
            )
            started = time.monotonic()
            with pytest.raises(SessionError, match="64 levels") as raised:
                session.fork()
            assert not isinstance(raised.value, SessionLostError)
            assert time.monotonic() - started < SLACK
            assert value(session, "kept + 1") == 42  # the parent lives on

    def test_a_fork_continues_the_cell_numbering(self, sandbox: Sandbox) -> None:
        with sandbox.session() as session:
            session.run_code("a = 1")
            session.run_code("b = 2")
            with session.fork() as branch:
                result = branch.run_code("raise KeyError('k')")
                assert 'File "<cell 3>"' in result.stderr, result.stderr
                result = session.run_code("raise KeyError('k')")
                assert 'File "<cell 3>"' in result.stderr, result.stderr

    def test_forks_of_forks_outlive_their_ancestors(self, sandbox: Sandbox) -> None:
        opened: list[Session] = []
        try:
            session = sandbox.open_session()
            opened.append(session)
            session.run_code("depth = 0")
            child = session.fork()
            opened.append(child)
            child.run_code("depth = 1")
            grandchild = child.fork()
            opened.append(grandchild)
            grandchild.run_code("depth = 2")
            session.close()
            ended = child.run_code("import os\nos._exit(0)")
            assert ended.detail.startswith("session lost:"), ended
            assert value(grandchild, "depth") == 2
            with pytest.raises(SessionLostError):
                child.fork()
        finally:
            for each in opened:
                each.close()

    def test_a_fork_survives_its_parent_being_killed(self, sandbox: Sandbox) -> None:
        with sandbox.session() as session:
            session.run_code("x = 'copied'")
            with session.fork() as branch:
                result = session.run_code("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
                assert result.detail.startswith("session lost:")
                assert value(branch, "x") == "copied"

    def test_forks_draw_their_own_numbers_from_the_libraries_generators(
        self, sandbox: Sandbox
    ) -> None:
        """Two Docker forks and their parent drew the same numbers from numpy's global
        generator and sympy's (thirty-seventh round): one branch could predict its
        sibling's draws. A library's generator is reseeded in each copy, as CPython
        reseeds ``random``'s; one the session's code holds in ``__main__`` is its own
        and replays alike in every branch (docs/sessions.md)."""
        with sandbox.session() as session:
            setup = session.run_code(
                "import random, numpy as np\n"
                "own = np.random.default_rng(7)\n"
                "def draws():\n"
                "    return (tuple(np.random.randint(0, 2**31, 4).tolist()),\n"
                "            tuple(own.integers(0, 2**31, 4).tolist()), random.random())"
            )
            assert setup.ok, setup
            with session.fork() as first, session.fork() as second:
                seen = [value(each, "draws()") for each in (session, first, second)]
        libraries = {numbers for numbers, _own, _random in seen}
        assert len(libraries) == 3, seen
        assert len({python for _numbers, _own, python in seen}) == 3, seen
        assert len({own for _numbers, own, _random in seen}) == 1, seen

    def test_closing_forks_frees_their_files(self, sandbox: Sandbox) -> None:
        """A closed Docker fork kept its copy of the files in the family's ``/tmp`` (a
        64 MiB tmpfs): with a 10 MiB file, the sixth fork-and-close failed with ENOSPC and
        the parent could write no more (thirty-seventh round)."""
        with sandbox.session() as session:
            assert session.run_code(
                "import os\nwith open('data.bin', 'wb') as handle:\n"
                "    handle.write(os.urandom(10 << 20))"
            ).ok
            for _ in range(8):
                session.fork().close()
            result = session.run_code(
                "with open('more.bin', 'wb') as handle:\n    handle.write(bytes(1 << 20))"
            )
            assert result.ok, result
            with session.fork() as branch:
                assert value(branch, "os.path.getsize('data.bin')") == 10 << 20

    def test_closing_a_fork_ends_the_processes_it_started(self, sandbox: Sandbox) -> None:
        """A process a Docker fork's cell started (and its own child) ran on after the
        fork was closed (thirty-seventh round), where docs/sessions.md says such processes
        run until their session closes. The parent lives on."""
        with sandbox.session() as session:
            session.run_code("import os, subprocess, sys, time")
            branch = session.fork()
            nested = (
                "import subprocess, sys, time\n"
                "grandchild = subprocess.Popen([sys.executable, '-c', 'import time; "
                "time.sleep(600)'])\n"
                "print(grandchild.pid, flush=True)\n"
                "time.sleep(600)"
            )
            started = branch.run_code(
                f"child = subprocess.Popen([sys.executable, '-c', {nested!r}], "
                "stdout=subprocess.PIPE)\n"
                "print(child.pid, int(child.stdout.readline()))"
            )
            assert started.ok, started
            pids = [int(pid) for pid in started.stdout.split()]
            branch.close()
            assert shown(session.run_code(still_running(pids))) == "[False, False]"

    def test_a_fork_lost_in_a_cell_ends_the_processes_it_started(self, sandbox: Sandbox) -> None:
        """A cell that ignored its interrupt was killed alone, its children orphaned to the
        supervisor and lost to its tree: they ran on in the family (the review of the
        thirty-seventh round). The parent lives on."""
        with sandbox.session() as session:
            session.run_code("import os, subprocess, sys, time")
            branch = session.fork()
            started = branch.run_code(
                "child = subprocess.Popen([sys.executable, '-c', 'import time; "
                "time.sleep(600)'])\nprint(child.pid)"
            )
            assert started.ok, started
            pid = int(started.stdout)
            lost = branch.run_code(
                "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n"
                "    pass",
                timeout=1,
            )
            assert lost.detail.startswith("session lost:"), lost
            branch.close()
            assert shown(session.run_code(still_running([pid]))) == "[False]"

    # -- closing -------------------------------------------------------------------------

    def test_close_ends_the_session_and_later_use_raises(self, sandbox: Sandbox) -> None:
        session = sandbox.open_session()
        opened = sandbox.open_sessions
        session.run_code("x = 1")
        session.close()
        session.close()  # idempotent
        assert session.closed
        assert session.lost is not None
        assert sandbox.open_sessions == opened - 1
        with pytest.raises(SessionLostError):
            session.run_code("x")
        with pytest.raises(SessionLostError):
            session.fork()

    def test_the_context_manager_closes_the_session(self, sandbox: Sandbox) -> None:
        with sandbox.session() as session:
            assert value(session, "21 * 2") == 42
        assert session.closed
        with pytest.raises(SessionLostError):
            session.run_code("1")

    def test_closing_the_sandbox_closes_its_sessions(self, backend_id: str) -> None:
        with own_sandbox(backend_id) as sandbox:
            session = sandbox.open_session()
            session.run_code("x = 1")
            branch = session.fork()
            assert sandbox.open_sessions == 2
        assert session.closed and branch.closed
        assert session.lost is not None and branch.lost is not None

    # -- the Sandbox's limits ------------------------------------------------------------

    def test_max_sessions_counts_forks_and_frees_on_close(self, backend_id: str) -> None:
        with own_sandbox(backend_id, max_sessions=2) as sandbox:
            first = sandbox.open_session()
            second = first.fork()
            with pytest.raises(SessionLimitError):
                sandbox.open_session()
            with pytest.raises(SessionLimitError):
                first.fork()
            assert sandbox.open_sessions == 2
            second.close()
            third = sandbox.open_session()
            assert value(third, "'third'") == "third"
            assert value(first, "1") == 1

    def test_an_idle_session_is_closed_after_its_ttl(self, backend_id: str) -> None:
        with own_sandbox(backend_id, session_ttl=1.0) as sandbox:
            idle = sandbox.open_session()
            idle.run_code("x = 1")
            busy = idle.fork()  # a fork: no second container to wait for on Docker
            # A cell longer than the TTL is not idleness: its session stays open.
            result = busy.run_code("import time\ntime.sleep(1.6)\n'awake'", timeout=5)
            assert shown(result) == "'awake'", result
            assert value(busy, "'still'") == "still"
            deadline = time.monotonic() + 1.0 + SLACK
            while not idle.closed and time.monotonic() < deadline:
                time.sleep(0.05)
            assert idle.closed
            with pytest.raises(SessionLostError):
                idle.run_code("x")

    # -- async ---------------------------------------------------------------------------

    def test_the_async_api(self, sandbox: Sandbox) -> None:
        async def scenario() -> None:
            async with sandbox.session() as session:
                first = await session.arun_code("x = 5\nx * 2")
                assert shown(first) == "10"
                branch = await session.afork()
                await session.arun_code("x = 0")
                assert shown(await branch.arun_code("x")) == "5"
                results = await asyncio.gather(
                    session.arun_code("x + 1"), branch.arun_code("x + 1")
                )
                assert [shown(result) for result in results] == ["1", "6"]
                await branch.aclose()
                assert branch.closed
                with pytest.raises(SessionLostError):
                    await branch.arun_code("x")
            assert session.closed
            other = await sandbox.aopen_session()
            try:
                assert shown(await other.arun_code("'other'")) == "'other'"
            finally:
                await other.aclose()

        asyncio.run(scenario())


# -- what the local backend leaves behind -------------------------------------------------


def _gone(pid: int) -> bool:
    """The process no longer runs (no entry, or a zombie waiting for its reaper)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def _eventually_gone(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while not _gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture()
def local_sandbox() -> Iterator[Sandbox]:
    sandbox = Sandbox(backend_config("local"))
    try:
        yield sandbox
    finally:
        sandbox.close()


_WHERE = (
    "import os, subprocess, sys\n"
    "helper = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "os.getpid(), os.getppid(), os.getcwd(), helper.pid"
)


class TestLocalSessions:
    """Local only: what the host can see (the local backend is NOT isolated; these check that
    it cleans up after itself), and a facade finding pinned on the cheapest backend."""

    def test_close_leaves_no_process_and_no_directory(self, local_sandbox: Sandbox) -> None:
        session = local_sandbox.open_session()
        pid, _parent, workdir, helper = value(session, _WHERE)
        assert os.path.isdir(workdir) and not _gone(pid) and not _gone(helper)
        assert os.path.realpath(workdir) != os.path.realpath(os.getcwd())
        session.close()
        assert _gone(pid)
        assert _eventually_gone(helper)
        assert not os.path.exists(workdir)

    def test_a_fork_is_a_process_of_its_own_in_a_directory_of_its_own(
        self, local_sandbox: Sandbox
    ) -> None:
        session = local_sandbox.open_session()
        session.run_code("import os\nos.makedirs('sub')\nos.chdir('sub')")
        pid, _parent, workdir, helper = value(session, _WHERE)
        branch = session.fork()
        fork_pid, waiter, fork_dir, fork_helper = value(branch, _WHERE)
        assert fork_pid not in (pid, os.getpid())
        assert waiter != pid  # a double fork: the copy is not its parent session's child
        assert fork_dir != workdir and os.path.basename(fork_dir) == "sub"
        branch.close()
        assert _gone(fork_pid)
        assert _eventually_gone(waiter) and _eventually_gone(fork_helper)
        assert not os.path.exists(os.path.dirname(fork_dir))
        assert not _gone(pid) and os.path.isdir(workdir)
        session.close()
        assert _gone(pid) and _eventually_gone(helper)
        assert not os.path.exists(os.path.dirname(workdir))

    def test_closing_the_sandbox_leaves_nothing(self) -> None:
        sandbox = Sandbox(backend_config("local"))
        session = sandbox.open_session()
        branch = session.fork()
        lost = session.fork()
        places = [value(each, _WHERE) for each in (session, branch, lost)]
        lost.run_code("import os\nos._exit(1)")
        sandbox.close()
        for pid, _parent, workdir, helper in places:
            assert _gone(pid)
            assert _eventually_gone(helper)
            assert not os.path.exists(workdir)

    def test_closing_the_backend_closes_its_sessions(self) -> None:
        async def scenario() -> tuple[list[int], list[str]]:
            async with LocalSubprocessBackend(LocalConfig(timeout=10)) as backend:
                session = await backend.open_session()
                branch = await session.fork()
                pids, dirs = [], []
                for each in (session, branch):
                    result = await each.run("import os\nos.getpid(), os.getcwd()", 10)
                    pid, workdir = eval(result.cells[0].display[0]["text/plain"])
                    pids.append(pid)
                    dirs.append(workdir)
            return pids, dirs

        pids, dirs = asyncio.run(scenario())
        assert all(_gone(pid) for pid in pids)
        assert not any(os.path.exists(workdir) for workdir in dirs)

    def test_a_cell_cancelled_by_its_caller_ends_the_session(self) -> None:
        """Its answer would come later, out of step with the next cell's: it is killed."""

        async def scenario() -> int:
            async with LocalSubprocessBackend(LocalConfig(timeout=10)) as backend:
                session = await backend.open_session()
                result = await session.run("import os\nos.getpid()", 10)
                pid = int(result.cells[0].display[0]["text/plain"])
                cell = asyncio.ensure_future(session.run("import time\ntime.sleep(30)", 60))
                await asyncio.sleep(0.3)
                cell.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await cell
                assert session.lost is not None
                with pytest.raises(SessionLostError):
                    await session.run("1", 10)
                return pid

        assert _eventually_gone(asyncio.run(scenario()))

    def test_a_fork_copies_links_without_following_them(self, local_sandbox: Sandbox) -> None:
        outside = os.path.realpath(os.getcwd())
        with local_sandbox.session() as session:
            session.run_code(f"import os\nos.symlink({outside!r}, 'link')\nos.mkfifo('fifo')")
            with session.fork() as branch:
                result = value(
                    branch,
                    "import stat\n"
                    "os.path.islink('link'), os.readlink('link'), "
                    "stat.S_ISFIFO(os.lstat('fifo').st_mode)",
                )
                assert result == (True, outside, True)

    def test_a_fork_is_known_by_its_own_pid_whatever_a_cell_did_to_os_getpid(
        self, local_sandbox: Sandbox
    ) -> None:
        """A cell's os.getpid = ... once made the fork report a pid of 2**70 (closing it
        raised OverflowError and left the copy and its socket behind) or its parent's pid
        (closing the fork killed the parent session)."""
        for lie in ("2 ** 70", "parent"):
            with local_sandbox.session() as session:
                parent = value(session, "import os\nreal = os.getpid\nparent = real()\nparent")
                session.run_code(f"os.getpid = lambda: {lie}")
                branch = session.fork()
                copy = value(branch, "real()")
                assert value(branch, "os.getpid()") != copy  # the lie is still in place
                branch.close()
                assert _gone(copy)
                assert value(session, "real()") == parent  # the parent lives on
            gc.collect()  # a socket left open fails the test here (ResourceWarning)

    @pytest.mark.parametrize(
        "forged",
        ["2 ** 70", "-1", "1", "True", "'12'", "parent", "sibling", "stranger", "host", "None"],
    )
    def test_a_fork_whose_hello_is_forged_fails_and_leaves_nothing(
        self, local_sandbox: Sandbox, forged: str
    ) -> None:
        """The copy's hello is made by code the cell can reach (here json.dumps): a pid
        that is not a live session leader of its own is refused, not killed later."""
        stranger = subprocess.Popen(  # another session leader of this user
            [sys.executable, "-c", "input()"], stdin=subprocess.PIPE, start_new_session=True
        )
        with (
            stranger,
            local_sandbox.session() as session,
            local_sandbox.session() as sibling,
        ):
            parent = value(session, "import os\nos.getpid()")
            known = {"parent": parent, "sibling": value(sibling, "import os\nos.getpid()")}
            lie = {**known, "host": os.getpid(), "stranger": stranger.pid}.get(forged, forged)
            session.run_code(
                "import json\n_dumps = json.dumps\n"
                f"json.dumps = lambda m, *a, **k: _dumps({{'pid': {lie}}} if 'pid' in m else m)"
            )
            with pytest.raises(SessionError, match="the copy did not start"):
                session.fork()
            assert value(session, "os.getpid()") == parent  # the parent lives on
            assert value(sibling, "os.getpid()") == known["sibling"]
            assert stranger.poll() is None
            stranger.kill()
        gc.collect()

    def test_an_oversized_answer_ends_the_session_at_once(self, local_sandbox: Sandbox) -> None:
        """A cell that reaches the driver's json.dumps once sent 3 million empty error
        records (9 MB): the host took 20 s and 2.4 GB to build them, past a 1 s timeout."""
        session = local_sandbox.open_session()
        session.run_code("import json\n_real = json.dumps")
        result = session.run_code(
            "def _forged(message, *args, **kwargs):\n"
            "    if 'display' in message:\n"
            "        return '{\"display\": [], \"error\": [' + '{},' * 3_000_000 + '{}]}'\n"
            "    return _real(message, *args, **kwargs)\n"
            "json.dumps = _forged",
            timeout=1,
        )
        assert "broke the cell protocol" in result.detail, result
        assert result.latency < 1 + SLACK
        assert session.lost is not None

    def test_a_forged_answer_gives_one_record_of_each_kind(self, local_sandbox: Sandbox) -> None:
        session = local_sandbox.open_session()
        session.run_code("import json\n_real = json.dumps")
        result = session.run_code(
            "json.dumps = lambda m, *a, **k: _real({'display': [{'text/plain': 'v'}] * 500, "
            "'error': [{'ename': 'E', 'evalue': '', 'traceback': []}] * 500} "
            "if 'display' in m else m)"
        )
        assert [len(result.cells[0].display), len(result.cells[0].error)] == [1, 1]

    def test_huge_exceptions_stay_the_cells_own_error(self, local_sandbox: Sandbox) -> None:
        """Cut to the output cap in the driver: an answer within its bound, the session lives."""
        cap = LocalConfig().max_output_chars
        with local_sandbox.session() as session:
            for code, ename in [
                ("raise ValueError('x' * 10**6)", "ValueError"),
                ("raise type('E' * 10**5, (Exception,), {})('\\U0001f600' * 10**5)", "E" * 200),
                ("def f(n): return f(n + 1)\nf(0)", "RecursionError"),
            ]:
                result = session.run_code(code)
                [error] = result.cells[0].error
                assert error["ename"] == ename and result.outcome is Outcome.ERROR, result
                trace = error["traceback"]
                assert sum(map(len, trace)) <= 2 * cap + 200
                assert trace[0] == "Traceback (most recent call last):\n"
                assert trace[-1].rstrip().endswith(("x", "\U0001f600", "exceeded"))
            assert value(session, "6 * 7") == 42

    def test_a_fork_of_a_huge_sparse_file_is_refused_at_once(self, local_sandbox: Sandbox) -> None:
        """A 2 GiB hole costs the parent no disk; the fork once wrote it all out, 7.8 s."""
        with local_sandbox.session() as session:
            session.run_code("import os\nwith open('hole', 'wb') as f:\n    f.truncate(2 << 30)")
            started = time.monotonic()
            with pytest.raises(SessionError, match="more than 1024 MiB"):
                session.fork()
            assert time.monotonic() - started < SLACK
            assert value(session, "os.path.getsize('hole')") == 2 << 30  # the parent lives

    def test_a_fork_of_too_many_names_is_refused(
        self, local_sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(local_module, "FORK_COPY_ENTRIES", 50)
        with local_sandbox.session() as session:
            session.run_code("import os\nfor i in range(60): open(f'f{i}', 'w').close()")
            with pytest.raises(SessionError, match="50 names"):
                session.fork()
            session.run_code("import os\nfor i in range(20): os.remove(f'f{i}')")
            with session.fork() as branch:
                assert value(branch, "len(os.listdir())") == 40

    def test_auto_print_does_not_change_what_a_cell_displays(self) -> None:
        sandbox = Sandbox(backend_config("local"), auto_print=True)
        with sandbox, sandbox.session() as session:
            result = session.run_code("x = 1\nx + 1")
            assert (result.stdout, shown(result)) == ("", "2")
            assert shown(session.run_code("None")) is None

    def test_a_python_that_cannot_start_is_a_session_error(self) -> None:
        config = LocalConfig(python="/nonexistent/python3")
        with Sandbox(config) as sandbox, pytest.raises(SessionLostError, match="could not start"):
            sandbox.open_session()


def test_a_fork_copy_is_a_live_session_leader_holding_its_channel() -> None:
    ours, theirs = socket.socketpair()
    inode = os.fstat(theirs.fileno()).st_ino

    def start(*, leader: bool, holds: bool) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-c", "input()"],
            stdin=subprocess.PIPE,
            start_new_session=leader,
            pass_fds=(theirs.fileno(),) if holds else (),
        )

    with ours, theirs:
        for leader, holds, copy_like in [
            (True, True, True),
            (False, True, False),
            (True, False, False),
        ]:
            with start(leader=leader, holds=holds) as process:
                try:
                    assert _is_fork_copy(process.pid, set(), inode) is copy_like
                    assert not _is_fork_copy(process.pid, {process.pid}, inode)  # known
                finally:
                    process.kill()
            assert not _is_fork_copy(process.pid, set(), inode)  # gone
        for number in (os.getpid(), 1, 0, -5, 2**70, True, "7", None, 7.0):
            assert not _is_fork_copy(number, set(), inode)


def test_killing_a_group_by_a_number_that_is_no_pid_does_nothing() -> None:
    for number in (2**70, -(2**70), (1 << 22) + 1):
        _kill_group(number)  # 2**70 raised OverflowError, in the middle of a session's close


def test_the_observation_of_a_cell_shows_its_final_value() -> None:
    """A model sees ``x * 7`` without a print, as a notebook shows Out[n]."""
    with Sandbox(backend_config("local"), auto_print=True) as sandbox, sandbox.session() as s:
        s.run_code("x = 6")
        result = s.run_code("print('side'); x * 7")
        assert result.stdout == "side\n"  # the stdout a reward compares stays the code's own
        assert s.format_tool_content(result) == "side\n42\n"


@pytest.mark.docker
@pytest.mark.parametrize("backend_id", ["docker-reuse", "docker-runsc"])
def test_a_docker_cell_cancelled_by_its_caller_leaves_its_family_as_it_was(
    backend_id: str,
) -> None:
    """The caller gives up on a cell (``asyncio.wait_for``, an MCP client's cancel); the
    cell still runs to its end in the family's container, whose stream stays in step.
    Before, the family's next request took the cell's answer for a broken stream and
    every session of the family was lost as ``sandbox_error`` (the sixth red-team round)."""
    from tests.conftest import require_docker

    require_docker()

    async def scenario(sandbox: Sandbox) -> tuple[ExecResult, ExecResult, ExecResult]:
        async with sandbox.session() as session:
            await session.arun_code("x = 1")
            branch = await session.afork()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(session.arun_code("import time; time.sleep(1.5)"), 0.3)
            after_branch = await branch.arun_code("x + 1")
            after_root = await session.arun_code("x")
            other = await sandbox.arun_code("print('stateless')")
            return after_branch, after_root, other

    with own_sandbox(backend_id, timeout=10) as sandbox:
        after_branch, after_root, other = asyncio.run(scenario(sandbox))
    assert (after_branch.outcome, shown(after_branch)) == (Outcome.SUCCESS, "2"), after_branch
    assert (after_root.outcome, shown(after_root)) == (Outcome.SUCCESS, "1"), after_root
    assert other.stdout == "stateless\n"


@pytest.mark.docker
@pytest.mark.parametrize("backend_id", ["docker-reuse", "docker-runsc"])
def test_a_session_lost_while_its_caller_gave_up_is_lost_at_its_next_use(
    backend_id: str,
) -> None:
    """A cell given up on by its caller that then lost its session (it ignored the
    interrupt): the host took the session for alive, and its next cell read the agent's
    "no such session" as killed by a signal, ``-9`` (thirty-first round, 10 of 10). Now
    the next use raises ``SessionLostError``, and the family's container is let go."""
    from tests.conftest import require_docker

    require_docker()
    stubborn = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass\n"

    async def scenario(sandbox: Sandbox) -> str | None:
        session = await sandbox.aopen_session()
        await session.arun_code("x = 1")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(session.arun_code(stubborn, timeout=1), 0.2)
        await asyncio.sleep(1 + INTERRUPT_GRACE + SLACK)  # killed, and said so, meanwhile
        with pytest.raises(SessionLostError):
            await session.arun_code("print(x)")
        return session.lost

    with own_sandbox(backend_id, timeout=10) as sandbox:
        lost = asyncio.run(scenario(sandbox))
        assert not sandbox.backend._session_containers  # type: ignore[attr-defined]
    assert lost is not None and "did not stop" in lost, lost


@pytest.mark.docker
@pytest.mark.parametrize("backend_id", ["docker-reuse", "docker-runsc"])
def test_a_fork_whose_caller_gave_up_is_closed_once_made(backend_id: str) -> None:
    """``afork()`` given up on by its caller: the copy was made and never closed, a live
    interpreter in the family's container holding two of its agent's descriptors until
    the family ended; ~120 of them ran the agent out of descriptors (runc) or the
    container out of memory (gVisor) and lost the family (thirty-first round). Now the
    copy is closed as soon as it is made."""
    from tests.conftest import require_docker

    require_docker()
    count = "import os\nsum(name.isdigit() for name in os.listdir('/proc'))"

    async def scenario(sandbox: Sandbox) -> tuple[int, int, int]:
        async with sandbox.session() as root:
            await root.arun_code("x = 1")
            before = value_of(await root.arun_code(count))
            for _ in range(20):
                with contextlib.suppress(TimeoutError):
                    copy = await asyncio.wait_for(root.afork(), 0.0005)
                    await copy.aclose()  # (made in time: closed as any)
            await root.arun_code("pass")  # every fork's exchange, and so its copy's close,
            after = value_of(await root.arun_code(count))  # is queued before this cell
            return before, after, sandbox.open_sessions

    with own_sandbox(backend_id, timeout=10) as sandbox:
        before, after, open_sessions = asyncio.run(scenario(sandbox))
    assert after == before, (before, after)
    assert open_sessions == 1


def value_of(result: ExecResult) -> Any:
    """A cell's displayed value, read as a Python literal."""
    import ast

    assert result.outcome is Outcome.SUCCESS, result
    text = shown(result)
    assert text is not None, result
    return ast.literal_eval(text)


@pytest.mark.docker
@pytest.mark.parametrize("backend_id", ["docker-reuse", "docker-runsc"])
def test_an_interrupt_that_misses_the_cells_code_does_not_end_the_session(
    backend_id: str,
) -> None:
    """A cell timeout so small that the interrupt lands before the cell's code starts, or
    after it ended: the session's own loop took the KeyboardInterrupt, its interpreter
    died and the session was lost (5 of 5 under 1e-6 s; 10-40% of cells ending near their
    deadline; the sixth red-team round). Now only a cell's code can be interrupted."""
    from tests.conftest import require_docker
    from tests.contract.test_backend_contract import run_cells

    require_docker()
    with own_sandbox(backend_id, timeout=10) as sandbox:
        with sandbox.session() as session:
            session.run_code("x = 41")
            tiny = [session.run_code("y = 1", timeout=1e-6) for _ in range(5)]
            after = session.run_code("x + 1")
        notebook = run_cells(sandbox, "a = 1", "a + 1", timeout=10, cell_timeout=1e-9)
    assert all("session lost" not in result.detail for result in tiny), [r.detail for r in tiny]
    assert (after.outcome, shown(after)) == (Outcome.SUCCESS, "42"), after
    assert notebook.outcome is not Outcome.SANDBOX_ERROR, notebook.detail


@pytest.mark.docker
@pytest.mark.parametrize("backend_id", ["docker-reuse"])
def test_a_cell_given_up_before_it_began_never_runs(backend_id: str) -> None:
    """An agent retrying with a tool timeout shorter than the session's: each cell it gave
    up on while an earlier one ran was still sent later, and ran unseen (``v`` was 3 where
    the caller saw it 0; red team D, the thirty-sixth round). A running cell runs on (it
    cannot be taken back); one given up before it began is never sent. (The local
    backend loses a session whose running cell is given up.)"""
    from tests.conftest import require_docker

    require_docker()

    async def retries(sandbox: Sandbox) -> str:
        session = await sandbox.aopen_session()
        try:
            await session.arun_code("v = 0")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(session.arun_code("import time; time.sleep(1.5)"), 0.3)
            for _ in range(3):  # each waits for the sleeping cell, and is given up
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(session.arun_code("v += 1"), 0.1)
            return (await session.arun_code("print(v)")).stdout
        finally:
            await session.aclose()

    with own_sandbox(backend_id, timeout=10) as sandbox:
        assert asyncio.run(retries(sandbox)) == "0\n"


@pytest.mark.docker
def test_forks_past_the_agents_descriptors_are_refused_and_the_family_lives_on() -> None:
    """Each session holds two of the agent's descriptors: fork 117 of an idle session met
    ``EMFILE`` mid-fork, the agent ended, and the parent and every fork were lost (red
    team D, the thirty-sixth round). Now the fork that does not fit is refused."""
    from tests.conftest import require_docker

    require_docker()
    config = DockerConfig(policy="reuse", pool_size=1, nofile=64)
    with Sandbox(config, timeout=10, max_sessions=100) as sandbox, sandbox.session() as session:
        session.run_code("state = 'precious'")
        forks = []
        with pytest.raises(SessionError) as refused:
            for _ in range(60):
                forks.append(session.fork())
        assert not isinstance(refused.value, SessionLostError), refused.value
        assert "descriptors" in str(refused.value), refused.value
        assert forks, "not one fork fitted: the test proves nothing"
        for survivor in (session, forks[0], forks[-1]):
            assert survivor.run_code("print(state)").stdout == "precious\n"
        for fork in forks:
            fork.close()


@pytest.mark.docker
@pytest.mark.parametrize("backend_id", ["docker-reuse", "docker-runsc"])
def test_a_fork_announced_by_a_process_that_is_not_its_copy_is_refused(backend_id: str) -> None:
    """A cell's ``os.register_at_fork`` hook announced a fork from the session's middle
    process, which holds the copy's socket too: the supervisor watched that pid (reaped
    at once) while the real copy ran on unwatched, so a lost fork's process went on and
    its own exit read as a timeout (thirty-third red-team round). Now only a process
    the supervisor adopted can be a fork's copy; the session lives on."""
    from tests.conftest import require_docker

    require_docker()
    claim_from_the_middle = (
        "import os, socket, sys\n"
        "HELLO = next(m.FORKED_BYTE for m in list(sys.modules.values())\n"
        "             if isinstance(getattr(m, 'FORKED_BYTE', None), bytes))\n"
        "done = []\n"
        "def claim():\n"
        "    if done:\n"
        "        return\n"
        "    done.append(1)\n"
        "    for fd in sorted((int(x) for x in os.listdir('/proc/self/fd')), reverse=True):\n"
        "        try:\n"
        "            if fd > 4 and os.readlink(f'/proc/self/fd/{fd}').startswith('socket:'):\n"
        "                socket.socket(fileno=os.dup(fd)).send(HELLO)\n"
        "                return\n"
        "        except OSError:\n"
        "            pass\n"
        "os.register_at_fork(after_in_child=claim)\n"
    )
    with own_sandbox(backend_id, timeout=10) as sandbox, sandbox.session() as session:
        assert session.run_code(claim_from_the_middle + "x = 1").ok
        with pytest.raises(SessionError):
            session.fork()
        assert shown(session.run_code("x + 1")) == "2"


@pytest.mark.docker
def test_a_fork_whose_copy_starts_too_slowly_says_so_and_the_parent_lives_on() -> None:
    """A copy late past the start budget (here an at-fork hook; on gVisor, 8,000 files to
    copy took 2.85 s of the 5) was refused as "out of memory or processes?" (thirty-seventh
    round): the reason now names the budget and what can spend it."""
    from tests.conftest import require_docker

    require_docker()
    with own_sandbox("docker-reuse", timeout=10) as sandbox, sandbox.session() as session:
        assert session.run_code(
            "import os, time\nos.register_at_fork(after_in_child=lambda: time.sleep(6))\nx = 1"
        ).ok
        with pytest.raises(SessionError, match=r"did not start within 5 s \(a large working"):
            session.fork()
        assert shown(session.run_code("x + 1")) == "2"


@pytest.mark.docker
@pytest.mark.parametrize("backend_id", ["docker-reuse", "docker-runsc"])
def test_a_fork_holds_no_copy_of_its_parents_channels(backend_id: str) -> None:
    """An earlier cell's ``os.dup(3)`` and ``os.dup(4)`` (the session's events pipe and
    request socket) reached every later fork: a fork read its parent's next cell and
    answered it, ``success`` with the fork's output, the parent's code never run
    (thirty-seventh round). The copy closes them; the parent's own copies stay its own."""
    from tests.conftest import require_docker

    require_docker()
    with own_sandbox(backend_id, timeout=10) as sandbox, sandbox.session() as session:
        assert session.run_code(
            "import os\n"
            "kept = [os.dup(3), os.dup(4)]\n"
            "channels = {(os.fstat(fd).st_dev, os.fstat(fd).st_ino) for fd in (3, 4)}\n"
            "def held():\n"
            "    found = set()\n"
            "    for name in os.listdir('/proc/self/fd'):\n"
            "        try:\n"
            "            info = os.fstat(int(name))\n"
            "        except OSError:\n"
            "            continue\n"
            "        found.add((info.st_dev, info.st_ino))\n"
            "    return len(channels & found)"
        ).ok
        with session.fork() as branch:
            assert value(branch, "held()") == 0
        assert value(session, "held()") == 2
        assert value(session, "len(kept)") == 2


@pytest.mark.docker
@pytest.mark.parametrize("backend_id", ["docker-reuse", "docker-runsc"])
def test_a_fork_whose_middle_process_ends_slowly_still_starts(backend_id: str) -> None:
    """The copy is the agent's child only once the fork's middle process has ended: a
    middle slowed for 1.3 s (here by the parent's at-fork hook; on a loaded host by the
    scheduler) had the fork refused after a budget of 1 s (the review of the thirty-third
    round). The copy has the fork's whole start budget."""
    from tests.conftest import require_docker

    require_docker()
    slow = "import os, time\nos.register_at_fork(after_in_parent=lambda: time.sleep(1.3))\nx = 1"
    with own_sandbox(backend_id, timeout=10) as sandbox, sandbox.session() as session:
        assert session.run_code(slow).ok
        copy = session.fork()
        assert shown(copy.run_code("x + 1")) == "2"
