"""A container start that fails or is cancelled at any step leaves nothing: no container,
no open socket (an unclosed one is a ResourceWarning at a later garbage collection,
somewhere else entirely), no claimed uid."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Iterator
from typing import Any

import pytest

from retool_exec import DockerConfig
from retool_exec.backends.docker import containers
from retool_exec.backends.docker.backend import DockerBackend
from retool_exec.backends.docker.client import connect
from retool_exec.backends.docker.containers import LABEL_POOL, ContainerFactory
from tests.conftest import LABELS, require_docker

pytestmark = pytest.mark.docker


@pytest.fixture()
def claimed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The uids the test's starts claim (other sandboxes of the run claim theirs)."""
    uids: list[int] = []
    allocate = containers.allocate_sandbox_uid

    def recording(client: Any) -> int:
        uids.append(allocate(client))
        return uids[-1]

    monkeypatch.setattr(containers, "allocate_sandbox_uid", recording)
    return uids


def still_claimed(uids: list[int]) -> set[int]:
    with containers._claimed_lock:
        return set(uids) & containers._claimed_uids


@contextlib.contextmanager
def factory(**options: Any) -> Iterator[ContainerFactory]:
    require_docker()
    config = DockerConfig(labels=LABELS, **options)
    client = connect()
    try:
        choice = DockerBackend(config)._resolve_image(client)
        yield ContainerFactory(
            client, config, choice.tag, send_agent=choice.send_agent, image_path=choice.image_path
        )
    finally:
        client.close()


def left_behind(made: ContainerFactory) -> list[str]:
    """The factory's containers (any state), once its threads have finished."""
    made._threads.shutdown(wait=True)
    gc.collect()  # a socket nobody closed warns here, and the warning fails the test
    listed = made.client.api.containers(all=True, filters={"label": f"{LABEL_POOL}={made.pool_id}"})
    return [each["Id"] for each in listed]


def test_a_start_whose_agent_is_not_ready_in_time_leaves_nothing(claimed: list[int]) -> None:
    with factory(start_timeout=0.05) as made:
        with pytest.raises(TimeoutError):
            asyncio.run(made.create())
        assert left_behind(made) == []
    assert claimed and not still_claimed(claimed)


@pytest.mark.parametrize("after", [0.0, 0.02, 0.1, 0.3, 0.6, 1.0])
def test_a_start_cancelled_at_any_step_leaves_nothing(after: float, claimed: list[int]) -> None:
    """Cancelled before, during and after the docker-py thread's create/attach/start,
    and while waiting for the agent's ready frame."""

    async def cancelled() -> bool:
        start = asyncio.ensure_future(made.create())
        await asyncio.sleep(after)
        start.cancel()
        try:
            container = await start
        except asyncio.CancelledError:
            return True
        await made.destroy(container)  # it was ready before the cancel came
        return False

    with factory() as made:
        asyncio.run(cancelled())
        assert left_behind(made) == []
    assert not still_claimed(claimed)
