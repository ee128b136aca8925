"""The ASGI app: SandboxFusion's endpoints plus retool_exec's own.

=========================  ==================================================
``GET  /v1/ping``          ``"pong"`` (never needs the token: for probes)
``POST /run_code``         SandboxFusion's ``RunCodeRequest`` → ``RunCodeResponse``
``POST /run_jupyter``      SandboxFusion's notebook call (see ``jupyter.py``)
``POST /v1/exec``          ``{"code", "timeout", "memory_mb"}`` → ``ExecResult``
``GET  /v1/metrics``       the sandbox's metrics and the queue's gauges
``POST /sessions``         a stateful interpreter for HTTP clients (and its
                           ``/run``, ``/fork`` and ``DELETE``; ``sessions.py``)
=========================  ==================================================

Every route is also served under ``settings.prefix`` (``/faas/sandbox/run_code``
as well as ``/run_code``). HTTP statuses: 200 for every outcome of the code,
including the sandbox failing (``"status": "SandboxError"``); 400/413/422
for a request that cannot be served as given (the message says why); 401
without the token; 404 for an unknown path (one that names an endpoint twice,
``/run_code/run_code``, says so); 504 only when the server cannot serve the
request now and the request is not at fault (clients retry on it): it is full,
or it is shutting down (``shutdown.py``).
The session endpoints add 201/204 and their own 403/404/409/410/429/501/503
(see ``sessions.py``).

Bodies are parsed here, not by FastAPI's parameter machinery, so any content
type is read as JSON (``curl -d`` sends a form type) and a broken body gets
one clear sentence instead of a framework error.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator, Collection
from typing import Any, TypeVar

from fastapi import APIRouter, FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException

from retool_exec import __version__
from retool_exec._models import ExecResult, Outcome
from retool_exec._sandbox import Sandbox
from retool_exec.backends.base import Backend
from retool_exec.backends.config import BackendConfigBase
from retool_exec.backends.registry import backend_config
from retool_exec.server.access_log import redact_session_ids
from retool_exec.server.admission import ClientGone, Overloaded, ShuttingDown
from retool_exec.server.descriptors import quiet_accept_errors
from retool_exec.server.files import RequestRejected
from retool_exec.server.guards import (
    BodyLimitMiddleware,
    BrowserGuardMiddleware,
    TokenMiddleware,
    presented_token,
)
from retool_exec.server.schemas import (
    ExecRequest,
    RunCodeRequest,
    RunCodeResponse,
    RunJupyterRequest,
    RunJupyterResponse,
    SessionCreated,
    SessionCreateRequest,
    SessionRunRequest,
    SessionRunResponse,
)
from retool_exec.server.service import SandboxService
from retool_exec.server.sessions import client_key
from retool_exec.server.settings import ServerSettings
from retool_exec.server.shutdown import ShutdownMiddleware

__all__ = ["OUTCOME_HEADER", "create_app"]

OUTCOME_HEADER = "X-Retool-Exec-Outcome"
"""Response header with retool_exec's ``Outcome`` (``oom``, ``cpu_limit``, ...),
which SandboxFusion's enums cannot express."""

_MAX_REPORTED_ERRORS = 10

M = TypeVar("M", bound=BaseModel)


def create_app(
    sandbox_or_config: Sandbox | BackendConfigBase | Backend | str = "docker",
    *,
    settings: ServerSettings | None = None,
    prefix: str | None = None,
) -> FastAPI:
    """The SandboxFusion-compatible app over a sandbox.

    ``sandbox_or_config`` is a ready ``Sandbox`` (the app starts it but never
    closes it: it is yours), or a backend name, config or ``Backend`` from
    which the app builds its own sandbox at startup and closes at shutdown.
    A sandbox the app builds keeps ``settings.sandbox_output_chars`` of each
    stream; answers are cut from that tail.
    ``prefix`` overrides ``settings.prefix``.

    Served by an ASGI server other than ``uvicorn_config``'s, turn the server's
    proxy headers off (``uvicorn --no-proxy-headers``): a client is its address,
    and a server that believes ``X-Forwarded-For`` lets a client write it.
    """
    redact_session_ids()  # (uvicorn's loggers, whichever way uvicorn serves the app)
    settings = settings or ServerSettings()
    if prefix is not None:
        settings = ServerSettings.model_validate({**settings.model_dump(), "prefix": prefix})
    sandbox, owned = _sandbox_for(sandbox_or_config, settings)
    service = SandboxService(sandbox, settings, owned=owned)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        with quiet_accept_errors():  # running out of descriptors: a line, not a flood
            await service.start()
            try:
                yield
            finally:
                await service.close()

    app = FastAPI(
        title="retool_exec sandbox server",
        version=__version__,
        description="SandboxFusion-compatible API over retool_exec's hardened sandbox.",
        lifespan=lifespan,
    )
    app.state.service = service
    router = _router(service)
    app.include_router(router)
    if settings.prefix:
        app.include_router(router, prefix=settings.prefix, include_in_schema=False)
    routes = [route for route in router.routes if isinstance(route, APIRoute)]
    _add_error_handlers(app, {route.path for route in routes if "{" not in route.path})
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(BrowserGuardMiddleware, check_host=settings.loopback_only)
    # Inside the token check (a request without the token is a 401 still), around all else.
    app.add_middleware(ShutdownMiddleware, stopping=lambda: service.stopping)
    if settings.token is not None:
        open_paths = {"/v1/ping", f"{settings.prefix}/v1/ping"}
        app.add_middleware(
            TokenMiddleware, token=settings.token.get_secret_value(), open_paths=open_paths
        )
    return app


def _sandbox_for(
    spec: Sandbox | BackendConfigBase | Backend | str, settings: ServerSettings
) -> tuple[Sandbox, bool]:
    if isinstance(spec, Sandbox):
        return spec, False
    workers = settings.max_concurrency  # None: as many as the backend runs at once
    if isinstance(spec, Backend):
        return Sandbox(spec, max_workers=workers), True
    config = backend_config(spec) if isinstance(spec, str) else spec
    if config.max_output_chars < settings.sandbox_output_chars:
        config = config.model_copy(update={"max_output_chars": settings.sandbox_output_chars})
    return Sandbox(config, max_workers=workers), True


def _router(service: SandboxService) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/ping", tags=["sandbox"])
    async def ping() -> str:
        """Liveness: always ``"pong"``."""
        return "pong"

    @router.post(
        "/run_code",
        response_model=RunCodeResponse,
        tags=["sandbox"],
        openapi_extra=_body(RunCodeRequest),
    )
    async def run_code(request: Request) -> Response:
        """Run code (SandboxFusion's API)."""
        body = _parse(RunCodeRequest, await request.body())
        response, outcome = await service.run_code(body, gone=request.is_disconnected)
        return _answer(response, outcome)

    @router.post(
        "/run_jupyter",
        response_model=RunJupyterResponse,
        tags=["sandbox"],
        openapi_extra=_body(RunJupyterRequest),
    )
    async def run_jupyter(request: Request) -> Response:
        """Run notebook cells in order in one sandbox (SandboxFusion's API)."""
        body = _parse(RunJupyterRequest, await request.body())
        response, outcome = await service.run_jupyter(body, gone=request.is_disconnected)
        return _answer(response, outcome)

    @router.post(
        "/v1/exec",
        response_model=ExecResult,
        tags=["retool_exec"],
        openapi_extra=_body(ExecRequest),
    )
    async def exec_code(request: Request) -> Response:
        """Run code and get retool_exec's full ``ExecResult``."""
        body = _parse(ExecRequest, await request.body())
        result = await service.exec(body, gone=request.is_disconnected)
        return Response(
            result.model_dump_json(),
            media_type="application/json",
            headers={OUTCOME_HEADER: result.outcome.value},
        )

    @router.get("/v1/metrics", tags=["retool_exec"])
    async def metrics() -> dict[str, float]:
        """The sandbox's cumulative metrics and the queue's current state."""
        return service.metrics()

    sessions = service.sessions

    @router.post(
        "/sessions",
        status_code=201,
        response_model=SessionCreated,
        tags=["sessions"],
        openapi_extra=_body(SessionCreateRequest),
    )
    async def create_session(request: Request) -> Response:
        """Open a stateful session (the body may be empty)."""
        raw = await request.body()
        body = _parse(SessionCreateRequest, raw if raw.strip() else b"{}")
        created = await sessions.create(
            body, client=_client(request, service.settings), gone=request.is_disconnected
        )
        return JSONResponse(created.model_dump(mode="json"), status_code=201)

    @router.post(
        "/sessions/{session_id}/run",
        response_model=SessionRunResponse,
        tags=["sessions"],
        openapi_extra=_body(SessionRunRequest),
    )
    async def run_in_session(session_id: str, request: Request) -> Response:
        """Run one cell in the session: its state persists to the next."""
        body = _parse(SessionRunRequest, await request.body())
        response, outcome = await sessions.run(
            session_id,
            body,
            client=_client(request, service.settings),
            gone=request.is_disconnected,
        )
        return JSONResponse(
            response.model_dump(mode="json"), headers={OUTCOME_HEADER: outcome.value}
        )

    @router.post(
        "/sessions/{session_id}/fork",
        status_code=201,
        response_model=SessionCreated,
        tags=["sessions"],
    )
    async def fork_session(session_id: str, request: Request) -> Response:
        """A new session whose state is a copy of this one's now."""
        created = await sessions.fork(
            session_id, client=_client(request, service.settings), gone=request.is_disconnected
        )
        return JSONResponse(created.model_dump(mode="json"), status_code=201)

    @router.delete("/sessions/{session_id}", status_code=204, tags=["sessions"])
    async def delete_session(session_id: str, request: Request) -> Response:
        """Close the session (204 for any id this client holds, ended ones included)."""
        await sessions.delete(session_id, client=_client(request, service.settings))
        return Response(status_code=204)

    return router


def _client(request: Request, settings: ServerSettings) -> str:
    """The session holder a request speaks for: its token if the server has one, else its IP."""
    token = None
    if settings.token is not None:
        token = presented_token(request.headers.get("authorization"))
    return client_key(token=token, peer=request.client.host if request.client else None)


def _add_error_handlers(app: FastAPI, endpoints: Collection[str]) -> None:
    @app.exception_handler(404)
    async def not_found(request: Request, exc: Exception) -> Response:
        # Only the router's own 404 (no route): sessions answer theirs as RequestRejected.
        assert isinstance(exc, HTTPException)
        hint = _doubled_endpoint(request.url.path, endpoints)
        if hint is None:
            return await http_exception_handler(request, exc)
        # The path only: behind a proxy the scheme and host this server sees are not the
        # client's, and the Host header is the client's to choose.
        detail = (
            f"no endpoint at {request.url.path}: it names {hint[0]} twice, so the client "
            f"was given the endpoint's URL where it wants the server's base URL; give it "
            f"the same URL without the last {hint[0]}, whose path is {hint[1] or '/'} "
            f"(it adds {hint[0]} itself)"
        )
        return JSONResponse({"detail": detail}, status_code=404)

    @app.exception_handler(RequestRejected)
    async def rejected(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestRejected)
        content: dict[str, Any] = {"detail": str(exc)}
        errors = getattr(exc, "errors", None)
        if errors:
            content["errors"] = errors
        return JSONResponse(content, status_code=exc.status, headers=exc.headers or None)

    @app.exception_handler(Overloaded)
    async def overloaded(_request: Request, exc: Exception) -> Response:
        headers = {"Retry-After": "1"}
        if isinstance(exc, ShuttingDown):
            headers["Connection"] = "close"
        return JSONResponse({"detail": str(exc)}, status_code=504, headers=headers)

    @app.exception_handler(ClientGone)
    async def client_gone(_request: Request, exc: Exception) -> Response:
        # Nobody reads this: the connection is closed. 499 is nginx's "client closed".
        return JSONResponse({"detail": str(exc)}, status_code=499)


def _doubled_endpoint(path: str, endpoints: Collection[str]) -> tuple[str, str] | None:
    """``(endpoint, base path)`` when ``path`` ends in an endpoint named twice, else ``None``.

    ``/faas/sandbox/run_code/run_code`` gives ``("/run_code", "/faas/sandbox")``.
    Why: some SandboxFusion clients take the endpoint's URL (verl), others the
    server's base URL and add ``/run_code`` themselves (SkyRL-agent). Given the
    endpoint's URL, the latter post to ``/run_code/run_code``, and a bare 404 says
    nothing of why (SkyRL-agent's tool then tells the model ``no stdout here``).
    """
    path = path.rstrip("/")
    for endpoint in sorted(endpoints, key=len, reverse=True):
        if path.endswith(endpoint + endpoint):
            return endpoint, path[: -2 * len(endpoint)]
    return None


def _with_lone_surrogates(model: type[M], raw: bytes) -> M | None:
    """``model`` from a body whose only fault is a lone-surrogate escape, else None.

    Why: Python's ``json.dumps`` writes a string holding a lone surrogate as
    ``"\ud800"``, and SandboxFusion (``json.loads`` under FastAPI) takes it; pydantic's
    parser refused it as "unexpected end of hex escape", a 400 that sent clients to look
    for broken JSON (thirty-seventh round's new-user pass). Such code then fails as it
    would through the Python API (``UnicodeEncodeError``); in stdin it becomes ``?``
    (``service``'s encoding). ``NaN`` and ``Infinity``, which ``json.loads`` would take,
    stay refused.
    """
    if not _SURROGATE_ESCAPE.search(raw):
        return None
    try:
        data = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError):  # (UnicodeDecodeError, JSONDecodeError; deep nesting)
        return None
    return model.model_validate(data)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class _InvalidBody(RequestRejected):
    def __init__(self, message: str, *, status: int, errors: list[dict[str, Any]]) -> None:
        super().__init__(message, status=status)
        self.errors = errors


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
"""A ``\ud800``-``\udfff`` escape: what ``json.dumps`` writes for a lone surrogate."""


def _parse(model: type[M], raw: bytes) -> M:
    """``model`` from a JSON body, or a 400 (not JSON) / 422 (wrong shape) with the reason."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors = _errors(exc)
        if not any(error["type"] == "json_invalid" for error in errors):
            raise _invalid(model, errors) from exc
        try:
            lenient = _with_lone_surrogates(model, raw)
        except ValidationError as shape:  # valid JSON after all, of the wrong shape
            raise _invalid(model, _errors(shape)) from shape
        if lenient is not None:
            return lenient
        reason = errors[0]["msg"] if raw.strip() else "the body is empty"
        raise _InvalidBody(
            f"the request body is not valid JSON: {reason}", status=400, errors=errors
        ) from exc


def _errors(exc: ValidationError) -> list[dict[str, Any]]:
    return [
        {"loc": list(error["loc"]), "msg": error["msg"], "type": error["type"]}
        for error in exc.errors(include_url=False, include_input=False)
    ]


def _invalid(model: type[BaseModel], errors: list[dict[str, Any]]) -> _InvalidBody:
    """The 422 for a body of the wrong shape, its first errors in one line."""
    parts = [
        f"{'.'.join(str(part) for part in error['loc']) or 'body'}: {error['msg']}"
        for error in errors[:_MAX_REPORTED_ERRORS]
    ]
    message = f"invalid {model.__name__}: " + "; ".join(parts)
    return _InvalidBody(message, status=422, errors=errors)


def _answer(response: RunCodeResponse | RunJupyterResponse, outcome: Outcome) -> Response:
    content = response.model_dump(mode="json")
    if content.get("request_id") is None:
        del content["request_id"]  # echoed only when the client sent one
    return _EscapingJSONResponse(content, headers={OUTCOME_HEADER: outcome.value})


class _EscapingJSONResponse(JSONResponse):
    """JSON as Starlette writes it, or, where a text holds a lone surrogate (a
    ``request_id`` the client sent so, ``_with_lone_surrogates``), with every non-ASCII
    character escaped: ``"\\ud800"`` back as it came, not a 500 after the code ran."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")


def _body(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI for a body we parse ourselves."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }
