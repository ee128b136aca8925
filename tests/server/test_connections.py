"""Slow and surplus connections: closed by the HTTP layer before the app (or the token) sees them.

A client that opens connections and never finishes its headers (slowloris)
would otherwise hold a socket and a file descriptor for as long as it likes:
uvicorn times out only idle keep-alive connections, and only after a response.
These tests speak raw HTTP over sockets to 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from retool_exec import FakeBackend
from retool_exec.server import ServerSettings, create_app
from tests.server.conftest import TOKEN, serve

pytestmark = pytest.mark.server

HEADER_TIMEOUT = 1.0


@contextlib.contextmanager
def guarded_server(**overrides: object) -> Iterator[tuple[str, int]]:
    options: dict[str, object] = {"header_timeout": HEADER_TIMEOUT, "token": TOKEN}
    options.update(overrides)
    settings = ServerSettings.model_validate(options)
    with serve(create_app(FakeBackend(lambda _request: "ok\n"), settings=settings)) as url:
        yield url, int(url.rsplit(":", 1)[1])


def closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """Whether the server closed ``sock`` within ``seconds``, and what it sent first."""
    sock.settimeout(0.1)
    received = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return True, received
        if not chunk:
            return True, received
        received += chunk
    return False, received


def trickle(sock: socket.socket, data: bytes, *, every: float, until: float) -> bool:
    """Send ``data`` a byte at a time; False as soon as the server has closed the socket."""
    for byte in data:
        if time.monotonic() > until:
            break
        try:
            sock.sendall(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            return False
        time.sleep(every)
    return True


def test_a_connection_that_sends_nothing_is_closed() -> None:
    with guarded_server() as (_url, port), socket.create_connection(("127.0.0.1", port)) as sock:
        closed, _ = closed_within(sock, HEADER_TIMEOUT + 2.0)
        assert closed


def test_headers_trickled_past_the_header_timeout_are_cut_off_before_the_token_check() -> None:
    with guarded_server() as (_url, port), socket.create_connection(("127.0.0.1", port)) as sock:
        started = time.monotonic()
        head = b"POST /run_code HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200
        trickle(sock, head, every=0.2, until=started + HEADER_TIMEOUT + 3.0)
        closed, answer = closed_within(sock, 3.0)
        assert closed
        assert time.monotonic() - started < HEADER_TIMEOUT + 3.5
        assert b"401" not in answer  # the request never reached the token check
        assert answer == b"" or answer.startswith(b"HTTP/1.1 408")


def test_the_next_request_on_a_kept_alive_connection_is_timed_too() -> None:
    with (
        guarded_server(token=None) as (_url, port),
        socket.create_connection(("127.0.0.1", port)) as sock,
    ):
        body = b'{"code": "print(1)"}'
        sock.sendall(
            b"POST /run_code HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        sock.settimeout(5)
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        still_open = trickle(
            sock, b"GET /v1/ping HTTP/1.1\r\nX-Slow: " + b"a" * 100, every=0.2, until=started + 6
        )
        closed, _ = closed_within(sock, 3.0) if still_open else (True, b"")
        assert closed
        assert time.monotonic() - started < HEADER_TIMEOUT + 3.5


def test_a_body_trickled_past_the_body_timeout_is_cut_off() -> None:
    """A body sent a byte every few seconds held its connection as long as the client
    liked: 1024 of them shut every other client out (eighteenth red-team round)."""
    with (
        guarded_server(token=None, body_timeout=1.0) as (_url, port),
        socket.create_connection(("127.0.0.1", port)) as sock,
    ):
        started = time.monotonic()
        sock.sendall(b"POST /run_code HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n")
        still_open = trickle(sock, b'{"code": "' + b"1" * 80, every=0.2, until=started + 6)
        closed, answer = closed_within(sock, 3.0) if still_open else (True, b"")
        assert closed
        assert time.monotonic() - started < 1.0 + 3.5
        assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer


def test_a_pipelined_request_s_body_is_timed_too() -> None:
    """A second request sent with the first, its body left unfinished: uvicorn takes it
    from its buffer after the first answer, outside ``data_received``."""
    with (
        guarded_server(token=None, body_timeout=1.0) as (_url, port),
        socket.create_connection(("127.0.0.1", port)) as sock,
    ):
        body = b'{"code": "print(1)"}'
        first = (
            b"POST /run_code HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        second = b"POST /run_code HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{"
        started = time.monotonic()
        sock.sendall(first + second)
        closed, answer = closed_within(sock, 1.0 + 4.0)
        assert closed, answer
        assert time.monotonic() - started < 1.0 + 4.0
        assert answer.startswith(b"HTTP/1.1 200")


def test_slow_but_timely_headers_are_served() -> None:
    with (
        guarded_server(token=None) as (_url, port),
        socket.create_connection(("127.0.0.1", port)) as sock,
    ):
        sock.sendall(b"GET /v1/ping HTTP/1.1\r\n")
        time.sleep(HEADER_TIMEOUT / 3)
        sock.sendall(b"Host: 127.0.0.1\r\n\r\n")
        sock.settimeout(5)
        answer = sock.recv(4096)
        while answer.endswith(b"\r\n\r\n"):  # the body may come in a segment of its own
            answer += sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 200")
        assert answer.endswith(b'"pong"')


def test_open_connections_are_bounded() -> None:
    with guarded_server(max_connections=4, header_timeout=10.0, token=None) as (url, port):
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        try:
            time.sleep(0.2)  # let the server accept them all
            with socket.create_connection(("127.0.0.1", port)) as surplus:
                closed, answer = closed_within(surplus, 3.0)
            assert closed
            assert answer == b"" or answer.startswith(b"HTTP/1.1 504")
        finally:
            for sock in idle:
                sock.close()
        deadline = time.monotonic() + 5
        while True:  # the slots come back once the idle connections are gone
            try:
                if httpx.get(f"{url}/v1/ping", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.05)


def _unread_answer(
    port: int, *, read_every: float | None, seconds: float, close: bool = False
) -> tuple[bool, int, int]:
    """Ask for a large answer on a connection with a tiny receive buffer and read it only
    ``read_every`` seconds 16 KiB at a time (None: never): (closed by the server,
    bytes received, the answer's length)."""
    body = b'{"code": "print()"}'
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        sock.sendall(
            b"POST /run_code HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + (b"Connection: close\r\n" if close else b"")
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        received, closed = b"", False
        deadline = time.monotonic() + seconds
        sock.settimeout(0.05)
        while time.monotonic() < deadline and not closed:
            time.sleep(read_every if read_every is not None else 0.05)
            if read_every is None:
                continue
            try:
                chunk = sock.recv(16384)
            except TimeoutError:
                continue
            except ConnectionResetError:
                closed = True
                continue
            closed = not chunk
            received += chunk
        if not closed:
            closed, rest = closed_within(sock, 3.0 if read_every is None else 0.5)
            received += rest
    head, _, answer = received.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0]) if head else -1
    return closed, len(answer), length


@pytest.mark.parametrize(
    ("keep_alive", "close"),
    [(5.0, False), (0.3, False), (5.0, True)],
    ids=["sending", "closing-after-keep-alive", "connection-close"],
)
def test_an_answer_the_client_never_reads_is_dropped_after_the_send_timeout(
    keep_alive: float, close: bool
) -> None:
    """A client that never read held the connection and the whole answer's memory for as
    long as it liked, past every other timeout (twentieth red-team round); a transport
    already closing (keep-alive's end, ``Connection: close``) waited for it just as long."""
    big = FakeBackend(lambda _request: "\x01" * (1 << 20))  # ~6 MB of JSON
    settings = ServerSettings(token=None, send_timeout=1.0)
    app = create_app(big, settings=settings)
    with serve(app, timeout_keep_alive=keep_alive) as url:
        port = int(url.rsplit(":", 1)[1])
        started = time.monotonic()
        closed, got, length = _unread_answer(port, read_every=None, seconds=3.5, close=close)
        assert closed and time.monotonic() - started < 9
        assert got < length or length == -1  # cut short: dropped with what it held


def test_an_answer_read_slowly_but_steadily_is_sent_whole() -> None:
    big = FakeBackend(lambda _request: "\x01" * (1 << 18))  # ~1.5 MB of JSON
    settings = ServerSettings(token=None, send_timeout=1.0)
    with serve(create_app(big, settings=settings)) as url:
        port = int(url.rsplit(":", 1)[1])
        closed, got, length = _unread_answer(port, read_every=0.02, seconds=30)
        assert got == length > 1 << 20, (closed, got, length)


def test_a_second_larger_answer_read_steadily_on_the_same_connection_is_sent_whole() -> None:
    """The watch of the first answer, still running, judged the second against the first's
    smaller mark and dropped a client that was reading (the review of the fix)."""
    sized = FakeBackend(lambda request: "\x01" * int(request.code))
    settings = ServerSettings(token=None, send_timeout=1.0)
    with serve(create_app(sized, settings=settings)) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port))
            sock.settimeout(10)
            for size in (1 << 17, 1 << 19):
                body = b'{"code": "%d"}' % size
                sock.sendall(
                    b"POST /run_code HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                received = b""
                while b"\r\n\r\n" not in received:
                    received += sock.recv(16384)
                head, _, answer = received.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                while len(answer) < length:
                    time.sleep(0.01)  # steadily, ~1.6 MB/s
                    chunk = sock.recv(16384)
                    assert chunk, f"dropped after {len(answer)} of {length} bytes"
                    answer += chunk
