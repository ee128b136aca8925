"""Backend configs (validation, the kind-discriminated union) and the backend registry."""

from __future__ import annotations

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
    available_backends,
    register_backend,
)
from retool_exec.backends.registry import _config_class

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
    [{"timeout": 0}, {"timeout": -1}, {"pool_size": 0}, {"memory_mb": 1}, {"policy": "shared"}],
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
        _config_class("no-such-backend")
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
        assert _config_class(name) is _UnitTestConfig
    finally:
        from retool_exec.backends import registry

        registry._registry.pop(name, None)
    assert name not in available_backends()
