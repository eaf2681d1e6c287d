"""The MCP tools of ``compaction mcp``: ``recall``, ``context_stats`` and ``compact``.

Apart from the command (:mod:`workers.cli.mcp`: arguments, transports, tokens)
because this is what a client sees: argument schemas with a description and the
bounds of every argument (a client shows them, a model reads them, strict clients
check them), unknown arguments refused (a misspelt ``limt`` would otherwise be
dropped and the default served), hints that two tools only read, and a ``recall``
result whose text block is the rendered hits alone: a JSON dump of the data would
give the model every passage twice, in a tool meant to save its context.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shared.core.errors import CompactionError, ConfigError, InvalidInput
from shared.core.recall import DEFAULT_LIMIT, MAX_LIMIT, RecallHit, render_hits
from shared.store.keys import SESSION_RE
from shared.store.recall_index import index_stats
from shared.store.recall_query import recall
from shared.store.sessions import SessionStore
from workers.cli._common import guard_for, load_session, session_state, store_errors
from workers.cli._format import needs_extra
from workers.settings import Settings

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.tools import Tool

INSTRUCTIONS = (
    "Context compaction for long agent sessions. `recall` brings back, verbatim, earlier "
    "messages that were summarized away (search with exact words: file paths, identifiers, "
    "error codes, numbers). `context_stats` shows how full a session's context is; "
    "`compact` compacts it now.")

SessionId = Annotated[str, Field(
    min_length=1, max_length=128, json_schema_extra={"pattern": SESSION_RE.pattern},
    description="The session's id, as the agent records it (1-128 characters: letters, "
                "digits, '_', '.', ':', '-').")]
Query = Annotated[str, Field(
    min_length=1, max_length=1000,
    description="Exact words to look for: file paths, identifiers, error codes, numbers, "
                "commands (e.g. 'src/app/main.py ERR_CONN_RESET').")]
Limit = Annotated[int, Field(
    ge=1, le=MAX_LIMIT,
    description=f"How many passages to return, best first (1-{MAX_LIMIT}).")]
Start = Annotated[int | None, Field(
    ge=0, description="First message index to search (default: the first message).")]
End = Annotated[int | None, Field(
    ge=0, description="Search the messages before this index (default: the watermark, "
                      "the end of what compaction summarized).")]
KeepRecent = Annotated[int | None, Field(
    ge=0, description="Tokens of recent history kept verbatim (default: the policy's).")]
Force = Annotated[bool, Field(
    description="Compact even when it would free little (default false).")]
Wait = Annotated[bool, Field(
    description="true: run the compaction here and return its outcome; false: queue it "
                "for the workers and return the task id.")]


class RecallAnswer(BaseModel):
    """``recall``'s structured result; its text block is :func:`render_hits` of ``hits``."""

    model_config = ConfigDict(extra="forbid")

    session_id: str
    hits: list[RecallHit]


def recall_answer(store: SessionStore, session_id: str, query: str, limit: int = DEFAULT_LIMIT,
                  start: int | None = None, end: int | None = None) -> RecallAnswer:
    """The ``recall`` tool's hits (InvalidInput naming the argument, SessionNotFound)."""
    hits = recall(store, session_id, query, limit=limit, start=start, end=end)
    return RecallAnswer(session_id=session_id, hits=list(hits))


def recall_text(store: SessionStore, answer: RecallAnswer) -> str:
    """The text a model reads: the rendered hits, or, for a session nothing of which was
    compacted yet, that (not "try other words": no word would find anything)."""
    if answer.hits or store.state(answer.session_id).watermark:
        return render_hits(answer.hits)
    return (f"Nothing of session {answer.session_id!r} has been compacted yet: all of it is "
            "still in the conversation, and recall only finds what compaction summarized "
            "away.")


def stats_answer(store: SessionStore, settings: Settings, session_id: str) -> dict[str, Any]:
    """The context meter of one session and its recall index's figures."""
    data = load_session(store, session_id)
    figures = guard_for(store, settings, data).stats(session_id)
    figures["recall_index"] = index_stats(store, session_id)
    return figures


def compact_answer(store: SessionStore, settings: Settings, session_id: str,
                   keep_recent: int | None = None, force: bool = False,
                   wait: bool = True) -> dict[str, Any]:
    """A manual compaction run here (the real task: lease, compare-and-swap) or queued."""
    from workers.cli.compact import publish, run_inline

    if keep_recent is not None and keep_recent < 0:
        raise InvalidInput("must be >= 0", field="keep_recent")
    session_state(store, session_id)  # SessionNotFound, without reading the log
    kwargs: dict[str, Any] = {"keep_recent": keep_recent, "force": force,
                              "tenant": store.tenant}
    if wait:
        outcome = run_inline(settings, session_id, kwargs)
        outcome["recall_index"] = index_stats(store, session_id)
        return outcome
    return {"session_id": session_id, "status": "queued",
            "task_id": publish(settings, session_id, kwargs)}


def invalid_arguments(tool: str, exc: ValidationError, known: list[str]) -> str:
    """A tool's rejected arguments in one line for the model: each argument named with
    what is wrong (no pydantic type codes, no documentation link)."""
    problems = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(part) for part in err["loc"]) or "arguments"
        if err["type"] == "extra_forbidden":
            problems.append(f"{where}: not an argument of {tool} ({', '.join(known)})")
        elif err["type"] == "missing":
            problems.append(f"{where}: required")
        else:
            problems.append(f"{where}: {err['msg']} (got {_shown(err.get('input'))})")
    return f"invalid arguments for {tool}: " + "; ".join(problems)


def _shown(value: Any, width: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= width else f"{text[:width - 3]}..."


def _strict(tool: Tool) -> Tool:
    """``tool`` refusing arguments it does not declare, in its schema and when called
    (the SDK reads ``fn_metadata.arg_model`` at each call)."""
    loose = tool.fn_metadata.arg_model
    strict = type(loose.__name__, (loose,), {
        "model_config": ConfigDict(**{**loose.model_config, "extra": "forbid"}),
        "__module__": loose.__module__})
    tool.fn_metadata.arg_model = strict
    tool.parameters = {**tool.parameters, "additionalProperties": False}
    return tool


def build_server(store: SessionStore, settings: Settings, *, version: str = "",
                 tenant_from_request: bool = False) -> MCPServer:
    """An MCP server whose tools act on ``store``'s tenant; with ``tenant_from_request``
    (the HTTP transport, behind ``workers.cli.mcp.http_app``) on the tenant the
    request's bearer token named, and a request without one is refused."""
    try:
        import anyio
        from mcp.server.mcpserver import Context, MCPServer
        from mcp.server.mcpserver.exceptions import ToolError
        from mcp.server.mcpserver.tools import Tool
        from mcp_types import CallToolResult, TextContent, ToolAnnotations
    except ImportError:
        raise ConfigError(needs_extra("mcp", "mcp")) from None
    from workers.server.bearer import TENANT_STATE

    def store_of(ctx: Any) -> SessionStore:
        if not tenant_from_request:
            return store
        request = ctx.request_context.request
        state = getattr(request, "scope", {}).get("state") or {}
        tenant = state.get(TENANT_STATE)
        if not isinstance(tenant, str):  # BearerAuth sets it; never serve a default tenant
            raise ToolError("unauthorized: no bearer token on this request")
        return store.for_tenant(tenant)

    def with_context(fn: Callable[..., Any], name: str,
                     returns: Any = dict[str, Any]) -> Callable[..., Any]:
        # The SDK finds the Context parameter and the output schema with get_type_hints,
        # which cannot see this function's local imports: set them as objects. Its name
        # names the argument model in validation errors.
        fn.__annotations__["ctx"] = Context
        fn.__annotations__["return"] = returns
        fn.__name__ = fn.__qualname__ = name
        return fn

    async def in_thread(fn: Any, *args: Any) -> Any:
        """Run a blocking tool off the event loop; our errors reach the model as text
        (bad input naming the field, unknown session, Redis down), crashes do not."""
        def call() -> Any:
            with store_errors(settings.redis_url):
                return fn(*args)
        try:
            return await anyio.to_thread.run_sync(call)
        except CompactionError as exc:
            raise ToolError(f"{type(exc).__name__}: {exc}") from exc

    async def recall_fn(ctx: Any, session_id: SessionId, query: Query, limit: Limit = DEFAULT_LIMIT,
                        start: Start = None, end: End = None) -> Any:
        def answer_and_text(tenant_store: SessionStore) -> tuple[RecallAnswer, str]:
            answer = recall_answer(tenant_store, session_id, query, limit, start, end)
            return answer, recall_text(tenant_store, answer)

        answer, text = await in_thread(answer_and_text, store_of(ctx))
        return CallToolResult(content=[TextContent(type="text", text=text)],
                              structured_content=answer.model_dump(mode="json"))

    async def stats_fn(ctx: Any, session_id: SessionId) -> Any:
        return await in_thread(stats_answer, store_of(ctx), settings, session_id)

    async def compact_fn(ctx: Any, session_id: SessionId, keep_recent: KeepRecent = None,
                         force: Force = False, wait: Wait = True) -> Any:
        return await in_thread(compact_answer, store_of(ctx), settings, session_id,
                               keep_recent, force, wait)

    reads = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)
    tools = [
        Tool.from_function(
            with_context(recall_fn, "recall", Annotated[CallToolResult, RecallAnswer]),
            name="recall",
            annotations=reads, description=(
                "Search the earlier messages of a session that compaction summarized away "
                "and get them back verbatim, best first, each headed by its message index "
                "and role. Use exact words: file paths, identifiers, error codes, numbers, "
                "commands.")),
        Tool.from_function(
            with_context(stats_fn, "context_stats"), name="context_stats", annotations=reads,
            description=(
                "The context meter of a session: tokens by region, usage ratio of the input "
                "budget, watermark, summaries, pending job, and the recall index (messages "
                "indexed).")),
        Tool.from_function(
            with_context(compact_fn, "compact"), name="compact",
            annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False,
                                        idempotent_hint=False, open_world_hint=False),
            description=(
                "Compact a session now (a manual /compact): older history is summarized; "
                "the raw log is kept and stays recallable. wait=true runs the job here and "
                "returns its outcome; wait=false queues it for the workers.")),
    ]
    strict = [_strict(t) for t in tools]
    schemas = {t.name: t.parameters for t in strict}

    class Server(MCPServer):
        async def call_tool(self, name: str, arguments: dict[str, Any],
                            context: Any = None) -> Any:
            try:
                return await super().call_tool(name, arguments, context)
            except ToolError as exc:
                if isinstance(exc.__cause__, ValidationError):
                    known = list(schemas[name]["properties"])
                    raise ToolError(invalid_arguments(name, exc.__cause__, known)) \
                        from exc.__cause__
                raise

    return Server("context-compaction", instructions=INSTRUCTIONS, version=version,
                  tools=strict)


__all__ = ["INSTRUCTIONS", "RecallAnswer", "build_server", "compact_answer", "invalid_arguments",
           "recall_answer", "recall_text", "stats_answer"]
