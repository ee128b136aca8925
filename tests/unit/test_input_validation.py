"""Bad inputs are the caller's error (ConfigError, TypeError), never the code's outcome."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from retool_exec import DockerConfig, Outcome, RunRequest, Sandbox, SessionLimitError
from retool_exec._errors import ConfigError
from retool_exec.backends.docker.agent import wire
from retool_exec.backends.fake import FakeBackend


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 0, -1, "5", True])
def test_bad_timeouts_are_refused(value: object) -> None:
    with pytest.raises(ConfigError):
        Sandbox(FakeBackend(), timeout=value)  # type: ignore[arg-type]
    with Sandbox(FakeBackend()) as sandbox, pytest.raises(ConfigError):
        sandbox.run_code("print(1)", timeout=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [math.nan, math.inf, 0, -5, 1.5, "64", True])
def test_bad_memory_limits_are_refused(value: object) -> None:
    with Sandbox(FakeBackend()) as sandbox, pytest.raises(ConfigError):
        sandbox.run_code("print(1)", memory_mb=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [math.nan, 0, 2.5, "8", True])
def test_bad_max_workers_are_refused(value: object) -> None:
    with pytest.raises(ConfigError):
        Sandbox(FakeBackend(), max_workers=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [math.nan, math.inf, 0, 2.5, "5", True])
def test_bad_max_code_chars_are_refused(value: object) -> None:
    """``True`` was taken as 1 (every call refused), ``nan`` switched the limit off, ``"5"``
    raised a bare TypeError (twenty-third outside check)."""
    with pytest.raises(ConfigError, match="max_code_chars"):
        Sandbox(FakeBackend(), max_code_chars=value)  # type: ignore[arg-type]


def test_a_huge_max_workers_costs_nothing() -> None:
    """Slots were stored one by one: ``max_workers=2**40`` never returned from the first
    call, and held ``close()`` as long (twenty-third outside check)."""
    with Sandbox(FakeBackend(lambda _request: "1\n"), max_workers=2**40) as sandbox:
        assert sandbox.run_code("print(1)").stdout == "1\n"


def test_an_empty_image_name_is_refused() -> None:
    """It ran the default image as if none were given."""
    with pytest.raises(ValidationError, match="image"):
        DockerConfig(image="")


def test_run_many_refuses_one_string_and_takes_limits() -> None:
    backend = FakeBackend(lambda request: f"{request.timeout} {request.memory_mb}\n")
    with Sandbox(backend) as sandbox:
        with pytest.raises(TypeError, match="not one string"):
            sandbox.run_many("print(1)")
        results = sandbox.run_many(["a", "b"], timeout=2, memory_mb=64)
    assert [r.stdout for r in results] == ["2 64\n", "2 64\n"]


@pytest.mark.parametrize(
    ("script", "files"),
    [("main.py", {"main.py/data.txt": b"x"}), ("s/main.py", {"s": b"x"}), ("a/b.py", {"a": b""})],
)
def test_a_script_that_clashes_with_the_files_is_refused_before_the_call(
    script: str, files: dict[str, bytes]
) -> None:
    """A script named like a folder of the files, or under a file: the agent refused the
    call after it was sent (``rejected``; thirty-third red-team round)."""
    with Sandbox(FakeBackend()) as sandbox, pytest.raises(ConfigError, match="both a file"):
        sandbox.run_code("print(1)", script=script, files=files)


class _ShortStr(str):
    def __len__(self) -> int:
        return 1

    def encode(self, *args: object, **kwargs: object) -> bytes:
        return b"not the text"


class _ShortBytes(bytes):
    def __len__(self) -> int:
        return 1

    def __bytes__(self) -> bytes:
        return b"not the content"


def test_sizes_are_the_contents_own_not_a_subclasss() -> None:
    """A ``str`` subclass whose ``__len__`` said 1 got a 20,000-character program past
    ``max_code_chars`` (and a 12 MiB one past the frame's size check, to the sandbox's
    failure; thirty-third red-team round). Sizes and content are read from the object's
    own data: no method of the caller's runs."""
    seen: list[RunRequest] = []

    def record(request: RunRequest) -> str:
        seen.append(request)
        return ""

    with Sandbox(FakeBackend(record), max_code_chars=1000) as sandbox:
        refused = sandbox.run_code(_ShortStr("x = 1\n" * 5000))
        assert refused.outcome is Outcome.REJECTED, refused
        assert "30000 characters" in refused.stderr
        sandbox.run_code(
            _ShortStr("print(1)"),
            stdin=_ShortStr("in"),
            files={"a": _ShortBytes(b"abc"), "b": _ShortStr("text")},
        )
    [request] = seen
    assert (type(request.code), request.code) == (str, "print(1)")
    assert (request.stdin, request.files) == (b"in", {"a": b"abc", "b": b"text"})
    with pytest.raises(ValueError, match="stdin of"):
        RunRequest(code="", timeout=1.0, stdin=_ShortBytes(b"x" * (wire.MAX_STDIN_BYTES + 1)))
    over = {"big": _ShortBytes(b"x" * (wire.MAX_UPLOAD_BYTES + 1))}
    with pytest.raises(ValueError, match="bytes of files"):
        RunRequest(code="", timeout=1.0, files=over)


def test_files_that_are_not_a_mapping_are_a_type_error() -> None:
    """A list of pairs raised ``AttributeError`` from inside (thirty-third red-team round)."""
    with Sandbox(FakeBackend()) as sandbox, pytest.raises(TypeError, match="mapping"):
        sandbox.run_code("pass", files=[("a", "b")])  # type: ignore[arg-type]


class _NeverEqual(str):
    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = str.__hash__


class _SplitsIntoStrangers(str):
    def split(self, *args: object, **kwargs: object) -> list[str]:  # type: ignore[override]
        return [_NeverEqual(part) for part in str.split(self, *args)]  # type: ignore[arg-type]


@pytest.mark.parametrize("where", ["files", "fetch", "script"])
def test_a_path_is_checked_by_its_own_text(where: str) -> None:
    """A ``str`` subclass whose parts never equal ``..`` wrote and fetched outside the
    working directory on the local backend (the review of the thirty-third round)."""
    path = _SplitsIntoStrangers("../escaped.txt")
    arguments: dict[str, object] = {
        "files": {"files": {path: b"x"}},
        "fetch": {"fetch": [path]},
        "script": {"script": path},
    }[where]
    with Sandbox(FakeBackend()) as sandbox, pytest.raises(ConfigError, match="leaves"):
        sandbox.run_code("pass", **arguments)  # type: ignore[arg-type]


def test_bad_stdin_files_and_fetch_name_the_argument() -> None:
    """``stdin=5`` and ``files={"a": None}`` both said only "expected str or bytes, not
    int", and ``fetch=5`` "'int' object is not iterable" (thirty-seventh round's new-user
    pass). ``fetch=None`` is no fetch, as ``files=None`` is no files."""
    with Sandbox(FakeBackend(lambda _request: "1\n")) as sandbox:
        with pytest.raises(TypeError, match=r"^stdin must be str or bytes, not int"):
            sandbox.run_code("print(1)", stdin=5)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"^files\['a'\] must be str or bytes, not NoneType"):
            sandbox.run_code("print(1)", files={"a": None})  # type: ignore[dict-item]
        with pytest.raises(TypeError, match=r"^fetch must be an iterable of paths, not int"):
            sandbox.run_code("print(1)", fetch=5)  # type: ignore[arg-type]
        assert sandbox.run_code("print(1)", fetch=None).ok  # type: ignore[arg-type]


def test_sessions_turned_off_say_so() -> None:
    """``max_sessions=0`` said the Sandbox "already holds 0 open sessions ... close some
    first" (thirty-seventh round's new-user pass)."""
    with (
        Sandbox(FakeBackend(), max_sessions=0) as sandbox,
        pytest.raises(SessionLimitError, match=r"sessions are off .*max_sessions=0"),
    ):
        sandbox.open_session()


def test_pickling_a_sandbox_says_what_to_pickle_instead() -> None:
    """It said only "cannot pickle '_thread.lock'" (the new-user pass of the round)."""
    import pickle

    with (
        Sandbox(FakeBackend()) as sandbox,
        pytest.raises(TypeError, match="pickle the config it was built from"),
    ):
        pickle.dumps(sandbox)
    assert pickle.loads(pickle.dumps(DockerConfig(pool_size=3))).pool_size == 3
