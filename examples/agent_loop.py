"""A complete, minimal agent loop with the context guard, for any OpenAI-compatible server.

Every model call goes through the guard: ``prepare`` builds the view
(summary + recent history + the turn so far) within the window, the call
is made with the ``openai`` SDK, a context-overflow error goes through
``recover`` and one retry, and the finished turn is recorded with the
provider's usage (which calibrates the guard's token estimate). Two small
tools (read a file, list a directory) make it a real tool-calling loop.

A Redis outage does not stop it (as the README's loop): ``prepare`` builds a
view of the history held in memory instead of raising (``fallback_messages``:
the last view's history, then the turns since), and a turn Redis missed is
kept with its request id and recorded, in order, before the next turn's first
call (an append that landed although its reply was lost is not stored twice);
at the end the loop records what is still waiting, or says which turns are lost.

    python examples/agent_loop.py --base-url http://127.0.0.1:8001/v1 --model gpt-4o \\
        --api-key test --prompt "List the examples directory" --prompt "Read README.md"

Without ``--redis-url`` the sessions live in an in-process fakeredis;
without ``--broker-url`` no worker summarizes in the background (the guard
still truncates and recovers on its own). See examples/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import openai

from shared import (
    CeleryEnqueuer,
    ContextGuard,
    Message,
    NullEnqueuer,
    PreparedView,
    SessionStore,
    StoreUnavailable,
    connect,
    from_openai,
    publisher_app,
)

SYSTEM = "You are a helpful assistant with read-only access to files under the working directory."
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a text file (relative path).",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                       "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "list_dir", "description": "List a directory (relative path, '.' for the root).",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                       "required": ["path"]}}},
]
MAX_TOOL_ROUNDS = 8
MAX_TOOL_OUTPUT = 8_000  # characters: one tool result must not fill a small window


def run_tool(root: Path, name: str, arguments: str) -> str:
    """Execute one tool call; errors are answers the model can read, not exceptions."""
    try:
        path = (root / str(json.loads(arguments or "{}").get("path", "."))).resolve()
        if not path.is_relative_to(root):
            return "error: path outside the working directory"
        if name == "list_dir":
            return "\n".join(sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir()))
        if name == "read_file":
            return path.read_text(encoding="utf-8", errors="replace")[:MAX_TOOL_OUTPUT]
        return f"error: unknown tool {name!r}"
    except (OSError, ValueError) as exc:
        return f"error: {exc}"


class Agent:
    def __init__(self, guard: ContextGuard, client: openai.OpenAI, model: str,
                 max_tokens: int, root: Path) -> None:
        self.guard, self.client, self.model = guard, client, model
        self.max_tokens, self.root = max_tokens, root
        # turns Redis missed, oldest first, each with the request id it was first sent with
        self.unrecorded: list[tuple[str, list[Message]]] = []
        # the session as last seen, for a view while Redis is down: the last view's history
        # (its summary first) and the turns recorded since
        self.history: list[Message] = []

    def _call(self, view: PreparedView) -> Any:
        # the view's reserve: max_tokens, or less when the model's window or output cap
        # has no room for it (the guard says so once); sent max_tokens itself, the call
        # and its retry after recover are refused
        return self.client.chat.completions.create(
            model=self.model, messages=view.openai(),  # type: ignore[arg-type]
            tools=TOOLS, max_tokens=view.report.budget.reserve)  # type: ignore[arg-type]

    def _record_missed(self, session_id: str) -> None:
        """Record the turns Redis missed, oldest first, while it answers: the next view
        holds them. A request id is stored at most once."""
        while self.unrecorded:
            request_id, messages = self.unrecorded[0]
            try:
                self.guard.record_turn(session_id, messages, request_id=request_id)
            except StoreUnavailable:
                return  # still down
            self.unrecorded.pop(0)
            self.history.extend(messages)

    def _seen(self, view: PreparedView, pending: list[Message]) -> None:
        """Hold the history of a view Redis answered (without the system prompt and the
        turn so far): what a view is built from while Redis is down."""
        messages = list(view.messages)
        if view.report.degraded or messages[len(messages) - len(pending):] != pending:
            return
        history = messages[:len(messages) - len(pending)]
        if history and history[0].role == "system":  # the system prompt, then any summary
            summary = history[0].text().removeprefix(SYSTEM).lstrip("\n")
            history[:1] = [Message(role="system", content=summary)] if summary else []
        self.history = history

    def finish(self, session_id: str) -> int:
        """At the loop's end: record the turns Redis missed if it answers now; how many
        are still unrecorded (lost when the process exits: said on stderr)."""
        self._record_missed(session_id)
        if self.unrecorded:
            print(f"[guard] Redis is still down: {len(self.unrecorded)} turns of session "
                  f"{session_id!r} were not recorded and are lost", file=sys.stderr)
        return len(self.unrecorded)

    def _record(self, session_id: str, messages: list[Message], usage: Any) -> None:
        """Record the finished turn after the missed ones; while Redis is down, keep it."""
        request_id = uuid.uuid4().hex
        try:
            if self.unrecorded:  # in order: after the turns still waiting
                raise StoreUnavailable("earlier turns are not recorded yet")
            self.guard.record_turn(session_id, messages, usage=usage, request_id=request_id)
        except StoreUnavailable as exc:  # the answer stands; recorded at a later turn
            self.unrecorded.append((request_id, messages))
            print(f"[guard] turn not recorded ({exc}); {len(self.unrecorded)} waiting",
                  file=sys.stderr)
            return
        self.history.extend(messages)

    # -- the loop: prepare -> call -> (recover -> retry) -> tools ... -> record_turn --------
    def turn(self, session_id: str, text: str) -> str:
        self._record_missed(session_id)
        turn: list[dict[str, Any]] = [{"role": "user", "content": text}]
        args = (SYSTEM, TOOLS, self.max_tokens, self.model)
        # Redis down: a view of the history held here and this turn, not an error
        held = [*self.history, *(m for _, messages in self.unrecorded for m in messages)]
        for _ in range(MAX_TOOL_ROUNDS):
            pending = from_openai(turn)
            view = self.guard.prepare(session_id, *args, pending=pending,
                                      fallback_messages=held)
            if len(turn) == 1:  # the turn's first call: the view holds the history
                self._seen(view, pending)
            try:
                reply = self._call(view)
            except openai.APIStatusError as exc:  # overflows come as 400, 413, 422, 500
                retry = self.guard.recover(session_id, exc, *args, pending=from_openai(turn))
                if retry is None:  # not a context overflow: a real error
                    raise
                print(f"[guard] context overflow: retried with "
                      f"{retry.report.estimated_prompt_tokens} tokens (window "
                      f"{retry.report.budget.window})", file=sys.stderr)
                reply = self._call(retry)
            message = reply.choices[0].message
            calls = [call.model_dump() for call in message.tool_calls or []]
            turn.append({"role": "assistant", "content": message.content, "tool_calls": calls})
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                output = run_tool(self.root, call.function.name, call.function.arguments)
                turn.append({"role": "tool", "tool_call_id": call.id, "content": output})
        else:
            turn.append({"role": "assistant", "content": "(stopped: too many tool rounds)"})
        self._record(session_id, from_openai(turn), reply.usage)
        return str(turn[-1].get("content") or "")


def build_guard(args: argparse.Namespace) -> ContextGuard:
    if args.redis_url:
        store = SessionStore(connect(args.redis_url))
    else:
        import fakeredis  # pip install 'context-compaction[embedded]'

        store = SessionStore(fakeredis.FakeRedis())
    enqueuer = CeleryEnqueuer(publisher_app(args.broker_url)) if args.broker_url \
        else NullEnqueuer()
    overrides = {args.model: args.window} if args.window else None
    return ContextGuard(store, enqueuer, overrides=overrides)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL"),
                        help="OpenAI-compatible endpoint (default: api.openai.com)")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                        help="API key (default: $OPENAI_API_KEY)")
    parser.add_argument("--model", default="gpt-4o-mini")
    parser.add_argument("--max-tokens", type=int, default=1024, help="output reserve per call")
    parser.add_argument("--window", type=int, help="context window to assume for --model")
    parser.add_argument("--redis-url", help="session store (default: in-process fakeredis)")
    parser.add_argument("--broker-url", help="Celery broker of the compaction workers")
    parser.add_argument("--session", default="agent-loop", help="session id")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="what the tools may read")
    parser.add_argument("--prompt", action="append", default=[],
                        help="a user message (repeatable); without any, read lines from stdin")
    args = parser.parse_args(argv)
    if not args.api_key:
        parser.error("no API key: pass --api-key or set OPENAI_API_KEY (any value for a "
                     "local server)")
    client = openai.OpenAI(api_key=args.api_key, base_url=args.base_url, max_retries=2,
                           timeout=120)
    agent = Agent(build_guard(args), client, args.model, args.max_tokens, args.root.resolve())
    prompts = args.prompt or (line.strip() for line in sys.stdin if line.strip())
    try:
        for text in prompts:
            print(f"> {text}\n{agent.turn(args.session, text)}\n", flush=True)
    finally:
        agent.finish(args.session)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
