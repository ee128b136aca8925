"""The CLI's shared parts: --config/--set on every command, one-line errors, exit statuses,
a closed pipe, and ``run`` behaving like ``python`` (no Docker needed)."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from pathlib import Path

import pydantic
import pytest

from retool_exec import ConfigError, DockerConfig, DockerUnavailableError, LocalConfig
from retool_exec.cli import build_parser, main
from retool_exec.cli._common import (
    EXIT_PIPE,
    EXIT_SOFTWARE,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    UsageError,
    build_configs,
    parse_set,
    read_config_file,
)
from retool_exec.cli.cmd_run import STARTING, _start
from retool_exec.cli.cmd_run import build_config as run_config

COMMANDS_WITH_SETTINGS = ["run", "serve", "bench", "audit", "doctor"]


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "retool_exec.cli", *args],
        input=stdin,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


# -- --set and --config ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("item", "pair"),
    [
        ("pool_size=2", ("pool_size", 2)),
        ("cpus=0.5", ("cpus", 0.5)),
        ("auto_build=false", ("auto_build", False)),
        ("runtime=runsc", ("runtime", "runsc")),
        ("runtime=null", ("runtime", None)),
        ('env={"A": "1"}', ("env", {"A": "1"})),
        ("image=", ("image", "")),
        ("docker_host=tcp://h:2375", ("docker_host", "tcp://h:2375")),
    ],
)
def test_set_values_are_json_when_they_parse_else_strings(
    item: str, pair: tuple[str, object]
) -> None:
    assert parse_set(item) == pair


@pytest.mark.parametrize("item", ["pool_size", "=2", "pool size=2", "a.b=1"])
def test_set_needs_key_equals_value(item: str) -> None:
    with pytest.raises(UsageError, match="KEY=VALUE"):
        parse_set(item)


def test_config_file_toml_and_json(tmp_path: Path) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text('policy = "fresh"\npool_size = 2\n[env]\nA = "1"\n')
    assert read_config_file(toml) == {"policy": "fresh", "pool_size": 2, "env": {"A": "1"}}
    js = tmp_path / "c.json"
    js.write_text('{"memory_mb": 512}')
    assert read_config_file(js) == {"memory_mb": 512}
    other = tmp_path / "c.conf"
    other.write_text("memory_mb = 256\n")
    assert read_config_file(other) == {"memory_mb": 256}


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        ("bad.toml", "pool_size = ", "not valid TOML"),
        ("bad.json", "{", "not valid JSON"),
        ("list.json", "[1]", "table of settings"),
    ],
)
def test_config_file_errors_name_the_file(tmp_path: Path, name: str, text: str, match: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(UsageError, match=match) as info:
        read_config_file(path)
    assert str(path) in str(info.value)


def test_a_missing_config_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read"):
        read_config_file(tmp_path / "nope.toml")


@pytest.mark.parametrize("command", COMMANDS_WITH_SETTINGS)
def test_every_command_takes_config_and_set(command: str, tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text("timeout = 5\n")
    args = parse(command, "--config", str(path), "--set", "timeout=7", "--set", "x=y")
    assert args.config_file == path
    assert args.set_items == ["timeout=7", "x=y"]


def test_layers_preset_defaults_file_set_flags(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"pool_size": 3, "memory_mb": 512, "runtime": "from-file"}))
    args = parse(
        "run", "--backend", "docker-runsc", "--config", str(path), "--set", "memory_mb=256"
    )
    config = build_configs(
        ["docker-runsc"],
        args,
        defaults={"pool_size": 1, "cpus": 0.5},
        flags={"runtime": ("from-flag", "--runtime")},
    )["docker-runsc"]
    assert isinstance(config, DockerConfig)
    assert config.policy == "reuse"  # the name's preset
    assert config.cpus == 0.5  # the command's default
    assert config.pool_size == 3  # --config over the default
    assert config.memory_mb == 256  # --set over --config
    assert config.runtime == "from-flag"  # the flag over everything


def test_a_bad_setting_names_the_flag_and_keeps_pydantic_as_cause() -> None:
    with pytest.raises(ConfigError, match=r"pool_size \(from --set pool_size=0\)") as info:
        build_configs(["docker"], parse("run", "--set", "pool_size=0"))
    assert isinstance(info.value.__cause__, pydantic.ValidationError)


def test_a_setting_from_a_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('policy = "shared"\n')
    with pytest.raises(ConfigError, match=f"from --config {path}"):
        build_configs(["docker"], parse("run", "--config", str(path)))


def test_with_several_backends_a_setting_goes_where_it_exists() -> None:
    configs = build_configs(["local", "docker-fresh"], parse("bench", "--set", "pool_size=3"))
    assert isinstance(configs["local"], LocalConfig)
    assert configs["docker-fresh"].pool_size == 3  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="unknown setting 'pool_sise'"):
        build_configs(["local", "docker"], parse("bench", "--set", "pool_sise=3"))


def test_a_flag_for_another_kind_of_backend_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="--runtime does not apply to the local backend"):
        build_configs(["local"], parse("run"), flags={"runtime": ("runsc", "--runtime")})


# -- one place for errors ----------------------------------------------------------------------


def test_config_errors_are_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(
        ["run", "--backend", "docker", "--set", "pool_size=0", "--set", "pids=1", "-c", "1"]
    )
    assert status == EXIT_USAGE == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("retool-exec run: backend 'docker': ")
    assert "pool_size" in err and "pids" in err


def test_an_unknown_backend_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--backend", "dokcer", "-c", "1"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "no backend named 'dokcer'" in err and "docker-runsc" in err


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (ConfigError("bad\nsetting"), EXIT_USAGE),
        (DockerUnavailableError("daemon down"), EXIT_UNAVAILABLE),
        (ConfigError("x"), 2),
    ],
)
def test_main_maps_library_errors_to_one_line_and_a_status(
    error: Exception,
    status: int,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from retool_exec.cli import cmd_gc

    def handler(args: argparse.Namespace) -> int:
        raise error

    monkeypatch.setattr(cmd_gc, "_handle", handler)
    assert main(["gc"]) == status
    err = capsys.readouterr().err
    assert err.startswith("retool-exec gc: ")
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_other_library_errors_are_status_70(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from retool_exec import SandboxClosedError
    from retool_exec.cli import cmd_gc

    def handler(args: argparse.Namespace) -> int:
        raise SandboxClosedError("closed")

    monkeypatch.setattr(cmd_gc, "_handle", handler)
    assert main(["gc"]) == EXIT_SOFTWARE == 70


def test_exit_statuses_are_documented_in_the_help() -> None:
    text = build_parser().format_help()
    for status in ("2 usage or configuration error", "69 the backend cannot start", "141"):
        assert status in " ".join(text.split())


def test_a_closed_pipe_is_status_141_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class ClosedPipe(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert main(["audit", "--list"]) == EXIT_PIPE == 141
    assert "Traceback" not in capsys.readouterr().err


def test_audit_list_into_a_reader_that_stops_after_one_line() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "retool_exec.cli", "audit", "--list"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    first = process.stdout.readline()
    process.stdout.close()  # what `| head -1` does
    stderr = process.stderr.read().decode()
    process.stderr.close()
    status = process.wait(timeout=60)
    assert first.startswith(b"priv-")
    assert "Traceback" not in stderr, stderr
    assert "BrokenPipe" not in stderr, stderr
    assert status in (0, EXIT_PIPE)  # 0 only when every line fit in the pipe before it closed


def test_run_output_into_a_closed_pipe_is_not_a_traceback() -> None:
    code = "import sys; sys.stdout.write('x' * 100 + chr(10))"
    # A big --json result into a pipe closed before it is read.
    process = subprocess.Popen(
        [sys.executable, "-m", "retool_exec.cli", "run", "--json", "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    stderr = process.stderr.read().decode()
    process.stderr.close()
    status = process.wait(timeout=60)
    assert "Traceback" not in stderr, stderr
    assert status == EXIT_PIPE


# -- run like python ----------------------------------------------------------------------------


def test_run_dash_c_runs_code() -> None:
    done = cli("run", "-c", "print(6 * 7)")
    assert (done.returncode, done.stdout, done.stderr) == (0, "42\n", "")


def test_run_a_missing_file_is_an_error_never_code() -> None:
    done = cli("run", "print(6 * 7)")
    assert done.returncode == EXIT_USAGE
    assert done.stdout == ""
    assert done.stderr == (
        "retool-exec run: no such file: 'print(6 * 7)' (to run code as text, use -c CODE)\n"
    )


def test_run_reads_a_file_with_a_bom_and_stdin(tmp_path: Path) -> None:
    path = tmp_path / "prog.py"
    path.write_bytes(b"\xef\xbb\xbfprint('\xc3\xa9')\n")
    assert cli("run", str(path)).stdout == "é\n"
    assert cli("run", "-", stdin="print(1 + 1)\n").stdout == "2\n"


def test_run_file_sees_its_own_name_as_under_python(tmp_path: Path) -> None:
    """``__file__`` and ``sys.argv[0]`` name the program's copy in the sandbox's working
    directory, by the file's own name; ``-c`` and ``-`` still see ``['-c']``."""
    path = tmp_path / "prog.py"
    path.write_text(
        "import os, sys\n"
        "print(os.path.basename(__file__), sys.argv[0] == __file__, len(sys.argv))\n"
    )
    done = cli("run", str(path))
    assert (done.returncode, done.stdout, done.stderr) == (0, "prog.py True 1\n", "")
    argv = "import sys; print(sys.argv, '__file__' in globals())"
    assert cli("run", "-c", argv).stdout == "['-c'] False\n"
    assert cli("run", "-", stdin=argv).stdout == "['-c'] False\n"


def test_run_without_a_program_says_what_to_give() -> None:
    done = cli("run")
    assert done.returncode == EXIT_USAGE
    assert "-c CODE" in done.stderr


def test_run_starts_one_container_for_a_docker_backend() -> None:
    config = run_config(parse("run", "--backend", "docker", "-c", "1"))
    assert isinstance(config, DockerConfig)
    assert config.pool_size == 1
    bigger = run_config(parse("run", "--backend", "docker", "--set", "pool_size=3", "-c", "1"))
    assert bigger.pool_size == 3  # type: ignore[attr-defined]


def test_run_offers_runtime_and_docker_host() -> None:
    config = run_config(
        parse("run", "--backend", "docker", "--runtime", "runsc", "--docker-host", "tcp://h:1")
    )
    assert isinstance(config, DockerConfig)
    assert (config.runtime, config.docker_host) == ("runsc", "tcp://h:1")
    runsc = run_config(parse("run", "--backend", "docker-runsc", "-c", "1"))
    assert runsc.runtime == "runsc"  # type: ignore[attr-defined]


def test_run_with_an_unreachable_daemon_is_one_line_and_status_69(tmp_path: Path) -> None:
    socket_path = tmp_path / "no-daemon.sock"
    done = cli("run", "--backend", "docker", "--docker-host", f"unix://{socket_path}", "-c", "1")
    assert done.returncode == EXIT_UNAVAILABLE == 69
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith("retool-exec run: cannot reach the Docker daemon")


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


class _Starts:
    started = False

    def start(self) -> None:
        self.started = True


@pytest.mark.parametrize("tty", [True, False])
def test_starting_sandbox_is_said_only_on_a_terminal(tty: bool) -> None:
    stream, sandbox = _Stream(tty), _Starts()
    _start(sandbox, DockerConfig(), stream)  # type: ignore[arg-type]
    assert sandbox.started
    assert (STARTING in stream.getvalue()) is tty


def test_starting_sandbox_is_not_said_for_the_local_backend() -> None:
    stream = _Stream(True)
    _start(_Starts(), LocalConfig(), stream)  # type: ignore[arg-type]
    assert stream.getvalue() == ""
