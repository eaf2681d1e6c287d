"""The tenant and session id of a request on every log line written while serving it.

One server serves every tenant its tokens name, and session ids are per tenant: a
guard's line such as "enqueue failed for session s1" says nothing of whose ``s1``
it was. :class:`LogIds` binds the request's tenant (from its bearer token) and
session id (from its path) with :func:`shared.telemetry.logs.log_context`, so a
handler with :func:`~shared.telemetry.logs.configure_json` writes them as fields
(the route's thread sees them: Starlette runs sync routes in a copy of the
context). An unauthenticated request binds nothing.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from shared.telemetry.logs import log_context
from workers.server.bearer import authorization_header, tenant_for
from workers.server.config import TokenBook

if TYPE_CHECKING:  # types only: the module imports without the server extra
    from starlette.types import ASGIApp, Receive, Scope, Send

SESSION_PATH = re.compile(r"^/v1/sessions/([^/]+)(?:/|$)")


def request_ids(scope: Scope, tokens: TokenBook) -> dict[str, str | None]:
    """``{"tenant", "session_id"}`` of a request (None for what it does not name)."""
    tenant = tenant_for(tokens, authorization_header(scope))
    found = SESSION_PATH.match(str(scope.get("path", "")))
    session = unquote(found.group(1)) if found and tenant is not None else None
    return {"tenant": tenant, "session_id": session}


class LogIds:
    """Pure ASGI middleware: :func:`request_ids` bound around the rest of the app."""

    def __init__(self, app: ASGIApp, tokens: TokenBook) -> None:
        self.app, self.tokens = app, tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        with log_context(**request_ids(scope, self.tokens)):
            await self.app(scope, receive, send)


def log_extra(scope: Any, tokens: TokenBook) -> dict[str, str]:
    """The ids as ``extra=`` of a line logged outside :class:`LogIds` (Starlette's
    outermost error middleware calls the handler of unexpected errors after it)."""
    return {k: v for k, v in request_ids(scope, tokens).items() if v is not None}


__all__ = ["SESSION_PATH", "LogIds", "log_extra", "request_ids"]
