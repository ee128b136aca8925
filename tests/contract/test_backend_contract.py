"""The behaviour every backend must share, run against each one for real.

One test class, parametrized over local, docker-fresh, docker-reuse and
docker+runsc through the ``sandbox`` fixture (see conftest.py).

``stdin``, ``files``, ``fetch`` and notebook ``cells`` are handled by the
backend outside the code's process; the tests for them say what every
backend must do, whatever the code prints.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from typing import Any

import pytest

from retool_exec import ConfigError, DockerConfig, ExecResult, Outcome, RunRequest, Sandbox
from tests.conftest import backend_config

TIMEOUT_GRACE = 1.0
INTERRUPT_GRACE = 1.0
"""Seconds a cell past its ``cell_timeout`` has after the interrupt before it is killed."""


def run_request(sandbox: Sandbox, request: RunRequest) -> ExecResult:
    """Run ``request`` on the sandbox's own loop (``run_code`` has no ``cells=``)."""
    portal = sandbox._ensure_portal()
    return portal.submit(sandbox._run(request, time.perf_counter())).result()


def run_cells(
    sandbox: Sandbox,
    *cells: str,
    timeout: float = 10.0,
    cell_timeout: float | None = None,
    files: dict[str, bytes] | None = None,
    fetch: tuple[str, ...] = (),
) -> ExecResult:
    request = RunRequest(
        code="",
        cells=cells,
        timeout=timeout,
        cell_timeout=cell_timeout,
        files=files or {},
        fetch=fetch,
    )
    return run_request(sandbox, request)


ANSWERED = "import io, os, sys\nprint('ANSWER 42')\n"
"""The start of code that prints its answer and then does something to its streams."""
DROPPED = "sys.stdout = sys.__stdout__ = io.StringIO()\n"
"""The code's last references to the stdout it started with, dropped: python3 writes what
that stream holds then, as it is finalized."""
FAILING_STDOUT = (
    "import sys\n"
    "class W:\n"
    "    def write(self, s): return len(s)\n"
    "    def flush(self): raise OSError('no')\n"
    "class V(W):\n"
    "    def flush(self): sys.stderr = W()\n"
    "print('x'); sys.stdout = W(); print('y')\n"
)
"""Code whose ``sys.stdout`` fails to flush at the end: python3 reports it and ends 120."""
COUNTED_FLUSHES = (
    "import os, sys\n"
    "class W:\n"
    "    def __init__(self, n): self.n = n\n"
    "    def write(self, s): return len(s)\n"
    "    def flush(self): os.write(1, b'%d\\n' % self.n)\n"
)
"""Streams that say on descriptor 1 each time they are flushed: python3 flushes the code's
``sys.stdout`` once at its end, and never a ``sys.__stdout__`` the code set."""

TRACER = "import sys\ndef t(f, e, a):\n    if e == 'call': {write}\nsys.settrace(t)\n"
"""A trace function the code leaves on: ``{write}`` runs at each call it sees."""
PROFILED = (
    "import atexit, sys\n"
    "def ex(): print('atexit fn')\n"
    "atexit.register(ex)\n"
    "def p(f, e, a):\n"
    "    name = a.__name__ if e.startswith('c_') else f.f_code.co_name\n"
    "    sys.stderr.write(f'P {e} {name}\\n')\n"
    "sys.setprofile(p)\n"
    "print('x')"
)
"""A profile function the code leaves on: python3's sees its at-exit function, nothing else."""
DIVISION_BY_ZERO_LINE_3 = (
    'Traceback (most recent call last):\n  File "<sandbox>", line 3, in <module>\n'
    "ZeroDivisionError: division by zero\n"
)
ANNOTATIONS = "def f(x: int) -> str: pass\nprint(f.__annotations__)\n"
"""Code whose output depends on the compiler flags it runs under (PEP 563 strings or not)."""
ANNOTATIONS_SEEN = "{'x': <class 'int'>, 'return': <class 'str'>}\n"


class TestBackendContract:
    def test_print_gives_the_canonical_success(self, sandbox: Sandbox) -> None:
        result = sandbox.run_code("print(2 + 3)")
        assert (result.ok, result.stdout, result.stderr) == (True, "5\n", "")
        assert (result.returncode, result.timed_out, result.outcome) == (0, False, Outcome.SUCCESS)
        assert result.latency > 0
        assert sandbox.format_tool_content(result) == "5\n"

    def test_auto_print_prints_a_final_expression_where_the_code_runs(
        self, sandbox: Sandbox
    ) -> None:
        """``auto_print`` travels with the request and the backend applies it: the same
        output on every backend, true traceback lines, and a script file holding the code
        as written (the host no longer rewrites it)."""

        def printed(code: str, **fields: Any) -> ExecResult:
            request = RunRequest(code=code, timeout=10, auto_print=True, **fields)
            return run_request(sandbox, request)

        assert printed("x = 6\nx * 7").stdout == "42\n"
        assert printed("x = None\nx").stdout == ""
        assert printed("print('once')").stdout == "once\n"
        assert printed("'a' + 'b'  # str, not repr").stdout == "ab\n"
        failed = printed("x = 0\n1 / x")
        assert failed.outcome is Outcome.ERROR
        assert 'File "<sandbox>", line 2, in <module>' in failed.stderr
        code = "import sys\nlen(open(sys.argv[0]).read())"
        assert printed(code, script="main.py").stdout == f"{len(code)}\n"
        broken = printed("x = (")
        assert broken.outcome is Outcome.ERROR and "SyntaxError" in broken.stderr

    def test_auto_print_leaves_the_codes_imports_as_python3s(
        self, sandbox: Sandbox, backend_id: str
    ) -> None:
        """The auto-print's own ``ast`` walk imported an uploaded ``collections/`` (the call
        failed before its code ran), and the ``ast``, ``enum`` and ``contextlib`` it brought
        in hid the call's uploads of those names, where ``python3 -c`` of the printed code
        imports them (the review of the thirty-third round)."""

        def printed(code: str, files: dict[str, bytes]) -> ExecResult:
            request = RunRequest(code=code, timeout=10, auto_print=True, files=files)
            return run_request(sandbox, request)

        result = printed("import ast\nast.MARK", {"ast.py": b"MARK = 'upload'\n"})
        assert result.stdout == "upload\n", result
        if backend_id == "local":
            return  # (the host's python3 may import the others as it starts: its .pth files)
        files = {
            "collections/__init__.py": b"MARK = 'package'\n",
            "enum.py": b"MARK = 'upload'\n",
            "contextlib.py": b"MARK = 'upload'\n",
        }
        code = "import collections as a, enum as b, contextlib as c\n(a.MARK, b.MARK, c.MARK)"
        result = printed(code, files)
        assert result.stdout == "('package', 'upload', 'upload')\n", result

    def test_the_main_namespace_is_the_one_python_dash_c_gives(self, sandbox: Sandbox) -> None:
        """``__builtins__`` is the module (``__builtins__.len`` works), and ``__annotations__``
        and ``__loader__`` are there, as in ``python3 -c``; nothing of the runner's."""
        result = sandbox.run_code(
            "print(__builtins__.len('ab'), __annotations__, __loader__.__name__)\n"
            "print(sorted(globals()))"
        )
        assert result.stdout == (
            "2 {} BuiltinImporter\n['__annotations__', '__builtins__', '__doc__', "
            "'__loader__', '__name__', '__package__', '__spec__']\n"
        ), result

    def test_code_runs_with_no_compiler_flags_of_the_runner(self, sandbox: Sandbox) -> None:
        """The code is compiled as ``python -c`` would: the runner's own ``from __future__``
        imports do not reach it (the Docker agent's once made every annotation a string)."""
        assert sandbox.run_code(ANNOTATIONS).stdout == ANNOTATIONS_SEEN
        cells = run_cells(sandbox, ANNOTATIONS, "f.__annotations__")
        assert [cell.stdout for cell in cells.cells] == [ANNOTATIONS_SEEN, ""]
        assert cells.cells[1].display == [{"text/plain": ANNOTATIONS_SEEN.strip()}]

    def test_localhost_resolves_and_a_loopback_server_answers(
        self, backend_id: str, sandbox: Sandbox
    ) -> None:
        """Code written for SandboxFusion resolves ``localhost`` everywhere (issue 12.12) and
        talks over unix sockets everywhere, over UDP and TCP where the backend allows IP:
        not under runc by default, where IP sockets move figures every container on the
        host shares (findings 30 and 36); a refused IP socket is a plain PermissionError."""
        result = sandbox.run_code(
            "import socket\n"
            "print(socket.gethostbyname('localhost'))\n"
            "a, b = socket.socketpair()\n"
            "a.sendall(b'unix')\n"
            "print(b.recv(4).decode())\n"
            "try:\n"
            "    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "except PermissionError as exc:\n"
            "    print('no ip', exc.errno)\n"
            "    raise SystemExit\n"
            "server.bind(('localhost', 0))\n"
            "client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "client.sendto(b'ping', ('localhost', server.getsockname()[1]))\n"
            "print(server.recv(4).decode())\n"
            "server = socket.socket()\n"
            "server.bind(('localhost', 0))\n"
            "server.listen(1)\n"
            "port = server.getsockname()[1]\n"
            "client = socket.create_connection(('localhost', port), timeout=5)\n"
            "peer, _ = server.accept()\n"
            "client.sendall(b'pong')\n"
            "print(peer.recv(4).decode())\n"
        )
        config = backend_config(backend_id)
        ip = not isinstance(config, DockerConfig) or config.ip_allowed
        expected = "127.0.0.1\nunix\n" + ("ping\npong\n" if ip else "no ip 13\n")
        assert (result.outcome, result.stdout) == (Outcome.SUCCESS, expected), result

    def test_a_script_names_a_real_file_as_python_file_py_would(self, sandbox: Sandbox) -> None:
        """``__file__`` and ``sys.argv[0]`` name the script, which holds the code (issue 12.12)."""
        code = (
            "import os, sys\n"
            "print(os.path.basename(__file__), sys.argv[0] == __file__, len(sys.argv))\n"
            "print(open(__file__).read() == open(sys.argv[0]).read() and 'import os' in "
            "open(__file__).read())\n"
            "print(os.path.dirname(__file__) == os.getcwd())\n"
        )
        result = run_request(sandbox, RunRequest(code=code, timeout=10, script="main.py"))
        assert (result.outcome, result.stdout) == (
            Outcome.SUCCESS,
            "main.py True 1\nTrue\nTrue\n",
        ), result
        plain = sandbox.run_code("print('__file__' in globals())")
        assert plain.stdout == "False\n"  # the seed's way (python -c) is unchanged

    def test_runtime_error_gives_a_traceback_in_sandbox_file(self, sandbox: Sandbox) -> None:
        result = sandbox.run_code("x = 1\nprint(1 / 0)")
        assert not result.ok
        assert result.returncode == 1
        assert result.outcome is Outcome.ERROR
        assert 'File "<sandbox>", line 2, in <module>' in result.stderr
        assert result.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
        assert sandbox.format_tool_content(result) == result.stderr

    def test_partial_stdout_is_kept_but_not_shown_on_failure(self, sandbox: Sandbox) -> None:
        result = sandbox.run_code("print('before')\nraise ValueError('boom')")
        assert result.stdout == "before\n"
        assert "ValueError: boom" in sandbox.format_tool_content(result)
        assert "before" not in sandbox.format_tool_content(result)

    def test_syntax_error_is_reported_in_sandbox_file(self, sandbox: Sandbox) -> None:
        result = sandbox.run_code("def f(:\n    pass")
        assert result.returncode == 1
        assert 'File "<sandbox>", line 1' in result.stderr
        assert "SyntaxError" in result.stderr

    def test_exit_code_is_passed_through(self, sandbox: Sandbox) -> None:
        result = sandbox.run_code("import sys\nsys.exit(3)")
        assert (result.ok, result.returncode, result.stderr) == (False, 3, "")
        assert sandbox.format_tool_content(result) == "Error: process exited with code 3."

    def test_exit_codes_out_of_range_or_of_int_subclasses_end_as_python3_ends(
        self, sandbox: Sandbox
    ) -> None:
        """python3 exits 255 for a code beyond a C long and takes an int subclass's own
        value; the Docker agent's ``code & 0xFF`` made both a success."""
        code = (
            "import sys\n"
            "class Code(int):\n"
            "    def __and__(self, other): return 0\n"
            "    def __index__(self): return 0\n"
            "sys.exit({})"
        )
        for value, status in (("2**63", 255), ("-2**64", 255), ("Code(7)", 7), ("2**40 + 7", 7)):
            result = sandbox.run_code(code.format(value))
            assert (result.outcome, result.returncode) == (Outcome.ERROR, status), value

    @pytest.mark.parametrize(
        ("code", "status"),
        [
            ("print('a', flush=True)\nraise KeyboardInterrupt", -2),
            ("import atexit\natexit.register(lambda: print('a'))\nraise KeyboardInterrupt", -2),
            ("class Stop(KeyboardInterrupt): pass\nraise Stop", 1),  # the exact class only
            ("import sys\nsys.excepthook = lambda *a: sys.exit(1)\nraise KeyboardInterrupt", 1),
            (
                "import signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n"
                "raise KeyboardInterrupt",
                130,
            ),
        ],
    )
    def test_an_uncaught_keyboard_interrupt_ends_by_sigint_as_python3(
        self, sandbox: Sandbox, code: str, status: int
    ) -> None:
        """python3 ends by SIGINT after a ``KeyboardInterrupt`` nothing caught (its at-exit
        functions run first): the seed's subprocess said -2, the backends said 1."""
        ran = subprocess.run(
            [sys.executable, "-c", code], check=False, capture_output=True, timeout=30
        )
        assert ran.returncode == status  # the expectation is python3's own
        result = sandbox.run_code(code)
        assert (result.returncode, result.stdout) == (status, ran.stdout.decode())
        expected = Outcome.SIGNAL if status < 0 else Outcome.ERROR
        assert result.outcome is expected

        # The last line names the exception; Python before 3.10 adds ``__main__.`` to a
        # class the code defined (a foreign image runs 3.9).
        def last(stderr: str) -> list[str]:
            return [line.removeprefix("__main__.") for line in stderr.splitlines()[-1:]]

        assert last(result.stderr) == last(ran.stderr.decode())

    def test_stderr_warnings_do_not_fail_a_success(self, sandbox: Sandbox) -> None:
        result = sandbox.run_code("import sys\nprint('warn', file=sys.stderr)\nprint('ok')")
        assert result.ok
        assert result.stderr == "warn\n"
        assert sandbox.format_tool_content(result) == "ok\n"

    def test_final_expression_is_not_printed_by_default(self, sandbox: Sandbox) -> None:
        assert sandbox.run_code("2 + 3").stdout == ""

    def test_code_runs_as_main(self, sandbox: Sandbox) -> None:
        assert sandbox.run_code("print(__name__)").stdout == "__main__\n"

    def test_the_main_thread_is_the_process_itself(self, sandbox: Sandbox) -> None:
        # As in a fresh interpreter: the docker zygote's plain fork must name it again.
        code = (
            "import os, threading\n"
            "main = threading.main_thread()\n"
            "print(main is threading.current_thread(), main.ident == threading.get_ident(),"
            " main.native_id == threading.get_native_id() == os.getpid())"
        )
        assert sandbox.run_code(code).stdout == "True True True\n"

    def test_stack_mb_lets_recursion_through_c_frames_go_deeper(
        self, sandbox: Sandbox, backend_id: str
    ) -> None:
        """``stack_mb`` raises the code's soft stack limit, as SandboxFusion's runner does
        with ``memory_limit_MB``: a memoized recursion 30,000 deep segfaults in python3's
        8 MiB and passes with 1 GiB, and threads still start (their stacks stay default).
        gVisor sizes a process's stack when it starts, so there the limit changes nothing
        (docs/server.md)."""
        code = (
            "import resource, sys, threading\n"
            "from functools import lru_cache\n"
            "sys.setrecursionlimit(10**6)\n"
            "@lru_cache(None)\n"
            "def depth(n):\n"
            "    return 0 if n == 0 else depth(n - 1) + 1\n"
            "print(resource.getrlimit(resource.RLIMIT_STACK)[0] >> 20, flush=True)\n"
            "started = []\n"
            "thread = threading.Thread(target=started.append, args=(1,))\n"
            "thread.start(); thread.join()\n"
            "print(started, depth(30000))\n"
        )
        plain = run_request(sandbox, RunRequest(code=code, timeout=20))
        if plain.stdout != "8\n":
            pytest.skip(f"the default stack here is not 8 MiB but {plain.stdout!r} MiB")
        assert (plain.outcome, plain.returncode) == (Outcome.SIGNAL, -11)
        deep = run_request(sandbox, RunRequest(code=code, timeout=20, stack_mb=1024))
        if backend_id == "docker-runsc":
            assert (deep.outcome, deep.stdout) == (Outcome.SIGNAL, "1024\n")
        else:
            assert (deep.outcome, deep.stdout) == (Outcome.SUCCESS, "1024\n[1] 30000\n")
        with pytest.raises(ValueError, match="stack_mb"):
            RunRequest(code="", timeout=1, stack_mb=0)

    def test_memory_mb_is_the_codes_limit_under_every_runtime(
        self, sandbox: Sandbox, backend_id: str
    ) -> None:
        """Past ``memory_mb`` an allocation raises ``MemoryError`` in the code, under
        gVisor too, which applies ``RLIMIT_DATA`` to ``brk`` only: 300 MB under a 64 MB
        limit was a success there (thirtieth red-team round)."""
        if backend_id == "local":
            pytest.skip("the local backend sets no memory limit (docs/server.md)")
        code = "b = bytearray({} << 20)\nb[::4096] = bytes(len(b) >> 12)\nprint(len(b) >> 20)"
        within = run_request(sandbox, RunRequest(code=code.format(64), timeout=20, memory_mb=256))
        assert (within.outcome, within.stdout) == (Outcome.SUCCESS, "64\n"), within.stderr
        past = run_request(sandbox, RunRequest(code=code.format(300), timeout=20, memory_mb=256))
        assert (past.outcome, past.stdout) == (Outcome.ERROR, ""), past
        assert past.stderr.endswith("\nMemoryError\n"), past.stderr

    def test_an_allocation_past_the_machines_memory_is_a_memory_error(
        self, sandbox: Sandbox, backend_id: str
    ) -> None:
        """Without ``memory_mb`` too: Linux refuses an allocation larger than the machine's
        memory, and python3 raises ``MemoryError``; gVisor's kernel mapped any size, so
        code catching it was the container's ``oom`` there (thirty-second red-team round)."""
        with open("/proc/sys/vm/overcommit_memory") as mode:
            if mode.read().strip() == "1" and backend_id != "docker-runsc":
                pytest.skip("this kernel overcommits always: python3 gets the memory here")
        code = (
            "for size in (1 << 40, 10**11):\n"
            "    try:\n"
            "        block = bytearray(size) if size == 1 << 40 else [0] * size\n"
            "    except MemoryError:\n"
            "        print('refused')\n"
        )
        result = run_request(sandbox, RunRequest(code=code, timeout=20))
        assert (result.outcome, result.stdout) == (Outcome.SUCCESS, "refused\nrefused\n"), result

    def test_threads_run_under_memory_mb_as_they_do_under_runc(self, sandbox: Sandbox) -> None:
        """gVisor's address-space limit counted the 64 MiB glibc reserves for each thread's
        malloc arena: sixteen threads that run in 0.3 s under runc failed to start, or
        timed out, at the same ``memory_mb`` (the thirtieth round's review)."""
        code = (
            "import concurrent.futures as cf, threading, time\n"
            "def work(i):\n"
            "    for _ in range(200): block = [bytes(1000) for _ in range(200)]\n"
            "    return 1\n"
            "with cf.ThreadPoolExecutor(16) as pool: print(sum(pool.map(work, range(64))))\n"
            "idle = [threading.Thread(target=time.sleep, args=(0.2,)) for _ in range(20)]\n"
            "for thread in idle: thread.start()\n"
            "for thread in idle: thread.join()\n"
            "print('joined')\n"
        )
        result = run_request(sandbox, RunRequest(code=code, timeout=30, memory_mb=256))
        assert (result.outcome, result.stdout) == (Outcome.SUCCESS, "64\njoined\n"), result

    def test_a_small_memory_mb_with_a_large_stdin_is_still_the_codes_call(
        self, sandbox: Sandbox
    ) -> None:
        """The limit is the code's from its first line, not the sandbox's before it: set
        before the stdin was decoded, code padded to 15 MB made its own wrong answer a
        ``sandbox_error`` (which trainers drop) at 24 MB over a call's own data."""
        probe = "print(next(l.split()[1] for l in open('/proc/self/status') if l[:7] == 'VmData:'))"
        data_mb = int(sandbox.run_code(probe).stdout) >> 10
        code = "a, b = map(int, input().split())\nprint(a - b)\n#" + "x" * (15 << 20) + "\n"
        request = RunRequest(
            code=code, timeout=30, stdin=b"3 4\n" + b"0" * (8 << 20), memory_mb=data_mb + 24
        )
        result = run_request(sandbox, request)
        assert (result.outcome, result.stdout) == (Outcome.SUCCESS, "-1\n"), result.detail

    def test_recursion_goes_as_deep_as_under_python3(
        self, sandbox: Sandbox, backend_id: str
    ) -> None:
        """The code's module frame is at depth one, as under ``python3 -c``: a recursion
        of 990 passes (at most 987 did; python3 3.9 and 3.10 count a comparison as a level,
        so 998 is 3.11's alone), the deepest reaches ``limit - 1`` (also after the code sets the
        limit), and the traceback counts its repeated lines as python3 does. The agent's
        own frames took 12 of them (thirty-second red-team round)."""
        if backend_id == "local":
            pytest.skip("the local backend's bootstrap frames count (docs/server.md)")
        code = (
            "import sys\n"
            "def deepest(n):\n"
            "    try:\n"
            "        return deepest(n + 1)\n"
            "    except RecursionError:\n"
            "        return n\n"
            "def down(n):\n"
            "    return 0 if n == 0 else down(n - 1) + 1\n"
            "print(deepest(1), down(990), sys.getrecursionlimit())\n"
            "sys.setrecursionlimit(200)\n"
            "print(deepest(1), sys.getrecursionlimit())\n"
            "down(500)\n"
        )
        result = sandbox.run_code(code)
        assert result.stdout == "999 990 1000\n199 200\n", result
        assert "[Previous line repeated 196 more times]" in result.stderr, result.stderr

    def test_calls_are_stateless(self, sandbox: Sandbox) -> None:
        assert sandbox.run_code("x = 5\nprint(x)").stdout == "5\n"
        result = sandbox.run_code("print(x)")
        assert result.returncode == 1
        assert "NameError: name 'x' is not defined" in result.stderr

    def test_unicode_output_round_trips(self, sandbox: Sandbox) -> None:
        assert sandbox.run_code("print('héllo ✓ 数学')").stdout == "héllo ✓ 数学\n"

    def test_invalid_utf8_output_is_replaced(self, sandbox: Sandbox) -> None:
        result = sandbox.run_code(r"import sys; sys.stdout.buffer.write(b'\xff\xfe ok\n')")
        assert result.ok
        assert result.stdout == "\ufffd\ufffd ok\n"

    def test_long_output_keeps_the_tail_with_the_seed_marker(self, sandbox: Sandbox) -> None:
        result = sandbox.run_code("print('a' * 5000 + 'b' * 5000)")
        assert result.ok
        assert result.stdout == "[... truncated 5905 chars ...]\n" + ("b" * 4095 + "\n")
        assert result.stdout_dropped_chars == 5905
        assert result.truncated

    def test_output_flood_is_capped_and_times_out_on_time(self, sandbox: Sandbox) -> None:
        started = time.monotonic()
        result = sandbox.run_code("while True:\n    print('x' * 1000)", timeout=2.0)
        assert time.monotonic() - started < 2.0 + TIMEOUT_GRACE + 0.5
        assert result.timed_out
        assert result.returncode is None
        assert len(result.stdout) <= 4096 + 64
        assert result.stdout_dropped_chars > 100_000

    def test_infinite_loop_times_out_with_the_seed_message(self, sandbox: Sandbox) -> None:
        started = time.monotonic()
        result = sandbox.run_code("while True:\n    pass", timeout=2.0)
        elapsed = time.monotonic() - started
        assert elapsed < 2.0 + TIMEOUT_GRACE, elapsed
        assert (result.ok, result.returncode, result.timed_out) == (False, None, True)
        assert result.outcome is Outcome.TIMEOUT
        # The limit the call ran under (2 s), not the sandbox's default (issue 12.7).
        assert sandbox.format_tool_content(result) == "Error: execution timed out after 2 seconds."

    def test_sleep_past_the_limit_times_out(self, sandbox: Sandbox) -> None:
        result = sandbox.run_code(
            "import time\nprint('started', flush=True)\ntime.sleep(30)", timeout=1.5
        )
        assert result.timed_out
        assert result.stdout == "started\n"

    @pytest.mark.parametrize("new_session", [False, True], ids=["same-group", "setsid"])
    def test_background_process_does_not_outlive_the_call(
        self, sandbox: Sandbox, backend_id: str, new_session: bool, request: pytest.FixtureRequest
    ) -> None:
        if backend_id == "local" and new_session:
            # A plain subprocess cannot catch a process that left its session;
            # the containers can (kill(-1) from the agent). Shown, not hidden.
            request.applymarker(pytest.mark.xfail(strict=True, reason="local is not isolated"))
        token = f"retool-bg-{uuid.uuid4().hex}"
        first = sandbox.run_code(
            "import subprocess, sys\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', "
            f"{token!r}], start_new_session={new_session})\n"
            "print('started')"
        )
        assert first.stdout == "started\n", first
        time.sleep(0.3)
        probe = sandbox.run_code(
            "import os\n"
            "alive = []\n"
            "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
            "    try:\n"
            "        cmd = open(f'/proc/{pid}/cmdline', 'rb').read()\n"
            "        state = open(f'/proc/{pid}/stat').read().rpartition(')')[2].split()[0]\n"
            "    except OSError:\n"
            "        continue\n"
            f"    if {token.encode()!r} in cmd and state != 'Z':\n"
            "        alive.append(pid)\n"
            "print(alive)"
        )
        if backend_id == "local":  # the host's own processes: never leave one behind
            for pid in ast.literal_eval(probe.stdout or "[]"):
                with contextlib.suppress(OSError):
                    os.kill(int(pid), signal.SIGKILL)
        assert probe.stdout == "[]\n", probe

    def test_nul_byte_in_code_gives_an_explicit_error(self, sandbox: Sandbox) -> None:
        result = sandbox.run_code("print(1)\x00")
        assert not result.ok
        assert result.returncode == 1
        assert "null bytes" in result.stderr

    def test_lone_surrogate_in_code_gives_an_explicit_error(self, sandbox: Sandbox) -> None:
        result = sandbox.run_code("print('\ud800')")
        assert not result.ok
        assert result.outcome in (Outcome.ERROR, Outcome.REJECTED)
        assert result.stderr

    def test_ten_megabytes_of_code_runs(self, sandbox: Sandbox) -> None:
        result = sandbox.run_code("#" * 10_000_000 + "\nprint('big')")
        assert result.stdout == "big\n", result

    def test_non_string_code_is_a_type_error(self, sandbox: Sandbox) -> None:
        with pytest.raises(TypeError, match="code must be str"):
            sandbox.run_code(b"print(1)")  # type: ignore[arg-type]

    def test_gather_in_three_separate_event_loops(self, sandbox: Sandbox) -> None:
        async def step(base: int) -> list[ExecResult]:
            return await asyncio.gather(
                *(sandbox.arun_code(f"print({base + i})") for i in range(64))
            )

        for base in (0, 1000, 2000):
            results = asyncio.run(step(base))
            assert [r.stdout for r in results] == [f"{base + i}\n" for i in range(64)]

    def test_run_many_keeps_order(self, sandbox: Sandbox) -> None:
        results = sandbox.run_many([f"print({i} * 2)" for i in range(10)])
        assert [r.stdout for r in results] == [f"{i * 2}\n" for i in range(10)]

    def test_stats_count_every_call(self, backend_id: str) -> None:
        with Sandbox(backend_config(backend_id, timeout=2.0), max_workers=4) as sb:
            sb.run_many(["print(1)", "1/0", "while True: pass", "print(2)"])
            metrics = sb.stats.metrics()
        assert sb.stats.calls == 4
        assert metrics["sandbox/success_rate"] == 0.5
        assert metrics["sandbox/error_rate"] == 0.25
        assert metrics["sandbox/timeout_rate"] == 0.25
        assert metrics["sandbox/latency"] > 0

    # -- stdin ---------------------------------------------------------------------

    def test_stdin_holds_exactly_the_given_bytes(self, sandbox: Sandbox) -> None:
        data = b"first line\nsecond \x00 \xff\n" * 3
        result = sandbox.run_code("import sys\nprint(sys.stdin.buffer.read())", stdin=data)
        assert result.stdout == f"{data!r}\n", result

    def test_stdin_serves_input_and_then_eof(self, sandbox: Sandbox) -> None:
        code = "print(input())\nprint(input())\ntry:\n    input()\nexcept EOFError:\n    print('.')"
        assert sandbox.run_code(code, stdin="a\nb c\n").stdout == "a\nb c\n.\n"

    def test_without_stdin_it_is_empty(self, sandbox: Sandbox) -> None:
        assert sandbox.run_code("import sys\nprint(repr(sys.stdin.read()))").stdout == "''\n"

    def test_large_stdin_is_delivered_whole(self, sandbox: Sandbox) -> None:
        data = bytes(range(256)) * 8192  # 2 MiB, far past a pipe's buffer
        code = "import sys, hashlib\nprint(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())"
        import hashlib

        assert sandbox.run_code(code, stdin=data).stdout == hashlib.sha256(data).hexdigest() + "\n"

    def test_unread_stdin_does_not_hold_the_call(self, sandbox: Sandbox) -> None:
        result = sandbox.run_code("print('done')", stdin=b"x" * (4 * 1024 * 1024))
        assert (result.ok, result.stdout) == (True, "done\n")

    # -- files in, files out -------------------------------------------------------------

    def test_files_are_written_before_and_fetched_after(self, sandbox: Sandbox) -> None:
        code = (
            "import os\n"
            "print(open('in/data.csv').read().upper(), end='')\n"
            "assert open('blob.bin', 'rb').read() == bytes(range(256))\n"
            "os.makedirs('out', exist_ok=True)\n"
            "open('out/result.bin', 'wb').write(bytes(range(255, -1, -1)))\n"
        )
        result = sandbox.run_code(
            code,
            files={"in/data.csv": "a,b\n1,2\n", "blob.bin": bytes(range(256))},
            fetch=["out/result.bin", "./in/data.csv"],
        )
        assert result.ok, result
        assert result.stdout == "A,B\n1,2\n"
        assert result.files == {  # named as asked for
            "out/result.bin": bytes(range(255, -1, -1)),
            "./in/data.csv": b"a,b\n1,2\n",
        }
        assert result.fetch_errors == {}

    def test_uploaded_files_are_in_the_working_directory(self, sandbox: Sandbox) -> None:
        code = "import os\nprint(os.path.isfile('only.txt'), os.path.isdir('sub'))"
        result = sandbox.run_code(code, files={"only.txt": b"1", "sub/x": b"2"})
        assert result.stdout == "True True\n", result

    def test_an_uploaded_module_wins_over_a_preloaded_one_of_its_name(
        self, sandbox: Sandbox
    ) -> None:
        """As under python3, whose working directory comes first on ``sys.path``: the
        Docker zygote's preloaded ``random`` (numpy and sympy import it) was imported
        instead of the call's ``random.py`` (thirty-first round)."""
        files = {
            "random.py": b"MARK = 'module'\n",
            "fractions/__init__.py": b"MARK = 'package'\n",
            "numpy.py": b"MARK = 'numpy'\n",
        }
        code = "import random, fractions, numpy\nprint(random.MARK, fractions.MARK, numpy.MARK)"
        result = sandbox.run_code(code, files=files)
        assert result.stdout == "module package numpy\n", result
        assert sandbox.run_code("import random\nprint(hasattr(random, 'MARK'))").stdout == (
            "False\n"
        )
        # What python3 has imported as it starts, an upload does not shadow (the review:
        # the count of those was lost on the way, and uploads of these names broke them).
        startup = {"sys.py": b"X = 1\n", "builtins.py": b"X = 1\n", "abc.py": b""}
        code = (
            "import sys, builtins, abc, collections.abc\nbuiltins.FOO = 5\n"
            "print(hasattr(sys, 'argv'), FOO, type(collections.abc.Sized) is abc.ABCMeta)"
        )
        assert sandbox.run_code(code, files=startup).stdout == "True 5 True\n"

    def test_a_module_named_agent_is_the_calls_own(self, sandbox: Sandbox) -> None:
        """The Docker zygote held its own package as ``agent``: an uploaded ``agent.py``,
        a common name in tool-use code, lost to it (``ImportError: cannot import name
        'solve'``), and ``import agent`` gave the agent's modules where python3 finds none
        (thirty-seventh round)."""
        files = {"agent.py": b"def solve(x):\n    return x * 2\n"}
        result = sandbox.run_code("from agent import solve\nprint(solve(21))", files=files)
        assert result.stdout == "42\n", result
        package = {"agent/__init__.py": b"MARK = 'package'\n"}
        result = sandbox.run_code("import agent\nprint(agent.MARK)", files=package)
        assert result.stdout == "package\n", result
        alone = sandbox.run_code(
            "try:\n    import agent\nexcept ModuleNotFoundError:\n    print('none')"
        )
        assert alone.stdout == "none\n", alone

    def test_a_script_in_a_folder_imports_from_its_folder_first(self, sandbox: Sandbox) -> None:
        """As ``python3 sub/main.py``: the script's directory is first on ``sys.path``.
        Its neighbours ``sub/random.py`` and ``sub/numpy/__init__.py`` lost to the
        preloaded modules under Docker, and the local backend kept the working directory
        first, so a top-level ``random.py`` won there (thirty-fourth red-team round)."""
        files = {
            "sub/random.py": b"MARK = 'beside the script'\n",
            "sub/numpy/__init__.py": b"MARK = 'package beside'\n",
            "random.py": b"MARK = 'working directory'\n",
        }
        code = (
            "import os, sys, random, numpy\n"
            "print(random.MARK, numpy.MARK, sys.path[0] == os.path.dirname(__file__))"
        )
        request = RunRequest(code=code, timeout=10, files=files, script="sub/main.py")
        result = run_request(sandbox, request)
        assert result.stdout == "beside the script package beside True\n", result
        # A script named like a module imports itself, as python3's does.
        code = "import json\nprint(json.__name__, json.__file__ == __file__)"
        request = RunRequest(code=code, timeout=10, script="sub/json.py")
        result = run_request(sandbox, request)
        assert result.stdout == "json True\n" * 2, result

    def test_an_uploaded_module_wins_over_what_starting_the_agents_archive_imported(
        self, sandbox: Sandbox, backend_id: str
    ) -> None:
        """The Docker agent took python3's own modules as they were when its archive's
        entry ran, after ``runpy`` had imported ``types``, ``functools``, ``collections``
        and more that ``python3 -c`` never has at start: uploads of those names were
        ignored for the zygote's (thirty-third red-team round)."""
        if backend_id == "local":
            pytest.skip("the host's python3 may import these as it starts (its .pth files)")
        names = ["types", "operator", "functools", "warnings", "keyword", "reprlib", "contextlib"]
        files = {f"{name}.py": b"MARK = 'upload'\n" for name in names}
        files["collections/__init__.py"] = b"MARK = 'package'\n"
        modules = ", ".join([*names, "collections"])
        code = f"import {modules}\nprint(*[module.MARK for module in [{modules}]])"
        result = sandbox.run_code(code, files=files)
        assert result.stdout == "upload " * len(names) + "package\n", result
        after = sandbox.run_code("import types, collections\nprint(hasattr(types, 'MARK'))")
        assert after.stdout == "False\n", after

    def test_files_are_fetched_after_an_error_a_timeout_and_os_exit(self, sandbox: Sandbox) -> None:
        write = "open('partial.txt', 'w').write('so far')\n"
        endings = {
            "error": "raise ValueError('late')",
            "os._exit": "import os\nos._exit(0)",
            "timeout": "import time\ntime.sleep(30)",
        }
        for name, ending in endings.items():
            result = sandbox.run_code(write + ending, fetch=["partial.txt"], timeout=1.5)
            assert result.files == {"partial.txt": b"so far"}, (name, result)

    def test_missing_and_special_files_are_fetch_errors(self, sandbox: Sandbox) -> None:
        code = "import os\nos.mkfifo('pipe')\nos.mkdir('adir')"
        started = time.monotonic()
        result = sandbox.run_code(code, fetch=["nope.txt", "pipe", "adir", "adir/x"])
        assert time.monotonic() - started < 5  # a FIFO does not stall the read
        assert result.ok, result
        assert result.files == {}
        assert result.fetch_errors == {  # in the same words on every backend
            "nope.txt": "not found",
            "pipe": "not a regular file",
            "adir": "not a regular file",
            "adir/x": "not found",
        }

    def test_the_fetch_budget_is_kept_where_the_files_are_read(self, sandbox: Sandbox) -> None:
        """A server returning 4 MiB of files had the backend read 32 MiB (twentieth
        red-team round): the budget goes down with the request."""
        code = "open('small', 'wb').write(b'1' * 3000)\nopen('big', 'wb').write(b'2' * 5000)"
        request = RunRequest(code=code, timeout=10.0, fetch=("small", "big"), fetch_budget=4096)
        result = run_request(sandbox, request)
        assert result.files == {"small": b"1" * 3000}, result
        assert result.fetch_errors == {"big": "5000 bytes; 1096 bytes of fetch budget left"}

    def test_a_file_the_code_could_open_is_fetched_through_a_directory_it_cannot_list(
        self, sandbox: Sandbox
    ) -> None:
        """The path is passed through as python3 opening it passes: a directory made
        execute-only refused the fetch under Docker (the thirty-third round)."""
        code = (
            "import os\nos.makedirs('d/e')\nopen('d/e/f', 'w').write('kept')\n"
            "os.chmod('d/e', 0o311)\nos.chmod('d', 0o111)\nprint(open('d/e/f').read())"
        )
        result = sandbox.run_code(code, fetch=["d/e/f"])
        assert (result.stdout, result.files, result.fetch_errors) == (
            "kept\n",
            {"d/e/f": b"kept"},
            {},
        )

    def test_fetched_files_are_named_as_the_call_asked_for_them(self, sandbox: Sandbox) -> None:
        """Keyed by the normal form, ``./out.txt`` was in neither ``files`` nor
        ``fetch_errors`` (the thirty-fourth round): a present answer scored missing.
        A path ending in ``/`` names a directory, as to ``open()``: refused up front."""
        code = "import os\nos.mkdir('sub')\nopen('out.txt', 'w').write('A')\n"
        code += "open('sub/x', 'w').write('B')"
        asked = ["./out.txt", "out.txt", "sub//x", "./sub/./x", "./gone", "\udcff"]
        result = sandbox.run_code(code, fetch=asked)
        assert result.files == {
            "./out.txt": b"A",
            "out.txt": b"A",
            "sub//x": b"B",
            "./sub/./x": b"B",
        }
        # (a name no UTF-8 can hold too: the review found it under "?" on Docker)
        assert result.fetch_errors == {"./gone": "not found", "\udcff": "not found"}
        for directory in ("out.txt/", "sub/.", "sub//"):
            with pytest.raises(ConfigError, match="names a directory"):
                sandbox.run_code(code, fetch=[directory])

    def test_a_link_is_not_followed_when_fetched(self, sandbox: Sandbox) -> None:
        code = "import os\nos.symlink('/etc/hostname', 'link')\nos.symlink('.', 'up')"
        result = sandbox.run_code(code, fetch=["link", "up/link"])
        assert result.files == {}
        refused = "a symbolic link or non-directory is in the way; not followed"
        assert result.fetch_errors == {"link": refused, "up/link": refused}

    # -- the end of the interpreter, as python3's --------------------------------------

    def test_the_end_calls_no_gc_callbacks_and_warns_from_sys_as_python3(
        self, sandbox: Sandbox
    ) -> None:
        """python3's finalization collects without the code's ``gc.callbacks`` and warns
        from no frame (``sys:1``, printed without the tracemalloc hint). The Docker end ran
        the callbacks (one that exited made a traceback's call ``success``) and named the
        agent's file for an unclosed file's warning (thirty-fourth red-team round)."""
        code = (
            "import gc, os\ngc.disable()\ngc.callbacks.append(lambda phase, info: os._exit(0))\n1/0"
        )
        result = sandbox.run_code(code)
        assert (result.outcome, result.returncode) == (Outcome.ERROR, 1), result
        code = (
            "import warnings\nwarnings.simplefilter('always')\n"
            "f = open('x.txt', 'w')\nf.write('hi')\nprint('done')"
        )
        result = sandbox.run_code(code, fetch=["x.txt"])  # (local: in a directory of its own)
        assert (result.stdout, result.stderr) == (
            "done\n",
            "sys:1: ResourceWarning: unclosed file <_io.TextIOWrapper name='x.txt' mode='w' "
            "encoding='UTF-8'>\n",
        ), result

    @pytest.mark.parametrize(
        ("code", "returncode", "stdout"),
        [
            (ANSWERED + "sys.stdout = io.StringIO()\nprint('x')", 0, "ANSWER 42\n"),
            (ANSWERED + "sys.stdout = open(os.devnull, 'w')", 0, "ANSWER 42\n"),
            (ANSWERED + "sys.stdout = None", 0, "ANSWER 42\n"),
            (ANSWERED + "sys.stdout = sys.stderr\nprint('x')", 0, "ANSWER 42\n"),
            (ANSWERED + "sys.stdout = io.StringIO(); del sys.__stdout__", 0, "ANSWER 42\n"),
            (ANSWERED + "sys.stdout = os.fdopen(1, 'w')\nprint('after')", 0, "after\n"),
            (ANSWERED + "del sys.stdout\nraise SystemExit(3)", 3, "ANSWER 42\n"),
            ("import sys\ndel sys.stderr\nprint('A')", 0, "A\n"),
            (ANSWERED + "import atexit\natexit.register(delattr, sys, 'stdout')", 0, "ANSWER 42\n"),
            ("import os\nos.close(1)\nprint('x')", 120, ""),
            (COUNTED_FLUSHES + "sys.stdout = W(1); sys.__stdout__ = W(2)\nprint('x')", 0, "1\n"),
            (ANSWERED + DROPPED + "os.write(1, b'B\\n')", 0, "ANSWER 42\nB\n"),
            (FAILING_STDOUT + "raise KeyboardInterrupt", -2, "x\n"),
            (FAILING_STDOUT.replace("print('x'); sys.stdout = W()", "sys.stdout = V()"), 0, ""),
            (FAILING_STDOUT + "raise SystemExit(3)", 120, "x\n"),
        ],
        ids=[
            "string-io", "devnull", "none", "stderr", "original-deleted", "fdopen-1",
            "deleted-exit-3", "stderr-deleted", "deleted-at-exit", "descriptor-closed",
            "flushed-once", "dropped-in-order", "interrupted", "stderr-swapped-in-flush",
            "flush-fails",
        ],
    )  # fmt: skip
    def test_what_was_printed_before_the_streams_were_replaced_ends_as_in_python3(
        self, sandbox: Sandbox, backend_id: str, code: str, returncode: int, stdout: str
    ) -> None:
        """python3 writes what its own stdout holds as that object is finalized, even after
        the code replaced ``sys.stdout``, and ends 120 if a flush at its end fails. The
        agent flushed only what ``sys.stdout`` named at the end: the answer printed before
        the swap was lost, and a deleted stream ended the call as the sandbox's failure
        (status 70; twenty-eighth red-team round). Expected: the image's python3's own
        results (``docker run ... python3 -c``); the local backend's child is this
        machine's python3 in this environment (``PYTHONUNBUFFERED`` changes two cases),
        so it is compared with that."""
        if backend_id == "local":
            ran = subprocess.run(
                [sys.executable, "-c", code], check=False, capture_output=True, timeout=30
            )
            returncode, stdout = ran.returncode, ran.stdout.decode()
        result = sandbox.run_code(code)
        assert (result.returncode, result.stdout) == (returncode, stdout), result

    def test_a_failing_flush_at_the_end_is_reported_as_python3_reports_it(
        self, sandbox: Sandbox
    ) -> None:
        result = sandbox.run_code(FAILING_STDOUT)
        assert result.returncode == 120, result
        assert result.stderr.startswith("Exception ignored in: <__main__.W object at "), result
        assert result.stderr.endswith(", in flush\nOSError: no\n"), result
        assert "agent" not in result.stderr, result
        hooked = sandbox.run_code(
            FAILING_STDOUT + "import os, traceback\n"
            "sys.unraisablehook = lambda a: os.write(2, ''.join(traceback.format_exception("
            "a.exc_type, a.exc_value, a.exc_value.__traceback__)).encode())\n"
        )
        assert hooked.returncode == 120, hooked
        assert "in flush\nOSError: no\n" in hooked.stderr, hooked
        assert "agent" not in hooked.stderr, hooked  # (the report's own traceback, review)

    @pytest.mark.parametrize(
        ("code", "stdout"),
        [
            (
                "class Resource:\n"
                "    def __del__(self):\n"
                "        print('released')\n"
                "r = Resource()\n"
                "print('working')",
                "working\nreleased\n",
            ),
            (
                "def numbers():\n"
                "    try:\n"
                "        yield 1\n"
                "    finally:\n"
                "        print('closed')\n"
                "g = numbers()\n"
                "next(g)\n"
                "print('working')",
                "working\nclosed\n",
            ),
            (
                "import json\n"
                "class Report:\n"
                "    def __init__(self):\n"
                "        self.me, self.items = self, [42]\n"
                "    def __del__(self):\n"
                "        print('report:', json.dumps(self.items))\n"
                "r = Report()\n"
                "print('done')",
                "done\nreport: [42]\n",
            ),
            (  # __main__ dropped, nothing imported: the end still collects (review)
                "import sys\n"
                "class A:\n"
                "    def __del__(self):\n"
                "        print('bye')\n"
                "x = A()\n"
                "sys.modules['__main__'] = None\n"
                "print('done')",
                "done\nbye\n",
            ),
        ],
        ids=["__del__", "generator-finally", "cycle-sees-its-globals", "main-dropped"],
    )
    def test_what_the_code_holds_is_finalized_at_its_end(
        self, sandbox: Sandbox, code: str, stdout: str
    ) -> None:
        """python3 finalizes ``__main__`` after the at-exit functions: what only it held
        first, its globals intact, then what is left; the Docker agent's ``os._exit``
        skipped it, and its first emulation cleared the globals first (twentieth and
        twenty-second red-team rounds). Expected: python3's own output."""
        result = sandbox.run_code(code)
        assert (result.outcome, result.stdout, result.stderr) == (Outcome.SUCCESS, stdout, ""), (
            result
        )

    @pytest.mark.parametrize(
        ("code", "stdout"),
        [
            (
                "import threading, time\n"
                "def late():\n"
                "    time.sleep(0.3)\n"
                "    print('late')\n"
                "threading.Thread(target=late).start()\n"
                "print('main')",
                "main\nlate\n",
            ),
            (
                "from concurrent.futures import ThreadPoolExecutor\n"
                "pool = ThreadPoolExecutor(2)\n"
                "print(pool.submit(pow, 2, 10).result())",
                "1024\n",
            ),
        ],
        ids=["a-thread-outlives-main", "an-executor-left-open"],
    )
    def test_threads_end_as_in_python3(self, sandbox: Sandbox, code: str, stdout: str) -> None:
        """An executor the code did not shut down kept the Docker call to its time limit
        (its workers wait for python3's threading atexits, which the agent did not run)."""
        started = time.monotonic()
        result = sandbox.run_code(code, timeout=8)
        assert (result.outcome, result.stdout) == (Outcome.SUCCESS, stdout), result
        assert time.monotonic() - started < 5

    def test_a_deleted_excepthook_is_reported_as_python3_reports_it(self, sandbox: Sandbox) -> None:
        result = sandbox.run_code("import sys\ndel sys.excepthook\nraise ValueError('v')")
        assert result.returncode == 1
        assert result.stderr.startswith("sys.excepthook is missing\nTraceback"), result
        assert result.stderr.endswith("ValueError: v\n"), result

    @pytest.mark.parametrize(
        ("code", "returncode", "stdout", "stderr"),
        [
            (
                "import sys\n"
                "def h(e, a):\n"
                "    if e in ('sys.settrace', 'sys.setprofile'): raise RuntimeError('no')\n"
                "sys.addaudithook(h)\n"
                "raise ValueError('v')",
                1, "", 'Traceback (most recent call last):\n  File "<sandbox>", line 5, in '
                "<module>\nValueError: v\n",
            ),
            (
                "import sys\n"
                "sys.addaudithook(lambda e, a: e.startswith('sys.set') and print(e))\n"
                "print('ok')",
                0, "ok\n", "",
            ),
            (TRACER.format(write="print('T', f.f_code.co_name)") + "print('x')", 0, "x\n", ""),
            (
                "import atexit\natexit.register(lambda: print('at exit'))\n"
                + TRACER.format(write="sys.stderr.write(f'T {f.f_code.co_name}\\n')")
                + "print('x')",
                0, "x\nat exit\n", "T <lambda>\n",
            ),
            (
                PROFILED, 0, "x\natexit fn\n",
                "P c_call print\nP c_return print\nP return <module>\n"
                "P call ex\nP c_call print\nP c_return print\nP return ex\n",
            ),
            (TRACER.format(write="raise RuntimeError('boom')") + "print('x')", 0, "x\n", ""),
            ("import builtins\nbuiltins.vars = None\nprint('answer 42')", 0, "answer 42\n", ""),
            ("import builtins\nbuiltins.getattr = None\n1/0", 1, "", DIVISION_BY_ZERO_LINE_3),
            (
                "import builtins, sys\nbuiltins.isinstance = lambda *a: False\nsys.exit(0)",
                0, "", "",
            ),
            (
                "import builtins, sys\n_print = print\n"
                "builtins.print = lambda *a, **k: _print('LOG', *a, **k)\nsys.exit('failed')",
                1, "", "failed\n",
            ),
            ("import sys\nsys.stderr = None\nsys.exit('ANSWER')", 1, "", "ANSWER\n"),
            (
                "import sys\nclass C:\n    def __str__(self): raise ValueError\nsys.exit(C())",
                1, "", "\n",
            ),
            (
                "import threading, time\n"
                "def b(): time.sleep(0.3); print('answer from B')\n"
                "def a(): time.sleep(0.2); threading.Thread(target=b).start()\n"
                "threading.Thread(target=a).start()\n"
                "print('main done')",
                0, "main done\nanswer from B\n", "",
            ),
            (
                "import threading, time\n"
                "class T(threading.Thread):\n"
                "    def run(self): time.sleep(0.3); print('answer 42')\n"
                "    def join(self, timeout=None): return None\n"
                "T().start()",
                0, "answer 42\n", "",
            ),
            (
                "import threading\n"
                "def w():\n"
                "    threading.main_thread().join()\n"
                "    print('after main')\n"
                "threading.Thread(target=w).start()\n"
                "print('main done')",
                0, "main done\nafter main\n", "",
            ),
            (
                "import atexit, sys\n"
                "atexit.register(lambda: print('last', getattr(sys, 'last_type', None)))\n"
                "1/0",
                1, "last <class 'ZeroDivisionError'>\n", DIVISION_BY_ZERO_LINE_3,
            ),
            ("import sys\nprint(hasattr(sys, 'last_value'))", 0, "False\n", ""),
            ("import os\nos._exit = lambda *a: None\nprint(42)", 0, "42\n", ""),
            (
                "import sys\n"
                "def h(event, args):\n"
                "    if event == 'sys.excepthook': raise RuntimeError('no')\n"
                "sys.addaudithook(h)\n"
                "1/0",
                1, "", "",
            ),
            (
                "import atexit, sys\n"
                "atexit.register(lambda: print('last', getattr(sys, 'last_type', None)))\n"
                "class D:\n"
                "    def __del__(self): print('del', sys.last_value)\n"
                "d = D()\n"
                "1/0",
                1, "last <class 'ZeroDivisionError'>\ndel None\n",
                'Traceback (most recent call last):\n  File "<sandbox>", line 6, in <module>\n'
                "ZeroDivisionError: division by zero\n",
            ),
        ],
        ids=[
            "audit-hook-refuses-tracing", "audit-hook-sees-no-tracing",
            "tracer-left-on", "tracer-sees-an-at-exit-function", "profiler-left-on",
            "tracer-raises", "vars-replaced", "getattr-replaced", "isinstance-replaced",
            "print-replaced", "exit-message-without-stderr", "exit-message-unprintable",
            "thread-started-late", "join-overridden", "thread-joins-main", "last-value-at-exit",
            "no-last-value-at-start", "os-exit-replaced", "audit-hook-refuses-the-hook",
            "last-values-released-at-the-end",
        ],
    )  # fmt: skip
    def test_the_end_is_python3_s_whatever_the_code_changed(  # noqa: PLR0917 - the table's
        self,
        sandbox: Sandbox,
        backend_id: str,
        code: str,
        returncode: int,
        stdout: str,
        stderr: str,
    ) -> None:
        """The end of a Docker call is the agent's Python, run in the interpreter the code
        changed: a tracer left on saw the agent's functions and, raising, ended the call
        with status 70; a builtin set to None lost a printed answer; the agent joined only
        the threads alive as the end began, through a ``join`` the code could override; an
        exit message went to stdout without ``sys.stderr``; ``sys.last_value`` was never
        set (twenty-ninth red-team round). Expected: the image's python3's own results
        (``docker run ... python3 -c``, ``<string>`` read as ``<sandbox>``). The local
        backend runs the code under the seed's bootstrap in the same interpreter, whose own
        frame a profiler sees return."""
        if backend_id == "local" and code == PROFILED:
            pytest.skip("the local backend's bootstrap frame returns under the profiler")
        result = sandbox.run_code(code)
        assert (result.returncode, result.stdout, result.stderr) == (returncode, stdout, stderr)

    def test_a_join_the_code_overrode_does_not_end_its_threads(self, sandbox: Sandbox) -> None:
        """python3 waits for every thread that is not a daemon, not through its ``join``: a
        worker that only an overridden ``join`` would stop keeps python3 running until its
        time limit. The agent called that ``join``, and the call was a success."""
        code = (
            "import queue, threading\n"
            "tasks = queue.Queue()\n"
            "class Worker(threading.Thread):\n"
            "    def run(self):\n"
            "        while tasks.get() is not None:\n"
            "            print('task')\n"
            "    def join(self, timeout=None):\n"
            "        tasks.put(None)\n"
            "Worker().start()\n"
            "tasks.put(1)\n"
            "print('main done')"
        )
        result = sandbox.run_code(code, timeout=2)
        assert result.outcome == Outcome.TIMEOUT, result

    @pytest.mark.parametrize(
        "code",
        [
            "lines = ['log = open(\"answer.txt\", \"w\")', 'log.write(\"42\")', 'def f():',"
            " '    return log']\n"
            "open('helper.py', 'w').write('\\n'.join(lines) + '\\n')\n"
            "import helper",
            "class Box:\n"
            "    pass\n"
            "b = Box()\n"
            "b.inner = Box()\n"
            "b.inner.inner = Box()\n"
            "b.inner.inner.f = open('answer.txt', 'w')\n"
            "b.inner.inner.f.write('42')\n"
            "def helper():\n"
            "    return b",
            # A module deleted from sys.modules first: the agent's end then reads every
            # name (zygote.ModulesAtStart), and still finds the call's own module.
            "import sys\n"
            "del sys.modules['os']\n"
            'lines = [\'log = open("answer.txt", "w")\', \'log.write("42")\']\n'
            "open('helper.py', 'w').write('\\n'.join(lines) + '\\n')\n"
            "import helper",
            # Held by a class attribute, and by a closure (twenty-seventh red-team round).
            "open('helper.py', 'w').write('class C:\\n  f = open(\"answer.txt\", \"w\")\\n"
            'C.f.write("42")\\n\')\n'
            "import helper",
            "open('helper.py', 'w').write('def make():\\n  f = open(\"answer.txt\", \"w\")\\n"
            '  f.write("42")\\n  return lambda: f\\nheld = make()\\n\')\n'
            "import helper",
            # Not a module: python3 sets every entry of sys.modules to None (review).
            "import sys\n"
            "f = open('answer.txt', 'w')\n"
            "f.write('42')\n"
            "sys.modules['holder'] = f\n"
            "del f",
        ],
        ids=[
            "an-imported-module-beside-a-function",
            "three-levels-down",
            "after-a-deletion",
            "a-class-attribute",
            "a-closure",
            "held-by-sys-modules",
        ],
    )
    def test_a_file_held_further_away_is_flushed_too(self, sandbox: Sandbox, code: str) -> None:
        result = sandbox.run_code(code, fetch=["answer.txt"])
        assert result.files == {"answer.txt": b"42"}, result

    @pytest.mark.parametrize(
        "change",
        [
            "class Modules(dict):\n"
            "    def __reversed__(self):\n"
            "        while True:\n"
            "            yield 'zz'\n"
            "    def get(self, *args):\n"
            "        while True:\n"
            "            pass\n"
            "sys.modules = Modules(sys.modules)",
            "class Name(str):\n"
            "    def __eq__(self, other):\n"
            "        while True:\n"
            "            pass\n"
            "    __hash__ = str.__hash__\n"
            "sys.modules[Name('evil')] = helper",
            "sys.modules = None",
            "import types\n"
            "big = [0] * 10000\n"
            "for i in range(20000):\n"
            "    extra = types.ModuleType(f'extra{i}')\n"
            "    extra.big = big\n"
            "    sys.modules[f'extra{i}'] = extra",
        ],
        ids=["a-dict-subclass", "a-looping-key", "rebound-to-none", "twenty-thousand-modules"],
    )
    def test_the_end_runs_none_of_the_codes_methods_on_its_modules(
        self, sandbox: Sandbox, change: str
    ) -> None:
        """python3 finalizes its own module dict at the end, without the code's methods;
        the Docker agent's end ran them (a loop until the time limit, or an unbounded
        list: "oom"), or lost a file's text, as the twenty-seventh red-team round found."""
        code = (
            "import sys\n"
            "open('helper.py', 'w').write('log = open(\"answer.txt\", \"w\")\\n"
            'log.write("42")\\n\')\n'
            "import helper\n" + change + "\nprint('x')"
        )
        result = sandbox.run_code(code, timeout=10, fetch=["answer.txt"])
        assert (result.outcome, result.stdout) == (Outcome.SUCCESS, "x\n"), result
        assert result.files == {"answer.txt": b"42"}, result

    def test_a_finalizer_that_ends_the_process_chooses_its_status(self, sandbox: Sandbox) -> None:
        code = (
            "import os\n"
            "class Guard:\n"
            "    def __init__(self):\n"
            "        self.me = self\n"
            "    def __del__(self):\n"
            "        os._exit(0)\n"
            "g = Guard()\n"
            "raise ValueError('x')"
        )
        result = sandbox.run_code(code)
        assert (result.returncode, result.stdout) == (0, ""), result
        assert result.stderr.endswith("ValueError: x\n"), result

    @pytest.mark.parametrize(
        "code",
        [
            "f = open('answer.txt', 'w')\nf.write('42')",
            "f = open('answer.txt', 'w')\nf.write('42')\ndef helper():\n    return f",
            "files = [open('answer.txt', 'w')]\nfiles[0].write('42')\ndef helper():\n    pass",
            "class Holder:\n"
            "    def __init__(self):\n"
            "        self.me, self.file = self, open('answer.txt', 'w')\n"
            "        self.file.write('42')\n"
            "h = Holder()",
            "open('helper.py', 'w').write(\"f = open('answer.txt', 'w'); f.write('42')\")\n"
            "import helper",
        ],
        ids=["global", "beside-a-function", "in-a-list", "in-a-cycle", "in-an-imported-module"],
    )
    def test_a_file_left_open_is_flushed_before_it_is_fetched(
        self, sandbox: Sandbox, code: str
    ) -> None:
        """python3 writes what a file left open buffered, wherever ``__main__`` (or a
        module it imported) holds it; a grader fetching it read it empty on Docker."""
        result = sandbox.run_code(code, fetch=["answer.txt"])
        assert result.files == {"answer.txt": b"42"}, result

    def test_an_excepthook_that_exits_chooses_the_status(self, sandbox: Sandbox) -> None:
        code = "import sys\nsys.excepthook = lambda *a: sys.exit(5)\nraise ValueError('v')"
        result = sandbox.run_code(code)
        assert (result.returncode, result.stdout, result.stderr) == (5, "", ""), result

    def test_a_failing_unraisable_hook_at_the_end_shows_nothing_of_the_sandbox(
        self, sandbox: Sandbox
    ) -> None:
        """The agent's wrapper around the code's hook, its repr and its path in the agent's
        archive, reached the observation (twenty-second red-team round); python3 shows
        nothing here."""
        code = (
            "import sys\n"
            "def hook(unraisable):\n"
            "    raise RuntimeError('my hook is buggy')\n"
            "sys.unraisablehook = hook\n"
            "class A:\n"
            "    def __del__(self):\n"
            "        raise ValueError('boom')\n"
            "a = A()\n"
            "a.me = a\n"
            "print('end')"
        )
        result = sandbox.run_code(code)
        assert (result.stdout, result.stderr) == ("end\n", ""), result

    def test_code_that_deletes_the_unraisable_hook_ends_as_usual(self, sandbox: Sandbox) -> None:
        result = sandbox.run_code("import sys\ndel sys.unraisablehook\nprint('hi')")
        assert (result.outcome, result.stdout, result.stderr) == (Outcome.SUCCESS, "hi\n", "")

    def test_an_exception_whose_str_ends_the_process_keeps_the_header_python3_wrote(
        self, sandbox: Sandbox
    ) -> None:
        """The Docker agent's traceback left in one write: an exception whose ``__str__``
        ended the process lost the header and the frame lines python3 had written, and one
        whose ``__str__`` wrote showed that first (thirty-second round's review)."""
        code = (
            "class E(Exception):\n"
            "    def __str__(self):\n"
            "        import os\n"
            "        os._exit(3)\n"
            "raise E()"
        )
        result = sandbox.run_code(code)
        assert result.returncode == 3, result
        # (and the class's name, unflushed, where stderr is line-buffered as in the image)
        assert result.stderr.startswith(
            'Traceback (most recent call last):\n  File "<sandbox>", line 5, in <module>\n'
        ), result
        writes = code.replace("import os", "import sys").replace(
            "os._exit(3)", "sys.stderr.write('inside\\n')\n        return 'm'"
        )
        result = sandbox.run_code(writes)
        assert result.stderr.replace("__main__.E", "E") == (  # (3.9 names the module)
            'Traceback (most recent call last):\n  File "<sandbox>", line 6, in <module>\n'
            "Einside\n: m\n"
        ), result

    def test_a_traceback_whose_source_lines_the_code_hooked_prints_as_python3s(
        self, sandbox: Sandbox
    ) -> None:
        """The default hook opens each frame's file through ``io.open``, which the code may
        replace: the Docker agent's one write put what that wrote before the traceback's
        header (and lost the header to an ``os._exit``; the review of the thirty-third
        round). python3 writes the lines before it as it goes."""
        code = (
            "import io, os, random\n"
            "real = io.open\n"
            "def hooked(*a, **k):\n"
            "    os.write(2, b'HOOK\\n')\n"
            "    return real(*a, **k)\n"
            "io.open = hooked\n"
            "random.choice([])"
        )
        result = sandbox.run_code(code)
        assert result.returncode == 1, result
        header = 'Traceback (most recent call last):\n  File "<sandbox>", line 7, in <module>\n'
        assert result.stderr.startswith(header), result
        assert "HOOK\n" in result.stderr, result  # (3.9 also looks for "<sandbox>": more)
        assert result.stderr.splitlines()[-1].startswith("IndexError: "), result

    def test_a_hooks_exception_whose_class_answers_for_itself_is_reported_as_python3_does(
        self, sandbox: Sandbox
    ) -> None:
        """The agent read the hook's exception's ``__traceback__`` as an attribute: a
        property that raised ``SystemExit`` there left nothing printed (the review of the
        thirty-third round); python3 reads the C slot."""
        code = (
            "import sys\n"
            "class H(Exception):\n"
            "    @property\n"
            "    def __traceback__(self):\n"
            "        raise SystemExit(0)\n"
            "def hook(*a):\n"
            "    raise H('hook')\n"
            "sys.excepthook = hook\n"
            "raise ValueError('v')"
        )
        result = sandbox.run_code(code)
        assert (result.outcome, result.returncode) == (Outcome.ERROR, 1), result
        assert result.stderr.replace("__main__.H", "H") == (  # (3.9 names the module)
            "Error in sys.excepthook:\n"
            "Traceback (most recent call last):\n"
            '  File "<sandbox>", line 7, in hook\n'
            "H: hook\n"
            "\n"
            "Original exception was:\n"
            "Traceback (most recent call last):\n"
            '  File "<sandbox>", line 9, in <module>\n'
            "ValueError: v\n"
        ), result

    def test_a_failing_excepthook_is_reported_as_python3_reports_it(self, sandbox: Sandbox) -> None:
        code = "import sys\nsys.excepthook = lambda *a: 1/0\nraise ValueError('v')"
        result = sandbox.run_code(code)
        assert (result.outcome, result.returncode) == (Outcome.ERROR, 1)
        assert result.stderr == (
            "Error in sys.excepthook:\n"
            "Traceback (most recent call last):\n"
            '  File "<sandbox>", line 2, in <lambda>\n'
            "ZeroDivisionError: division by zero\n"
            "\n"
            "Original exception was:\n"
            "Traceback (most recent call last):\n"
            '  File "<sandbox>", line 3, in <module>\n'
            "ValueError: v\n"
        ), result

    def test_an_at_exit_function_s_exception_shows_no_frame_of_the_sandbox(
        self, sandbox: Sandbox
    ) -> None:
        """The agent's ``_finish`` frame, with its path in the agent's archive, reached
        this observation; the rest is the interpreter's own (3.10 and later report an
        at-exit function's SystemExit, 3.9 ignores it: a foreign image may run 3.9)."""
        code = "import atexit, sys\natexit.register(sys.exit, 6)\n1/0"
        result = sandbox.run_code(code)
        assert (result.outcome, result.returncode) == (Outcome.ERROR, 1)
        traceback = (
            "Traceback (most recent call last):\n"
            '  File "<sandbox>", line 3, in <module>\n'
            "ZeroDivisionError: division by zero\n"
        )
        reported = "Exception ignored in atexit callback: <built-in function exit>\nSystemExit: 6\n"
        assert result.stderr in (traceback, traceback + reported), result

    def test_the_std_streams_are_python3_s(self, sandbox: Sandbox, backend_id: str) -> None:
        code = (
            "import sys\n"
            "streams = (sys.stdin, sys.stdout, sys.stderr)\n"
            "print([(s.name, s.mode, s.encoding) for s in streams])\n"
            "print(sys.stderr.errors)"
        )
        result = sandbox.run_code(code)
        assert result.stdout == (
            "[('<stdin>', 'r', 'utf-8'), ('<stdout>', 'w', 'utf-8'), ('<stderr>', 'w', 'utf-8')]"
            "\nbackslashreplace\n"
        ), result
        if backend_id == "local":
            return  # the host's locale decides the rest there
        # python3 in the image (C.UTF-8) reads and writes bytes that are not UTF-8.
        result = sandbox.run_code("print(input())", stdin=b"caf\xe9\n")
        assert (result.outcome, result.stdout) == (Outcome.SUCCESS, "caf\ufffd\n"), result

    def test_stdin_keeps_its_line_endings_as_python3_s(self, sandbox: Sandbox) -> None:
        """python3's stdin splits lines at "\\n" only and keeps "\\r": the agent's turned
        "\\r\\n" into "\\n", and a real client's check of ``len(input())`` on a dataset with
        CRLF input came out the other way (twenty-eighth red-team round, verl's reward path)."""
        code = "import sys\ns = input()\nprint(len(s), repr(sys.stdin.read()))"
        result = sandbox.run_code(code, stdin=b"abc\r\na\rb\r\n")
        assert result.stdout == "4 'a\\rb\\r\\n'\n", result
        result = sandbox.run_code("import sys\nprint(repr(sys.stdin.newlines), end='')")
        assert result.stdout == "None", result

    def test_a_deep_tree_keeps_the_codes_own_outcome_and_is_removed(
        self, sandbox: Sandbox, backend_id: str
    ) -> None:
        """The local backend's cleanup recursed: 3000 nested directories raised RecursionError
        out of run_code (a sandbox_error over the server) and left the directory on the host
        (thirteenth red-team round)."""
        code = (
            "import os, sys\n"
            "print(os.getcwd())\n"
            "with open('out.txt', 'w') as f:\n"
            "    f.write('kept')\n"
            "for _ in range(3000):\n"
            "    os.mkdir('d')\n"
            "    os.chdir('d')\n"
            "os.chmod('.', 0)\n"
            "sys.exit(3)\n"
        )
        result = sandbox.run_code(code, fetch=["out.txt"])
        assert (result.outcome, result.returncode) == (Outcome.ERROR, 3), result
        assert result.files == {"out.txt": b"kept"}, result
        if backend_id == "local":  # removed off the result's path, before close() ends
            sandbox.backend._removals.wait()  # type: ignore[attr-defined]
            assert not os.path.exists(result.stdout.strip())

    def test_symlinks_planted_by_the_code_are_not_followed(self, sandbox: Sandbox) -> None:
        code = (
            "import os\n"
            "os.symlink('/etc/passwd', 'leak.txt')\n"
            "os.symlink('/etc', 'etcdir')\n"
            "os.symlink(os.path.abspath('..'), 'up')\n"
            "os.makedirs('real')\n"
            "os.symlink('/etc/hostname', 'real/inner')\n"
        )
        wanted = ["leak.txt", "etcdir/hostname", "up/x", "real/inner"]
        result = sandbox.run_code(code, fetch=wanted)
        assert result.files == {}, result
        assert set(result.fetch_errors) == set(wanted)

    def test_output_cannot_forge_fetched_files(self, sandbox: Sandbox) -> None:
        code = (
            "import base64, json, os\n"
            "record = {'kind': 'files', 'files': {'f': base64.b64encode(b'forged').decode()}}\n"
            "print('<<retool-exec:0000>>' + json.dumps(record) + '<<end:0000>>', flush=True)\n"
            "os._exit(0)\n"
        )
        result = sandbox.run_code(code, fetch=["f"])
        assert result.files == {}
        assert set(result.fetch_errors) == {"f"}

    def test_bad_paths_are_refused_before_anything_runs(self, sandbox: Sandbox) -> None:
        from retool_exec import ConfigError

        for files in ({"../x": b""}, {"/etc/x": b""}, {"a": b"", "a/b": b""}):
            with pytest.raises(ConfigError):
                sandbox.run_code("print(1)", files=files)
        with pytest.raises(ConfigError):
            sandbox.run_code("print(1)", fetch=["../../etc/passwd"])

    # -- notebook cells ------------------------------------------------------------------

    def test_cells_share_one_namespace_with_output_apart(self, sandbox: Sandbox) -> None:
        result = run_cells(
            sandbox,
            "a = 123",
            "a",
            "print(a)",
            "import sys; sys.stderr.write('stderr message')",
            "raise RuntimeError('error message')",
            "a + 1",
            "None",
        )
        assert result.ok, result
        cells = result.cells
        assert len(cells) == 7
        assert all(cell.finished and not cell.timed_out for cell in cells)
        assert (cells[0].stdout, cells[0].stderr, cells[0].display, cells[0].error) == (
            "",
            "",
            [],
            [],
        )
        assert cells[1].display == [{"text/plain": "123"}]
        assert cells[2].stdout == "123\n"
        assert cells[3].stderr == "stderr message"
        [error] = cells[4].error
        assert (error["ename"], error["evalue"]) == ("RuntimeError", "error message")
        assert cells[4].stderr == ""  # as in Jupyter: the traceback is the error, not stderr
        assert 'File "<cell 5>", line 1' in "".join(error["traceback"])
        assert cells[5].display == [{"text/plain": "124"}]
        assert cells[6].display == []

    def test_a_notebook_s_own_streams_hold_what_was_written_outside_every_cell(
        self, sandbox: Sandbox
    ) -> None:
        """The server's ``driver``: the Docker agent joined every cell's output there, the
        local backend kept only what came outside the cells (twentieth red-team round)."""
        result = run_cells(
            sandbox,
            "x = 5",
            "print('x is', x)",
            "import atexit, sys\nsys.stderr.write('careful\\n')\n"
            "atexit.register(print, 'at exit')\nx * 2",
        )
        assert [cell.stdout for cell in result.cells] == ["", "x is 5\n", ""]
        assert result.cells[2].stderr == "careful\n"
        assert (result.ok, result.stdout, result.stderr) == (True, "at exit\n", ""), result

    def test_a_cell_that_replaced_its_stdout_keeps_what_it_printed(self, sandbox: Sandbox) -> None:
        """What a cell printed before it replaced ``sys.stdout`` was written later, into
        the next cell's output (twenty-eighth red-team round)."""
        result = run_cells(
            sandbox, "import sys, io\nprint('ANSWER 42')\nsys.stdout = io.StringIO()", "print(2)"
        )
        first, second = result.cells
        assert first.stdout == "ANSWER 42\n", result
        assert "ANSWER" not in second.stdout, result

    def test_a_cell_with_a_traceback_over_a_mebibyte_is_its_error_and_the_next_runs(
        self, sandbox: Sandbox
    ) -> None:
        """A failed ``assert`` printing a long list made a cell's end too large for the
        events pipe: the interpreter was killed and the later cells lost (twenty-eighth
        red-team round). Now the record's lines are cut to fit (``zygote.fitted_frame``)."""
        result = run_cells(
            sandbox,
            "x = 42",
            "data = list(range(300_000))\nassert data == [], f'unexpected: {data}'",
            "raise ValueError('\\U0001F600' * 600_000)",
            "print(x)",
            timeout=30.0,
        )
        assert [cell.finished for cell in result.cells] == [True] * 4, result
        assert [[error["ename"] for error in cell.error] for cell in result.cells] == [
            [],
            ["AssertionError"],
            ["ValueError"],
            [],
        ]
        assert result.cells[3].stdout == "42\n"

    def test_each_cell_keeps_the_tail_of_its_output_it_was_given(self, sandbox: Sandbox) -> None:
        """``cell_output_chars`` cuts where the output is captured: a server showing each of
        128 cells a share of 4096 characters held 1 MiB a stream for each."""
        request = RunRequest(
            code="",
            cells=("print('a' * 500 + 'END')", "import sys; sys.stderr.write('b' * 50)"),
            cell_output_chars=100,
            timeout=10.0,
        )
        result = run_request(sandbox, request)
        first, second = result.cells
        assert first.stdout.startswith("[... truncated "), first  # the seed's marker
        assert first.stdout.endswith("]\n" + "a" * 96 + "END\n"), first
        assert first.stdout_dropped_chars == 404
        assert (second.stderr, second.stderr_dropped_chars) == ("b" * 50, 0)

    def test_a_long_value_and_error_keep_their_ends_with_the_count_cut(
        self, sandbox: Sandbox
    ) -> None:
        """A cell's value and exception are cut as its output is (the seed's marker, the
        tail, the exact count): the Docker agent kept a value's first 65,536 characters
        unmarked and an exception's first 4,096, which a server then cut from the middle
        and counted wrong (red team, the thirty-sixth round)."""
        request = RunRequest(
            code="",
            cells=(
                "list(range(100000))",
                "raise ValueError('A' * 5000 + 'END')",
                "class Long:\n    def __repr__(self):\n        return 'x' * 150 + 'LAST'\nLong()",
            ),
            cell_output_chars=100,
            timeout=10.0,
        )
        result = run_request(sandbox, request)
        value = repr(list(range(100000)))
        assert result.cells[0].display == [
            {"text/plain": f"[... truncated {len(value) - 100} chars ...]\n{value[-100:]}"}
        ]
        (error,) = result.cells[1].error
        assert error["evalue"] == "[... truncated 4903 chars ...]\n" + "A" * 97 + "END"
        assert error["traceback"][-1].endswith("A" * 50 + "END\n"), error["traceback"]
        assert sum(map(len, error["traceback"][1:-1])) <= 100, error["traceback"]
        assert result.cells[2].display == [
            {"text/plain": "[... truncated 54 chars ...]\n" + "x" * 96 + "LAST"}
        ]

    def test_output_written_to_the_descriptors_stays_with_its_cell(self, sandbox: Sandbox) -> None:
        result = run_cells(
            sandbox,
            "import os, subprocess, sys\nos.write(1, b'raw one\\n')\nprint('printed one')",
            "subprocess.run([sys.executable, '-c', 'print(2)'])\nos.write(2, b'raw err\\n')",
            "print('three')",
        )
        assert [cell.stdout for cell in result.cells] == [
            "raw one\nprinted one\n",
            "2\n",
            "three\n",
        ]
        assert [cell.stderr for cell in result.cells] == ["", "raw err\n", ""]

    def test_cell_timeout_interrupts_one_cell_and_the_next_runs(self, sandbox: Sandbox) -> None:
        started = time.monotonic()
        result = run_cells(
            sandbox,
            "import time",
            "print('before', flush=True)\ntime.sleep(30)",
            "print('after')",
            cell_timeout=0.5,
        )
        assert time.monotonic() - started < 5
        assert [cell.timed_out for cell in result.cells] == [False, True, False]
        assert result.cells[1].stdout == "before\n"
        assert [error["ename"] for error in result.cells[1].error] == ["KeyboardInterrupt"]
        assert result.cells[2].stdout == "after\n"
        assert result.cells[2].finished

    def test_a_cell_that_ignores_the_interrupt_is_killed(self, sandbox: Sandbox) -> None:
        started = time.monotonic()
        result = run_cells(
            sandbox,
            "print('first')",
            "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(30)",
            "print('never')",
            cell_timeout=0.5,
        )
        assert time.monotonic() - started < 0.5 + INTERRUPT_GRACE + 3
        assert len(result.cells) == 2
        assert result.cells[0].finished
        assert result.cells[1].timed_out
        assert not result.cells[1].finished
        assert not result.ok

    def test_the_process_ending_in_a_cell_ends_the_notebook(self, sandbox: Sandbox) -> None:
        result = run_cells(
            sandbox,
            "print('x')",
            "import os, sys\nprint('y', flush=True)\nos._exit(0)",
            "print('z')",
        )
        assert [cell.stdout for cell in result.cells] == ["x\n", "y\n"]
        assert [cell.finished for cell in result.cells] == [True, False]

    def test_a_cell_cannot_report_a_later_one(self, sandbox: Sandbox) -> None:
        forged = (
            "import json, os\n"
            "fake = {'kind': 'cell', 'index': 1, 'stdout': 'forged', 'finished': True}\n"
            "line = '<<retool-exec:0000>>' + json.dumps(fake) + '<<end:0000>>'\n"
            "for fd in (1, 2):\n"
            "    os.write(fd, line.encode())\n"
            "os._exit(0)\n"
        )
        result = run_cells(sandbox, forged, "print('second')")
        assert len(result.cells) == 1
        assert not result.cells[0].finished

    def test_the_notebook_timeout_keeps_the_finished_cells(self, sandbox: Sandbox) -> None:
        started = time.monotonic()
        result = run_cells(
            sandbox,
            "print('first')",
            "import time\nprint('second', flush=True)\ntime.sleep(30)",
            "print('never')",
            timeout=1.5,
        )
        assert time.monotonic() - started < 1.5 + TIMEOUT_GRACE + 1
        assert result.timed_out
        assert result.outcome is Outcome.TIMEOUT
        assert [cell.stdout for cell in result.cells] == ["first\n", "second\n"]
        assert [cell.finished for cell in result.cells] == [True, False]

    def test_cells_import_an_uploaded_module_over_a_preloaded_one(self, sandbox: Sandbox) -> None:
        """As a plain call does (finding 77): the notebook's ``random.py`` is imported."""
        result = run_cells(
            sandbox,
            "import random",
            "print(random.MARK)",
            files={"random.py": b"MARK = 'module'\n", "ast.py": b"raise SystemExit(9)\n"},
        )
        assert [cell.error for cell in result.cells] == [[], []], result
        assert result.cells[1].stdout == "module\n", result

    def test_cells_see_uploaded_files_and_their_files_are_fetched(self, sandbox: Sandbox) -> None:
        result = run_cells(
            sandbox,
            "text = open('in.txt').read()",
            "open('out.txt', 'w').write(text * 2)",
            files={"in.txt": b"ab"},
            fetch=("out.txt",),
        )
        assert result.files == {"out.txt": b"abab"}, result
