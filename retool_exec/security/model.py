"""What an attack case is, what a run of one observed, and what the audit concluded.

A :class:`Case` is data: attack code, a predicate that says what a *contained*
outcome looks like, and where the attack comes from. Predicates are judged on
the host, over an :class:`Observation` (the call's ExecResult, the follow-up
call's ExecResult where the invariant spans two calls, and the facts the host
itself knows: its hostname, the canary it planted, what its listeners heard).
Attack code reports facts as one JSON line (``report(...)``); predicates read
them with :meth:`Observation.facts`.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from retool_exec._models import ExecResult

__all__ = [
    "CallInputs",
    "Case",
    "CaseClass",
    "CaseContext",
    "CaseReport",
    "Expect",
    "HostFacts",
    "Inconclusive",
    "LocalExpectation",
    "Observation",
    "Predicate",
    "SessionStep",
    "Severity",
    "Status",
    "StepAction",
    "exposed_as_root",
]


class CaseClass(enum.StrEnum):
    """What an attack goes after: the host, the network, limits, output, secrets, other calls,
    and the integrity of our own agent protocol."""

    PRIVILEGE = "privilege"
    NETWORK = "network"
    RESOURCES = "resources"
    OUTPUT = "output"
    INFORMATION = "information"
    ISOLATION = "isolation"
    PROTOCOL = "protocol"


class Severity(enum.StrEnum):
    """How bad an exposure is: ``critical`` reaches the host or the agent."""

    CRITICAL = "critical"
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


class Status(enum.StrEnum):
    """The audit's verdict for one case on one backend."""

    CONTAINED = "contained"
    """The predicate held and so did every invariant."""
    EXPOSED = "exposed"
    """The attack got through, or an invariant (on time, next call, nothing left) broke."""
    ERROR = "error"
    """The audit could not judge (the predicate could not read the output)."""
    SKIPPED = "skipped"
    """Not run on this backend (it would harm the host, or does not apply)."""


class Inconclusive(ValueError):
    """A predicate cannot judge this run because the attack's timing missed (its neighbour
    ran only after the hold it had to meet, on a loaded host): the runner runs the case
    again, a few times, before it reports an error. Never raised for an attack that got
    through, so a retry cannot turn an exposure into a pass."""


class Expect(enum.StrEnum):
    """What the local backend (a plain subprocess on this host) is expected to do."""

    CONTAINED = "contained"
    """A subprocess contains it (timeouts, output capping, formatting)."""
    EXPOSED = "exposed"
    """A subprocess cannot contain it."""
    HARMFUL = "harmful"
    """Not run locally: it would really harm this host (fork bomb, memory bomb, disk fill...)."""
    NOT_APPLICABLE = "not_applicable"
    """The attack targets the container agent's protocol, which the local backend does not have."""
    HOST_DEPENDENT = "host_dependent"
    """The outcome depends on how this host is configured; not asserted locally."""


LocalExpectation = Expect | Callable[[], Expect]
"""An expectation, or a function of the host that computes one (e.g. "exposed when root")."""


def exposed_as_root() -> Expect:
    """Exposed when the local backend runs as root (as on CI); else it depends on the host."""
    return Expect.EXPOSED if os.geteuid() == 0 else Expect.HOST_DEPENDENT


@dataclass(frozen=True)
class HostFacts:
    """What the host knows that a predicate may compare against (see ``host.HostFixtures``)."""

    hostname: str
    canary_name: str
    canary_value: str
    secret_file: str
    """A file the host created, readable by anyone on the host, that a sandbox must not see."""
    package_dir: str
    """The retool_exec checkout on the host."""
    tcp_port: int
    udp_port: int
    unix_name: str
    """Name of the host's abstract unix socket (without the leading NUL)."""
    heard: Callable[[str], frozenset[str]] = field(default=lambda token: frozenset())
    """Which host listeners (``tcp``, ``udp``, ``unix``) received ``token``."""


@dataclass(frozen=True)
class CaseContext:
    """One run of one case: its unique token and where it runs."""

    token: str
    """Unique per run; names the run's files and processes so the host can find leftovers."""
    backend: str
    gvisor: bool
    """The backend is gVisor: syscalls reach gVisor's own kernel (the Sentry), not the host's."""
    timeout: float
    host: HostFacts

    @property
    def nonce_like(self) -> str:
        """32 hex digits unique to this run, shaped like the agent's per-call nonces
        (``sha256("nonce-like:" + token)``, so attack code can also derive it at run time)."""
        return hashlib.sha256(f"nonce-like:{self.token}".encode()).hexdigest()[:32]

    def substitutions(self) -> Mapping[str, str]:
        """Placeholders a case's code (and its call inputs) may contain, and their values."""
        return {
            "__NONCE_LIKE_DIGEST__": hashlib.sha256(self.nonce_like.encode()).hexdigest()[:16],
            "__NONCE_LIKE__": self.nonce_like,
            "__TOKEN__": self.token,
            "__TCP_PORT__": str(self.host.tcp_port),
            "__UDP_PORT__": str(self.host.udp_port),
            "__UNIX_NAME__": self.host.unix_name,
            "__CANARY_NAME__": self.host.canary_name,
            "__CANARY_VALUE__": self.host.canary_value,
            "__SECRET_FILE__": self.host.secret_file,
            "__PACKAGE_DIR__": self.host.package_dir,
        }


def _last_json(text: str) -> dict[str, Any]:
    for raw in reversed(text.splitlines()):
        line = raw.strip()
        if line.startswith("{"):
            value = json.loads(line)
            if isinstance(value, dict):
                return value
    raise ValueError(f"no JSON facts in output: {text[-200:]!r}")


@dataclass(frozen=True)
class Observation:
    """What one run of a case produced, as a predicate sees it."""

    result: ExecResult
    follow: ExecResult | None
    ctx: CaseContext
    neighbour: ExecResult | None = None
    """The ``neighbour`` call's result (it ran in another container, during the attack)."""
    cells: Mapping[str, ExecResult] = field(default_factory=dict)
    """A session case's cells that returned a result, by step name (``SessionStep.name``)."""
    refused: Mapping[str, str] = field(default_factory=dict)
    """A session case's steps that raised a ``SessionError`` instead (``SessionLostError``
    after the session ended), by step name: the exception's type and message."""

    def facts(self) -> dict[str, Any]:
        """The attack's last ``report(...)`` line."""
        return _last_json(self.result.stdout)

    def follow_facts(self) -> dict[str, Any]:
        """The follow-up call's last ``report(...)`` line."""
        if self.follow is None:
            raise ValueError("this case has no follow-up call")
        return _last_json(self.follow.stdout)

    def neighbour_facts(self) -> dict[str, Any]:
        """The neighbour call's last ``report(...)`` line."""
        if self.neighbour is None:
            raise ValueError("this case has no neighbour call")
        return _last_json(self.neighbour.stdout)

    def cell(self, name: str) -> ExecResult:
        """A session case's cell ``name`` (KeyError when it returned no result)."""
        return self.cells[name]

    def cell_facts(self, name: str) -> dict[str, Any]:
        """The last ``report(...)`` line of the session case's cell ``name``."""
        return _last_json(self.cells[name].stdout)


Predicate = Callable[[Observation], bool]


@dataclass(frozen=True)
class CallInputs:
    """What the attack call is given besides its code (``Sandbox.run_code``'s keywords).

    Placeholders of ``CaseContext`` are filled in, in the stdin text, file paths
    and file contents. The backend handles them outside the code's process.
    """

    stdin: str | None = None
    files: Mapping[str, str] = field(default_factory=dict)
    """Uploaded into the call's working directory before the code starts."""
    fetch: tuple[str, ...] = ()
    """Read back from the working directory after the code ends (``ExecResult.files``)."""
    memory_mb: int | None = None
    """The call's own memory limit (``RunRequest.memory_mb``), as a server's client sets it."""


class StepAction(enum.StrEnum):
    """What one step of a session case does."""

    OPEN = "open"
    """Open a new session family (``Sandbox.aopen_session()``)."""
    FORK = "fork"
    """Fork ``parent`` into a new session of its family."""
    CELL = "cell"
    """Run ``code`` as a cell of the session."""
    CLOSE = "close"
    """Close the session (a family ends with its last session)."""


@dataclass(frozen=True)
class SessionStep:
    """One step of a session case; the runner takes the steps in order.

    Sessions are named by the case (``"a"``, ``"b"``...). A cell's code gets the
    prelude and the placeholders like any case's code; its result is
    ``Observation.cells[name]``, or ``Observation.refused[name]`` when the step
    raised a ``SessionError`` (a session that is gone). Sessions still open
    after the last step are closed before the follow-up call.
    """

    action: StepAction
    session: str
    code: str = ""
    name: str = ""
    """The step's key in ``Observation.cells``/``refused`` (default: action:session)."""
    parent: str = ""
    """For ``FORK``: the session copied."""
    timeout: float | None = None
    """For ``CELL``: its limit; None uses the case's."""

    @property
    def key(self) -> str:
        return self.name or f"{self.action.value}:{self.session}"


@dataclass(frozen=True)
class Case:
    """One attack, what containing it means, and where it comes from."""

    id: str
    klass: CaseClass
    title: str
    code: str | Callable[[], str]
    """Attack code; ``__TOKEN__`` and the other placeholders of ``CaseContext`` are filled in.
    A function is called when the case runs (for code too large to keep in memory)."""
    contained: Predicate
    """True when the outcome is the contained one (judged on the host)."""
    severity: Severity
    reference: str
    """Where the attack comes from: a CVE, a CIS item, a named sandbox's test."""
    catalogue: tuple[int, ...] = ()
    """Item numbers (1-44) of the attack list the corpus was first written against that this
    case covers; the audit's tests check that every number is covered by some case."""
    follow_up: str | None = None
    """Code run as the next call on the same backend, where the invariant spans two calls."""
    companion: str | None = None
    """Code run concurrently with the attack, on the same sandbox (a neighbour the attack must
    not see; with a ``reuse`` pool of one container the two run one after the other)."""
    neighbour: str | None = None
    """Code run during the attack in *another* container of the same backend (the runner's
    neighbour sandbox), ``neighbour_delay`` seconds after the attack starts: a bystander the
    attack must not disturb. Its result is ``Observation.neighbour``."""
    neighbour_delay: float = 0.5
    inputs: CallInputs = field(default_factory=CallInputs)
    """The attack call's stdin, uploaded files and fetched files."""
    timeout: float | None = None
    """Wall-clock limit of the attack call; None uses the runner's default."""
    exclusive: bool = False
    """Run alone (resource bombs): nothing else runs on the machine's sandboxes meanwhile."""
    raw: bool = False
    """Send ``code`` exactly as written (no prelude, no placeholders)."""
    local: LocalExpectation = Expect.EXPOSED
    """What the local backend is expected to do with it."""
    local_reason: str = ""
    """Why the local backend does not run it (for ``HARMFUL`` / ``NOT_APPLICABLE``)."""
    note: str = ""
    """How the predicate reads the outcome where it is not obvious (e.g. under gVisor)."""
    session_steps: tuple[SessionStep, ...] = ()
    """A session case: these steps run on the backend's sessions instead of ``code`` (which
    is then empty); the cell named ``attack`` (else the last) is ``Observation.result``.
    A backend without sessions skips the case."""

    def source(self) -> str:
        """The attack code as written (before placeholders are filled in)."""
        return self.code() if callable(self.code) else self.code

    def cell_sources(self) -> tuple[str, ...]:
        """The code of each cell of a session case (before placeholders are filled in)."""
        return tuple(step.code for step in self.session_steps if step.action is StepAction.CELL)

    def local_expectation(self) -> Expect:
        """The local backend's expectation on this host."""
        return self.local() if callable(self.local) else self.local

    def local_skip_reason(self) -> str:
        """Why the local backend skips this case ("" when it runs it)."""
        expect = self.local_expectation()
        if expect is Expect.HARMFUL:
            return self.local_reason or (
                "would harm the host: the seed's sandbox has no limit here"
            )
        if expect is Expect.NOT_APPLICABLE:
            return self.local_reason or "the local backend has no container agent to attack"
        return ""


@dataclass(frozen=True)
class CaseReport:
    """The verdict on one case for one backend, with the evidence behind it."""

    case_id: str
    klass: CaseClass
    severity: Severity
    backend: str
    status: Status
    reasons: tuple[str, ...] = ()
    """Why it is not contained (or why skipped / in error); empty when contained."""
    evidence: str = ""
    """The attack's own report (or output tail), shortened."""
    outcome: str = ""
    seconds: float = 0.0

    def describe(self) -> str:
        """One paragraph for a test failure or a scorecard note."""
        text = f"[{self.backend}] {self.case_id}: {self.status.value}"
        if self.reasons:
            text += " - " + "; ".join(self.reasons)
        if self.evidence:
            text += f"\n  evidence: {self.evidence}"
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.case_id,
            "class": self.klass.value,
            "severity": self.severity.value,
            "backend": self.backend,
            "status": self.status.value,
            "reasons": list(self.reasons),
            "evidence": self.evidence,
            "outcome": self.outcome,
            "seconds": round(self.seconds, 3),
        }
