"""The ray backend on a real multi-node Ray cluster: routing, node loss, node join, restarts.

Each test adds nodes of its own, offering a resource only it asks for
(``node_resource``), so it can kill them without touching the contract
suite's fleet; every node's actor uses this host's Docker daemon. Nothing is
mocked: a node is removed by killing its raylet and workers.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from retool_exec import ExecResult, Outcome, Sandbox, SessionLostError
from retool_exec.backends.config import RayConfig
from retool_exec.backends.ray.actor import NODE_LABEL
from retool_exec.backends.ray.backend import CALL_MARGIN, RayBackend
from tests.conftest import LABELS, SESSION_ID, TEST_LABEL
from tests.ray.cluster import LocalCluster

pytestmark = [pytest.mark.docker, pytest.mark.ray, pytest.mark.slow]


@pytest.fixture()
def cluster(ray_cluster: LocalCluster) -> LocalCluster:
    return ray_cluster


def config(resource: str, **settings: Any) -> RayConfig:
    base: dict[str, Any] = {
        "node_resource": resource,
        "pool_size": 2,
        "labels": LABELS,
        "timeout": 10.0,
        "refresh_interval": 0.25,
    }
    return RayConfig(**{**base, **settings})


def backend_of(sandbox: Sandbox) -> RayBackend:
    assert isinstance(sandbox.backend, RayBackend)
    return sandbox.backend


def containers(**labels: str) -> list[dict[str, Any]]:
    """This session's test containers (any state) that carry ``labels`` too."""
    import docker

    client = docker.from_env()
    try:
        wanted = [f"{TEST_LABEL}={SESSION_ID}", *(f"{k}={v}" for k, v in labels.items())]
        return list(client.api.containers(all=True, filters={"label": wanted}))
    finally:
        client.close()


def wait_until(check: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture()
def resource() -> str:
    return f"fleet-{uuid.uuid4().hex[:8]}"


@pytest.fixture()
def nodes(cluster: LocalCluster, resource: str) -> Iterator[list[Any]]:
    """Nodes this test adds (two to start with); whatever is left is removed after."""
    added = [cluster.add_node({resource: 1}) for _ in range(2)]
    yield added
    for node in added:
        if node in cluster.cluster.worker_nodes:
            cluster.remove_node(node)


def test_calls_spread_over_the_nodes_least_loaded_first(nodes: list[Any], resource: str) -> None:
    with Sandbox(config(resource), max_workers=4) as sandbox:
        sandbox.start()
        backend = backend_of(sandbox)
        assert {s.node_id for s in backend.nodes()} == {LocalCluster.node_id(n) for n in nodes}
        assert sandbox.concurrency == 4  # max_workers, below max_in_flight
        results = sandbox.run_many([f"import time; time.sleep(0.3); print({i})" for i in range(8)])
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(8)]
        assert {r.backend for r in results} == {"ray"}
        # Four at once over two nodes of two slots each: both nodes were full, twice.
        assert sorted(s.calls for s in backend.nodes()) == [4, 4]
        node_ids = {LocalCluster.node_id(n) for n in nodes}
        labelled = {c["Labels"].get(NODE_LABEL) for c in containers()} & node_ids
        assert labelled == node_ids  # each node's containers carry its id


def test_a_node_lost_under_load_loses_no_call_and_a_new_node_takes_calls(
    cluster: LocalCluster, nodes: list[Any], resource: str
) -> None:
    total, callers = 240, 16
    codes = [f"import time; time.sleep(0.15); print({i} * {i})" for i in range(total)]
    done: list[ExecResult | None] = [None] * total
    finished = threading.Semaphore(0)
    with Sandbox(config(resource), max_workers=callers) as sandbox:
        sandbox.start()
        backend = backend_of(sandbox)
        victim, survivor = nodes
        victim_id = LocalCluster.node_id(victim)

        def call(i: int) -> None:
            done[i] = sandbox.run_code(codes[i])
            finished.release()

        with ThreadPoolExecutor(callers) as pool:
            futures = [pool.submit(call, i) for i in range(total)]
            for _ in range(total // 4):
                finished.acquire()
            victim_load = next(s.in_flight for s in backend.nodes() if s.node_id == victim_id)
            cluster.remove_node(victim)  # mid-load: its calls in flight are lost with it
            for _ in range(total // 4):
                finished.acquire()
            newcomer = cluster.add_node({resource: 1})
            nodes.append(newcomer)
            newcomer_id = LocalCluster.node_id(newcomer)
            for future in futures:
                future.result(timeout=300)  # every call returns (never raises, never hangs)
        stats = {s.node_id: s for s in backend.nodes()}
        assert victim_id not in stats
        assert newcomer_id in stats and stats[newcomer_id].calls > 0, stats
        reruns = backend.reruns
    assert victim_load > 0
    results = [r for r in done if r is not None]
    assert len(results) == total
    for i, result in enumerate(results):
        if result.outcome is Outcome.SANDBOX_ERROR:  # allowed, but explicit and named
            assert "node" in result.detail, result
        else:
            assert (result.outcome, result.stdout) == (Outcome.SUCCESS, f"{i * i}\n"), result
    rerun = [r for r in results if "run again after losing its node" in r.detail]
    assert reruns >= 1 and len(rerun) == reruns
    assert all(r.ok for r in rerun), rerun
    # Nothing left: the live nodes' pools are closed, and the dead node's containers (its
    # actor's process is gone) were swept by a surviving node sharing this daemon.
    node_ids = {victim_id, LocalCluster.node_id(survivor), newcomer_id}
    assert not [c for c in containers() if c["Labels"].get(NODE_LABEL) in node_ids]


def test_a_restarted_node_actor_removes_its_predecessors_containers(
    cluster: LocalCluster, nodes: list[Any], resource: str
) -> None:
    cluster.remove_node(nodes.pop())  # one node: every call goes to it
    node_id = LocalCluster.node_id(nodes[0])
    with Sandbox(config(resource), max_workers=2) as sandbox:
        assert sandbox.run_code("print(1)").stdout == "1\n"
        before = {c["Id"] for c in containers(**{NODE_LABEL: node_id})}
        assert before
        fleet = backend_of(sandbox).fleet
        assert fleet is not None
        node = fleet.nodes[node_id]
        cluster.ray.kill(node.actor, no_restart=False)  # its process dies; Ray restarts it
        results = [sandbox.run_code("print(2)") for _ in range(3)]
        assert results[-1].stdout == "2\n", results
        # The first call may have met the dying actor: then it was run again, not lost.
        assert all(r.ok for r in results), results
        after = {c["Id"] for c in containers(**{NODE_LABEL: node_id})}
        assert after and not (before & after)


def test_a_session_stays_on_its_node_and_ends_when_the_node_dies(
    cluster: LocalCluster, nodes: list[Any], resource: str
) -> None:
    with Sandbox(config(resource)) as sandbox:
        session = sandbox.open_session()
        session.run_code("x = 41")
        branch = session.fork()
        assert session.run_code("x + 1").cells[0].display == [{"text/plain": "42"}]
        homes = [s.node_id for s in backend_of(sandbox).nodes() if s.sessions]
        assert len(homes) == 1  # the session and its fork live on one node
        home = next(n for n in nodes if LocalCluster.node_id(n) == homes[0])
        with ThreadPoolExecutor(1) as pool:
            cell = pool.submit(session.run_code, "import time\ntime.sleep(30)\nx", timeout=60)
            time.sleep(1.0)
            nodes.remove(home)
            started = time.monotonic()
            cluster.remove_node(home)
            result = cell.result(timeout=30)
        assert time.monotonic() - started < 20  # ended by the node's loss, not by its timeout
        assert result.outcome is Outcome.SANDBOX_ERROR, result
        assert "session lost" in result.detail and "Ray node" in result.detail, result
        with pytest.raises(SessionLostError):
            session.run_code("x")
        with pytest.raises(SessionLostError):
            branch.fork()
        assert sandbox.run_code("print('fleet lives')").stdout == "fleet lives\n"
        fresh = sandbox.open_session()  # a new session goes to the live node
        assert fresh.run_code("1 + 1").cells[0].display == [{"text/plain": "2"}]


def test_closing_a_session_while_its_family_runs_a_cell_loses_nothing(
    nodes: list[Any], resource: str
) -> None:
    """A close waits for the family's running cell (one frame stream a family), longer than
    CALL_MARGIN when the cell is long: that wait is not a hung node."""
    with Sandbox(config(resource)) as sandbox:
        session = sandbox.open_session()
        session.run_code("import time")
        branch = session.fork()
        long_cell = f"time.sleep({CALL_MARGIN + 3})\nprint('done')"
        with ThreadPoolExecutor(1) as pool:
            cell = pool.submit(session.run_code, long_cell, timeout=CALL_MARGIN + 10)
            time.sleep(1.0)
            branch.close()
            result = cell.result(timeout=60)
        assert result.ok and result.stdout == "done\n", result
        assert session.run_code("print('alive')").stdout == "alive\n"
        assert backend_of(sandbox).reruns == 0


def test_a_fleet_with_no_node_for_it_is_an_error_at_start(resource: str) -> None:
    from retool_exec import BackendUnavailableError

    sandbox = Sandbox(config(resource))
    try:
        with pytest.raises(BackendUnavailableError, match=resource):
            sandbox.start()
    finally:
        sandbox.close()


def test_without_ray_the_error_says_what_to_install() -> None:
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from retool_exec import Sandbox, BackendUnavailableError\n"
        "sandbox = Sandbox(backend='ray')\n"
        "try:\n"
        "    sandbox.start()\n"
        "except BackendUnavailableError as exc:\n"
        "    print(exc)\n"
        "finally:\n"
        "    sandbox.close()\n"
        "print('ray' in sys.modules and sys.modules['ray'] is not None)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert "pip install 'retool_exec[ray]'" in out
    assert out.endswith("False\n")


def test_a_hung_node_actor_is_restarted_and_its_call_run_again(
    cluster: LocalCluster, nodes: list[Any], resource: str
) -> None:
    import os
    import signal

    cluster.remove_node(nodes.pop())  # one node: the call cannot go elsewhere first
    settings = {"timeout": 2.0, "start_timeout": 5.0, "rerun_budget": 60.0}
    with Sandbox(config(resource, **settings), max_workers=2) as sandbox:
        assert sandbox.run_code("print(1)").stdout == "1\n"
        fleet = backend_of(sandbox).fleet
        assert fleet is not None
        (node,) = fleet.nodes.values()
        pid = int(cluster.ray.get(node.actor.load.remote())["pid"])
        os.kill(pid, signal.SIGSTOP)  # the actor hangs: alive to Ray, silent to us
        try:
            started = time.monotonic()
            result = sandbox.run_code("print(3)")
            took = time.monotonic() - started
        finally:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
        assert (result.outcome, result.stdout) == (Outcome.SUCCESS, "3\n"), result
        assert "no answer within" in result.detail, result
        budget = 2.0 + 2.0 + 5.0 + CALL_MARGIN  # timeout + host_grace + start_timeout + margin
        assert budget <= took < budget + 20
        assert int(cluster.ray.get(node.actor.load.remote())["pid"]) != pid
