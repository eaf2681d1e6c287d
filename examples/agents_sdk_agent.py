"""An OpenAI Agents SDK agent whose long runs stay inside the context window.

The agent reads many bulky files in one run: far more than its model's
window holds. ``GuardedSession`` stores the conversation in the compaction
store and hands the runner the compacted view; its budget filter trims the
input before every model call; ``session.wrap(model)`` recovers once from a
context-overflow error. Offline by default: the model is the project's fake
OpenAI-compatible server (it enforces the window and fails like OpenAI),
reached through the real ``openai`` client and the SDK's Chat Completions
model; the store is an in-process fakeredis. Last, the compaction job a
worker would run summarizes the run away (here inline), and a second run
asks about the first file: the model calls ``recall`` (``session.recall_tool()``
among its tools) and gets the original call back, verbatim, with its index.

    python examples/agents_sdk_agent.py [--files 30] [--window 8192] [--redis-url URL]

Needs the ``openai-agents`` and ``embedded`` extras.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from openai import AsyncOpenAI

from shared import ContextGuard, NullEnqueuer, SessionStore, connect
from shared.integrations.agents_sdk import GuardedSession
from workers.compactor import Compactor
from workers.harness.fakes import FakeOpenAIServer
from workers.summarizer.engine import SummaryEngine

MODEL = "gpt-4o-fake"
INSTRUCTIONS = "You audit source files. Read each one, then report."
BODY = "def handle(event):\n    return dispatch(event['kind'], event['payload'])\n" * 50


@function_tool
def read_file(path: str) -> str:
    """Read one source file."""
    return f"# {path}\n{BODY}"


def scripted_model(files: int) -> Any:
    """The fake provider's replies: one read_file call per request, then the report."""
    state = {"calls": 0}

    def reply(request: dict[str, Any]) -> dict[str, Any]:
        last = (request.get("messages") or [{}])[-1]
        if last.get("role") == "user" and "first file" in str(last.get("content")):
            return {"role": "assistant", "content": None, "tool_calls": [{
                "id": "call_recall", "type": "function",
                "function": {"name": "recall", "arguments": json.dumps({"query": "m1.py"})}}]}
        if last.get("role") == "tool" and last.get("tool_call_id") == "call_recall":
            return {"role": "assistant", "content": f"Recalled: {last['content'][:120]}"}
        state["calls"] += 1
        n = state["calls"]
        if n <= files:
            return {"role": "assistant", "content": None, "tool_calls": [{
                "id": f"call_{n}", "type": "function",
                "function": {"name": "read_file", "arguments": json.dumps({"path": f"m{n}.py"})}}]}
        return {"role": "assistant", "content": f"Audited {files} files: all dispatch events."}

    return reply


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=30)
    parser.add_argument("--window", type=int, default=8192)
    parser.add_argument("--redis-url", help="a real Redis (default: in-process fakeredis)")
    args = parser.parse_args()
    set_tracing_disabled(True)

    if args.redis_url:
        client: Any = connect(args.redis_url)
    else:
        import fakeredis

        client = fakeredis.FakeRedis()
    guard = ContextGuard(SessionStore(client), NullEnqueuer(), overrides={MODEL: args.window})
    with FakeOpenAIServer(window=args.window, responder=scripted_model(args.files),
                          model=MODEL) as provider:
        openai_client = AsyncOpenAI(base_url=provider.base_url, api_key="test")
        model = OpenAIChatCompletionsModel(model=MODEL, openai_client=openai_client)
        session = GuardedSession(guard, "audit-1", model=MODEL, max_tokens=512,
                                 instructions=INSTRUCTIONS)
        guarded = session.wrap(model)
        agent = Agent(name="auditor", instructions=INSTRUCTIONS,
                      tools=[read_file, session.recall_tool()],  # recall: this one tool
                      model=guarded, model_settings=ModelSettings(max_tokens=512))
        result = await Runner.run(agent, "Audit every module.", session=session,
                                  run_config=session.run_config(), max_turns=args.files + 5)
        sent = [r.prompt_tokens for r in provider.requests if r.status == 200 and r.prompt_tokens]
        refused = sum(1 for r in provider.requests if r.status == 400)
        # The job a worker runs in the background (inline: this example has no workers):
        # summary committed, the summarized range indexed for recall.
        outcome = Compactor(guard.store, SummaryEngine(None)).run("audit-1")
        asked = await Runner.run(agent, "Which was the first file you read?", session=session,
                                 run_config=session.run_config())
    tool_tokens = args.files * len(BODY) // 4
    print(result.final_output)
    print(f"{args.files} tool results (~{tool_tokens} tokens) through a {args.window}-token "
          f"window: {len(sent)} model calls, largest prompt {max(sent)} tokens, "
          f"{session.input_filter.truncations} trimmed by the budget filter, "
          f"{refused} refused for overflow, {guarded.recoveries} recovered; "
          f"{guard.store.length('audit-1')} messages stored")
    print(f"compacted up to message {outcome.watermark_after}; {asked.final_output}")


if __name__ == "__main__":
    asyncio.run(main())
