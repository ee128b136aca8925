"""What stands between the network and the sandbox: a body-size cap, the token, and browsers.

Both are plain ASGI so they act before FastAPI parses anything: an oversized
body is refused without being held in memory, and a request without the token
never reaches a handler. The token is compared in constant time
(``hmac.compare_digest``). It is accepted as ``Authorization: Bearer <token>``
or as the password of HTTP Basic auth, because SandboxFusion clients (verl)
cannot add headers but do honour ``http://user:<token>@host/run_code`` URLs.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import json
from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "BodyLimitMiddleware",
    "BrowserGuardMiddleware",
    "TokenMiddleware",
    "is_loopback",
    "is_loopback_host",
    "presented_token",
    "send_json",
    "token_matches",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_DRAIN_FACTOR = 4
"""Past the limit, read (and discard) up to this many times the limit before
answering, so an ordinary client that is still sending gets the 413 instead
of a reset connection; a larger upload is cut off."""


async def send_json(
    send: Send, status: int, detail: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """A whole answer in the server's error shape: ``{"detail": ...}``."""
    body = json.dumps({"detail": detail}).encode("utf-8")
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode("ascii")),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimitMiddleware:
    """Answers 413 to a request whose body is larger than ``max_bytes``."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = f"the request body is larger than {self.max_bytes} bytes"
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._drain(receive, int(declared))
            await send_json(send, 413, too_large)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                if message.get("more_body", False):
                    await self._drain(receive, None)
                await send_json(send, 413, too_large)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _drain(self, receive: Receive, declared: int | None) -> None:
        if declared is not None and declared > _DRAIN_FACTOR * self.max_bytes:
            return
        budget = _DRAIN_FACTOR * self.max_bytes
        while budget > 0:
            message = await receive()
            if message["type"] != "http.request":
                return
            budget -= len(message.get("body", b""))
            if not message.get("more_body", False):
                return


def presented_token(authorization: str | None) -> str | None:
    """The token an ``Authorization`` header carries (Bearer, or Basic password), if any."""
    if not authorization:
        return None
    scheme, _, credentials = authorization.strip().partition(" ")
    credentials = credentials.strip()
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return decoded.partition(":")[2]
    if scheme.lower() != "bearer":
        return None
    return credentials


def token_matches(authorization: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``token`` (Bearer, or Basic password)."""
    presented = presented_token(authorization)
    if presented is None:
        return False
    return hmac.compare_digest(presented.encode("utf-8"), token.encode("utf-8"))


class TokenMiddleware:
    """Answers 401 unless the request carries the token; ``open_paths`` need none."""

    def __init__(self, app: ASGIApp, *, token: str, open_paths: Collection[str]) -> None:
        if not token:
            raise ValueError("the token must not be empty")
        self.app = app
        self.token = token
        self.open_paths = frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self.open_paths:
            await self.app(scope, receive, send)
            return
        raw = _header(scope, b"authorization")
        if not token_matches(raw, self.token):
            await send_json(
                send,
                401,
                "missing or wrong token: send 'Authorization: Bearer <token>'",
                [(b"www-authenticate", b'Bearer realm="retool-exec"')],
            )
            return
        await self.app(scope, receive, send)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def is_loopback(name: str) -> bool:
    """Whether a host name or address is this machine's loopback (``localhost``,
    127.0.0.0/8, ``::1``)."""
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def is_loopback_host(host: str) -> bool:
    """Whether a ``Host`` header's or an origin's ``host[:port]`` is loopback."""
    try:
        return is_loopback(urlsplit(f"//{host}").hostname or "")
    except ValueError:  # a malformed port or bracket
        return False


class BrowserGuardMiddleware:
    """Answers 403 to what only a web page sends: a foreign ``Origin``, or (on a server
    bound to loopback) a ``Host`` that is not loopback.

    Why: a page in any browser on this machine may POST to ``http://127.0.0.1:8080``
    (a ``text/plain`` body needs no CORS preflight, and this server reads any body as
    JSON), so every web page could run code in the sandbox, and on the host itself
    with ``--backend local``; with DNS rebinding (``Host: evil.example`` resolving to
    127.0.0.1) it could read the answers too. Training clients send no ``Origin``
    and a loopback ``Host`` (the sixth red-team round). The MCP server's transport
    refuses the same requests.
    """

    def __init__(self, app: ASGIApp, *, check_host: bool) -> None:
        self.app = app
        self.check_host = check_host

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {name.lower(): value for name, value in scope.get("headers", [])}
        origin = headers.get(b"origin")
        if origin is not None and not _local_origin(origin.decode("latin-1")):
            await send_json(send, 403, "cross-origin requests are refused")
            return
        host = headers.get(b"host", b"").decode("latin-1")
        if self.check_host and not is_loopback_host(host):
            await send_json(send, 403, f"Host {host[:100]!r} is not this machine's loopback")
            return
        await self.app(scope, receive, send)


def _local_origin(origin: str) -> bool:
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and is_loopback_host(parts.netloc)
