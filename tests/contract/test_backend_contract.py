"""The behaviour every backend must share, run against each one for real.

One test class, parametrized over local, docker-fresh, docker-reuse and
docker+runsc through the ``sandbox`` fixture (see conftest.py).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import os
import signal
import time
import uuid

import pytest

from retool_exec import ExecResult, Outcome, Sandbox

TIMEOUT_GRACE = 1.0


class TestBackendContract:
    def test_print_gives_the_canonical_success(self, sandbox: Sandbox) -> None:
        result = sandbox.run_code("print(2 + 3)")
        assert (result.ok, result.stdout, result.stderr) == (True, "5\n", "")
        assert (result.returncode, result.timed_out, result.outcome) == (0, False, Outcome.SUCCESS)
        assert result.latency > 0
        assert sandbox.format_tool_content(result) == "5\n"

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

    def test_stderr_warnings_do_not_fail_a_success(self, sandbox: Sandbox) -> None:
        result = sandbox.run_code("import sys\nprint('warn', file=sys.stderr)\nprint('ok')")
        assert result.ok
        assert result.stderr == "warn\n"
        assert sandbox.format_tool_content(result) == "ok\n"

    def test_final_expression_is_not_printed_by_default(self, sandbox: Sandbox) -> None:
        assert sandbox.run_code("2 + 3").stdout == ""

    def test_code_runs_as_main(self, sandbox: Sandbox) -> None:
        assert sandbox.run_code("print(__name__)").stdout == "__main__\n"

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
        assert sandbox.format_tool_content(result) == "Error: execution timed out after 10 seconds."

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
        from tests.conftest import backend_config

        with Sandbox(backend_config(backend_id, timeout=2.0), max_workers=4) as sb:
            sb.run_many(["print(1)", "1/0", "while True: pass", "print(2)"])
            metrics = sb.stats.metrics()
        assert sb.stats.calls == 4
        assert metrics["sandbox/success_rate"] == 0.5
        assert metrics["sandbox/error_rate"] == 0.25
        assert metrics["sandbox/timeout_rate"] == 0.25
        assert metrics["sandbox/latency"] > 0
