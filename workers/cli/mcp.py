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
which mcp 2 renamed from ``FastMCP``). The tools themselves (schemas, results) are
in :mod:`workers.mcp_tools`. The server starts when Redis is down (a client starts it
when the client starts) and serves once Redis is up; under stdio Ctrl-C ends it.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import TYPE_CHECKING

from shared.core.errors import ConfigError, StoreUnavailable
from shared.store.sessions import SessionStore, redis_errors
from workers.cli._common import open_store, store_errors
from workers.cli._format import needs_extra
from workers.mcp_tools import (
    INSTRUCTIONS,
    build_server,
    compact_answer,
    recall_answer,
    stats_answer,
)
from workers.settings import Settings

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer
    from starlette.types import ASGIApp

    from workers.server.config import TokenBook

log = logging.getLogger(__name__)

NO_MCP_TOKEN = ("compaction mcp --transport http: no bearer token configured "
                "(COMPACTION_SERVER_TOKENS_FILE or COMPACTION_SERVER_TOKENS, {token: tenant}): "
                "refusing to serve sessions openly (stdio needs none)")


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


def serving_store(settings: Settings, tenant: str | None) -> SessionStore:
    """The store the server serves, even when Redis is down at start: an MCP client starts
    this process when it starts (maybe before Redis), and a process that exits is gone
    until the client restarts. Each call then says Redis cannot be reached, until it can."""
    store = open_store(settings, tenant, check=False)  # a bad tenant or URL stops it first
    try:
        with store_errors(settings.redis_url), redis_errors("ping"):
            store.redis.ping()
    except StoreUnavailable as exc:
        log.warning("%s; serving anyway: each tool call reports it until Redis is back", exc)
    return store


def _version() -> str:
    from workers.cli.main import version

    return version()


def run(args: argparse.Namespace, settings: Settings) -> int:
    _require_extra()
    if args.transport == "http":
        tokens = http_tokens(args.tenant)  # before anything connects: refuse to start open
        import anyio
        import uvicorn

        server = build_server(serving_store(settings, args.tenant), settings,
                              version=_version(), tenant_from_request=True)
        config = uvicorn.Config(http_app(server, tokens, args.host), host=args.host,
                                port=args.port, log_level=server.settings.log_level.lower())
        anyio.run(uvicorn.Server(config).serve)
        return 0
    server = build_server(serving_store(settings, args.tenant), settings, version=_version())
    # Ctrl-C ends the process as SIGTERM does: the SDK reads stdin in a thread nothing can
    # cancel, so asyncio's own handler would wait for the next line (or EOF) to stop.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    server.run("stdio")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m workers.cli.mcp``: ``compaction mcp``, errors and all (one line, the
    CLI's exit status, never a traceback)."""
    from workers.cli.main import main as cli

    return cli(["mcp", *(sys.argv[1:] if argv is None else argv)])


__all__ = ["INSTRUCTIONS", "NO_MCP_TOKEN", "add_arguments", "build_server", "compact_answer",
           "http_app", "http_tokens", "main", "recall_answer", "run", "serving_store",
           "stats_answer"]

if __name__ == "__main__":
    raise SystemExit(main())
