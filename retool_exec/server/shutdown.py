"""A stop with requests in hand: every one of them gets an explicit answer in JSON.

uvicorn's graceful shutdown (a supervisor's SIGTERM, Ctrl-C, ``should_exit``) stops
listening, waits up to ``timeout_graceful_shutdown`` seconds (``retool-exec serve
--shutdown-grace``, 10 by default) for the requests in hand, then cancels those still
running, and answers a cancelled request that had not answered yet with its own ``500
text/plain "Internal Server Error"``. A request queued for a run slot waited out those
seconds and got the
same 500 (red-team round B): to a SandboxFusion client a server error, not a sign to
retry. So, from the moment the shutdown begins (``GuardedH11Protocol.shutdown``, which
uvicorn calls on every open connection first, calls ``SandboxService.begin_shutdown``):

- a request waiting for a run slot is answered at once (``Admission.close``);
- a request that reaches the app from then on (its body was still coming in) is
  answered at once (``ShutdownMiddleware``); new connections find no listener;
- a running call has the grace period to finish, and its answer is its own;
- a call still running when the grace period ends is cancelled, and its client is
  answered (``ShutdownMiddleware``), never with uvicorn's 500.

Each of these is ``504`` with a JSON ``detail`` and ``Retry-After: 1``: the status
this server answers whenever it cannot serve a request that is not at fault
(``admission.py``), and the only one verl's client retries (it raises on a 503 and
scores the sample -1). Behind a load balancer, or once a supervisor has restarted the
server, the retry is served. Nothing of the cancelled call's output is returned: it was
cut short by the server, as a call shortened by its wait in the queue is (also 504).

An app served without ``uvicorn_config``'s protocol does not know when the shutdown
begins: its queued requests are answered when they are cancelled, in the same JSON.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from retool_exec.server.admission import SHUTTING_DOWN
from retool_exec.server.guards import ASGIApp, Message, Receive, Scope, Send, send_json

__all__ = ["CANCELLED", "CUT_SHORT", "SHUTTING_DOWN", "ShutdownMiddleware"]

log = logging.getLogger("retool_exec.server")

CUT_SHORT = (
    "the server shut down before the call finished: it was stopped at the end of the "
    "shutdown's grace period, and nothing of its output is returned; retry (another "
    "server, or this one once it is back)"
)

CANCELLED = (
    "the server cancelled the request before it answered (it is most likely shutting down); retry"
)

_RETRY = [(b"retry-after", b"1"), (b"connection", b"close")]


class ShutdownMiddleware:
    """Refuses requests that arrive once ``stopping()``, and answers one that is
    cancelled before it answered, both with a JSON 504 (see the module)."""

    def __init__(self, app: ASGIApp, *, stopping: Callable[[], bool]) -> None:
        self.app = app
        self.stopping = stopping

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.stopping():
            await send_json(send, 504, SHUTTING_DOWN, _RETRY)
            return
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except asyncio.CancelledError:
            if started:
                raise  # part of an answer is out: the server closes the connection
            stopping = self.stopping()
            if stopping:
                log.warning("a call was cut short by the shutdown; its client got 504")
            try:
                await send_json(send, 504, CUT_SHORT if stopping else CANCELLED, _RETRY)
            except Exception:  # the connection is gone: nobody to answer
                log.debug("could not answer a cancelled request", exc_info=True)
            if not stopping:
                raise  # not the shutdown's cancel: whoever cancelled it expects it to end so
            # The shutdown cancelled this request only to end it; it has ended, answered.
