"""DockerBackend: each call runs in a hardened container, forked from a warm zygote.

Registered as ``"docker"``. ``Sandbox(backend="docker")`` and
``Sandbox(backend=DockerConfig(policy="reuse", runtime="runsc"))`` both land
here. The hot path of a call is two frames over an already-open attach
stream; Docker's API is only used to start and remove containers, in the
background.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import secrets
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import docker
import docker.errors

from retool_exec._errors import BackendUnavailableError, ImageError, SessionLostError
from retool_exec._models import CellResult, ExecResult, Outcome, classify_exit
from retool_exec._output import finish_stream, read_cap_bytes
from retool_exec.backends.base import Backend, RunRequest, SessionHandle
from retool_exec.backends.config import DockerConfig
from retool_exec.backends.docker import frame_limit
from retool_exec.backends.docker.agent import wire
from retool_exec.backends.docker.client import connect, retry_docker
from retool_exec.backends.docker.containers import (
    ContainerFactory,
    SandboxContainer,
    Silence,
    find_orphans,
    remove_container,
)
from retool_exec.backends.docker.pool import PoolUnavailableError, WarmPool
from retool_exec.backends.docker.protocol import AgentChannel, ProtocolError

if TYPE_CHECKING:
    from retool_exec.backends.docker.image_inputs import ImageChoice

__all__ = ["DockerBackend", "PoolStats"]

log = logging.getLogger(__name__)
A = TypeVar("A")

START_GRACE = 5.0
"""Seconds a container has to start the code (its "started" frame); past them it is taken
as broken (paused, wedged) and, since the code provably never ran, the call moves on."""
LATE_PROBE = 0.5
"""Seconds past its time limit at which a call the agent has not answered has its
container's CPU noted (``_note_cpu``; a quarter of ``host_grace`` if less)."""
ANSWER_IN_TRANSIT = 5.0
"""Seconds more a call waits, at the end of its wait, for an answer its runc agent has
given (it waits for its next request): Docker's stream can stall that long on a loaded
host (``host_process``). Past them the call is the sandbox's failure, as before."""
RESULT_AFTER_LIMIT = 0.8
"""Seconds past its time limit that a call's result may take once the agent has said the
call ended (an ``ended`` frame): then the call comes back on time with its own outcome,
its output lost (``DockerBackend._output_lost``), whatever its code made the result (0.8 s:
within the promise of timeout + 1 s, with room for the host's own steps)."""
RETRIES_BEFORE_START = 1
"""Times a call whose container failed before its code began is run on another one: its
stream ended, its agent said it failed, or it said nothing for ``START_GRACE`` while the
call's deadline was still ahead (a frozen container; the call then costs up to
``START_GRACE`` more, not its result). Never once the deadline itself has passed: a second
wait doubled it (a 1 s call with 2 s of grace answered after 6 s; twenty-third outside
check)."""


class CallProgress:
    """What the host has seen of one call: whether its code has started, how it ended."""

    code_started = False
    ended: dict[str, Any] | None = None
    """The agent's ``ended`` frame: the outcome, sent ahead of a result that may be slow."""
    deadline = math.inf
    """The ``time.monotonic()`` past which the host stops waiting for the call."""
    cpu_when_late: tuple[float, float] | None = None
    """When the agent was ``LATE_PROBE`` seconds past the call's limit without an answer,
    and the container's CPU seconds then (``_note_cpu``)."""
    cpu_noted = False
    """Whether ``receive_noting_cpu`` took its one note (the probe may have found none)."""
    task_limit_seen = False
    """Under gVisor: whether a sample during the wait (``receive_noting_cpu``) found the
    container's pids limit reached since the request (the cgroup is gone once the
    stream ends, so it is read while the agent is silent)."""
    tasks_before: int | None = None
    """The container's pids-limit refusals when the request was sent (``task_limit_count``)."""
    in_transit_until: float | None = None
    """Set when the wait ended with the agent waiting for its next request: the
    ``time.monotonic()`` until which the host waits for its answer in Docker's stream."""
    silence: Silence | None = None
    """What the container did while its agent was silent to the wait's end
    (``silent_agents_container``), asked as the wait ends (None: not asked)."""
    questions_until: float | None = None
    """When the host stops asking Docker about the silent agent: ``VERDICT_QUESTIONS``
    from the wait's first end, however many frames come between its questions."""


TASK_LIMIT_SAMPLE = 0.1
"""Seconds between two reads of a gVisor container's pids-limit refusals while its agent
is silent: the Sentry died 1-3 s after the first one, and its cgroup went with it."""
TASK_LIMIT_KILLED = (
    "the call's processes and threads took the container's task limit (pids): gVisor's "
    "kernel could not go on, and the container was killed whole"
)


def task_limit_count(container: SandboxContainer) -> int | None:
    """The container's tasks refused for its pids limit so far, where the host reads
    them (gVisor): noted when a request is sent."""
    hits = container.task_limit_hits
    sample = None if hits is None else hits.sample()
    return None if sample is None else sample[0]


def sample_task_limit(
    container: SandboxContainer, progress: CallProgress, before: int | None
) -> None:
    """Note in ``progress`` whether the container's pids limit refused a task since
    ``before`` or its tasks are at the limit now (``TaskLimitHits.reached``)."""
    hits = container.task_limit_hits
    sample = None if hits is None or before is None else hits.sample()
    if hits is not None and before is not None and sample is not None:
        refused, tasks = sample
        progress.task_limit_seen |= refused > before or hits.reached(tasks)


def task_limit_reached(
    container: SandboxContainer, progress: CallProgress, before: int | None
) -> bool:
    """Whether the container's pids limit was reached since ``before``: as sampled during
    the wait (the cgroup is removed with the container), or read now. A call's doing:
    gVisor keeps the call's own tasks to ``pids``, and the limit has room for the
    Sentry's host tasks of as many, so only a call's churn reaches it (``TaskLimitHits``)."""
    sample_task_limit(container, progress, before)
    return progress.task_limit_seen


VERDICT_PROBE_BUDGET = 2.0
"""Seconds the host asks Docker, at a silent call's deadline, whether its container is
busy or its agent answered: a daemon that stalls the stream may stall those answers too
(docker-py would wait 60 s); not known by then, the answer is no."""
VERDICT_QUESTIONS = 2 * VERDICT_PROBE_BUDGET
"""Seconds all of a call's questions about its silent agent take at most: its two
(answered? busy?), however many times a frame that comes meanwhile (``started``,
``ended``) sends the wait round again (a review found each round asking anew)."""


async def _answered_within(asking: Coroutine[Any, Any, A], seconds: float, unknown: A) -> A:
    """``asking``'s answer, or ``unknown`` past ``seconds`` (its worker thread ends on
    its own)."""
    try:
        return await asyncio.wait_for(asking, seconds)
    except TimeoutError:
        return unknown


async def _asked_while_listening(
    channel: AgentChannel, asking: Coroutine[Any, Any, A]
) -> dict[str, Any] | A:
    """``asking``'s answer about a silent agent, or the agent's frame if one comes first.

    Why: at a wait's end the host asks Docker about the container, which took 2.3 s on
    a loaded host (six fork bombs in cells under gVisor, each to its limit); the cell's
    answer arrived meanwhile, unread, and the verdict said the container had failed: a
    ``sandbox_error`` the cell's own code caused (a CI run of the thirty-fifth session).
    A stream that ends meanwhile ends the question: its ProtocolError is raised, and the
    end judged as any stream's end (a container that stopped under its silent agent,
    gVisor's kernel killed for memory, could still read as running, or as busy).

    The listen is cancelled and awaited before the caller reads again: a cancelled read
    still unwinding removed the channel's reader that the caller's next read had set,
    and that read never woke (a stalled stream's answer, delivered, went unread)."""
    probe = asyncio.ensure_future(asking)
    frame = asyncio.ensure_future(channel.receive())
    probe.add_done_callback(_exception_taken)
    frame.add_done_callback(_exception_taken)
    try:
        await asyncio.wait({probe, frame}, return_when=asyncio.FIRST_COMPLETED)
        if frame.done() and not frame.cancelled():
            return frame.result()  # (or its ProtocolError)
        return await probe
    finally:
        probe.cancel()  # (its worker thread ends on its own)
        if not frame.done():
            frame.cancel()
            await asyncio.wait({frame})


def _question_budget(progress: CallProgress) -> float:
    """Seconds one more question about a silent agent may take (``VERDICT_QUESTIONS``)."""
    if progress.questions_until is None:
        progress.questions_until = time.monotonic() + VERDICT_QUESTIONS
    return min(VERDICT_PROBE_BUDGET, progress.questions_until - time.monotonic())


def _exception_taken(task: asyncio.Future[Any]) -> None:
    """Take a finished task's exception (a listen's stream ended: the verdict stands; a
    probe's answer came too late to matter)."""
    if not task.cancelled():
        task.exception()


def stream_stalled() -> str:
    """Why a call whose agent answered (``host_process``) got no answer: the stream's."""
    return (
        "the agent answered, but Docker's stream did not deliver its answer within "
        f"{ANSWER_IN_TRANSIT:g} s of the deadline; the container was killed"
    )


def _may_run_again(attempt: int, progress: CallProgress, broken: bool = False) -> bool:
    """Whether a call whose code provably never began runs again in a fresh container:
    once, while its deadline is ahead (or however late, if its container's stream broke:
    the call never had its chance). Not a second draw: the code never ran."""
    return attempt < RETRIES_BEFORE_START and (broken or time.monotonic() < progress.deadline)


class DockerBackend(Backend):
    """Hardened, warm Docker containers; see ``DockerConfig`` for the knobs."""

    name = "docker"

    def __init__(self, config: DockerConfig | None = None) -> None:
        self.config = config or DockerConfig()
        self._client: docker.DockerClient | None = None
        self._pool: WarmPool | None = None
        self._factory: ContainerFactory | None = None
        self.image: str | None = None
        self.startup_seconds: float | None = None
        self._session_containers: set[SandboxContainer] = set()
        self._session_ends: set[asyncio.Future[object]] = set()
        self._closed = False

    @property
    def capacity(self) -> int:
        """One call per container: calls beyond ``pool_size`` wait in the Sandbox's queue."""
        return self.config.pool_size

    @property
    def pool(self) -> WarmPool | None:
        """The warm pool, once started (for benchmarks and tests)."""
        return self._pool

    async def start(self) -> None:
        if self._pool is not None:
            return
        self._closed = False
        started = time.perf_counter()
        client = await asyncio.to_thread(connect, self.config.docker_host)
        try:
            choice = await asyncio.to_thread(self._resolve_image, client)
            self.image = choice.tag
            await asyncio.to_thread(_remove_orphans, client)
            machine_memory = await asyncio.to_thread(self._check_runtime, client)
        except BaseException:
            client.close()
            raise
        factory = ContainerFactory(
            client,
            self.config,
            choice.tag,
            send_agent=choice.send_agent,
            image_path=choice.image_path,
            machine_memory=machine_memory,
        )
        pool = WarmPool(
            factory,
            size=self.config.pool_size,
            reuse=self.config.policy == "reuse",
            max_calls=self.config.max_calls_per_container,
        )
        self._client, self._factory, self._pool = client, factory, pool
        try:
            await factory.watch_oom()
            await pool.start(self.config.start_timeout)
        except PoolUnavailableError as exc:
            await self.close()
            raise BackendUnavailableError(str(exc)) from exc
        self.startup_seconds = time.perf_counter() - started

    def _resolve_image(self, client: docker.DockerClient) -> ImageChoice:
        from retool_exec.backends.docker import image as image_module
        from retool_exec.backends.docker import image_inputs

        spec = self.config.spec
        tag = self.config.image or image_inputs.image_tag(spec)
        try:
            attrs = retry_docker(lambda: client.images.get(tag)).attrs
        except docker.errors.ImageNotFound as exc:
            if self.config.image is not None:
                ours = tag.startswith(f"{image_inputs.IMAGE_REPOSITORY}:")
                raise ImageError(
                    f"image {tag!r} is not present in the Docker daemon; images are never "
                    "pulled (no registry is assumed): "
                    + (
                        "build this project's image with `retool-exec image build`"
                        if ours
                        else "load it with `docker load` or `docker import` first"
                    )
                ) from exc
            if not self.config.auto_build:
                raise ImageError(
                    f"sandbox image {tag!r} ({spec.describe()}) is not present; build it "
                    f"with `retool-exec image build{image_inputs.build_flags(spec)}`"
                ) from exc
            log.warning(
                "sandbox image %s (%s) is missing; building it (once, a minute or two)",
                tag,
                spec.describe(),
            )
            try:
                built = image_module.build_image(
                    client, spec, progress=lambda line: log.warning("image build: %s", line)
                )
                attrs = retry_docker(lambda: client.images.get(built.tag)).attrs
            except Exception as exc:
                raise ImageError(f"could not build the sandbox image {tag!r}: {exc}") from exc
        except docker.errors.APIError as exc:
            if not exc.is_client_error():
                raise
            # Docker's word on the name itself (an invalid reference format): it was a raw
            # APIError at the first call (thirty-third red-team round).
            raise ImageError(f"image {tag!r} cannot be used: {exc.explanation or exc}") from exc
        return image_inputs.image_choice(tag, attrs)

    def _check_runtime(self, client: docker.DockerClient) -> int | None:
        """Refuse a runtime Docker lacks. With one (gVisor), the bytes of memory of the
        machine Docker runs on (``MemTotal``), the most one allocation gets there as under
        runc (``hardening.agent_arguments``); runc's own kernel needs no telling."""
        if not self.config.runtime:
            return None
        info = retry_docker(client.info)
        runtimes = info.get("Runtimes", {})
        if self.config.runtime not in runtimes:
            raise BackendUnavailableError(
                f"Docker has no runtime {self.config.runtime!r} (it has: {', '.join(runtimes)}); "
                "install gVisor and register it in /etc/docker/daemon.json"
            )
        memory = info.get("MemTotal")
        return memory if isinstance(memory, int) and memory > 0 else None

    @property
    def runs_on_any_loop(self) -> bool:
        """Once started, a call runs on whichever event loop awaits it (see ``WarmPool``)."""
        return self._pool is not None

    async def run(self, request: RunRequest) -> ExecResult:
        started = time.perf_counter()
        if self._pool is None and not self._closed:
            await self.start()
        pool = self._pool
        if pool is None:  # closed: a call still queued must not start a pool of its own
            return self._failure(started, "the Docker backend was closed")
        frame = self._run_frame(request)
        too_large = frame_limit.encoded_size_if_too_large(frame, frame_limit.upper_bound(request))
        if too_large is not None:
            return frame_limit.rejected(too_large, self.name, time.perf_counter() - started)
        for attempt in range(1 + RETRIES_BEFORE_START):
            try:
                container = await pool.acquire(self.config.start_timeout)
            except PoolUnavailableError as exc:
                return self._failure(started, f"no sandbox container available: {exc}")
            waited = time.perf_counter() - started
            progress = CallProgress()
            oom_before = self.container_oom_count(container)
            tasks_before = progress.tasks_before = task_limit_count(container)
            try:
                reply = await self._call(container, request, progress, frame)
            except (TimeoutError, ProtocolError) as exc:
                # A stream that ended, or a container found stopped under its silent agent
                # as the wait ended (``progress.silence``: the end had not come through
                # yet), may be gVisor's kernel killed for memory or tasks; a silent agent
                # in a running container has nothing to ask. Read first: the cgroup goes
                # with the container (``task_limit_reached``).
                ended = isinstance(exc, ProtocolError) or progress.silence == "stopped"
                over_tasks = ended and task_limit_reached(container, progress, tasks_before)
                # Asked even without a "started" frame: the agent sends that frame only
                # once a call has run 50 ms, and only code can outgrow the container.
                try:
                    oom = (
                        ended
                        and self._factory is not None
                        and await self._factory.oom_killed(
                            container.id, oom_before, known=container.oom_kills > 0
                        )
                    )
                    # (Asked only once the wait reached the call's deadline.)
                    held_up = progress.silence == "busy"
                finally:
                    pool.retire(container)
                broken = isinstance(exc, ProtocolError)
                if (
                    not progress.code_started
                    and not oom
                    and not over_tasks
                    and _may_run_again(attempt, progress, broken)
                ):
                    # The code provably never ran (no "started" frame): run it elsewhere.
                    log.warning("retrying a call whose container failed before it began: %s", exc)
                    continue
                if oom:  # the code outgrew the container (gVisor kills the sandbox as a whole)
                    return self._container_oom(started, waited)
                if over_tasks:
                    return self._task_limit_killed(started, waited)
                if isinstance(exc, TimeoutError) and progress.ended is not None:
                    return self._output_lost(progress, started, waited)
                if held_up:
                    return self._silent_past_deadline(
                        container, oom_before, request, started, waited
                    )
                if isinstance(exc, TimeoutError) and progress.in_transit_until is not None:
                    return self._failure(started, stream_stalled(), waited)
                if isinstance(exc, TimeoutError):
                    return self._failure(
                        started,
                        "the agent was silent past the deadline "
                        f"({request.timeout + self.config.host_grace:.1f}s), its container "
                        "idle, paused or stopped; the container was killed",
                        waited,
                    )
                return self._failure(
                    started, f"the sandbox container failed mid-call: {exc}", waited
                )
            except BaseException:  # cancelled (or its loop went away): the call may still run
                pool.retire(container)
                raise
            # A container whose agent counted new OOM kills is not reused: their Docker
            # events may come after the next call was sent and count for it.
            killed = self.note_oom_kills(container, reply, oom_before)
            if self.config.policy == "reuse" and not killed:
                pool.release(container)
            else:
                pool.retire(container)
            if (
                reply.get("started") is False
                and not reply.get("timed_out")
                and not reply.get("setup_error")
                and _may_run_again(attempt, progress)
            ):
                # Its process ended before the code's first line (a child forked ahead
                # and killed as it waited, thirty-second round): the code never ran, so
                # it runs again in a fresh one, as a container failing before it would.
                log.warning("retrying a call whose process ended before its code began")
                continue
            try:
                return self._result(reply, started, waited, self._cell_chars(request))
            except (ProtocolError, ValueError) as exc:
                return self._failure(started, f"the agent's result was malformed: {exc}", waited)
        return self._failure(
            started, "no healthy sandbox container: each one failed before the code began"
        )

    async def open_session(self, *, memory_mb: int | None = None) -> SessionHandle:
        """A session family of its own: a warm container taken out of the pool for good."""
        from retool_exec.backends.docker.sessions import DockerSession

        if self._pool is None:
            await self.start()
        pool = self._pool
        assert pool is not None
        try:
            container = await pool.acquire(self.config.start_timeout)
        except PoolUnavailableError as exc:
            raise SessionLostError(f"no sandbox container for the session: {exc}") from exc
        pool.detach(container)
        self._session_containers.add(container)
        try:
            return await DockerSession.open(self, container, memory_mb)
        except BaseException:
            await self.destroy_session_container(container)
            raise

    async def destroy_session_container(self, container: SandboxContainer) -> None:
        """The end of a session family: its container is destroyed (never reused)."""
        if container in self._session_containers:
            self._session_containers.discard(container)
            if self._factory is not None:
                await self._factory.destroy(container)

    def end_session_container_soon(self, container: SandboxContainer) -> None:
        """A lost session family's container, destroyed in the background: its stream is
        closed now, and ``close()`` waits for the removal.

        Why not awaited: a cell's result is known before its container is gone, and
        removing one full of a fork bomb's processes took 5-10 s, which the cell's caller
        waited on top of its time limit (the thirty-first round)."""
        if container not in self._session_containers:
            return
        self._session_containers.discard(container)
        container.channel.close()
        if self._factory is not None:
            self.end_soon(self._factory.destroy(container))

    def end_soon(self, ending: Coroutine[Any, Any, object]) -> None:
        """Run the end of a session or of its family's container in the background, on
        this loop; ``close()`` waits for it."""
        task = asyncio.ensure_future(ending)
        self._session_ends.add(task)
        task.add_done_callback(self._session_ends.discard)  # (the set of its time)

    def note_oom_kills(
        self, container: SandboxContainer, reply: dict[str, Any], before: int | None
    ) -> bool:
        """Whether the reply's agent counted OOM kills the host had not seen. Their Docker
        events can come after the next request was sent and count for it (an earlier
        cell's late event made the next cell's lost container its ``oom``), so the
        request's starting count is noted for ``await_oom_events_due``."""
        kills = reply.get("oom_kills")
        if not isinstance(kills, int) or isinstance(kills, bool) or kills <= container.oom_kills:
            return False
        container.oom_kills = kills
        if before is not None:
            container.oom_events_due = before
        return True

    async def await_oom_events_due(self, container: SandboxContainer) -> None:
        """Before a session's request is sent: the Docker events of kills counted earlier
        (at most ``containers.OOM_EVENTS_WAIT``, off the earlier request's result path).
        The request's deadline starts after it: taken from its time, a cell that ran to
        its own limit would read as the container lost; so its result can come up to
        that much later than its limit + grace, once, after a cell's OOM kills."""
        due, container.oom_events_due = container.oom_events_due, None
        if due is not None and self._factory is not None:
            await self._factory.await_oom_events(container.id, due)

    def container_oom_count(self, container: SandboxContainer) -> int | None:
        """``container``'s OOM events so far, taken when a request is sent to it."""
        return self._factory.oom_count(container.id) if self._factory is not None else None

    def oom_counted_since(self, container: SandboxContainer, before: int | None) -> bool:
        """Whether Docker counted an OOM kill in ``container`` since ``before``, read now:
        for a container still running (``container_oom_killed`` waits for it to stop)."""
        counted = self.container_oom_count(container)
        return before is not None and counted is not None and counted > before

    async def silence_of(self, container: SandboxContainer, progress: CallProgress) -> Silence:
        """What a container whose agent was silent past the deadline was doing, since
        ``progress``'s CPU note (``ContainerFactory.silent_agents_container``); not
        known within ``VERDICT_PROBE_BUDGET`` (and the call's ``questions_until``), it was
        idle."""
        budget = _question_budget(progress)
        if self._factory is None or budget <= 0:
            return "idle"
        asking = self._factory.silent_agents_container(container.id, since=progress.cpu_when_late)
        return await _answered_within(asking, budget, "idle")

    async def container_oom_killed(self, container: SandboxContainer, before: int | None) -> bool:
        """Whether Docker saw ``container`` killed for memory since ``before`` (after
        its stream ended)."""
        return self._factory is not None and await self._factory.oom_killed(
            container.id, before, known=container.oom_kills > 0
        )

    def _run_frame(self, request: RunRequest) -> dict[str, Any]:
        """The call's frame to the agent, but for its id and nonce (``_call`` adds them)."""
        frame: dict[str, Any] = {
            "type": "run",
            "code": request.code,
            "timeout": request.timeout,
            "cpu_seconds": self.config.cpu_seconds or request.cpu_seconds,
            "read_cap": read_cap_bytes(self.config.max_output_chars),
            "reset": self.config.policy == "reuse",
        }
        if request.auto_print:
            frame["auto_print"] = True
        if request.memory_mb is not None:
            frame["memory_mb"] = min(request.memory_mb, self.config.memory_mb)
        if request.stack_mb is not None:
            frame["stack_mb"] = min(request.stack_mb, self.config.memory_mb)
        if request.stdin is not None:
            frame["stdin"] = wire.b64encode(request.stdin)
        files = dict(request.files)
        if request.script is not None:  # the code is also a file there, as with `python FILE`
            files[request.script] = request.code.encode("utf-8", "surrogatepass")
            frame["script"] = request.script
        if files:
            frame["files"] = [[path, wire.b64encode(data)] for path, data in files.items()]
        if request.fetch:
            frame["fetch"] = list(request.fetch)
            frame["fetch_cap"] = request.fetch_budget
        if request.cells:
            frame["cells"] = list(request.cells)
            frame["cell_timeout"] = request.cell_timeout
            frame["cell_read_cap"] = read_cap_bytes(self._cell_chars(request))
            frame["text_cap"] = self._cell_chars(request)  # a value's, as local cuts it
        return frame

    async def _call(
        self,
        container: SandboxContainer,
        request: RunRequest,
        progress: CallProgress | None = None,
        frame: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        container.next_id += 1
        call_id = container.next_id
        container.nonce = secrets.token_hex(16)
        frame = {
            **(frame or self._run_frame(request)),
            "id": call_id,
            "nonce": container.nonce,
        }
        progress = progress or CallProgress()
        sent = time.monotonic()
        await container.channel.send(frame, timeout=START_GRACE)
        # The call's time runs from when the agent has its request: a frame of up to 64 MB
        # (code of 10 million "é") took seconds to encode and hand over on a loaded host,
        # and counted from before, they ate the grace before the code began (the
        # thirtieth round's second review). Before the code starts, the wait stays
        # bounded from the send (``START_GRACE``; finding 62).
        taken = time.monotonic()
        deadline = progress.deadline = taken + request.timeout + self.config.host_grace
        start_deadline = min(deadline, sent + START_GRACE)
        late: float | None = None  # when to note the container's CPU (``_note_cpu``)
        while True:
            until = deadline if progress.code_started else start_deadline
            if progress.ended is not None:
                until = min(until, taken + request.timeout + RESULT_AFTER_LIMIT)
            # Not before the code began and the deadline ends: that call runs elsewhere.
            final = progress.code_started or until >= deadline
            if progress.in_transit_until is not None:
                until = progress.in_transit_until
            reply = await self.receive_noting_cpu(
                container,
                progress,
                until=until,
                late=late,
                in_transit=final,
                ask_silence=progress.ended is None and until >= deadline,
            )
            authentic = reply.get("id") == call_id and hmac.compare_digest(
                str(reply.get("nonce")), container.nonce
            )
            if reply.get("type") == "started" and authentic:
                progress.code_started = True
                if late is None and self._factory is not None:  # (a call of 50 ms or more)
                    # From the later of the hand-over and the code's start (50 ms before
                    # this frame): the agent's own clock for the call starts there.
                    # At the latest halfway through the grace: a frame made late by a call
                    # that starves its agent must not leave the window too short to tell.
                    began = max(taken, time.monotonic() - wire.STARTED_DELAY)
                    late = min(
                        began + request.timeout + min(LATE_PROBE, self.config.host_grace / 4),
                        deadline - self.config.host_grace / 2,
                    )
                continue
            if reply.get("type") == "ended" and authentic:
                progress.code_started = True
                progress.ended = reply
                continue
            if reply.get("type") == "result" and authentic:
                return reply
            # Anything else (a forged or stray frame) means the stream cannot be trusted.
            if reply.get("type") == "error":  # the agent failed and is exiting
                if reply.get("started") is not False:
                    # It had handed the request to a child (or does not say): the code may
                    # have run, so it is not run again elsewhere (a second draw).
                    progress.code_started = True
                raise ProtocolError(f"the agent failed: {str(reply.get('reason'))[:300]}")
            raise ProtocolError(f"unauthenticated frame from the agent: {reply.get('type')!r}")

    async def receive_noting_cpu(
        self,
        container: SandboxContainer,
        progress: CallProgress,
        *,
        until: float,
        late: float | None,
        in_transit: bool = True,
        ask_silence: bool = False,
    ) -> dict[str, Any]:
        """The agent's next frame, waited for until ``until`` (``time.monotonic()``; then
        TimeoutError); if the agent is still silent at ``late``, the container's CPU is
        noted there once per call (``_note_cpu``) and the wait goes on. A call's wait and a
        session cell's share it.

        ``in_transit``: at ``until``, an agent found waiting for its next request has
        answered (``host_process``), and the wait goes on, once per call, until
        ``ANSWER_IN_TRANSIT`` later (``progress.in_transit_until``).

        ``ask_silence``: at the wait's final end, what the container was doing is asked
        then (``progress.silence``), listening on: an answer that comes while the host
        asks is the call's (``_asked_while_listening``)."""
        sampling = container.task_limit_hits is not None
        while True:
            noting = late is not None and not progress.cpu_noted
            wake = min(until, late) if noting and late is not None else until
            if sampling:
                wake = min(wake, time.monotonic() + TASK_LIMIT_SAMPLE)
            try:
                return await container.channel.receive(timeout=max(0.0, wake - time.monotonic()))
            except TimeoutError:
                # The note's and the sample's wakes and an answer in transit go on (a
                # timeout leaves a frame half read where it was: the wait resumes); the
                # wait's own bound ends it.
                if sampling:
                    sample_task_limit(container, progress, progress.tasks_before)
                if time.monotonic() < until:
                    if noting and late is not None and time.monotonic() >= late:
                        progress.cpu_noted = True
                        await self._note_cpu(container, progress)
                    continue
                if not in_transit:
                    raise
                answer = await self._answer_in_transit(container, progress)
                if isinstance(answer, dict):
                    return answer
                if answer:
                    until = progress.in_transit_until or until
                    continue
                if ask_silence and progress.in_transit_until is None:
                    asking = self.silence_of(container, progress)
                    verdict = await _asked_while_listening(container.channel, asking)
                    if isinstance(verdict, dict):
                        return verdict
                    progress.silence = verdict
                raise

    async def _answer_in_transit(
        self, container: SandboxContainer, progress: CallProgress
    ) -> dict[str, Any] | bool:
        """Whether, the first time a wait ends, the agent waits for its next request (it
        answered; Docker's stream holds the answer): the wait's new end is noted. The
        agent's frame instead, if it comes while that is asked."""
        budget = _question_budget(progress)
        if progress.in_transit_until is not None or self._factory is None or budget <= 0:
            return False
        asking = _answered_within(self._factory.awaits_next_request(container.id), budget, False)
        answer = await _asked_while_listening(container.channel, asking)
        if not answer or isinstance(answer, dict):
            return answer
        progress.in_transit_until = time.monotonic() + ANSWER_IN_TRANSIT
        log.warning(
            "container %s: the agent answered but Docker's stream is silent; waiting %g s more",
            container.id[:12],
            ANSWER_IN_TRANSIT,
        )
        return True

    async def _note_cpu(self, container: SandboxContainer, progress: CallProgress) -> None:
        """Note the container's CPU seconds now (``LATE_PROBE`` past the call's limit, the
        agent silent): what ``silent_agents_container`` measures a silent agent's container
        against.

        Why a window that long: one sample of 0.1 s read a container starved by eleven
        other fork bombs as idle, and the call was the sandbox's failure (thirtieth
        round); charging the silence to any call whose code had started charged a host's
        stall after the code had ended to the code (the round's review). Over the rest of
        the grace (1.5 s by default), a call that keeps its container busy shows, and an
        agent stalled from outside leaves it idle. Taken only for calls still running
        then; the agent answers the others (nearly every timeout) first. Noted in the
        call's own wait, not a task of its own: a task outlived a loop dropped under its
        call."""
        assert self._factory is not None
        seconds = await self._factory.cpu_seconds(container.id)
        if seconds is not None:
            progress.cpu_when_late = (time.monotonic(), seconds)

    def _result(
        self, reply: dict[str, Any], started: float, waited: float, cell_chars: int
    ) -> ExecResult:
        if reply.get("setup_error"):
            return ExecResult(
                ok=False,
                stdout="",
                stderr=f"Error: {reply['setup_error']}",
                returncode=None,
                timed_out=False,
                latency=time.perf_counter() - started,
                outcome=Outcome.REJECTED,
                backend=self.name,
                queue_wait=waited,
                detail=str(reply["setup_error"]),
            )
        if reply.get("started") is False and not reply.get("timed_out"):
            # The process ended before the code's first instruction: not the code's doing.
            reason = str(reply.get("stderr", "")).strip()[-300:] or "no message"
            return self._failure(
                started,
                f"the call's process ended before the code started (status "
                f"{reply.get('returncode')}): {reason}",
                waited,
            )
        stdout, stdout_dropped, stderr, stderr_dropped = streams(
            reply, self.config.max_output_chars
        )
        timed_out = bool(reply.get("timed_out"))
        raw_code = reply.get("returncode")
        returncode = None if timed_out or raw_code is None else int(raw_code)
        outcome = agent_outcome(reply, returncode, timed_out)
        try:
            files = {
                str(path): wire.b64decode(data) for path, data in (reply.get("files") or {}).items()
            }
        except wire.WireError as exc:
            raise ProtocolError(f"bad fetched file from the agent: {exc}") from exc
        return ExecResult(
            ok=outcome is Outcome.SUCCESS,
            stdout=stdout,
            stderr=stderr,
            returncode=returncode,
            timed_out=timed_out,
            latency=time.perf_counter() - started,
            outcome=outcome,
            stdout_dropped_chars=stdout_dropped,
            stderr_dropped_chars=stderr_dropped,
            backend=self.name,
            queue_wait=waited,
            files=files,
            fetch_errors={str(k): str(v) for k, v in (reply.get("fetch_errors") or {}).items()},
            cells=[self._cell(cell, cell_chars) for cell in reply.get("cells") or []],
        )

    def _cell_chars(self, request: RunRequest) -> int:
        """The characters of each cell's streams kept (``RunRequest.cell_output_chars``)."""
        chars = self.config.max_output_chars
        return chars if request.cell_output_chars is None else min(request.cell_output_chars, chars)

    def _cell(self, cell: dict[str, Any], chars: int) -> CellResult:
        """One cell of a result frame (its streams, display, error and how it ended)."""
        stdout, stdout_dropped, stderr, stderr_dropped = streams(cell, chars)
        return CellResult(
            stdout=stdout,
            stderr=stderr,
            stdout_dropped_chars=stdout_dropped,
            stderr_dropped_chars=stderr_dropped,
            display=cell.get("display") or [],
            error=cell.get("error") or [],
            finished=bool(cell.get("finished")),
            timed_out=bool(cell.get("timed_out")),
        )

    def _container_oom(
        self,
        started: float,
        waited: float,
        detail: str = "the container hit its memory limit and was killed whole",
    ) -> ExecResult:
        return self._without_output(Outcome.OOM, -9, False, started, waited, detail)

    def _task_limit_killed(
        self, started: float, waited: float, detail: str = TASK_LIMIT_KILLED
    ) -> ExecResult:
        """The call's outcome when its tasks took the container's pids limit and gVisor's
        kernel died of it (``host_cgroup.TaskLimitHits``): killed whole, as for memory."""
        return self._without_output(Outcome.SIGNAL, -9, False, started, waited, detail)

    def _silent_past_deadline(
        self,
        container: SandboxContainer,
        oom_before: int | None,
        request: RunRequest,
        started: float,
        waited: float,
    ) -> ExecResult:
        """The call's outcome when the agent said nothing by the host's deadline (the call's
        time limit and ``host_grace``; the container, killed, is retired): ``oom`` if Docker
        counted a kill for memory since the request, else ``timeout``, its output lost.

        Why never ``sandbox_error``: a call can starve its own container's agent. Under
        gVisor a fork bomb run to its time limit kept the sandbox's kernel busy past the
        grace, and the call came back as the sandbox's failure, which trainers drop: a
        call that chose its outcome (twenty-ninth red-team round). The host cannot tell
        that from an agent that failed on its own during the call; what it does know is
        that the call was given its whole time and did not end in it, in a container that
        nobody paused and that was busy since the agent was late
        (``silent_agents_container`` over ``_note_cpu``'s window: an agent stopped or
        wedged leaves it idle,
        before the code ran or after it ended, and reads as the sandbox's failure). Only
        the OOM counter is read (``oom_killed`` waits for a container that stops; this one
        still runs).
        """
        limit = request.timeout + self.config.host_grace
        if self.oom_counted_since(container, oom_before):
            return self._container_oom(
                started, waited, f"the container hit its memory limit; silent past {limit:.1f}s"
            )
        detail = (
            f"the sandbox's agent was silent past the deadline ({limit:.1f}s), held up by the "
            "call (or failing during it): the call's output is lost, the container was killed"
        )
        log.warning("%s", detail)
        return self._without_output(Outcome.TIMEOUT, None, True, started, waited, detail)

    def _output_lost(self, progress: CallProgress, started: float, waited: float) -> ExecResult:
        """The call's own outcome, from the agent's ``ended`` frame, when its result (fetched
        files, cells, large output) did not arrive by the deadline: the outcome stands,
        the output is lost and said to be (the container, still busy, is retired)."""
        ended = progress.ended or {}
        timed_out = bool(ended.get("timed_out"))
        raw_code = ended.get("returncode")
        returncode = None if timed_out or not isinstance(raw_code, int) else raw_code
        outcome = agent_outcome(ended, returncode, timed_out)
        detail = (
            "the call's output was lost: its result (large output, fetched files or cells) "
            f"did not arrive within {RESULT_AFTER_LIMIT:g} s of its time limit"
        )
        if progress.in_transit_until is not None:
            detail += f" (nor {ANSWER_IN_TRANSIT:g} s later, though the agent had answered)"
        log.warning("%s", detail)
        return self._without_output(outcome, returncode, timed_out, started, waited, detail)

    def _without_output(  # noqa: PLR0917 - the result's own fields
        self,
        outcome: Outcome,
        returncode: int | None,
        timed_out: bool,
        started: float,
        waited: float,
        detail: str,
    ) -> ExecResult:
        """A call's outcome whose output never reached the host (said in ``detail``)."""
        return ExecResult(
            ok=outcome is Outcome.SUCCESS,
            stdout="",
            stderr="",
            returncode=returncode,
            timed_out=timed_out,
            latency=time.perf_counter() - started,
            outcome=outcome,
            backend=self.name,
            queue_wait=waited,
            detail=detail,
        )

    def _failure(self, started: float, detail: str, waited: float = 0.0) -> ExecResult:
        log.warning("sandbox failure: %s", detail)
        return ExecResult.sandbox_failure(
            detail, backend=self.name, latency=time.perf_counter() - started, queue_wait=waited
        )

    async def close(self) -> None:
        self._closed = True
        for container in list(self._session_containers):
            await self.destroy_session_container(container)
        while self._session_ends:  # (one may be added while the others are awaited)
            ends, self._session_ends = self._session_ends, set()
            # One begun on another loop (a backend driven from several) cannot be awaited
            # here: the pool's close removes its container by label all the same.
            here = asyncio.get_running_loop()
            await asyncio.gather(*(end for end in ends if end.get_loop() is here))
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
        if self._factory is not None:
            self._factory.shutdown()
            self._factory = None
        if self._client is not None:
            self._client.close()
            self._client = None

    @property
    def closing(self) -> bool:
        """Whether ``close()`` has begun (it ends every session family under its cells)."""
        return self._closed

    def pool_stats(self) -> PoolStats | None:
        """The warm pool's figures now; None before ``start()`` and after ``close()``."""
        pool = self._pool
        if pool is None:
            return None
        return PoolStats(
            size=pool.size,
            ready=pool.settled_count(),
            pending=sum(not task.done() for task in pool._tasks),
            started=pool.started_containers,
            pool_id=pool.factory.pool_id,
        )


def agent_outcome(frame: dict[str, Any], returncode: int | None, timed_out: bool) -> Outcome:
    """The outcome of an agent's result or ``ended`` frame: how the process ended, with the
    agent's own verdicts on the memory and CPU limits (which a signal alone cannot give)."""
    return classify_exit(
        returncode,
        timed_out=timed_out,
        oom=bool(frame.get("oom")),
        cpu_limit=bool(frame.get("cpu_limit")),
    )


def streams(frame: dict[str, Any], limit: int) -> tuple[str, int, str, int]:
    """stdout, its dropped characters, stderr, its dropped characters of an agent frame,
    cut to ``limit`` characters each (the seed's tail rule)."""
    stdout, stdout_dropped = finish_stream(
        str(frame.get("stdout", "")), int(frame.get("stdout_dropped", 0)), limit
    )
    stderr, stderr_dropped = finish_stream(
        str(frame.get("stderr", "")), int(frame.get("stderr_dropped", 0)), limit
    )
    return stdout, stdout_dropped, stderr, stderr_dropped


def _remove_orphans(client: docker.DockerClient) -> None:
    """The start-up sweep: remove containers whose owner process is gone."""
    for orphan in find_orphans(client):
        try:
            remove_container(client, orphan.id)
        except docker.errors.APIError as exc:
            log.warning("could not remove orphaned container %s: %s", orphan.short_id, exc)


@dataclass(frozen=True, slots=True)
class PoolStats:
    """A snapshot of a Docker backend's warm pool (``DockerBackend.pool_stats()``)."""

    size: int
    """Containers the pool keeps (``pool_size``)."""
    ready: int
    """Containers ready for a call now (a reused one only once its agent answered its reset)."""
    pending: int
    """Background steps still running: container starts and removals."""
    started: int
    """Containers started since the pool started."""
    pool_id: str
    """The value of the ``LABEL_POOL`` label on the pool's containers."""
