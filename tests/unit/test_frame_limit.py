"""The bound that spares encoding a call's frame is an upper bound, whatever the inputs."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from retool_exec.backends.base import RunRequest
from retool_exec.backends.config import DockerConfig
from retool_exec.backends.docker import frame_limit
from retool_exec.backends.docker.agent import wire
from retool_exec.backends.docker.backend import DockerBackend

# Astral characters (12 bytes each as JSON escapes), BMP ones (6), ASCII (1 or 2).
any_text = st.text(alphabet=st.sampled_from('a"\\\x01é\u2028😀'), max_size=200)
names = st.text(alphabet="abc", min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(
    code=any_text,
    stdin=st.none() | st.binary(max_size=200),
    files=st.dictionaries(names, st.binary(max_size=200), max_size=3),
    fetch=st.lists(names, max_size=3, unique=True),
    script=st.none() | st.just("main.py"),
    cells=st.lists(any_text, max_size=3),
)
def test_the_upper_bound_is_never_below_the_encoded_frame(
    *,
    code: str,
    stdin: bytes | None,
    files: dict[str, bytes],
    fetch: list[str],
    script: str | None,
    cells: list[str],
) -> None:
    if cells:
        code, script = "", None  # notebook mode has no code of its own
    request = RunRequest(
        code=code,
        timeout=1e9,
        stdin=stdin,
        files=files,
        fetch=tuple(fetch),
        script=script,
        cells=tuple(cells),
    )
    frame = {**DockerBackend(DockerConfig())._run_frame(request), "id": 2**40, "nonce": "f" * 32}
    assert len(wire.encode_payload(frame)) <= frame_limit.upper_bound(request)


def test_a_frame_over_the_limit_is_measured_and_one_under_is_not() -> None:
    small = {"type": "run", "code": "print(1)"}
    assert frame_limit.encoded_size_if_too_large(small, wire.MAX_FRAME) is None
    assert frame_limit.encoded_size_if_too_large(small, wire.MAX_FRAME + 1) is None  # measured
    big = {"type": "run", "code": "é" * (wire.MAX_FRAME // 6 + 1)}
    size = frame_limit.encoded_size_if_too_large(big, wire.MAX_FRAME + 1)
    assert size is not None and size > wire.MAX_FRAME
