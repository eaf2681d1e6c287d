"""The endpoints. Each is a thin shell over the guard: parse, convert, call, convert back.

``def`` (not ``async def``) on purpose: the guard and the store are
synchronous, so FastAPI runs each request in its thread pool and the event
loop never waits on Redis.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel

from shared.core.errors import InvalidInput, SessionNotFound
from shared.core.messages import Message, validate_messages
from shared.core.prepared import PreparedView
from shared.core.recall import render_hits
from shared.core.wire import from_anthropic, from_gemini, from_openai, to_anthropic, to_gemini
from shared.enqueue import TASK_COMPACT
from shared.guard import ContextGuard
from shared.store.keys import validate_session_id
from workers.server.app import ApiError, ServerState
from workers.server.schemas import (
    CompactOut,
    CompactRequest,
    ErrorOut,
    Format,
    HealthOut,
    HistoryOut,
    OverflowErrorOut,
    PreparedOut,
    PrepareRequest,
    RecallOut,
    RecallRequest,
    RecordOut,
    RecordRequest,
    RecoverOut,
    RecoverRequest,
    StatsOut,
    SummaryOut,
)

bearer = HTTPBearer(auto_error=False, description="a token from the server's token map; "
                                                  "it names the tenant")
ERROR_TEXT = {
    400: "invalid_json: the body is not JSON (syntax, invalid UTF-8, nesting too deep)",
    401: "unauthorized: missing or unknown bearer token",
    404: "session_not_found: no such session in the token's tenant",
    409: "irreducible_overflow: the fixed part (system + tools + reserve + newest message) "
         "alone exceeds the window",
    413: "payload_too_large: body over the configured limit",
    422: "invalid_input / limit_exceeded (field named)",
    500: "internal_error: unexpected, logged on the server",
    503: "store_unavailable (Redis) or broker_unavailable (compact)",
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The error responses an operation can give, each with its body's model."""
    return {code: {"model": OverflowErrorOut if code == 409 else ErrorOut,
                   "description": ERROR_TEXT[code]} for code in codes}


#: every /v1 operation: token, session id, Redis, the unexpected
COMMON = (401, 422, 500, 503)
#: an operation with a JSON body
BODY = (400, 413)

router = APIRouter(prefix="/v1")


def _state(request: Request) -> ServerState:
    state: ServerState = request.app.state.server
    return state


def tenant_of(request: Request,
              credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
              ) -> str:
    """The tenant the bearer token names; 401 otherwise."""
    challenge = {"WWW-Authenticate": "Bearer"}
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise ApiError(401, "unauthorized", "missing bearer token", headers=challenge)
    tenant = _state(request).tokens.tenant(credentials.credentials)
    if tenant is None:
        raise ApiError(401, "unauthorized", "unknown bearer token", headers=challenge)
    return tenant


Tenant = Annotated[str, Depends(tenant_of)]
SessionId = Annotated[str, Path(min_length=1, max_length=128, description="session id")]


def _guard(request: Request, tenant: str, session_id: str) -> ContextGuard:
    validate_session_id(session_id)
    return _state(request).guard(tenant)


def _exists(guard: ContextGuard, session_id: str) -> None:
    data = guard.store.load_view(session_id)
    if data.length == 0 and data.summary is None:
        raise SessionNotFound(f"no session {session_id!r}")


# -- conversions -------------------------------------------------------------------------
def messages_in(raw: Sequence[Any], fmt: Format, name: str) -> list[Message]:
    """Messages of ``fmt``; a bad one raises InvalidInput naming ``<name>[i].field``."""
    try:
        if fmt == "openai":
            return from_openai(raw)
        if fmt == "anthropic":
            return from_anthropic(raw)
        if fmt == "gemini":
            return from_gemini(raw)
        return validate_messages(raw)
    except InvalidInput as exc:
        where = exc.field or "messages"
        message = str(exc).removeprefix(f"{where}: ")
        for wire in ("messages", "contents"):
            if where.startswith(wire):
                where = name + where[len(wire):]
                break
        raise InvalidInput(message, field=where) from None


def view_out(view: PreparedView, fmt: Format) -> PreparedOut:
    system: Any = None
    if fmt == "openai":
        messages: list[Any] = view.openai()
    elif fmt == "anthropic":
        system, messages = to_anthropic(view.messages)
    elif fmt == "gemini":
        system, messages = to_gemini(view.messages)
    else:
        messages = [m.model_dump(mode="json", exclude_none=True) for m in view.messages]
    return PreparedOut(format=fmt, messages=messages, system=system, report=view.report)


def fast(model: BaseModel, status: int = 200) -> Response:
    """The model as JSON, serialized by pydantic in one pass (FastAPI's generic encoder
    takes ~4 ms on a 100-message view; ``response_model`` still documents the shape)."""
    return Response(model.model_dump_json(), status_code=status, media_type="application/json")


# -- endpoints -----------------------------------------------------------------------------
@router.post("/sessions/{session_id}/prepare", response_model=PreparedOut,
             responses=errors(*BODY, 409, *COMMON),
             summary="The view to send now (summary + recent messages within the budget)")
def prepare(request: Request, tenant: Tenant, session_id: SessionId,
            body: PrepareRequest) -> Response:
    guard = _guard(request, tenant, session_id)
    pending = messages_in(body.pending, body.format, "pending")
    view = guard.prepare(session_id, body.system_prompt, body.tools, body.max_tokens,
                         body.model, pending=pending, min_length=body.min_length)
    return fast(view_out(view, body.format))


@router.post("/sessions/{session_id}/record", response_model=RecordOut,
             responses=errors(*BODY, *COMMON),
             summary="Append a turn and enqueue background summarization (coalesced)")
def record(request: Request, tenant: Tenant, session_id: SessionId,
           body: RecordRequest) -> RecordOut:
    guard = _guard(request, tenant, session_id)
    messages = messages_in(body.messages, body.format, "messages")
    length = guard.record_turn(session_id, messages, body.usage, request_id=body.request_id)
    return RecordOut(session_id=session_id, length=length)


@router.post("/sessions/{session_id}/recover", response_model=RecoverOut,
             responses=errors(*BODY, *COMMON),  # no view that fits: recovered false
             summary="After a provider error: a harder-compacted view for one retry")
def recover(request: Request, tenant: Tenant, session_id: SessionId,
            body: RecoverRequest) -> Response:
    guard = _guard(request, tenant, session_id)
    pending = messages_in(body.pending, body.format, "pending")
    error: dict[str, Any] = {"message": body.error} if isinstance(body.error, str) \
        else dict(body.error)
    if body.status is not None:
        error["status_code"] = body.status
    view = guard.recover(session_id, error, body.system_prompt, body.tools, body.max_tokens,
                         body.model, pending=pending, prepared_tokens=body.prepared_tokens,
                         min_length=body.min_length)
    if view is None:
        return fast(RecoverOut(recovered=False))
    return fast(RecoverOut(recovered=True, view=view_out(view, body.format)))


@router.post("/sessions/{session_id}/recall", response_model=RecallOut,
             responses=errors(*BODY, 404, *COMMON),
             summary="Recall: the earlier messages compaction summarized away that match, "
                     "verbatim, with their index")
def recall(request: Request, tenant: Tenant, session_id: SessionId,
           body: RecallRequest) -> Response:
    guard = _guard(request, tenant, session_id)
    hits = guard.recall(session_id, body.query, limit=body.limit, start=body.start,
                        end=body.end)
    return fast(RecallOut(session_id=session_id, hits=hits, text=render_hits(hits)))


@router.get("/sessions/{session_id}/stats", response_model=StatsOut,
            responses=errors(404, *COMMON), summary="Tokens by region, usage, summaries")
def stats(request: Request, tenant: Tenant, session_id: SessionId) -> StatsOut:
    guard = _guard(request, tenant, session_id)
    # SessionNotFound (404) for a session never recorded
    return StatsOut.model_validate(guard.stats(session_id))


@router.post("/sessions/{session_id}/compact", response_model=CompactOut, status_code=202,
             responses=errors(*BODY, 404, *COMMON),
             summary="Enqueue a manual compaction (/compact)")
def compact(request: Request, tenant: Tenant, session_id: SessionId,
            body: CompactRequest | None = None) -> CompactOut:
    guard = _guard(request, tenant, session_id)
    body = body or CompactRequest()
    _exists(guard, session_id)
    publish = _state(request).compact
    if publish is None:
        raise ApiError(503, "broker_unavailable", "this server has no broker to publish to")
    try:
        task_id = publish(tenant, session_id, body.keep_recent, body.force)
    except Exception as exc:
        raise ApiError(503, "broker_unavailable", f"cannot publish the job: {exc}") from None
    return CompactOut(session_id=session_id, task_id=task_id, task=TASK_COMPACT)


@router.get("/sessions/{session_id}/history", response_model=HistoryOut,
            responses=errors(404, *COMMON), summary="The session's summaries, by watermark")
def history(request: Request, tenant: Tenant, session_id: SessionId) -> HistoryOut:
    guard = _guard(request, tenant, session_id)
    store = guard.store
    data = store.load_view(session_id)
    summaries = store.summaries(session_id)
    if data.length == 0 and not summaries:
        raise SessionNotFound(f"no session {session_id!r}")
    return HistoryOut(session_id=session_id, watermark=data.state.watermark, summaries=[
        SummaryOut(watermark=s.watermark, kind=s.kind, tokens=s.tokens,
                   created_at=s.created_at, text=s.injected_text()) for s in summaries])


health = APIRouter()


@health.get("/healthz", response_model=HealthOut, responses=errors(503),
            summary="Liveness and Redis reachability (no authentication)")
def healthz(request: Request) -> HealthOut:
    try:
        _state(request).store.redis.ping()
    except Exception as exc:
        raise ApiError(503, "store_unavailable", f"Redis did not answer: {exc}") from None
    return HealthOut(status="ok")


__all__ = ["health", "messages_in", "router", "tenant_of", "view_out"]
