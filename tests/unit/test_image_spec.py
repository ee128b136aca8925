"""Image specs and the bootstrap, without Docker: validation, the spec -> tag mapping, the frame."""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from retool_exec.backends.config import DockerConfig
from retool_exec.backends.docker import image_inputs
from retool_exec.backends.docker.agent import wire
from retool_exec.backends.docker.bootstrap import agent_frame, bootstrap_command, needs_bootstrap
from retool_exec.backends.docker.image_spec import (
    PRESETS,
    ImageSpec,
    ImageSpecError,
    preset_packages,
)
from retool_exec.cli.cmd_image import spec_from_args

# -- the spec ------------------------------------------------------------------------


def test_the_default_spec_is_the_math_preset() -> None:
    spec = ImageSpec()
    assert spec.preset == "math" and spec.apt == () and spec.pip == ()
    assert spec.preload_modules == ("numpy", "sympy", "scipy", "mpmath")
    assert DockerConfig().spec == spec
    assert {"python3", "python3-numpy", "python3-sympy"} <= set(spec.packages)


def test_every_preset_has_a_package_list_built_on_math() -> None:
    math = set(preset_packages("math"))
    for preset in PRESETS:
        assert math <= set(preset_packages(preset))
    assert {"python3-pandas", "python3-matplotlib", "python3-sklearn", "python3-networkx"} <= set(
        preset_packages("datascience")
    )
    assert ImageSpec(preset="datascience").env == {"MPLBACKEND": "Agg"}


def test_tag_follows_what_is_installed_not_how_it_is_spelled() -> None:
    base = image_inputs.image_tag(ImageSpec())
    assert image_inputs.image_tag() == base
    tags = {
        base,
        image_inputs.image_tag(ImageSpec(apt=("python3-tabulate",))),
        image_inputs.image_tag(ImageSpec(pip=("tomli-w==1.0.0",))),
        image_inputs.image_tag(ImageSpec(pip=("tomli-w==1.0.1",))),
        image_inputs.image_tag(ImageSpec(preset="datascience")),
    }
    assert len(tags) == 5, "each change of what goes in must change the tag"
    # Order, duplicates and the zygote's preload are not part of the image.
    assert image_inputs.image_tag(
        ImageSpec(apt=("b-pkg", "a-pkg", "a-pkg"))
    ) == image_inputs.image_tag(ImageSpec(apt=("a-pkg", "b-pkg")))
    assert image_inputs.image_tag(ImageSpec(preload=("numpy",))) == base


def test_pip_inputs_add_pip_to_the_packages() -> None:
    inputs = image_inputs.build_inputs(ImageSpec(pip=("tomli-w==1.0.0",)))
    assert inputs["requirements.txt"] == b"tomli-w==1.0.0\n"
    assert b"python3-pip\n" in inputs["packages.txt"]
    assert "requirements.txt" not in image_inputs.build_inputs(ImageSpec())


@pytest.mark.parametrize(
    "bad",
    [
        {"apt": ["Bad Name"]},
        {"apt": ["python3;rm -rf /"]},
        {"apt": ["-o=APT::Foo"]},
        {"pip": ["--index-url=http://127.0.0.1/"]},
        {"pip": ["-e ."]},
        {"pip": ["ok\n--extra-index-url x"]},
        {"pip": [""]},
        {"preset": "gpu"},
        {"preload": ["os; import x"]},
        {"unknown": 1},
    ],
)
def test_bad_specs_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ImageSpec.model_validate(bad)


@given(st.text(min_size=1).map(lambda text: "-" + text))
def test_nothing_pip_could_read_as_an_option_is_accepted(requirement: str) -> None:
    with pytest.raises(ValidationError):
        ImageSpec(pip=(requirement,))


@given(st.text())
def test_a_requirement_never_spans_lines(text: str) -> None:
    try:
        spec = ImageSpec(pip=(text,))
    except ValidationError:
        return
    assert all("\n" not in line and "\r" not in line for line in spec.pip)


def test_spec_from_toml_and_its_errors(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text('preset = "datascience"\napt = ["python3-bs4"]\npip = ["tabulate==0.9.0"]\n')
    assert ImageSpec.from_toml(good) == ImageSpec(
        preset="datascience", apt=("python3-bs4",), pip=("tabulate==0.9.0",)
    )
    assert DockerConfig(image_spec=str(good)).spec.apt == ("python3-bs4",)
    broken = tmp_path / "broken.toml"
    broken.write_text("apt = [\n")
    with pytest.raises(ImageSpecError, match=r"broken\.toml is not valid TOML"):
        ImageSpec.from_toml(broken)
    typo = tmp_path / "typo.toml"
    typo.write_text('packages = ["x"]\n')
    with pytest.raises(ImageSpecError, match=r"typo\.toml: packages"):
        ImageSpec.from_toml(typo)
    with pytest.raises(ImageSpecError, match="cannot read"):
        ImageSpec.from_toml(tmp_path / "missing.toml")


def test_a_preset_name_is_a_spec_in_settings() -> None:
    assert DockerConfig.model_validate({"image_spec": "datascience"}).spec == ImageSpec(
        preset="datascience"
    )
    with pytest.raises(ValidationError, match="neither a preset"):
        DockerConfig.model_validate({"image_spec": "no-such-preset"})


def test_your_own_image_and_a_spec_exclude_each_other() -> None:
    with pytest.raises(ValidationError, match="not both"):
        DockerConfig(image="team/image:1", image_spec=ImageSpec())


def test_preload_follows_the_spec_under_reuse_only() -> None:
    spec = ImageSpec(preset="datascience")
    assert "pandas" in DockerConfig(image_spec=spec).preload_modules
    assert DockerConfig(image_spec=spec, policy="fresh").preload_modules == ()
    assert DockerConfig(image_spec=spec, preload=("json",)).preload_modules == ("json",)


@pytest.mark.parametrize(
    "spec",
    [
        ImageSpec(),
        ImageSpec(preset="datascience"),
        ImageSpec(apt=("python3-bs4", "python3-tabulate"), pip=("a==1", "b[x]>=2,<3")),
    ],
)
def test_build_flags_say_the_same_spec(spec: ImageSpec) -> None:
    import shlex

    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default=None)
    parser.add_argument("--apt", action="append", default=[])
    parser.add_argument("--pip", action="append", default=[])
    parser.add_argument("--spec", default=None)
    args = parser.parse_args(shlex.split(image_inputs.build_flags(spec)))
    assert spec_from_args(args) == spec


# -- the bootstrap -------------------------------------------------------------------


def test_needs_bootstrap_unless_the_image_holds_this_agent() -> None:
    digest = image_inputs.agent_digest()
    ours = {"Config": {"Labels": {image_inputs.AGENT_LABEL: digest}}}
    assert not needs_bootstrap(ours, digest)
    assert needs_bootstrap({"Config": {"Labels": {image_inputs.AGENT_LABEL: "0" * 16}}}, digest)
    assert needs_bootstrap({"Config": {"Labels": None}}, digest)
    assert needs_bootstrap({}, digest)


def test_an_image_with_a_volume_is_refused() -> None:
    from retool_exec._errors import ImageError

    attrs = {"Config": {"Volumes": {"/data": {}}, "Labels": {}}}
    with pytest.raises(ImageError, match="VOLUME /data"):
        image_inputs.image_choice("team/image:1", attrs)


def test_a_foreign_image_gets_the_agent_sent_with_its_own_path() -> None:
    attrs = {"Config": {"Env": ["PATH=/opt/py/bin:/usr/bin", "SECRET=x"], "Labels": {}}}
    choice = image_inputs.image_choice("team/image:1", attrs)
    assert choice.send_agent == image_inputs.agent_zipapp()
    assert choice.image_path == "/opt/py/bin:/usr/bin"


def _run_bootstrap(stdin: bytes, zipapp: bytes) -> dict[str, object]:
    """The bootstrap under this host's Python, fed ``stdin``: the frame it writes back."""
    command = bootstrap_command(zipapp, ["PATH"])
    done = subprocess.run(
        [sys.executable, *command[1:]], input=stdin, capture_output=True, timeout=30, check=False
    )
    assert done.returncode == 70, done.stderr
    (size,) = wire.FRAME_HEADER.unpack(done.stdout[:4])
    frame: dict[str, object] = json.loads(done.stdout[4 : 4 + size])
    return frame


def test_the_bootstrap_refuses_an_agent_that_does_not_match_its_digest() -> None:
    zipapp = image_inputs.agent_zipapp()
    forged = zipapp[:-1] + bytes([zipapp[-1] ^ 1])
    frame = _run_bootstrap(agent_frame(forged), zipapp)
    assert frame == {"type": "fatal", "reason": "the agent received does not match its digest"}


def test_the_bootstrap_says_when_the_stream_ends_early() -> None:
    zipapp = image_inputs.agent_zipapp()
    frame = _run_bootstrap(agent_frame(zipapp)[:100], zipapp)
    assert frame["reason"] == "the host closed the stream before sending the agent"


def test_the_bootstrap_command_pins_the_digest_and_keeps_only_named_variables() -> None:
    zipapp = image_inputs.agent_zipapp()
    command = bootstrap_command(zipapp, ["PATH", "HOME", "PATH"])
    assert command[:4] == ["python3", "-I", "-B", "-c"]
    assert hashlib.sha256(zipapp).hexdigest() in command[4]
    assert "['HOME', 'PATH']" in command[4]
    compile(command[4], "<bootstrap>", "exec")
    assert agent_frame(zipapp)[:4] == len(zipapp).to_bytes(4, "big")
