"""The FastAPI application: ``create_app(config, store, ...)``.

Cross-cutting rules live here, the endpoints in :mod:`workers.server.routes`:

- **Authentication**: ``Authorization: Bearer <token>``; the token names the
  tenant (``ServerConfig`` tokens, compared in constant time). A request
  only ever reaches that tenant's sessions (``store.for_tenant``): session
  ids are not global, so another tenant's session is simply not there.
- **Body size**: a body over ``max_body_bytes`` is answered 413 before it
  is parsed, from its ``Content-Length`` or, when streamed, as soon as the
  bytes read pass the limit.
- **Errors** are JSON, ``{"error": {"code", "message", "field"}}``, with the
  code of the exception tree (``shared.core.errors``) in snake case:
  ``invalid_input`` 422 (400 ``invalid_json`` for a body that is not JSON),
  ``session_not_found`` 404, ``irreducible_overflow`` 409,
  ``store_unavailable`` 503; ``unauthorized`` 401, ``payload_too_large`` 413.
  Unexpected errors are 500 ``internal_error`` without details (logged).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.core.config import CompactionPolicy
from shared.core.errors import (
    CompactionError,
    ConfigError,
    InvalidInput,
    IrreducibleOverflow,
    SessionNotFound,
    StoreUnavailable,
    SummarizerError,
)
from shared.core.limits import ModelLimits
from shared.core.viewcache import ViewCache
from shared.enqueue import Enqueuer, NullEnqueuer
from shared.guard import ContextGuard
from shared.store.changes import ChangeFeed, feed_for
from shared.store.sessions import SessionStore
from shared.telemetry import MetricsEndpoint
from workers.server.config import NO_TOKEN, ServerConfig, TokenBook
from workers.server.logids import LogIds, log_extra

log = logging.getLogger(__name__)

#: Publishes a manual compaction: (tenant, session, keep_recent, force) -> task id.
CompactPublisher = Callable[[str, str, int | None, bool], str]

STATUS: list[tuple[type[Exception], int]] = [  # most specific first
    (InvalidInput, 422),
    (SessionNotFound, 404),
    (IrreducibleOverflow, 409),
    (StoreUnavailable, 503),
    (SummarizerError, 502),
    (CompactionError, 500),
]
HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
              405: "method_not_allowed", 413: "payload_too_large", 503: "unavailable"}


#: the 422's message when the body as a whole is wrong, by pydantic's error type
BODY_MESSAGE = {"missing": "a JSON object is required (sent as Content-Type: application/json)"}


def error_code(exc: BaseException) -> str:
    """``InvalidInput`` -> ``invalid_input``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(exc).__name__).lower()


class ApiError(Exception):
    """An HTTP-level error with its own code (unauthorized, broker_unavailable...)."""

    def __init__(self, status: int, code: str, message: str, *, field: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field
        self.headers = dict(headers or {})


def error_response(status: int, code: str, message: str, field: str | None = None,
                   headers: Mapping[str, str] | None = None,
                   extra: Mapping[str, Any] | None = None) -> JSONResponse:
    body: dict[str, Any] = {"code": code, "message": message, "field": field, **(extra or {})}
    return JSONResponse({"error": body}, status_code=status, headers=dict(headers or {}))


@dataclass
class ServerState:
    """What the routes need: the store, one guard per tenant, auth, the publishers."""

    config: ServerConfig
    store: SessionStore
    tokens: TokenBook
    enqueuer: Enqueuer
    policy: CompactionPolicy | None = None
    overrides: Mapping[str, ModelLimits | int] | None = None
    compact: CompactPublisher | None = None
    _guards: dict[str, ContextGuard] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _feed: ChangeFeed | bool | None = None  # one change feed for every tenant's guard
    _views: ViewCache | None = None  # one cache, one bound, for every tenant's guard

    def _shared_feed(self) -> ChangeFeed | bool:
        if self._feed is None:
            self._feed = feed_for(self.store.redis, f"{self.store.config.key_prefix}:{{") \
                or False
        return self._feed

    def guard(self, tenant: str) -> ContextGuard:
        """The tenant's guard (its learned limits and its scope of the process's view cache
        are the tenant's own; the cache's bound is the process's)."""
        with self._lock:
            guard = self._guards.get(tenant)
            if guard is None:
                if self._views is None:
                    self._views = ViewCache(
                        self.config.cache_sessions, self.config.cache_messages,
                        pending_tokens=self.config.cache_pending_tokens)
                guard = self._guards[tenant] = ContextGuard(
                    self.store.for_tenant(tenant), self.enqueuer, policy=self.policy,
                    overrides=self.overrides, view_cache=self._views.scoped(tenant),
                    watch_changes=self._shared_feed())
            return guard


class BodyLimit:
    """Pure ASGI middleware: 413 for bodies over ``limit`` bytes, before anything parses them."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        # A Content-Length that is not a number never gets here from uvicorn (h11 and
        # httptools answer it 400 themselves); from a server that passes it on, it is
        # ignored like a missing one: the bytes are counted below either way.
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._too_large(scope, receive, send)
            return
        # Streamed (chunked) or under-declared: read it all, counting, before the app runs.
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._too_large(scope, receive, send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(413, "payload_too_large",
                                  f"request body over {self.limit} bytes",
                                  headers={"Connection": "close"})
        await response(scope, receive, send)


def _field(loc: Sequence[Any]) -> str | None:
    """``("body", "query")`` -> ``query``: only the first item names where (a body
    field may be called ``query`` too, as recall's is)."""
    parts = list(loc[1:] if loc and loc[0] in ("body", "path", "query", "header") else loc)
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or None


def body_parse_error(exc: StarletteHTTPException) -> str | None:
    """What the parser said, for the 400 FastAPI raises from a body it could not decode
    (invalid UTF-8, nesting past the recursion limit): a body that is not JSON, like a
    syntax error (which FastAPI reports as a validation error instead). None otherwise."""
    cause = exc.__cause__
    if exc.status_code != 400 or not isinstance(cause, ValueError | RecursionError):
        return None
    return str(cause)[:200]


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message, exc.field, exc.headers)

    @app.exception_handler(CompactionError)
    async def _compaction(request: Request, exc: CompactionError) -> JSONResponse:
        status = next(s for cls, s in STATUS if isinstance(exc, cls))
        field_name = exc.field if isinstance(exc, InvalidInput) else None
        message = str(exc)
        if field_name and message.startswith(f"{field_name}: "):
            message = message[len(field_name) + 2:]
        extra: dict[str, Any] = {}
        if isinstance(exc, IrreducibleOverflow):
            extra = {"fixed_tokens": exc.fixed_tokens, "window": exc.window}
        if status >= 500:
            log.warning("%s %s: %s", request.method, request.url.path, exc)
        return error_response(status, error_code(exc), message, field_name, extra=extra)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
        if first.get("type") == "json_invalid":
            return error_response(400, "invalid_json",
                                  f"the body is not valid JSON: {first.get('msg')}")
        if tuple(first.get("loc", ())) == ("body",):  # the body itself, not one of its fields
            return error_response(422, "invalid_input", BODY_MESSAGE.get(
                str(first.get("type")), "the body should be a JSON object"), "body")
        message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
        return error_response(422, "invalid_input", message, _field(first.get("loc", ())))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        reason = body_parse_error(exc)
        if reason is not None:
            return error_response(400, "invalid_json", f"the body is not valid JSON: {reason}")
        code = HTTP_CODES.get(exc.status_code, "http_error")
        return error_response(exc.status_code, code, str(exc.detail), headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path,
                      extra=log_extra(request.scope, request.app.state.server.tokens))
        return error_response(500, "internal_error", "internal error (logged on the server)")


def create_app(config: ServerConfig, store: SessionStore, enqueuer: Enqueuer | None = None,
               *, policy: CompactionPolicy | None = None,
               overrides: Mapping[str, ModelLimits | int] | None = None,
               compact: CompactPublisher | None = None,
               tokens: Mapping[str, str] | None = None) -> FastAPI:
    """The HTTP API over ``store`` (any tenant the tokens name).

    ``enqueuer`` publishes ``maybe_summarize`` after record and truncations;
    ``compact`` publishes a manual ``compaction.compact`` (without it the
    compact endpoint answers 503). ``tokens`` overrides the config's map.
    """
    from workers.server.routes import health, router

    book = TokenBook(tokens if tokens is not None else config.token_map())
    if not len(book):  # a configuration error (exit 2 from the CLI), also a ValueError
        raise ConfigError(NO_TOKEN)
    app = FastAPI(title="context-compaction", version="0.1.0",
                  summary="The context guard over HTTP: prepare views, record turns, recover "
                          "from overflows; Celery workers summarize in the background.")
    app.state.server = ServerState(config=config, store=store, tokens=book,
                                   enqueuer=enqueuer or NullEnqueuer(), policy=policy,
                                   overrides=overrides, compact=compact)
    install_error_handlers(app)
    app.include_router(router)
    app.include_router(health)
    app.add_middleware(BodyLimit, limit=config.max_body_bytes)
    app.add_middleware(LogIds, tokens=book)  # tenant and session id on its log lines
    # Prometheus scrapes without a token, like Flower's /metrics; no session ids in labels.
    # A route, not a mount: a mount answers /metrics with a redirect to /metrics/. With
    # several processes (`compaction serve --workers N`) it serves all their sums.
    metrics = MetricsEndpoint()
    for path in ("/metrics", "/metrics/"):
        app.router.routes.append(Route(path, metrics, include_in_schema=False))
    return app


__all__ = ["ApiError", "BodyLimit", "CompactPublisher", "ServerState", "create_app",
           "error_code", "error_response"]
