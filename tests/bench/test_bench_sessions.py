"""The session figures of ``retool-exec bench``: what they measure (on the fake backend, no
processes), the three targets, the tables, and the JSON round trip."""

from __future__ import annotations

import asyncio

import pytest

from retool_exec import Sandbox
from retool_exec._errors import SessionsUnsupportedError
from retool_exec.backends.base import RunRequest
from retool_exec.backends.fake import FakeBackend, FakeCell, FakeSession
from retool_exec.bench import sessions
from retool_exec.bench.progress import Progress
from retool_exec.bench.report import render_text, session_tables
from retool_exec.bench.results import BenchResult, BenchSettings, SessionFigures
from retool_exec.bench.targets import evaluate_targets
from tests.bench_settings import bench_settings


def _settings(*, quick: bool, backends: tuple[str, ...] = ("docker",)) -> BenchSettings:
    return bench_settings(backends=list(backends), quick=quick, extras=True)


def _answer(code: str) -> str:
    """What the real interpreter prints for the benchmark's code (a stateless call may run
    several turns: it prints each of their lines)."""
    if code == sessions.CELL_CODE:
        return "5\n"
    if "len(state)" in code:
        return f"{sessions.FORK_STATE_MB << 20}\n"
    lines = [expected for turn, expected in sessions.TURNS if turn in code]
    return "\n".join(lines) + "\n"


def _fake(*, with_sessions: bool = True) -> FakeBackend:
    def call(request: RunRequest) -> str:
        return _answer(request.code)

    def cell(c: FakeCell) -> str:
        return _answer(c.code)

    if with_sessions:
        return FakeBackend(call, session_handler=cell)
    return _NoSessions(call)


class _NoSessions(FakeBackend):
    async def open_session(self, *, memory_mb: int | None = None) -> FakeSession:
        raise SessionsUnsupportedError("the fake has none here")


def _measure(backend: FakeBackend, *, quick: bool) -> BenchResult:
    settings = _settings(quick=quick)
    result = BenchResult(started_at="now", settings=settings)

    async def go() -> None:
        async with Sandbox(backend=backend) as sandbox:
            await sessions.measure_sessions(
                {"docker": sandbox},
                settings,
                result=result,
                progress=Progress(sessions.planned_calls(settings), enabled=False),
            )

    asyncio.run(go())
    return result


def test_the_conversation_uses_earlier_turns_and_checks_each_output() -> None:
    names = ["A", "f", "B", "crit", "roots", "area"]
    later = "\n".join(code for code, _ in sessions.TURNS[1:])
    assert all(name in later for name in names)
    assert len(sessions.TURNS) == 10


@pytest.mark.parametrize("quick", [True, False])
def test_every_figure_is_measured(quick: bool) -> None:
    backend = _fake()
    result = _measure(backend, quick=quick)
    plan = sessions.plan(result.settings)
    assert plan.turns == (3 if quick else 10)
    (figures,) = result.sessions
    assert figures.error is None, figures.error
    assert len(figures.cell_latencies) == len(figures.call_latencies) == plan.cell_calls
    assert len(figures.fork_latencies) == plan.forks
    assert len(figures.conversation_session) == len(figures.conversation_stateless) == plan.rounds
    assert (figures.cell_failures, figures.fork_failures, figures.conversation_failures) == (
        0,
        0,
        0,
    )
    assert figures.turns == plan.turns and figures.fork_state_mb == 100
    # The stateless way re-runs turns 1..k: its calls carry ever more turns.
    calls = [r.code for r in backend.requests if "sp." in r.code or "np." in r.code]
    turns_per_call = [sum(code in call for code, _ in sessions.TURNS) for call in calls]
    assert turns_per_call == list(range(1, plan.turns + 1)) * plan.rounds
    verdicts = {t.name: t.verdict for t in evaluate_targets(result)}
    assert verdicts["reuse session cell p50"] in ("PASS", "FAIL")  # measured, either way
    assert verdicts["reuse session fork p50"] == "PASS"


def test_a_wrong_answer_counts_as_a_failure() -> None:
    def call(request: RunRequest) -> str:
        return _answer(request.code)

    def cell(c: FakeCell) -> str:
        return "4\n" if c.code == sessions.CELL_CODE else _answer(c.code)

    result = _measure(FakeBackend(call, session_handler=cell), quick=True)
    assert result.sessions[0].cell_failures > 0
    verdicts = {t.name: t.verdict for t in evaluate_targets(result)}
    assert verdicts["reuse session cell p50"] == "FAIL"


def test_a_backend_without_sessions_is_noted_not_failed() -> None:
    result = _measure(_fake(with_sessions=False), quick=True)
    (figures,) = result.sessions
    assert figures.error is not None and "no sessions" in figures.error
    targets = [t for t in evaluate_targets(result) if t.name.startswith("reuse session")]
    assert [t.verdict for t in targets] == ["NOT MEASURED"] * 3
    assert "no sessions" in targets[0].measured
    assert "no sessions" in render_text(result)


def _figures(**update: object) -> BenchResult:
    result = BenchResult(started_at="now", settings=_settings(quick=False))
    base = SessionFigures(
        backend="docker",
        cell_latencies=[0.002] * 5,
        call_latencies=[0.005] * 5,
        turns=10,
        conversation_session=[0.4, 0.5],
        conversation_open=[0.01, 0.01],
        conversation_close=[0.1, 0.1],
        conversation_stateless=[3.0, 3.2],
        fork_state_mb=100,
        fork_latencies=[0.006] * 9,
    )
    result.sessions = [base.model_copy(update=update)]
    return result


def _verdicts(result: BenchResult) -> dict[str, str]:
    return {t.name: t.verdict for t in evaluate_targets(result) if t.name.startswith("reuse ses")}


def test_the_three_targets() -> None:
    assert _verdicts(_figures()) == {
        "reuse session cell p50": "PASS",
        "reuse session conversation": "PASS",
        "reuse session fork p50": "PASS",
    }
    slow = _figures(
        cell_latencies=[0.006] * 5, conversation_stateless=[0.3, 0.3], fork_latencies=[0.03] * 3
    )
    assert set(_verdicts(slow).values()) == {"FAIL"}
    assert set(_verdicts(_figures(fork_failures=1, cell_failures=1)).values()) >= {"FAIL"}
    measured = {t.name: t.measured for t in evaluate_targets(_figures())}
    assert "= 0.40 x" in measured["reuse session cell p50"]
    assert "= 6.9 x faster" in measured["reuse session conversation"]  # 6.2 / 0.9
    assert "fork p50 6.0 ms" in measured["reuse session fork p50"]


def test_no_session_figures_are_not_measured() -> None:
    result = BenchResult(started_at="now", settings=_settings(quick=False))
    assert set(_verdicts(result).values()) == {"NOT MEASURED"}
    assert session_tables(result) == []


def test_tables_and_the_json_round_trip() -> None:
    result = _figures()
    titles = [t.title for t in session_tables(result)]
    assert len(titles) == 3 and all(title.startswith("sessions:") for title in titles)
    text = render_text(result)
    assert "cell vs call" in text and "stateless / session" in text
    again = BenchResult.model_validate_json(result.model_dump_json(by_alias=True))
    assert again == result
    assert again.sessions[0].conversation_ratio == pytest.approx(6.2 / 0.9)
