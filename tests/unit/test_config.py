"""Backend configs (validation, the kind-discriminated union) and the table of backend names."""

from __future__ import annotations

import subprocess
import sys

import pydantic
import pytest

from retool_exec import (
    AnyBackendConfig,
    BackendConfigBase,
    BackendNotFoundError,
    ConfigError,
    DockerConfig,
    FakeConfig,
    LocalConfig,
    Sandbox,
    available_backends,
    register_backend,
)
from retool_exec.backends.registry import (
    BUILTIN_BACKENDS,
    backend_config,
    backend_spec,
    backend_specs,
    canonical_names,
)

_ADAPTER: pydantic.TypeAdapter[LocalConfig | DockerConfig | FakeConfig] = pydantic.TypeAdapter(
    AnyBackendConfig
)


def test_docker_config_defaults_are_valid() -> None:
    config = DockerConfig()
    assert config.kind == "docker"
    assert config.timeout == 30.0
    assert config.max_output_chars == 4096


def test_docker_config_rejects_unknown_fields() -> None:
    with pytest.raises(pydantic.ValidationError):
        DockerConfig(memroy_mb=512)  # type: ignore[call-arg]


def test_local_config_rejects_unknown_fields() -> None:
    with pytest.raises(pydantic.ValidationError):
        LocalConfig(network=True)  # type: ignore[call-arg]


@pytest.mark.parametrize("name", ["1ABC", "A-B", "A B", "", "A=B", "É"])
def test_docker_config_rejects_bad_env_names(name: str) -> None:
    with pytest.raises(pydantic.ValidationError, match="not a valid identifier"):
        DockerConfig(env={name: "1"})


@pytest.mark.parametrize("name", ["PATH", "HOME", "LANG", "PYTHONDONTWRITEBYTECODE", "HOSTNAME"])
def test_docker_config_rejects_reserved_env_names(name: str) -> None:
    with pytest.raises(pydantic.ValidationError, match="set by the sandbox itself"):
        DockerConfig(env={name: "/x"})


def test_docker_config_rejects_nul_in_env_value() -> None:
    with pytest.raises(pydantic.ValidationError, match="NUL"):
        DockerConfig(env={"FOO": "a\x00b"})


def test_docker_config_accepts_good_env() -> None:
    config = DockerConfig(env={"FOO": "bar baz", "_X1": ""})
    assert config.env == {"FOO": "bar baz", "_X1": ""}


@pytest.mark.parametrize("module", ["numpy; rm -rf /", "", "a..b", "1numpy", "os.path.", "a b"])
def test_docker_config_rejects_non_module_preload(module: str) -> None:
    with pytest.raises(pydantic.ValidationError, match="not a module name"):
        DockerConfig(preload=(module,))


def test_docker_config_accepts_dotted_preload() -> None:
    assert DockerConfig(preload=("os.path", "numpy")).preload == ("os.path", "numpy")


@pytest.mark.parametrize(
    "fields",
    [
        {"timeout": 0},
        {"timeout": -1},
        {"pool_size": 0},
        {"memory_mb": 1},
        {"policy": "shared"},
        {"nofile": 31},  # no container started at 16 (thirtieth red-team round)
    ],
)
def test_docker_config_rejects_out_of_range_values(fields: dict[str, object]) -> None:
    with pytest.raises(pydantic.ValidationError):
        DockerConfig.model_validate(fields)


def test_configs_are_frozen() -> None:
    config = DockerConfig()
    with pytest.raises(pydantic.ValidationError):
        config.pool_size = 8


def test_union_parses_docker_by_kind() -> None:
    config = _ADAPTER.validate_python({"kind": "docker", "policy": "fresh"})
    assert isinstance(config, DockerConfig)
    assert config.policy == "fresh"


def test_union_parses_local_and_fake_by_kind() -> None:
    assert isinstance(_ADAPTER.validate_python({"kind": "local"}), LocalConfig)
    assert isinstance(_ADAPTER.validate_json('{"kind": "fake", "stdout": "hi"}'), FakeConfig)


def test_union_rejects_unknown_kind() -> None:
    with pytest.raises(pydantic.ValidationError):
        _ADAPTER.validate_python({"kind": "kubernetes"})


def test_union_rejects_missing_kind() -> None:
    with pytest.raises(pydantic.ValidationError):
        _ADAPTER.validate_python({"timeout": 5.0})


def test_union_rejects_field_of_another_kind() -> None:
    with pytest.raises(pydantic.ValidationError):
        _ADAPTER.validate_python({"kind": "local", "pool_size": 2})


def test_docker_config_json_round_trip() -> None:
    config = DockerConfig(policy="fresh", env={"A": "1"}, preload=("numpy",), runtime="runsc")
    assert _ADAPTER.validate_json(config.model_dump_json()) == config


def test_available_backends_has_the_builtins() -> None:
    assert {"local", "docker", "fake"} <= set(available_backends())


def test_available_backends_is_sorted() -> None:
    names = available_backends()
    assert names == sorted(names)


def test_unknown_backend_raises_with_available_names() -> None:
    with pytest.raises(BackendNotFoundError) as info:
        backend_config("no-such-backend")
    message = str(info.value)
    assert "no-such-backend" in message
    for name in ("local", "docker", "fake"):
        assert name in message


def test_backend_not_found_is_a_config_and_lookup_error() -> None:
    assert issubclass(BackendNotFoundError, ConfigError)
    assert issubclass(BackendNotFoundError, LookupError)
    assert issubclass(BackendNotFoundError, ValueError)


@pytest.mark.parametrize("not_a_config", [dict, object, "LocalConfig", LocalConfig()])
def test_register_backend_rejects_non_config_class(not_a_config: object) -> None:
    with pytest.raises(ConfigError):
        register_backend("bogus", not_a_config)  # type: ignore[arg-type]
    assert "bogus" not in available_backends()


def test_register_backend_accepts_a_config_subclass() -> None:
    class _UnitTestConfig(BackendConfigBase):
        pass

    name = "unit-test-only-backend"
    register_backend(name, _UnitTestConfig)
    try:
        assert name in available_backends()
        assert backend_spec(name).config_class is _UnitTestConfig
        assert isinstance(backend_config(name), _UnitTestConfig)
    finally:
        from retool_exec.backends import registry

        registry._registry.pop(name, None)
    assert name not in available_backends()


# -- the table of backend names ------------------------------------------------------------

TABLE_NAMES = ["local", "docker", "docker-reuse", "docker-fresh", "docker-runsc", "ray", "fake"]


def test_the_table_has_every_builtin_name_once_in_order() -> None:
    assert [spec.name for spec in BUILTIN_BACKENDS] == TABLE_NAMES
    assert set(TABLE_NAMES) <= set(available_backends())


@pytest.mark.parametrize("spec", BUILTIN_BACKENDS, ids=lambda spec: spec.name)
def test_every_entry_says_what_it_is_and_what_to_install(spec: object) -> None:
    from retool_exec.backends.registry import BackendSpec

    assert isinstance(spec, BackendSpec)
    assert spec.description and "\n" not in spec.description
    assert spec.install
    assert isinstance(backend_config(spec.name), spec.config_class)


@pytest.mark.parametrize(
    ("name", "policy", "runtime"),
    [
        ("docker", "reuse", None),
        ("docker-reuse", "reuse", None),
        ("docker-fresh", "fresh", None),
        ("docker-runsc", "reuse", "runsc"),
    ],
)
def test_docker_names_preset_policy_and_runtime(
    name: str, policy: str, runtime: str | None
) -> None:
    config = backend_config(name)
    assert isinstance(config, DockerConfig)
    assert (config.policy, config.runtime) == (policy, runtime)


@pytest.mark.parametrize("name", TABLE_NAMES)
def test_sandbox_accepts_every_name_of_the_table(name: str) -> None:
    # Building a Sandbox makes the backend but starts nothing (no Docker needed).
    sandbox = Sandbox(backend=name, timeout=3.0)
    try:
        config = getattr(sandbox.backend, "config", None)
        assert config == backend_config(name, {"timeout": 3.0})
    finally:
        sandbox.close()


def test_sandbox_docker_runsc_runs_under_runsc() -> None:
    sandbox = Sandbox(backend="docker-runsc")
    try:
        assert sandbox.backend.config.runtime == "runsc"  # type: ignore[attr-defined]
    finally:
        sandbox.close()


def test_docker_is_an_alias_of_docker_reuse() -> None:
    assert backend_spec("docker").alias_of == "docker-reuse"
    assert backend_config("docker") == backend_config("docker-reuse")
    assert canonical_names(["local", "docker", "docker-fresh"]) == [
        "local",
        "docker-reuse",
        "docker-fresh",
    ]


def test_isolating_backends_are_the_docker_ones() -> None:
    isolating = {spec.name for spec in backend_specs() if spec.isolating}
    assert isolating == {"docker", "docker-reuse", "docker-fresh", "docker-runsc", "ray"}


def test_settings_go_on_top_of_the_preset() -> None:
    config = backend_config("docker-runsc", {"pool_size": 1, "memory_mb": 512})
    assert isinstance(config, DockerConfig)
    assert (config.runtime, config.pool_size, config.memory_mb) == ("runsc", 1, 512)
    assert backend_config("docker-runsc", {"runtime": None}).runtime is None  # type: ignore[attr-defined]


def test_a_bad_setting_is_a_config_error_naming_it_and_its_source() -> None:
    with pytest.raises(ConfigError) as info:
        backend_config("docker-fresh", {"pool_size": 0}, sources={"pool_size": "--set pool_size=0"})
    message = str(info.value)
    assert "docker-fresh" in message
    assert "pool_size" in message
    assert "--set pool_size=0" in message
    assert isinstance(info.value.__cause__, pydantic.ValidationError)


def test_an_unknown_setting_is_named_with_the_settings_there_are() -> None:
    with pytest.raises(ConfigError, match=r"unknown setting 'memroy_mb'.*memory_mb") as info:
        backend_config("docker", {"memroy_mb": 512})
    assert isinstance(info.value.__cause__, pydantic.ValidationError)


def test_a_setting_of_another_backend_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"backend 'local': unknown setting 'pool_size'"):
        backend_config("local", {"pool_size": 2})


def test_register_backend_keeps_a_description_and_what_to_install() -> None:
    class _Described(BackendConfigBase):
        """A backend for this test only.

        More text that is not the summary."""

    register_backend("unit-test-described", _Described, install="a unicorn")
    try:
        spec = backend_spec("unit-test-described")
        assert (spec.description, spec.install) == ("A backend for this test only.", "a unicorn")
    finally:
        from retool_exec.backends import registry

        registry._registry.pop("unit-test-described", None)


@pytest.mark.parametrize(
    "module",
    [
        "retool_exec.backends.config",
        "retool_exec.backends.registry",
        "retool_exec.backends.local",
        "retool_exec.backends.fake",
        "retool_exec.backends.docker.backend",
    ],
)
def test_each_backend_module_imports_first_on_its_own(module: str) -> None:
    """No import circle: any of them can be the first one imported."""
    code = f"import {module}"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=60)


def test_importing_the_package_and_its_table_imports_no_docker_machinery() -> None:
    """``build()`` imports a backend's module only when a backend is made."""
    code = (
        "import sys, retool_exec, retool_exec.backends.registry\n"
        "loaded = [m for m in ('retool_exec.backends.local', 'retool_exec.backends.docker.backend',"
        " 'docker') if m in sys.modules]\n"
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=60)
