"""The fleet: which Ray nodes run sandboxes, and which one takes the next call.

Ray's node table (``ray.nodes()``, read every ``refresh_interval`` seconds)
is the one source of truth for membership: a node that appears (and offers
``node_resource``, if set) gets an actor pinned to it with Ray's
node-affinity strategy (``soft=False``: a sandbox actor never wanders to
another host, whose daemon it would not own); a node that disappears is
dropped. A node takes calls only once its actor has started its pool.

Routing is least-loaded by the driver's own count of calls in flight per
node (each driver has actors of its own, so its count is the node's load,
with no round trip to ask). A node is full at ``capacity`` (its pool size);
when every node is full, callers wait in one FIFO queue and each freed slot
goes to the longest waiter, so no caller is woken for nothing. A caller
waits without a limit while some node is alive (that is queueing, bounded by
the calls ahead of it), and at most ``node_wait`` seconds while none is.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from retool_exec._errors import BackendUnavailableError
from retool_exec.backends.config import DockerConfig, RayConfig
from retool_exec.backends.ray.actor import NODE_LABEL

__all__ = ["Fleet", "Node", "NodeStats"]

log = logging.getLogger(__name__)

ACTOR_RESTARTS = 3
"""Times Ray restarts a node's actor whose process died while its node lives (``max_restarts``).
Past that (or when the node is gone) the actor is dead, the node is dropped, and the next
look at the node table gives a live node a new actor."""
RETRY_FAILED_NODE = 30.0
"""Seconds before a node whose actor failed to start is tried again."""
CLOSE_BUDGET = 30.0
"""Seconds each actor has to remove its containers when the backend closes."""


@dataclass(eq=False)
class Node:
    """One node's actor, as the driver sees it."""

    node_id: str
    actor: Any
    """Ray's ActorHandle (typed Any: Ray ships no type information for it)."""
    capacity: int
    in_flight: int = 0
    sessions: int = 0
    calls: int = 0
    lost: str | None = None
    """Why the node was dropped; None while it takes calls."""

    @property
    def name(self) -> str:
        return self.node_id[:12]


@dataclass(frozen=True, slots=True)
class NodeStats:
    """A snapshot of one node (``RayBackend.nodes()``)."""

    node_id: str
    capacity: int
    in_flight: int
    sessions: int
    calls: int


@dataclass(eq=False)
class _Waiter:
    future: asyncio.Future[Node | None]
    since: float = field(default_factory=time.monotonic)


class Fleet:
    """The nodes of one RayBackend (see the module docstring)."""

    def __init__(self, ray: Any, config: RayConfig, actor_class: Any) -> None:
        self._ray = ray
        self.config = config
        self._actor_class = actor_class
        self.nodes: dict[str, Node] = {}
        self._starting: dict[str, asyncio.Task[None]] = {}
        self._retry_at: dict[str, float] = {}
        self._failures: dict[str, str] = {}
        self._waiters: collections.deque[_Waiter] = collections.deque()
        self._empty_since: float | None = time.monotonic()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._refresher: asyncio.Task[None] | None = None
        self._closed = False
        self.on_drop: list[Callable[[Node], None]] = []

    # -- membership ----------------------------------------------------------------------

    async def start(self) -> None:
        """Start an actor on every eligible node and wait for them; then keep watching."""
        eligible = await self.refresh()
        if not eligible:
            which = (
                f"offering the resource {self.config.node_resource!r}"
                if (self.config.node_resource)
                else "alive"
            )
            raise BackendUnavailableError(
                f"the Ray cluster has no node {which} to run sandboxes on"
            )
        await asyncio.gather(*self._starting.values(), return_exceptions=True)
        if not self.nodes:
            reasons = "; ".join(f"{nid[:12]}: {why}" for nid, why in self._failures.items())
            raise BackendUnavailableError(f"no Ray node could start a sandbox pool: {reasons}")
        self._refresher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.config.refresh_interval)
            try:
                await self.refresh()
            except Exception as exc:  # a GCS hiccup must not end the watching
                log.warning("could not read Ray's node table: %s", exc)
            self._expire_waiters()

    async def refresh(self) -> set[str]:
        """Read the node table once: drop the dead, start actors on the new; the eligible set."""
        table = await asyncio.to_thread(self._ray.nodes)
        resource = self.config.node_resource
        eligible = {
            str(entry["NodeID"])
            for entry in table
            if entry.get("Alive") and (resource is None or entry["Resources"].get(resource, 0) > 0)
        }
        for node_id in list(self.nodes):
            if node_id not in eligible:
                self.drop(self.nodes[node_id], "Ray reports the node dead or gone")
        now = time.monotonic()
        for node_id in eligible:
            if node_id in self.nodes or node_id in self._starting or self._closed:
                continue
            if self._retry_at.get(node_id, 0.0) > now:
                continue
            task = asyncio.get_running_loop().create_task(self._add(node_id))
            self._starting[node_id] = task
            task.add_done_callback(functools.partial(self._started, node_id))
        return eligible

    def _started(self, node_id: str, _task: asyncio.Task[None]) -> None:
        self._starting.pop(node_id, None)

    async def _add(self, node_id: str) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        docker = DockerConfig.model_validate(
            self.config.model_dump(exclude={"kind", *_FLEET_FIELDS})
        )
        docker = docker.model_copy(update={"labels": {**docker.labels, NODE_LABEL: node_id}})
        actor = self._actor_class.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            num_cpus=0,
            max_restarts=ACTOR_RESTARTS,
            max_concurrency=max(1000, 4 * docker.pool_size),
            # No per-call task events to the GCS: CPU on every call for a record nobody
            # reads here (Ray Serve turns them off for its replicas for the same reason).
            enable_task_events=False,
        ).remote(docker.model_dump(mode="json"), node_id)
        budget = docker.start_timeout + (900.0 if docker.auto_build else 60.0)
        try:
            info = await asyncio.wait_for(_ref(actor.start.remote()), budget)
        except asyncio.CancelledError:
            self._kill(actor)
            raise
        except Exception as exc:
            self._failures[node_id] = f"{type(exc).__name__}: {exc}"
            self._retry_at[node_id] = time.monotonic() + RETRY_FAILED_NODE
            log.warning("Ray node %s could not start a sandbox pool: %s", node_id[:12], exc)
            self._kill(actor)
            return
        if self._closed:
            await self._close_actor(actor)
            return
        self._failures.pop(node_id, None)
        self.nodes[node_id] = Node(node_id, actor, int(info["capacity"]))
        self._empty_since = None
        log.info("Ray node %s takes calls (capacity %s)", node_id[:12], info["capacity"])
        self._dispatch()

    def drop(self, node: Node, reason: str) -> None:
        """Stop routing to ``node`` and end its actor; survivors sweep their daemons."""
        if self.nodes.get(node.node_id) is not node:
            return
        del self.nodes[node.node_id]
        node.lost = reason
        log.warning("dropping Ray node %s: %s", node.name, reason)
        self._kill(node.actor)
        if not self.nodes:
            self._empty_since = time.monotonic()
        for callback in self.on_drop:
            callback(node)
        for survivor in self.nodes.values():
            self._track(_ref(survivor.actor.sweep_orphans.remote()))

    def restart(self, node: Node, reason: str) -> None:
        """A node's actor that stopped answering: Ray kills it and starts it again there."""
        log.warning("restarting the actor of Ray node %s: %s", node.name, reason)
        with contextlib.suppress(Exception):
            self._ray.kill(node.actor, no_restart=False)

    def _kill(self, actor: Any) -> None:
        with contextlib.suppress(Exception):
            self._ray.kill(actor, no_restart=True)

    # -- routing -------------------------------------------------------------------------

    def _pick(self) -> Node | None:
        free = [node for node in self.nodes.values() if node.in_flight < node.capacity]
        if not free:
            return None
        return min(free, key=lambda node: (node.in_flight / node.capacity, node.in_flight))

    def least_loaded(self) -> Node | None:
        """The node a new session goes to: fewest sessions, then least busy."""
        if not self.nodes:
            return None
        return min(
            self.nodes.values(), key=lambda node: (node.sessions, node.in_flight / node.capacity)
        )

    async def acquire(self) -> Node | None:
        """A node with a free slot (its count taken), or None when none lived for ``node_wait``."""
        if not self._waiters:
            node = self._pick()
            if node is not None:
                node.in_flight += 1
                return node
        waiter = _Waiter(asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        self._expire_waiters()
        try:
            return await waiter.future
        except asyncio.CancelledError:
            got = waiter.future
            handed = got.result() if got.done() and not got.cancelled() else None
            if handed is not None:
                self.release(handed)  # handed a slot just as the caller gave up
            raise

    def release(self, node: Node) -> None:
        node.in_flight -= 1
        node.calls += 1
        self._dispatch()

    def _dispatch(self) -> None:
        while self._waiters:
            if self._waiters[0].future.done():
                self._waiters.popleft()
                continue
            node = self._pick()
            if node is None:
                return
            node.in_flight += 1
            self._waiters.popleft().future.set_result(node)

    def _expire_waiters(self) -> None:
        """With no node alive, a waiter gives up after ``node_wait`` seconds (checked at each
        look at the node table); on close, every waiter gives up at once."""
        if self._empty_since is None and not self._closed:
            return
        now = time.monotonic()
        for waiter in list(self._waiters):
            since = max(waiter.since, self._empty_since or 0.0)
            if (self._closed or now - since >= self.config.node_wait) and not waiter.future.done():
                waiter.future.set_result(None)

    def stats(self) -> list[NodeStats]:
        return [
            NodeStats(node.node_id, node.capacity, node.in_flight, node.sessions, node.calls)
            for node in self.nodes.values()
        ]

    # -- lifecycle -----------------------------------------------------------------------

    def _track(self, awaitable: Any) -> None:
        async def guarded() -> None:
            with contextlib.suppress(Exception):
                await awaitable

        task = asyncio.get_running_loop().create_task(guarded())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _close_actor(self, actor: Any) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(_ref(actor.close.remote()), CLOSE_BUDGET)
        self._kill(actor)

    async def close(self) -> None:
        """Every actor removes its containers (and its daemon's orphans), then is killed."""
        self._closed = True
        self._expire_waiters()
        if self._refresher is not None:
            self._refresher.cancel()
        starting = list(self._starting.values())
        if starting:  # a node still warming closes its own actor when it sees _closed
            _, late = await asyncio.wait(starting, timeout=CLOSE_BUDGET)
            for task in late:
                task.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(
            *(t for t in (self._refresher, *starting, *self._tasks) if t is not None),
            return_exceptions=True,
        )
        nodes, self.nodes = list(self.nodes.values()), {}
        for node in nodes:
            node.lost = "the backend was closed"
        sweeps = [_ref(node.actor.sweep_orphans.remote()) for node in nodes]
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*sweeps, return_exceptions=True), CLOSE_BUDGET)
        await asyncio.gather(*(self._close_actor(node.actor) for node in nodes))


_FLEET_FIELDS = frozenset(set(RayConfig.model_fields) - set(DockerConfig.model_fields))
"""RayConfig's own fields: everything else is the Docker config each node's pool uses."""


async def _ref(ref: Any) -> Any:
    """Await a Ray ObjectRef (a coroutine, so that ``wait_for`` and ``gather`` take it)."""
    return await ref
