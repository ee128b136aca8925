"""A web page cannot use the server: a foreign Origin, or a non-loopback Host on a
loopback server (DNS rebinding), is refused before any handler runs.

A page's ``text/plain`` POST needs no CORS preflight, and the server reads any body
as JSON: before the guard, every page in a browser on the machine could run code in
the sandbox, on the host itself with ``--backend local`` (the sixth red-team round).
Real training clients send no Origin and a loopback Host, and keep working.
"""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from retool_exec.backends.fake import FakeBackend
from retool_exec.server import ServerSettings, create_app
from retool_exec.server.guards import is_loopback_host
from tests.server.conftest import serve

pytestmark = pytest.mark.server

RUN = {"code": "print(1)", "language": "python"}


def _post(url: str, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{url}/run_code", content=json.dumps(RUN), headers=headers)


def test_a_page_from_another_origin_is_refused_and_clients_are_not() -> None:
    with serve(create_app(FakeBackend(lambda _request: "ok\n"))) as url:
        plain = {"content-type": "text/plain"}
        page = _post(url, {**plain, "origin": "http://evil.example"})
        null_origin = _post(url, {**plain, "origin": "null"})
        local_page = _post(url, {**plain, "origin": "http://127.0.0.1:3000"})
        client = _post(url, {"content-type": "application/json"})
    assert (page.status_code, page.json()["detail"]) == (403, "cross-origin requests are refused")
    assert null_origin.status_code == 403
    assert local_page.status_code == 200
    assert (client.status_code, client.json()["status"]) == (200, "Success")


def test_a_loopback_server_refuses_a_rebound_host() -> None:
    settings = ServerSettings(loopback_only=True)
    with serve(create_app(FakeBackend(lambda _request: "ok\n"), settings=settings)) as url:
        port = url.rsplit(":", 1)[1]
        rebound = _post(url, {"host": f"evil.example:{port}"})
        hosts = [
            _post(url, {"host": host}).status_code
            for host in (f"127.0.0.1:{port}", f"localhost:{port}", "127.0.0.2", f"[::1]:{port}")
        ]
    assert rebound.status_code == 403
    assert hosts == [200, 200, 200, 200]


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1:8080", True),
        ("localhost", True),
        ("[::1]:80", True),
        ("127.255.0.1", True),
        ("evil.example", False),
        ("127.0.0.1.evil.example", False),
        ("localhost.evil.example:8080", False),
        ("[::1", False),
        ("127.0.0.1:99999999", True),  # the name is what counts; a bad port does not help
        ("", False),
    ],
)
def test_which_hosts_are_loopback(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


@given(st.text(max_size=40))
def test_any_host_header_is_judged_without_error(host: str) -> None:
    assert isinstance(is_loopback_host(host), bool)
