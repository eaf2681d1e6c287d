"""``compaction mcp``: the session store as MCP tools (stdio or streamable HTTP).

Three tools, for any MCP client (an agent, an IDE, an operator's assistant):

- ``recall(session_id, query, limit=5, start=None, end=None)``: passages of
  the messages compaction summarized away that match ``query`` (exact words:
  paths, identifiers, error codes), verbatim, best first;
- ``context_stats(session_id)``: the context meter (tokens by region, usage
  ratio, watermark, summaries) and the recall index's figures;
- ``compact(session_id, keep_recent=None, force=False, wait=True)``: a manual
  compaction, run inline (the real task: lease, compare-and-swap) or queued
  for the workers.

A client names sessions, never tenants. Over stdio (a local client starts
this process; no authentication) the server is bound to one tenant
(``--tenant`` or ``COMPACTION_TENANT``). Over streamable HTTP every request
needs ``Authorization: Bearer <token>`` from the same token map as
``compaction serve`` (``COMPACTION_SERVER_TOKENS_FILE`` or
``COMPACTION_SERVER_TOKENS``, ``{token: tenant}``, compared in constant
time): the token names the tenant of that request, ``--tenant`` restricts
the server to that tenant's tokens, and the server refuses to start without
a token (an open port would hand out sessions verbatim). Needs the ``mcp``
extra (``pip install 'context-compaction[mcp]'``, the SDK's ``MCPServer``,
which mcp 2 renamed from ``FastMCP``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shared.core.errors import CompactionError, ConfigError, InvalidInput
from shared.core.recall import DEFAULT_LIMIT, MAX_LIMIT, render_hits
from shared.store.recall_index import index_stats
from shared.store.recall_query import recall
from shared.store.sessions import SessionStore
from workers.cli._common import guard_for, load_session, open_store, store_errors
from workers.cli._format import needs_extra
from workers.settings import Settings

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer
    from starlette.types import ASGIApp

    from workers.server.config import TokenBook

NO_MCP_TOKEN = ("compaction mcp --transport http: no bearer token configured "
                "(COMPACTION_SERVER_TOKENS_FILE or COMPACTION_SERVER_TOKENS, {token: tenant}): "
                "refusing to serve sessions openly (stdio needs none)")

INSTRUCTIONS = (
    "Context compaction for long agent sessions. `recall` brings back, verbatim, earlier "
    "messages that were summarized away (search with exact words: file paths, identifiers, "
    "error codes, numbers). `context_stats` shows how full a session's context is; "
    "`compact` compacts it now.")


def recall_tool(store: SessionStore, session_id: str, query: str, limit: int = DEFAULT_LIMIT,
                start: int | None = None, end: int | None = None) -> dict[str, Any]:
    """The ``recall`` tool's answer: hits as data, and as text for a model."""
    hits = recall(store, session_id, query, limit=limit, start=start, end=end)
    return {"session_id": session_id, "hits": [h.model_dump() for h in hits],
            "text": render_hits(hits)}


def stats_tool(store: SessionStore, settings: Settings, session_id: str) -> dict[str, Any]:
    data = load_session(store, session_id)
    figures = guard_for(store, settings, data).stats(session_id)
    figures["recall_index"] = index_stats(store, session_id)
    return figures


def compact_tool(store: SessionStore, settings: Settings, session_id: str,
                 keep_recent: int | None = None, force: bool = False,
                 wait: bool = True) -> dict[str, Any]:
    from workers.cli.compact import publish, run_inline

    if keep_recent is not None and keep_recent < 0:
        raise InvalidInput("must be >= 0", field="keep_recent")
    load_session(store, session_id)
    kwargs: dict[str, Any] = {"keep_recent": keep_recent, "force": force,
                              "tenant": store.tenant}
    if wait:
        outcome = run_inline(settings, session_id, kwargs)
        outcome["recall_index"] = index_stats(store, session_id)
        return outcome
    return {"session_id": session_id, "status": "queued",
            "task_id": publish(settings, session_id, kwargs)}


def build_server(store: SessionStore, settings: Settings, *,
                 tenant_from_request: bool = False) -> MCPServer:
    """An MCP server whose tools act on ``store``'s tenant; with ``tenant_from_request``
    (the HTTP transport, behind :func:`http_app`) on the tenant the request's bearer
    token named, and a request without one is refused."""
    try:
        import anyio
        from mcp.server.mcpserver import Context, MCPServer
        from mcp.server.mcpserver.exceptions import ToolError
    except ImportError:
        raise ConfigError(needs_extra("mcp", "mcp")) from None
    from workers.server.bearer import TENANT_STATE

    server = MCPServer("context-compaction", instructions=INSTRUCTIONS)

    def store_of(ctx: Any) -> SessionStore:
        if not tenant_from_request:
            return store
        request = ctx.request_context.request
        state = getattr(request, "scope", {}).get("state") or {}
        tenant = state.get(TENANT_STATE)
        if not isinstance(tenant, str):  # BearerAuth sets it; never serve a default tenant
            raise ToolError("unauthorized: no bearer token on this request")
        return store.for_tenant(tenant)

    def with_context(fn: Callable[..., Any]) -> Callable[..., Any]:
        # The SDK injects the request's Context into the parameter annotated with it (found
        # with get_type_hints, which cannot see this function's local import).
        fn.__annotations__["ctx"] = Context
        return fn

    async def in_thread(fn: Any, *args: Any) -> dict[str, Any]:
        """Run a blocking tool off the event loop; our errors reach the model as text
        (bad input naming the field, unknown session, Redis down), crashes do not."""
        def call() -> dict[str, Any]:
            with store_errors(settings.redis_url):
                result: dict[str, Any] = fn(*args)
                return result
        try:
            answer: dict[str, Any] = await anyio.to_thread.run_sync(call)
        except CompactionError as exc:
            raise ToolError(f"{type(exc).__name__}: {exc}") from exc
        return answer

    @server.tool(description=(
        "Search the earlier messages of a session that compaction summarized away and get "
        "them back verbatim. Use exact words: file paths, identifiers, error codes, numbers, "
        f"commands. limit: 1-{MAX_LIMIT}; start/end: a range of message indexes (end "
        "defaults to the watermark)."))
    @with_context
    async def recall(ctx: Any, session_id: str, query: str, limit: int = DEFAULT_LIMIT,
                     start: int | None = None, end: int | None = None) -> dict[str, Any]:
        return await in_thread(recall_tool, store_of(ctx), session_id, query, limit, start,
                               end)

    @server.tool(description=(
        "The context meter of a session: tokens by region, usage ratio of the input budget, "
        "watermark, summaries, pending job, and the recall index (messages indexed)."))
    @with_context
    async def context_stats(ctx: Any, session_id: str) -> dict[str, Any]:
        return await in_thread(stats_tool, store_of(ctx), settings, session_id)

    @server.tool(description=(
        "Compact a session now (a manual /compact). wait=true runs the job here and returns "
        "its outcome; wait=false queues it for the workers. keep_recent: tokens of recent "
        "history kept verbatim; force: compact even when it frees little."))
    @with_context
    async def compact(ctx: Any, session_id: str, keep_recent: int | None = None,
                      force: bool = False, wait: bool = True) -> dict[str, Any]:
        return await in_thread(compact_tool, store_of(ctx), settings, session_id, keep_recent,
                               force, wait)

    return server


def http_tokens(tenant: str | None = None) -> TokenBook:
    """The bearer tokens of the HTTP transport: ``compaction serve``'s token map
    (``COMPACTION_SERVER_TOKENS_FILE`` / ``COMPACTION_SERVER_TOKENS``), only ``tenant``'s
    tokens when one is named; ConfigError (one line, naming the setting) when none."""
    from workers.server.config import TokenBook, load_token_config

    try:
        config = load_token_config()
    except ConfigError as exc:
        raise ConfigError(f"compaction mcp --transport http: {exc}") from None
    tokens = config.token_map()
    if not tokens:
        raise ConfigError(NO_MCP_TOKEN)
    if tenant is not None:
        tokens = {t: name for t, name in tokens.items() if name == tenant}
        if not tokens:
            raise ConfigError(f"compaction mcp --transport http --tenant {tenant}: no token "
                              "of that tenant in COMPACTION_SERVER_TOKENS_FILE / "
                              "COMPACTION_SERVER_TOKENS")
    return TokenBook(tokens)


def http_app(server: MCPServer, tokens: TokenBook, host: str = "127.0.0.1") -> ASGIApp:
    """The streamable HTTP app (``/mcp``) behind bearer authentication: 401 with
    ``WWW-Authenticate: Bearer`` before the MCP app sees a request without a known
    token. ``server`` must be built with ``tenant_from_request=True``."""
    from workers.server.bearer import BearerAuth

    app: ASGIApp = BearerAuth(server.streamable_http_app(host=host), tokens)
    return app


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--transport", choices=("stdio", "http"), default="stdio",
                        help="stdio (default; for a client that starts this process, no "
                             "authentication) or streamable HTTP at /mcp (every request needs "
                             "a bearer token, see below)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="HTTP: address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8765, help="HTTP: port (default 8765)")
    parser.add_argument("--tenant", help="stdio: tenant served (default: COMPACTION_TENANT); "
                                         "HTTP: accept only this tenant's tokens")
    parser.epilog = (
        "HTTP transport: clients send 'Authorization: Bearer <token>'; the tokens are "
        "compaction serve's, a JSON object {token: tenant} in COMPACTION_SERVER_TOKENS_FILE "
        "(or inline in COMPACTION_SERVER_TOKENS), and a token names the tenant of its "
        "requests. Without a token the HTTP transport refuses to start; a request without "
        "a known one gets 401.")


def _require_extra() -> None:
    """The missing extra said first: not a Redis error of the store opened before it."""
    try:
        import mcp.server.mcpserver  # noqa: F401
    except ImportError:
        raise ConfigError(needs_extra("mcp", "mcp")) from None


def run(args: argparse.Namespace, settings: Settings) -> int:
    _require_extra()
    if args.transport == "http":
        tokens = http_tokens(args.tenant)  # before anything connects: refuse to start open
        import anyio
        import uvicorn

        with store_errors(settings.redis_url):
            store = open_store(settings, args.tenant)
        server = build_server(store, settings, tenant_from_request=True)
        config = uvicorn.Config(http_app(server, tokens, args.host), host=args.host,
                                port=args.port, log_level=server.settings.log_level.lower())
        anyio.run(uvicorn.Server(config).serve)
        return 0
    with store_errors(settings.redis_url):
        store = open_store(settings, args.tenant)
    build_server(store, settings).run("stdio")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m workers.cli.mcp``: the same command without the CLI's command table."""
    from workers.settings import load_settings

    parser = argparse.ArgumentParser(prog="compaction mcp", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv), load_settings())


__all__ = ["NO_MCP_TOKEN", "add_arguments", "build_server", "compact_tool", "http_app",
           "http_tokens", "main", "recall_tool", "run", "stats_tool"]

if __name__ == "__main__":
    raise SystemExit(main())
