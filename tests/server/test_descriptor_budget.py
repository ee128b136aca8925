"""The descriptor budget of ``retool-exec serve``, as numbers (``descriptors.py``)."""

from __future__ import annotations

import pytest

from retool_exec._errors import ConfigError
from retool_exec.server.descriptors import (
    ACCEPT_HEADROOM,
    DESCRIPTORS_PER_CALL,
    DESCRIPTORS_RESERVED,
    descriptor_reserve,
    fit_max_connections,
)

pytestmark = pytest.mark.server


def test_the_reserve_grows_with_the_calls_and_sessions_the_backend_holds() -> None:
    fixed = DESCRIPTORS_RESERVED + ACCEPT_HEADROOM
    assert descriptor_reserve(run_slots=0, sessions=0) == fixed
    assert descriptor_reserve(run_slots=4, sessions=64) == fixed + DESCRIPTORS_PER_CALL * 68
    # What is open already (inherited, say) is not there to be used.
    assert descriptor_reserve(run_slots=4, sessions=64, open_now=500) == (
        fixed + DESCRIPTORS_PER_CALL * 68 + 500
    )


def test_a_default_bound_that_fits_is_kept_and_one_that_does_not_is_lowered() -> None:
    assert fit_max_connections(None, limit=1 << 20, reserve=500) == (1024, None)
    bound, warning = fit_max_connections(None, limit=1024, reserve=324)
    assert bound == 700
    assert warning is not None
    assert "1024" in warning
    assert "700" in warning


def test_an_explicit_bound_is_kept_or_refused_never_changed() -> None:
    assert fit_max_connections(700, limit=1024, reserve=324) == (700, None)
    with pytest.raises(ConfigError) as refused:
        fit_max_connections(701, limit=1024, reserve=324)
    message = str(refused.value)
    assert "701" in message
    assert "1024" in message
    assert "--max-connections 700" in message


def test_no_room_at_all_is_refused_even_for_the_default() -> None:
    with pytest.raises(ConfigError, match="file-descriptor limit"):
        fit_max_connections(None, limit=300, reserve=324)
