"""Bearer-token authentication as pure ASGI middleware (no fastapi): ``compaction mcp
--transport http`` puts it in front of the MCP SDK's app.

The same tokens as ``compaction serve`` (:class:`~workers.server.config.TokenBook`:
``{token: tenant}``, compared in constant time): a request without a known token is
answered 401 with ``WWW-Authenticate: Bearer`` and the server's JSON error body, before
the app sees it; an authenticated request carries its tenant in
``scope["state"][TENANT_STATE]``. Non-HTTP scopes (lifespan) pass through.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from workers.server.config import TokenBook

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

TENANT_STATE = "compaction_tenant"


def bearer_token(authorization: str | None) -> str | None:
    """``Bearer <token>`` (the scheme in any case) -> the token; None otherwise."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def authorization_header(scope: Scope) -> str | None:
    """The request's ``Authorization`` header as text (its first), or None."""
    for name, value in scope.get("headers") or []:
        if name == b"authorization":
            return str(value.decode("latin-1"))
    return None


def tenant_for(tokens: TokenBook, authorization: str | None) -> str | None:
    """The tenant the request's ``Authorization`` header names, or None."""
    token = bearer_token(authorization)
    return None if token is None else tokens.tenant(token)


class BearerAuth:
    """401 unless ``Authorization: Bearer <token>`` names a tenant of ``tokens``."""

    def __init__(self, app: ASGIApp, tokens: TokenBook) -> None:
        self.app, self.tokens = app, tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = bearer_token(authorization_header(scope))
        tenant = None if token is None else self.tokens.tenant(token)
        if tenant is None:
            await self._unauthorized(send, "missing bearer token" if token is None
                                     else "unknown bearer token")
            return
        scope.setdefault("state", {})[TENANT_STATE] = tenant
        await self.app(scope, receive, send)

    @staticmethod
    async def _unauthorized(send: Send, message: str) -> None:
        body = json.dumps({"error": {"code": "unauthorized", "message": message,
                                     "field": None}}).encode()
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})


__all__ = ["TENANT_STATE", "BearerAuth", "authorization_header", "bearer_token", "tenant_for"]
