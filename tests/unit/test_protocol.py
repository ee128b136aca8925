"""The attach-stream demuxer and the agent frame codec, without Docker."""

from __future__ import annotations

import marshal
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retool_exec.backends.docker.agent import wire
from retool_exec.backends.docker.protocol import (
    FrameDecoder,
    ProtocolError,
    StreamDemuxer,
    encode_frame,
)


def docker_record(stream: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxI", stream, len(payload)) + payload


messages = st.dictionaries(
    st.text(max_size=8),
    st.one_of(st.integers(), st.text(max_size=50), st.booleans(), st.none()),
    max_size=5,
).map(lambda d: {**d, "type": "result"})


@given(st.lists(messages, min_size=1, max_size=5), st.integers(min_value=1, max_value=40))
def test_frames_survive_any_chunking_through_docker_records(
    sent: list[dict[str, object]], chunk: int
) -> None:
    stream = b"".join(docker_record(1, encode_frame(m)) for m in sent)
    demux, decoder = StreamDemuxer(), FrameDecoder()
    received: list[dict[str, object]] = []
    for start in range(0, len(stream), chunk):
        for kind, payload in demux.feed(stream[start : start + chunk]):
            assert kind == 1
            received.extend(decoder.feed(payload))
    assert received == sent


def test_lone_surrogates_in_code_survive_the_frame() -> None:
    [message] = FrameDecoder().feed(encode_frame({"type": "run", "code": "x = '\ud800'"}))
    assert message["code"] == "x = '\ud800'"


def test_stderr_records_are_kept_apart() -> None:
    records = StreamDemuxer().feed(docker_record(2, b"oops") + docker_record(1, b"ok"))
    assert records == [(2, b"oops"), (1, b"ok")]


def test_oversized_frame_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="exceeds"):
        FrameDecoder(max_frame=10).feed(struct.pack(">I", 11) + b"x" * 11)


def test_nesting_deeper_than_the_decoder_is_a_frame_error_on_both_sides() -> None:
    deep = b"[" * 5000  # json's C decoder raises RecursionError, which is no ValueError
    with pytest.raises(ProtocolError, match="not JSON"):
        FrameDecoder().feed(struct.pack(">I", len(deep)) + deep)
    with pytest.raises(wire.WireError, match="not JSON"):
        wire.FrameDecoder().feed(struct.pack(">I", len(deep)) + deep)


def test_garbage_frame_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="not JSON"):
        FrameDecoder().feed(struct.pack(">I", 3) + b"{{{")
    with pytest.raises(ProtocolError, match="typed JSON object"):
        FrameDecoder().feed(encode_frame({"no": "type"}))


# -- supervisor -> call process frames (marshal) ------------------------------------------


@given(messages, st.text(max_size=200), st.floats(allow_nan=False))
def test_frames_to_a_call_round_trip(message: dict[str, Any], code: str, timeout: float) -> None:
    from retool_exec.backends.docker.agent import wire

    sent = {**message, "code": code, "timeout": timeout, "cells": [code, ""]}
    frame = wire.encode_for_call(sent)
    (size,) = wire.FRAME_HEADER.unpack(frame[: wire.FRAME_HEADER.size])
    assert size == len(frame) - wire.FRAME_HEADER.size
    assert wire.decode_for_call(frame[wire.FRAME_HEADER.size :]) == sent


@pytest.mark.parametrize(
    "data",
    [b"", b"\x00\x01", b"not marshal", marshal.dumps(None), marshal.dumps([1]),
     marshal.dumps({"no": "type"})],
)  # fmt: skip
def test_a_broken_frame_to_a_call_is_a_wire_error(data: bytes) -> None:
    from retool_exec.backends.docker.agent import wire

    with pytest.raises(wire.WireError):
        wire.decode_for_call(data)
