"""Creating, connecting to and destroying sandbox containers, plus finding orphans.

Blocking docker-py calls run in a small thread pool (never on the event
loop); the attach stream of each container is then read and written by the
call that holds it (``AgentChannel``), so a call costs no Docker API request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import docker
import docker.errors

from retool_exec._errors import ImageError
from retool_exec._handoff import LoopRef
from retool_exec.backends.config import DockerConfig, is_gvisor
from retool_exec.backends.docker.agent import wire
from retool_exec.backends.docker.bootstrap import agent_frame
from retool_exec.backends.docker.client import retry_docker
from retool_exec.backends.docker.hardening import container_spec, with_sandbox_uid
from retool_exec.backends.docker.host_cgroup import (
    HostMemory,
    TaskLimitHits,
    busy,
    cpu_seconds,
    find_host_memory,
    find_task_limit_hits,
)
from retool_exec.backends.docker.host_process import has_ended, waits_to_read_stdin
from retool_exec.backends.docker.oom_events import OomEvents
from retool_exec.backends.docker.protocol import AgentChannel, ProtocolError

__all__ = [
    "LABEL_MANAGED",
    "LABEL_OWNER",
    "LABEL_POOL",
    "ContainerFactory",
    "Orphan",
    "SandboxContainer",
    "find_orphans",
    "owner_token",
    "remove_container",
]

T = TypeVar("T")
Silence = Literal["busy", "idle", "stopped"]
"""What a container whose agent is silent past a deadline is doing (``silent_agents_container``)."""
log = logging.getLogger(__name__)

LABEL_MANAGED = "org.retool_exec.managed"
LABEL_OWNER = "org.retool_exec.owner"
LABEL_POOL = "org.retool_exec.pool"
LABEL_POLICY = "org.retool_exec.policy"
LABEL_UID = "org.retool_exec.uid"
"""The uid this container's calls run as: no other live container on the host uses it."""
OOM_EVENTS_WAIT = 1.0
"""Seconds a session's next request may wait for Docker's events of the OOM kills its
agent counted (a few milliseconds; a burst of kills takes up to ~0.5 s under load)."""
OOM_EVENTS_QUIET = 0.15
"""Seconds without a new OOM event after which a burst of them is taken as over: Docker
sends no fixed number of events per kill (one per notification: 4 kills at once gave 27
events under cgroup v1; under cgroup v2 close kills share one)."""

_claimed_uids: set[int] = set()
_claimed_lock = threading.Lock()


def allocate_sandbox_uid(client: docker.DockerClient) -> int:
    """A calls' uid no live container on this host uses (nor one this process is creating).

    Containers of other processes are seen through their ``LABEL_UID`` label;
    two processes creating at the same instant are kept apart by drawing at
    random from a range of 800,000 uids.
    """
    listed = retry_docker(
        lambda: client.api.containers(all=True, filters={"label": f"{LABEL_MANAGED}=1"})
    )
    used = set()
    for info in listed:
        text = (info.get("Labels") or {}).get(LABEL_UID, "")
        if text.isdigit():
            used.add(int(text))
    low, high = wire.SANDBOX_UID_RANGE
    with _claimed_lock:
        for _ in range(1000):
            uid = low + secrets.randbelow(high - low + 1)
            if uid not in used and uid not in _claimed_uids:
                _claimed_uids.add(uid)
                return uid
    raise RuntimeError("no free sandbox uid")


def _undo_result(
    done: Future[T], undo: Callable[[T], object], nothing: Callable[[], object]
) -> None:
    """Hand a finished thread's result to ``undo`` (``nothing()`` when it failed or never
    ran)."""
    try:
        if done.cancelled() or done.exception() is not None:
            nothing()
            return
        undo(done.result())
    except Exception:  # a thread's callback: nobody could catch it
        log.warning("could not undo an abandoned container start", exc_info=True)


def release_sandbox_uid(uid: int | None) -> None:
    with _claimed_lock:
        _claimed_uids.discard(uid or -1)


def _process_start_ticks(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return None


def owner_token(pid: int | None = None) -> str:
    """``host:pid:start-ticks`` of a process: unique even when pids are reused."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{_process_start_ticks(pid) or '?'}"


def _owner_alive(token: str) -> bool:
    host, _, rest = token.partition(":")
    pid_text, _, ticks = rest.partition(":")
    if host != socket.gethostname():
        return True  # another machine's: not ours to judge
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    return _process_start_ticks(pid) == ticks


@dataclass(frozen=True)
class Orphan:
    """A container of ours whose owner process is gone."""

    id: str
    owner: str

    @property
    def short_id(self) -> str:
        return self.id[:12]


def find_orphans(client: docker.DockerClient) -> list[Orphan]:
    """Our containers whose owner process on this host is gone.

    Uses the list endpoint's labels (one request), not per-container inspects,
    which race with other pools removing their containers.
    """
    listed = retry_docker(
        lambda: client.api.containers(all=True, filters={"label": f"{LABEL_MANAGED}=1"})
    )
    orphans = []
    for info in listed:
        owner = (info.get("Labels") or {}).get(LABEL_OWNER, "")
        if not _owner_alive(owner):
            orphans.append(Orphan(id=str(info["Id"]), owner=owner))
    return orphans


def remove_container(client: docker.DockerClient, container_id: str) -> None:
    """Force-remove a container; already gone (or going) is fine."""
    try:
        retry_docker(lambda: client.api.remove_container(container_id, force=True, v=True))
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if exc.status_code != 409:  # 409: removal already in progress
            raise


@dataclass(eq=False)
class SandboxContainer:
    """A started container whose agent said it is ready."""

    id: str
    channel: AgentChannel
    ready: dict[str, Any]
    sandbox_uid: int | None = None
    calls: int = 0
    next_id: int = 0
    nonce: str = ""
    """The current call's nonce: only frames carrying it are the agent's."""
    reset_due: float | None = None
    """While the reset after its last call is not yet confirmed: the ``time.monotonic()``
    by which the confirmation must have come (it is read when the next call takes it)."""
    oom_kills: int = 0
    """The container's OOM kills as its agent last counted them (``oom_kills`` of a reply)."""
    oom_events_due: int | None = None
    """Docker's OOM event count those kills bring it to, awaited before the next request."""
    drawn_by: LoopRef | None = None
    """The event loop (weakly) of the call that took it from the pool or that it is on its
    way to; None while the pool holds it, once it is retired, and in a session."""
    reclaimed: bool = False
    """Retired by the pool because the loop that took it was closed: what that call's
    coroutine does with it afterwards (give it back, retire it) is ignored."""
    host_memory: HostMemory | None = None
    """Under gVisor with reuse: the host's view of what its kernel holds (the pool retires
    the container when a call left it grown past its tolerance: ``host_cgroup``)."""
    task_limit_hits: TaskLimitHits | None = None
    """Under gVisor: where the host counts the container's tasks refused for its pids
    limit, so a call that took the Sentry down that way is charged with it."""


class ContainerFactory:
    """Makes hardened containers for one pool and removes them again."""

    def __init__(
        self,
        client: docker.DockerClient,
        config: DockerConfig,
        image: str,
        *,
        send_agent: bytes | None = None,
        image_path: str | None = None,
        machine_memory: int | None = None,
    ) -> None:
        self.client = client
        self.config = config
        self.image = image
        self._agent_frame = agent_frame(send_agent) if send_agent is not None else b""
        self.pool_id = uuid.uuid4().hex[:12]
        self.labels = {
            **config.labels,
            LABEL_MANAGED: "1",
            LABEL_OWNER: owner_token(),
            LABEL_POOL: self.pool_id,
            LABEL_POLICY: config.policy,
        }
        self._spec = container_spec(
            config,
            image=image,
            labels=self.labels,
            send_agent=send_agent,
            image_path=image_path,
            machine_memory=machine_memory,
        )
        self._threads = ThreadPoolExecutor(max_workers=4, thread_name_prefix="retool-docker")
        self._probes = ThreadPoolExecutor(max_workers=4, thread_name_prefix="retool-probe")
        """Threads of their own for the quick reads a silent agent's call waits on
        (``silent_agents_container``, ``cpu_seconds``): behind removals of containers full of
        fork bombs (seconds each) in ``_threads``, a CPU note was taken 0.6 s late and a
        cell's outcome decided 2.6 s past its deadline (thirty-first round). Four: six
        cells silent at once queued behind two for 2.3 s, past ``VERDICT_PROBE_BUDGET``
        (thirty-fifth session); with the others, within docker-py's ten connections."""
        self._host_memory_unknown = False
        self.oom_events = OomEvents(client, f"{LABEL_POOL}={self.pool_id}")
        """The daemon's OOM events for this pool's containers; started by ``watch_oom``."""

    async def watch_oom(self) -> None:
        """Follow the daemon's OOM events, before the first container is made (a daemon
        that never answers leaves them not followed: Docker's flag judges instead)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                asyncio.shield(self._blocking(self.oom_events.start)), self.config.start_timeout
            )

    async def await_oom_events(self, container_id: str, before: int) -> None:
        """Until Docker's OOM events for ``container_id`` have passed ``before`` and then
        paused for ``OOM_EVENTS_QUIET`` (at most ``OOM_EVENTS_WAIT``): called before a
        session's next request when its agent counted kills, so their events, which come
        later and in no fixed number, are not taken for that request's."""
        give_up = time.monotonic() + OOM_EVENTS_WAIT
        last, quiet_since = before, time.monotonic()
        while time.monotonic() < give_up:
            count = self.oom_events.count(container_id)
            if count is None:
                return
            if count != last:
                last, quiet_since = count, time.monotonic()
            elif count > before and time.monotonic() - quiet_since >= OOM_EVENTS_QUIET:
                return
            await asyncio.sleep(0.01)
        log.warning("the OOM events of container %s did not settle", container_id[:12])

    def oom_count(self, container_id: str) -> int | None:
        """The container's OOM events so far (None when they cannot be followed): taken
        when a request is sent, so ``oom_killed`` counts only that request's."""
        return self.oom_events.count(container_id)

    async def _blocking(self, func: Callable[[], T], *, probe: bool = False) -> T:
        """``func`` in a worker thread (``probe``: of ``_probes``); at interpreter exit, on
        this loop's thread.

        Why the second: ``concurrent.futures`` stops every thread pool when the
        interpreter exits, before ``atexit`` closes the sandboxes left open, and the
        removals it refused left every container of such a sandbox (twenty-third outside
        check). Blocking the sandbox's own loop is then harmless: the close waits anyway.
        """
        try:
            threads = self._probes if probe else self._threads
            work = asyncio.get_running_loop().run_in_executor(threads, func)
        except RuntimeError:  # the pool is shut down
            return func()
        return await work

    async def _blocking_owned(
        self,
        func: Callable[[], T],
        undo: Callable[[T], object],
        nothing: Callable[[], object] = lambda: None,
    ) -> T:
        """``_blocking`` for work that makes something to own (a uid; a container and its
        socket). A caller cancelled first cannot take it, so ``undo`` gets it in the
        worker thread once it is made, even after this loop has closed (``nothing``
        runs instead when the work failed or never ran)."""
        work = self._threads.submit(func)
        try:
            return await asyncio.wrap_future(work)
        except asyncio.CancelledError:
            work.add_done_callback(lambda done: _undo_result(done, undo, nothing))
            raise

    async def create(self) -> SandboxContainer:
        """Create, attach, start, and wait for the agent's ready frame.

        Nothing is left when it fails or is cancelled at any step: no container, no
        open socket, no claimed uid.
        """
        name = f"retool-exec-{self.pool_id}-{uuid.uuid4().hex[:8]}"
        uid = await self._blocking_owned(
            lambda: allocate_sandbox_uid(self.client), release_sandbox_uid
        )
        try:
            container_id, raw_socket = await self._blocking_owned(
                lambda: self._create_sync(name, uid),
                lambda made: self._undo_create(made, uid),
                lambda: release_sandbox_uid(uid),
            )
        except asyncio.CancelledError:
            raise  # the uid is released with what the thread made, once it is removed
        except BaseException:
            release_sandbox_uid(uid)
            raise
        channel = AgentChannel(raw_socket)
        try:
            ready = await channel.receive(timeout=self.config.start_timeout)
            if ready.get("type") == "fatal":
                raise ProtocolError(f"the agent refused to start: {ready.get('reason')}")
            if ready.get("type") != "ready":
                raise ProtocolError(f"agent sent {ready.get('type')!r} instead of ready")
            if ready.get("sandbox_uid") != uid:
                raise ProtocolError(
                    f"the agent runs calls as {ready.get('sandbox_uid')}, not {uid}"
                )
            watched, task_limit_hits = None, None
            if is_gvisor(self.config.runtime):  # (cancelled: removed below)
                watched, task_limit_hits = await self._host_counters(container_id)
        except ProtocolError as exc:
            channel.close()
            starved = await self.oom_killed(container_id, 0, settle=2.0, after_exit=0.5)
            await self.destroy_id(container_id, then=lambda: self._removed(container_id, uid))
            if starved:  # a setting, not a passing failure: say which one
                under = " under gVisor" if is_gvisor(self.config.runtime) else ""
                raise ProtocolError(
                    f"the container ran out of memory while starting: memory_mb="
                    f"{self.config.memory_mb} is too small for this image's preloaded "
                    f"modules{under}; raise it"
                ) from exc
            raise
        except BaseException:
            channel.close()
            await self.destroy_id(container_id, then=lambda: self._removed(container_id, uid))
            raise
        return SandboxContainer(
            id=container_id,
            channel=channel,
            ready=ready,
            sandbox_uid=uid,
            host_memory=watched,
            task_limit_hits=task_limit_hits,
        )

    async def _host_counters(
        self, container_id: str
    ) -> tuple[HostMemory | None, TaskLimitHits | None]:
        """Where the host reads what a gVisor container's kernel holds (with ``reuse``:
        its baseline taken now) and its tasks refused for the pids limit (``host_cgroup``);
        each None where the host cannot read it (the memory's said once)."""

        def find() -> tuple[HostMemory | None, TaskLimitHits | None]:
            pid = self.client.api.inspect_container(container_id).get("State", {}).get("Pid")
            if not isinstance(pid, int) or pid <= 0:
                return None, None
            reused = self.config.policy == "reuse"
            return find_host_memory(pid) if reused else None, find_task_limit_hits(pid)

        try:
            found, task_limit_hits = await self._blocking(find)
        except Exception:
            found, task_limit_hits = None, None
        if self.config.policy != "reuse":
            return None, task_limit_hits
        if found is None and not self._host_memory_unknown:
            self._host_memory_unknown = True
            log.warning(
                "cannot read gVisor containers' memory cgroups on this host: what a call "
                "leaves in gVisor's own kernel is not checked between calls"
            )
        return found, task_limit_hits

    def _removed(self, container_id: str, uid: int | None) -> None:
        """What a removed container held: its OOM count, then its uid (released after the
        removal: until then the container's label holds it)."""
        self.oom_events.forget(container_id)
        release_sandbox_uid(uid)

    def _undo_create(self, made: tuple[str, socket.socket], uid: int) -> None:
        container_id, raw_socket = made
        raw_socket.close()
        try:
            remove_container(self.client, container_id)
        finally:
            self._removed(container_id, uid)

    def _create_sync(self, name: str, uid: int) -> tuple[str, socket.socket]:
        api = self.client.api
        spec = with_sandbox_uid(self._spec, uid, LABEL_UID)
        host_config = api.create_host_config(**spec.host_config)
        host_config.update(spec.host_config_fields)

        def create() -> str:
            try:
                created = api.create_container(**spec.create, name=name, host_config=host_config)
                return str(created["Id"])
            except docker.errors.APIError as exc:
                if exc.status_code == 409:  # a retried create that had in fact succeeded
                    return str(api.inspect_container(name)["Id"])
                raise

        container_id = retry_docker(create)
        self.oom_events.track(container_id)
        duplicate = None
        try:
            attached = api.attach_socket(
                container_id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
            raw = getattr(attached, "_sock", attached)
            if not isinstance(raw, socket.socket):
                raise ProtocolError(
                    f"the attach stream is a {type(raw).__name__}, not a socket; "
                    "use a unix:// or tcp:// DOCKER_HOST (TLS is not supported)"
                )
            # Our own descriptor for the connection: docker-py's objects are closed
            # now (closing is not shutdown(), so the connection stays up).
            duplicate = raw.dup()
            attached.close()
            raw.close()
            try:
                retry_docker(lambda: api.start(container_id))
            except docker.errors.APIError as exc:
                if "executable file not found" in str(exc):
                    raise ImageError(
                        f"image {self.image!r} cannot host the sandbox agent: no python3 on its "
                        f"PATH ({self._spec.create['environment']['PATH']}); it needs "
                        "python3 >= 3.9 (images/README.md)"
                    ) from exc
                raise
            if self._agent_frame:  # the image lacks this agent: the bootstrap reads it first
                duplicate.sendall(self._agent_frame)
        except BaseException:
            if duplicate is not None:
                duplicate.close()
            with contextlib.suppress(Exception):
                api.remove_container(container_id, force=True, v=True)
            self.oom_events.forget(container_id)
            raise
        return container_id, duplicate

    async def destroy(self, container: SandboxContainer) -> None:
        """Kill and remove a container; never raises (see ``destroy_id``)."""
        container.channel.close()

        await self.destroy_id(
            container.id, then=lambda: self._removed(container.id, container.sandbox_uid)
        )

    async def destroy_id(
        self, container_id: str, *, then: Callable[[], None] | None = None
    ) -> None:
        """Remove a container, then run ``then``; never raises. Once begun, the removal
        (in a worker thread) finishes even if the caller is cancelled meanwhile."""

        def remove() -> None:
            try:
                with contextlib.suppress(Exception):
                    remove_container(self.client, container_id)
            finally:
                if then is not None:
                    then()

        try:
            work = self._threads.submit(remove)
        except RuntimeError:  # shut down (interpreter exit, see ``_blocking``): remove it here
            remove()
            return
        try:
            await asyncio.shield(asyncio.wrap_future(work))
        except asyncio.CancelledError:
            if not work.cancelled():
                raise  # our caller was cancelled; the removal goes on in its thread
            if then is not None:  # the executor shut down before it ran: swept by label
                then()

    async def oom_killed(
        self,
        container_id: str,
        before: int | None = None,
        settle: float = 6.0,
        after_exit: float = 1.0,
        *,
        known: bool = False,
    ) -> bool:
        """Whether Docker saw the container OOM-killed since ``before`` (``oom_count``
        when the request was sent); Docker's sticky ``State.OOMKilled`` counts too unless
        a kill is ``known`` to have come before the request (then only the events tell).

        The attach stream can end before the daemon has processed the exit; until
        the container is no longer running (at most ``settle`` seconds) the flag
        is not yet known, so the answer waits for that (gVisor kills the whole
        sandbox on OOM: asking too early turned such calls into sandbox errors).
        The OOM event can also be processed just after the exit (seen under load
        with gVisor), so a stopped container is asked again for ``after_exit``.
        """

        def inspect() -> bool:
            give_up = time.monotonic() + settle
            stopped_at: float | None = None
            while True:
                state = self.client.api.inspect_container(container_id).get("State", {})
                now_count = self.oom_events.count(container_id)
                if before is not None and now_count is not None and now_count > before:
                    return True
                if state.get("OOMKilled") and (before is None or now_count is None or not known):
                    return True  # the flag is exact where no kill came before this request
                now = time.monotonic()
                if not state.get("Running"):
                    stopped_at = now if stopped_at is None else stopped_at
                    if now - stopped_at >= after_exit:
                        return False
                elif now > give_up:
                    return False
                time.sleep(0.05)

        try:
            return await self._blocking(inspect)
        except Exception:
            return False

    async def silent_agents_container(
        self, container_id: str, *, since: tuple[float, float] | None = None
    ) -> Silence:
        """What a container whose agent went silent is doing: ``"busy"`` (running, not
        paused, and busy by ``host_cgroup.busy``, since ``since``, the time and CPU seconds
        noted when the agent was late, else over a sample; busy too where its cgroup
        cannot be read): a call keeping its agent from answering; ``"stopped"``: it ended
        (gVisor's kernel killed for memory or tasks) and its stream's end has not come
        yet; else ``"idle"``: an agent or a daemon that failed on its own, or a container
        someone else froze (which no call can do)."""

        def inspect() -> Silence:
            state = self.client.api.inspect_container(container_id).get("State", {})
            pid = state.get("Pid")
            if state.get("Paused"):
                return "idle"
            if not state.get("Running") or not isinstance(pid, int) or pid <= 0:
                return "stopped"
            if has_ended(pid):
                return "stopped"
            return "idle" if busy(pid, since=since) is False else "busy"

        try:
            return await self._blocking(inspect, probe=True)
        except Exception:
            return "idle"

    async def awaits_next_request(self, container_id: str) -> bool:
        """Whether the agent of a running container (runc: the host sees it as a process)
        is blocked reading its next request: it answered what it was sent, and a silence
        is Docker's stream's (``host_process``). False where the host cannot tell."""
        if self.config.runtime not in {None, "", "runc"}:
            return False

        def inspect() -> bool:
            state = self.client.api.inspect_container(container_id).get("State", {})
            pid = state.get("Pid")
            if state.get("Paused") or not state.get("Running") or not isinstance(pid, int):
                return False
            return pid > 0 and waits_to_read_stdin(pid) is True

        try:
            return await self._blocking(inspect, probe=True)
        except Exception:
            return False

    async def cpu_seconds(self, container_id: str) -> float | None:
        """The CPU seconds the container has used, read on the host (None: unreadable)."""

        def read() -> float | None:
            pid = self.client.api.inspect_container(container_id).get("State", {}).get("Pid")
            return cpu_seconds(pid) if isinstance(pid, int) and pid > 0 else None

        try:
            return await self._blocking(read, probe=True)
        except Exception:
            return None

    async def remove_pool_containers(self) -> None:
        """Remove every container labelled with this pool (the last word on leaks)."""

        def sweep() -> None:
            for info in self.client.api.containers(
                all=True, filters={"label": f"{LABEL_POOL}={self.pool_id}"}
            ):
                with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                    self.client.api.remove_container(info["Id"], force=True, v=True)

        with contextlib.suppress(Exception):
            await self._blocking(sweep)

    def shutdown(self) -> None:
        self.oom_events.close()
        self._threads.shutdown(wait=False, cancel_futures=True)
        self._probes.shutdown(wait=False, cancel_futures=True)
