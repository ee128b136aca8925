"""The session examples in docs/examples run as documented, on the local backend."""

from __future__ import annotations

import importlib
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from retool_exec.adapters import SessionCodeTool

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"

pytestmark = pytest.mark.slow


def run_example(name: str) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--backend", "local"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_multi_turn_example_builds_on_earlier_turns() -> None:
    out = run_example("multi_turn.py")
    assert ">>> 111\n" in out
    assert ">>> 6171\n" in out  # turn 3 displays what turns 1 and 2 built
    assert "NameError: name 'undefined_name' is not defined" in out
    assert out.rstrip().endswith(
        "--- 5 cells, outcomes: ['success', 'success', 'success', 'error', 'success']"
    )


def test_the_branching_example_gets_the_stateless_answers() -> None:
    out = run_example("branching.py")
    assert "print(len(primes))                       -> 412849\n" in out
    assert "print(primes[-1], primes[0])             -> 5999993 2\n" in out  # a sibling reversed
    assert "(same answers: True)" in out


def test_the_verl_config_names_the_tool_and_only_keys_it_reads(
    caplog: pytest.LogCaptureFixture,
) -> None:
    text = (EXAMPLES / "verl_session_tool_config.yaml").read_text(encoding="utf-8")
    class_name = re.search(r'class_name: "([\w.]+)"', text)
    assert class_name
    module, _, name = class_name.group(1).rpartition(".")
    assert getattr(importlib.import_module(module), name) is SessionCodeTool
    config = text.split("    config:\n", 1)[1].split("    tool_schema:", 1)[0]
    keys = {line.split(":")[0].strip() for line in config.splitlines() if line.startswith("      ")}
    keys.discard("pool_size")  # inside backend_config
    assert keys == {
        "type",
        "backend",
        "backend_config",
        "timeout",
        "max_sessions",
        "session_ttl",
    }
    with caplog.at_level(logging.WARNING, logger="retool_exec.adapters"):
        SessionCodeTool(dict.fromkeys(keys, 1))
    assert caplog.text == ""  # every key is one the tool reads
    assert 'name: "code_interpreter"' in text
