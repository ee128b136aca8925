"""What every subcommand shares: backend names, ``--config``/``--set``, and exit statuses.

Settings reach a backend's config in layers, each overriding the one before:

1. the backend's own defaults and what its name presets (``docker-runsc``
   sets ``runtime="runsc"``);
2. the command's defaults (``run`` starts one container: ``pool_size=1``);
3. ``--config FILE`` (a TOML or JSON table of settings);
4. ``--set KEY=VALUE``, in order (VALUE is JSON when it parses as JSON, else
   a string);
5. the command's own flags, when given (``--runtime``, ``--docker-host``...).

The backend's pydantic model validates the result (unknown keys included),
and a problem is a ``ConfigError`` naming the setting and where it came from.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import stat
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from retool_exec._errors import ConfigError
from retool_exec.backends.config import BackendConfigBase
from retool_exec.backends.registry import available_backends, backend_spec, backend_specs

__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_PIPE",
    "EXIT_SOFTWARE",
    "EXIT_STATUS_HELP",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "SETTINGS_HELP",
    "Layers",
    "UsageError",
    "add_settings_options",
    "backend_list",
    "backend_names_help",
    "build_configs",
    "check_output_file",
    "parse_set",
    "read_config_file",
    "sigterm_stops_quietly",
    "user_layers",
]

EXIT_USAGE = 2
"""A usage or configuration error (argparse's own status for bad arguments)."""
EXIT_UNAVAILABLE = 69
"""The backend cannot start: Docker unreachable, image missing, runtime unknown, port taken."""
EXIT_SOFTWARE = 70
"""retool_exec itself failed."""
EXIT_INTERRUPTED = 130
"""Ctrl-C."""
EXIT_PIPE = 141
"""The reader of the output went away (``| head``), as for a process killed by SIGPIPE."""

EXIT_STATUS_HELP = f"""\
Exit status, the same for every command when retool_exec itself stops it
(always with one line on stderr): {EXIT_USAGE} usage or configuration error;
{EXIT_UNAVAILABLE} the backend cannot start (Docker unreachable, sandbox image missing,
unknown runtime, port in use); {EXIT_SOFTWARE} retool_exec failed; {EXIT_INTERRUPTED} interrupted;
{EXIT_PIPE} the output pipe was closed. Each command's own statuses are in its --help."""

SETTINGS_HELP = """\
Settings: --config FILE (TOML or JSON: a table of backend settings) and
--set KEY=VALUE (repeatable; VALUE is JSON if it parses, else a string) set
any field of the backend's config (a mistyped KEY's error lists them all);
later layers win: the name's preset < the command's defaults < --config <
--set < the command's own flags."""


class UsageError(ConfigError):
    """The command line asks for something impossible (a missing file, a bad flag value)."""


def backend_list(*, indent: str = "  ") -> str:
    """One line per backend name of the table: name and description."""
    specs = backend_specs()
    width = max(len(spec.name) for spec in specs)
    return "\n".join(f"{indent}{spec.name:<{width}}  {spec.description}" for spec in specs)


def backend_names_help() -> str:
    return ", ".join(available_backends())


def add_settings_options(parser: argparse.ArgumentParser) -> None:
    """``--config FILE`` and ``--set KEY=VALUE``."""
    group = parser.add_argument_group("backend settings")
    group.add_argument(
        "--config",
        dest="config_file",
        type=Path,
        default=None,
        metavar="FILE",
        help="backend settings from a TOML or JSON file",
    )
    group.add_argument(
        "--set",
        dest="set_items",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one backend setting (repeatable); VALUE is JSON if it parses, else a string",
    )


@dataclass
class Layers:
    """Settings with where each came from (for error messages)."""

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    def add(self, values: Mapping[str, Any], source: str) -> None:
        for key, value in values.items():
            self.values[key] = value
            self.sources[key] = source


def read_config_file(path: Path) -> dict[str, Any]:
    """A TOML (``.toml``) or JSON (``.json``; anything else is tried as JSON, then TOML)."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except OSError as exc:
        raise UsageError(f"--config {path}: cannot read it: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise UsageError(f"--config {path}: not UTF-8 text ({exc.reason})") from exc
    suffix = path.suffix.lower()
    data: Any
    try:
        if suffix == ".toml":
            data = tomllib.loads(text)
        elif suffix == ".json":
            data = json.loads(text)
        else:
            try:
                data = json.loads(text)
            except ValueError:
                data = tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        kind = "TOML" if suffix == ".toml" else "JSON" if suffix == ".json" else "JSON or TOML"
        raise UsageError(f"--config {path}: not valid {kind}: {exc}") from exc
    if not isinstance(data, dict):
        raise UsageError(
            f"--config {path}: must hold a table of settings, not {type(data).__name__}"
        )
    return data


def parse_set(item: str) -> tuple[str, Any]:
    """``"pool_size=2"`` -> ``("pool_size", 2)``; a value that is not JSON stays a string."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key.isidentifier():
        raise UsageError(f"--set takes KEY=VALUE (KEY a setting's name), got {item!r}")
    try:
        value: Any = json.loads(raw)
    except ValueError:
        value = raw
    return key, value


def user_layers(args: argparse.Namespace) -> Layers:
    """``--config`` then each ``--set``, with their sources."""
    layers = Layers()
    path: Path | None = getattr(args, "config_file", None)
    if path is not None:
        layers.add(read_config_file(path), f"--config {path}")
    for item in getattr(args, "set_items", None) or []:
        key, value = parse_set(item)
        layers.add({key: value}, f"--set {item}")
    return layers


def build_configs(
    names: Sequence[str],
    args: argparse.Namespace,
    *,
    defaults: Mapping[str, Any] | None = None,
    flags: Mapping[str, tuple[Any, str]] | None = None,
    backend_defaults: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, BackendConfigBase]:
    """One validated config per backend name, from the layers (see the module docstring).

    ``defaults`` are the command's (applied where the backend has the setting),
    ``backend_defaults`` the command's for one backend name (on top of ``defaults``);
    ``flags`` maps a setting to (value, the flag that gave it), for flags the
    user gave. With one backend every setting must be one of its own; with
    several, a setting applies to the backends that have it and must belong
    to at least one of them.
    """
    user = user_layers(args)
    flag_layer = Layers()
    for key, (value, flag) in (flags or {}).items():
        flag_layer.add({key: value}, flag)
    specs = [backend_spec(name) for name in names]
    for key, source in {**user.sources, **flag_layer.sources}.items():
        if len(specs) > 1 and not any(spec.accepts(key) for spec in specs):
            raise ConfigError(
                f"unknown setting {key!r} (from {source}) for backends "
                f"{', '.join(names)}; they take: "
                + ", ".join(sorted(set().union(*(spec.settings for spec in specs))))
            )
        if key in flag_layer.sources and len(specs) == 1 and not specs[0].accepts(key):
            raise UsageError(f"{source} does not apply to the {specs[0].name} backend")
    configs: dict[str, BackendConfigBase] = {}
    for spec in specs:
        strict = len(specs) == 1
        layers = Layers()
        for command_defaults in (defaults or {}, (backend_defaults or {}).get(spec.name, {})):
            layers.add(
                {k: v for k, v in command_defaults.items() if spec.accepts(k)},
                "the command's default",
            )
        for layer in (user, flag_layer):
            for key, value in layer.values.items():
                if strict or spec.accepts(key):
                    layers.add({key: value}, layer.sources[key])
        configs[spec.name] = spec.config(layers.values, sources=layers.sources)
    return configs


@contextlib.contextmanager
def sigterm_stops_quietly() -> Iterator[Callable[[], None]]:
    """A supervisor's SIGTERM ends the command through its ``with Sandbox``, which closes
    the sandbox (removing its containers), and it exits 0; with Python's default handler
    the process ended at once and left the containers.

    The first SIGTERM raises ``SystemExit(0)`` where the main thread is, as Ctrl-C's
    ``KeyboardInterrupt`` does: while the sandbox starts, too (a pool's warm-up takes
    seconds). While uvicorn runs, its own handler stops it gracefully and raises the
    signal again with this one once it returns. Yields ``closing``: call it when the
    command's work is over (its ``with Sandbox`` is about to close); from then on, and
    after a first SIGTERM, a SIGTERM does nothing, so none cuts the close short.
    """
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        if not stopping:
            stopping = True
            raise SystemExit(0)

    def closing() -> None:
        nonlocal stopping
        stopping = True

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield closing
    finally:
        signal.signal(signal.SIGTERM, previous)


def check_output_file(path: Path, flag: str) -> None:
    """Refuse an output file that cannot be written, before a run of minutes, not after it.

    A device or pipe (``/dev/stdout``) is taken as it is (opening a pipe waits for its
    reader), and so is a link to nothing (writing it makes its target). Every error is
    one line (``UsageError``), a folder that may not be looked in too.
    """
    try:
        _open_without_writing(path)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot write it: {exc.strerror or exc}") from exc


def _open_without_writing(path: Path) -> None:
    """Open ``path`` for writing and leave it as it was: a new file is created and
    removed again, an existing one is opened for appending (never truncated)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            return  # a link to nothing: the write will make its target
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        path.unlink()
        return
    if stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode):  # (a folder: EISDIR)
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
