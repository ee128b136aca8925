"""``/sessions`` on real interpreters: the local backend and Docker containers.

The same conversation runs on both servers of ``conftest.py`` (local: a host
process per session, NOT isolated; docker: a container per session family).
What only Docker can show, a session's container being released when the
session ends, runs on a server of its own whose containers carry a label of
their own, so they can be counted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import docker
import httpx
import pytest

from retool_exec import DockerConfig
from retool_exec.server import OUTCOME_HEADER, ServerSettings, create_app
from tests.conftest import LABELS, require_docker
from tests.server.conftest import serve

pytestmark = pytest.mark.server

COUNT_LABEL = "test.server-sessions"


@pytest.fixture(
    params=[pytest.param("local"), pytest.param("docker", marks=pytest.mark.docker)],
)
def url(request: pytest.FixtureRequest) -> str:
    """The URL of the local server, then of the Docker server (both session-scoped)."""
    base: str = request.getfixturevalue(f"{request.param}_url")
    return base


class Conversation:
    """One session over HTTP, closed at the end of the test."""

    def __init__(self, url: str, http: httpx.Client, session_id: str | None = None) -> None:
        self.url = url
        self.http = http
        if session_id is None:
            created = http.post(f"{url}/sessions")
            assert created.status_code == 201, created.text
            session_id = created.json()["session_id"]
        self.id: str = session_id

    def run(self, code: str, **body: Any) -> dict[str, Any]:
        response = self.http.post(f"{self.url}/sessions/{self.id}/run", json={"code": code, **body})
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        answer["outcome"] = response.headers[OUTCOME_HEADER]
        return answer

    def stdout(self, code: str) -> str:
        answer = self.run(code)
        assert answer["status"] == "Success", answer
        stdout: str = answer["run_result"]["stdout"]
        return stdout

    def fork(self) -> Conversation:
        response = self.http.post(f"{self.url}/sessions/{self.id}/fork")
        assert response.status_code == 201, response.text
        return Conversation(self.url, self.http, response.json()["session_id"])

    def status_of_next_call(self) -> int:
        return self.http.post(f"{self.url}/sessions/{self.id}/run", json={"code": "1"}).status_code

    def close(self) -> int:
        return self.http.delete(f"{self.url}/sessions/{self.id}").status_code


@pytest.fixture()
def conversation(url: str, client: httpx.Client) -> Iterator[Conversation]:
    talk = Conversation(url, client)
    yield talk
    talk.close()


def test_variables_imports_and_files_persist(conversation: Conversation) -> None:
    assert conversation.stdout("import math\nx = 41\nopen('notes.txt', 'w').write('kept')") == ""
    assert conversation.run("x + 1")["display"] == [{"text/plain": "42"}]
    assert conversation.stdout("print(math.sqrt(x + 8), open('notes.txt').read())") == "7.0 kept\n"


def test_an_exception_is_the_cells_and_the_session_lives_on(conversation: Conversation) -> None:
    conversation.stdout("x = 1")
    answer = conversation.run("raise ValueError('boom')")
    assert (answer["status"], answer["outcome"], answer["session_lost"]) == (
        "Failed",
        "error",
        False,
    )
    assert answer["run_result"]["return_code"] == 1
    assert answer["error"][0]["ename"] == "ValueError"
    assert answer["error"][0]["evalue"] == "boom"
    assert answer["run_result"]["stderr"].endswith("ValueError: boom\n")
    assert conversation.stdout("print(x)") == "1\n"


def test_forks_copy_the_state_and_never_meet(
    conversation: Conversation, client: httpx.Client
) -> None:
    conversation.stdout("x = [1]\nopen('f.txt', 'w').write('root')")
    branch = conversation.fork()
    try:
        branch.stdout("x.append(2)\nopen('f.txt', 'w').write('branch')")
        conversation.stdout("x.append(3)")
        assert branch.stdout("print(x, open('f.txt').read())") == "[1, 2] branch\n"
        assert conversation.stdout("print(x, open('f.txt').read())") == "[1, 3] root\n"
    finally:
        assert branch.close() == 204


def test_two_sessions_share_nothing(conversation: Conversation, client: httpx.Client) -> None:
    conversation.stdout("secret = 'mine'\nopen('secret.txt', 'w').write('mine')")
    stranger = Conversation(conversation.url, client)
    try:
        answer = stranger.stdout(
            "import os\nprint('secret' in globals(), os.path.exists('secret.txt'))"
        )
        assert answer == "False False\n"
    finally:
        stranger.close()


def test_a_cell_past_its_timeout_is_interrupted_and_the_state_kept(
    conversation: Conversation,
) -> None:
    conversation.stdout("x = 'kept'")
    answer = conversation.run("import time\nwhile True: time.sleep(0.05)", timeout=1)
    assert answer["run_result"]["status"] == "TimeLimitExceeded"
    assert answer["outcome"] == "timeout"
    assert answer["session_lost"] is False
    assert answer["error"][0]["ename"] == "KeyboardInterrupt"
    assert "interrupted; the session keeps its state" in answer["message"]
    assert conversation.stdout("print(x)") == "kept\n"


def test_a_cell_that_ignores_the_interrupt_loses_the_session(
    conversation: Conversation,
) -> None:
    code = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(30)"
    started = time.monotonic()
    answer = conversation.run(code, timeout=1)
    assert time.monotonic() - started < 10
    assert answer["session_lost"] is True
    assert answer["run_result"]["status"] == "TimeLimitExceeded"
    assert answer["message"].startswith("session lost: ")
    assert conversation.status_of_next_call() == 410
    assert conversation.close() == 204


def test_the_interpreter_exiting_loses_the_session(conversation: Conversation) -> None:
    answer = conversation.run("import os\nprint('bye', flush=True)\nos._exit(3)")
    assert answer["session_lost"] is True
    assert answer["run_result"]["return_code"] == 3
    assert answer["run_result"]["stdout"] == "bye\n"
    assert conversation.status_of_next_call() == 410


# -- Docker: a session's container ----------------------------------------------------------


@pytest.fixture(scope="module")
def counted() -> Iterator[tuple[str, Any]]:
    """A Docker server with one warm container, and a function counting its containers."""
    require_docker()
    labels = {**LABELS, COUNT_LABEL: "1"}
    config = DockerConfig(timeout=10.0, policy="reuse", pool_size=1, labels=labels)
    daemon = docker.from_env()

    def containers() -> int:
        filters = {"label": [f"{key}={value}" for key, value in labels.items()]}
        return len(daemon.api.containers(filters=filters))

    try:
        with serve(create_app(config, settings=ServerSettings(max_concurrency=1))) as base:
            yield base, containers
    finally:
        daemon.close()


def settles_at(count: Any, expected: int, within: float = 15.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if count() == expected:
            return True
        time.sleep(0.25)
    return False


@pytest.mark.docker
def test_deleting_a_session_releases_its_container(
    counted: tuple[str, Any], client: httpx.Client
) -> None:
    url, containers = counted
    assert settles_at(containers, 1)  # the warm pool
    talk = Conversation(url, client)
    talk.stdout("x = 1")
    branch = talk.fork()  # a fork lives in its family's container
    assert settles_at(containers, 2)  # the session's own, and the pool's new warm one
    assert talk.close() == 204
    assert branch.stdout("print('still here')") == "still here\n"
    assert branch.close() == 204
    assert settles_at(containers, 1)


@pytest.mark.docker
def test_a_lost_session_releases_its_container(
    counted: tuple[str, Any], client: httpx.Client
) -> None:
    url, containers = counted
    assert settles_at(containers, 1)
    talk = Conversation(url, client)
    talk.stdout("x = 1")
    assert settles_at(containers, 2)  # the session's own, and the pool's new warm one
    assert talk.run("import os\nos._exit(0)")["session_lost"] is True
    assert settles_at(containers, 1)


@pytest.mark.docker
def test_a_deleted_session_counts_against_its_client_until_its_cell_ends() -> None:
    """Closing a Docker session waits for its running cell; until then it is still held."""
    require_docker()
    config = DockerConfig(timeout=10.0, policy="reuse", pool_size=1, labels=LABELS)
    settings = ServerSettings(max_sessions_per_client=1)
    with (
        serve(create_app(config, settings=settings)) as url,
        httpx.Client(timeout=30) as http,
        httpx.Client(timeout=30) as other_line,
    ):
        talk = Conversation(url, http)
        talk.stdout("import time")
        with ThreadPoolExecutor(2) as pool:
            cell = pool.submit(talk.run, "time.sleep(4)")
            time.sleep(1.0)  # the cell is running
            deleting = pool.submit(Conversation(url, other_line, talk.id).close)
            time.sleep(1.0)
            assert not deleting.done()  # the close waits for the cell
            assert other_line.post(f"{url}/sessions").status_code == 429
            assert deleting.result() == 204
            assert cell.result()["status"] == "Success"
        assert Conversation(url, http).close() == 204  # now the cap is free
