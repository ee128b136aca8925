"""What a sandbox image holds: a preset, extra Debian packages, extra PyPI requirements.

Plain data (pydantic, no Docker import), so ``DockerConfig`` can carry one and
a TOML file can hold one. The image module turns a spec into a
content-addressed tag and builds it; the same spec never builds twice.

Why presets are lists of *Debian* packages: they build from a Debian mirror
alone (air-gapped clusters), are built against one another, and need no
compiler. PyPI requirements are for what Debian lacks or a pinned version;
they are installed at build time only, into the image's own Python (the
sandbox itself never has a network).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

__all__ = [
    "PRESETS",
    "ImageSpec",
    "ImageSpecError",
    "describe_errors",
    "preset_files",
    "preset_packages",
]

PresetName = Literal["math", "datascience"]

PRESETS: dict[str, str] = {
    "math": "python3 with numpy, scipy, sympy and mpmath (the default)",
    "datascience": "math plus pandas, scikit-learn, networkx, matplotlib (Agg), seaborn, "
    "statsmodels, pillow, bs4, lxml, openpyxl, xlrd, tabulate, gmpy2: the data-work "
    "part of SandboxFusion's Python image",
}
"""Preset name -> what it holds. The package lists are ``image_files/preset-<name>.txt``."""

PRESET_PRELOAD: dict[str, tuple[str, ...]] = {
    "math": ("numpy", "sympy", "scipy", "mpmath"),
    "datascience": (
        *("numpy", "sympy", "scipy", "mpmath", "pandas"),
        *("matplotlib.pyplot", "networkx", "sklearn.linear_model"),
    ),
}
"""What the zygote imports once under the ``reuse`` policy, per preset (override: ``preload``)."""

PRESET_ENV: dict[str, dict[str, str]] = {
    "math": {},
    "datascience": {"MPLBACKEND": "Agg"},
}
"""Environment a preset needs at run time (no display: matplotlib draws to files)."""

_FILES = Path(__file__).resolve().parent / "image_files"
# A Debian package name, optionally pinned: ``name`` or ``name=version``.
_APT_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+~:-]+)?$")
# A PEP 508 requirement starts with a project name; anything starting with "-"
# would be read by pip as an option (``--index-url ...``), so it is refused.
_PIP_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._, -]*\])?([^\n\r\x00]*)$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class ImageSpecError(ValueError):
    """An image spec (or its TOML file) is not valid; the message says which part."""


def preset_files(preset: str) -> list[Path]:
    """The package lists a preset installs: every preset builds on ``math``."""
    names = ["math"] if preset == "math" else ["math", preset]
    return [_FILES / f"preset-{name}.txt" for name in names]


def preset_packages(preset: str) -> list[str]:
    """The Debian packages a preset installs (comments and blank lines dropped)."""
    words = []
    for path in preset_files(preset):
        try:
            text = path.read_text()
        except OSError as exc:
            raise ImageSpecError(f"no package list for preset {preset!r}: {exc}") from exc
        words += [word for line in text.splitlines() for word in line.split("#", 1)[0].split()]
    return words


class ImageSpec(BaseModel):
    """A sandbox image to build: ``preset`` plus ``apt`` and ``pip`` extras.

    ``ImageSpec()`` is the default image. Build one with ``retool-exec image
    build --preset datascience --apt python3-bs4 --pip 'tabulate==0.9.0'`` or
    pass it as ``DockerConfig(image_spec=...)`` (built on first use).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    preset: PresetName = "math"
    """The base package set (see ``PRESETS``)."""
    apt: tuple[str, ...] = ()
    """Extra Debian packages (bookworm names, ``name`` or ``name=version``)."""
    pip: tuple[str, ...] = ()
    """Extra PyPI requirements (``name``, ``name==1.2``, ``name>=1,<2``), installed at build
    time into the image's Python; their resolved versions are recorded on the image."""
    preload: tuple[str, ...] | None = None
    """Modules the zygote imports once under the ``reuse`` policy; None: the preset's."""

    @field_validator("apt")
    @classmethod
    def _apt_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            if not _APT_NAME.match(name):
                raise ValueError(f"{name!r} is not a Debian package name (name or name=version)")
        return tuple(sorted(set(names)))

    @field_validator("pip")
    @classmethod
    def _pip_requirements(cls, requirements: tuple[str, ...]) -> tuple[str, ...]:
        cleaned = []
        for requirement in requirements:
            text = requirement.strip()
            if not text or len(text) > 300 or not _PIP_REQUIREMENT.match(text):
                raise ValueError(
                    f"{requirement!r} is not a PyPI requirement (a project name, optionally "
                    "with extras and a version; pip options are not accepted)"
                )
            cleaned.append(text)
        return tuple(sorted(set(cleaned)))

    @field_validator("preload")
    @classmethod
    def _preload_modules(cls, modules: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for module in modules or ():
            if not _MODULE.match(module):
                raise ValueError(f"preload entry {module!r} is not a module name")
        return modules

    @property
    def preload_modules(self) -> tuple[str, ...]:
        """``preload``, or the preset's default."""
        return self.preload if self.preload is not None else PRESET_PRELOAD[self.preset]

    @property
    def env(self) -> dict[str, str]:
        """Environment the image's packages need at run time."""
        return dict(PRESET_ENV[self.preset])

    @property
    def packages(self) -> list[str]:
        """Every Debian package to install: the preset's, then the extras."""
        return [*preset_packages(self.preset), *self.apt]

    def describe(self) -> str:
        """One line for logs and ``image ls``: ``datascience +apt python3-bs4 +pip tabulate``."""
        parts: list[str] = [self.preset]
        if self.apt:
            parts.append("+apt " + ",".join(self.apt))
        if self.pip:
            parts.append("+pip " + ",".join(self.pip))
        return " ".join(parts)

    @classmethod
    def from_toml(cls, path: str | Path) -> ImageSpec:
        """A spec from a TOML file: top-level keys ``preset``, ``apt``, ``pip``, ``preload``."""
        try:
            data: dict[str, Any] = tomllib.loads(Path(path).read_text())
        except OSError as exc:
            raise ImageSpecError(f"cannot read image spec {path}: {exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ImageSpecError(f"image spec {path} is not valid TOML: {exc}") from exc
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ImageSpecError(f"image spec {path}: {describe_errors(exc)}") from exc


def describe_errors(exc: ValidationError, prefix: str = "") -> str:
    """pydantic's errors about a spec as ``field: problem``; ``prefix`` names a field as a flag."""
    return "; ".join(
        f"{prefix}{'.'.join(str(part) for part in error['loc']) or 'spec'}: "
        + str(error["msg"]).removeprefix("Value error, ")
        for error in exc.errors()
    )
