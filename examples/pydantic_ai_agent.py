"""A pydantic-ai agent kept inside its context window by the guard (a capability).

Runs offline: the model is pydantic-ai's own ``FunctionModel`` driven by
``windowed_model``, which enforces a small context window (past it, it raises
``ModelHTTPError`` 400 with OpenAI's overflow text, as a provider would) and
calls a ``lookup`` tool once per question. The compaction stack is the
embedded one (fakeredis, in-memory broker, a Celery worker in this process
with the offline summarizer), so the worker's summaries reach later requests.
Last, the model is asked about an early booking that was summarized away: it
calls ``recall`` (the capability's tool, on by default) and gets the original
message back, verbatim, with its index.

    PYTHONPATH=. python examples/pydantic_ai_agent.py --turns 30 --window 3000

With a real model: ``Agent("openai:gpt-4o", capabilities=[ContextGuardCapability(ContextGuard(
SessionStore(connect(REDIS_URL)), CeleryEnqueuer(publisher_app(BROKER_URL))))])``.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai import Agent
from pydantic_ai import messages as pm
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

from shared.core.view import SUMMARY_OPEN
from shared.guard import ContextGuard
from shared.integrations.pydantic_ai import ContextGuardCapability

INSTRUCTIONS = "You are a support agent. Look facts up with the lookup tool before answering."


def approx_tokens(messages: list[pm.ModelMessage], instructions: str | None) -> int:
    """About four characters a token, every part included (what a provider would count)."""
    chars = len(instructions or "")
    for message in messages:
        for part in message.parts:
            content = getattr(part, "content", None)
            chars += len(content if isinstance(content, str) else json.dumps(content, default=str))
            if isinstance(part, pm.ToolCallPart):
                chars += len(part.args_as_json_str()) + len(part.tool_name)
    return chars // 4 + 4 * len(messages)


@dataclass
class WindowedModel:
    """The function behind ``FunctionModel``: a window, a log of what it was sent."""

    window: int = 3000
    requests: list[list[pm.ModelMessage]] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    overflows: int = 0
    fail: Exception | None = None
    recall_query: str | None = None  # set: a new question gets a recall call, not lookup

    def __call__(self, messages: list[pm.ModelMessage], info: AgentInfo) -> pm.ModelResponse:
        if self.fail is not None:
            raise self.fail
        tokens = approx_tokens(messages, info.instructions)
        if tokens > self.window:
            self.overflows += 1
            raise ModelHTTPError(400, "windowed-fake", body={"error": {
                "code": "context_length_exceeded",
                "message": f"This model's maximum context length is {self.window} tokens. "
                           f"However, your messages resulted in {tokens} tokens."}})
        self.requests.append(list(messages))
        self.counts.append(tokens)
        last = messages[-1].parts[-1]
        usage = RequestUsage(input_tokens=tokens, output_tokens=20)
        if isinstance(last, pm.ToolReturnPart):
            return pm.ModelResponse(parts=[pm.TextPart(f"Found: {str(last.content)[:80]}")],
                                    usage=usage)
        if self.recall_query is not None:
            return pm.ModelResponse(parts=[pm.ToolCallPart(
                "recall", {"query": self.recall_query}, tool_call_id="call_recall")],
                usage=usage)
        question = str(getattr(last, "content", "?"))[:40]
        return pm.ModelResponse(parts=[pm.ToolCallPart(
            "lookup", {"query": question}, tool_call_id=f"call_{len(self.requests)}")],
            usage=usage)

    def model(self) -> FunctionModel:
        return FunctionModel(self, model_name="windowed-fake")


def build_agent(guard: ContextGuard, model: WindowedModel, **kwargs: Any) -> Agent[None, str]:
    capability = ContextGuardCapability(guard, max_tokens=256, **kwargs)
    agent = Agent(model.model(), instructions=INSTRUCTIONS, capabilities=[capability])

    @agent.tool_plain
    def lookup(query: str) -> str:
        """Look a customer-service fact up (a long record, as real tools return)."""
        return json.dumps({"query": query, "record": [
            {"booking": f"BK{i:04d}", "status": "confirmed", "fare": 120 + i,
             "notes": "Passenger requested an aisle seat and a vegetarian meal."}
            for i in range(6)]})

    return agent


def question(i: int) -> str:
    return (f"Question {i}: my booking reference is BK{i:04d}; can you check the fare, the "
            "seat and the meal, and tell me what changes are possible? " * 3)


def run(turns: int = 30, window: int = 3000, session: str = "pydantic-ai-example",
        verbose: bool = True) -> dict[str, Any]:
    """Drive the agent through ``turns`` runs sharing one history."""
    from workers.harness.stack.demo import choose_backends, open_stack
    from workers.settings import Settings

    settings = Settings()
    with open_stack(settings, choose_backends(settings, "embedded"), concurrency=1) as stack:
        guard = ContextGuard(stack.store, stack.enqueuer, overrides={"windowed-fake": window})
        model = WindowedModel(window=window)
        agent = build_agent(guard, model, session_id=session)
        history: list[pm.ModelMessage] = []
        for i in range(turns):
            result = agent.run_sync(question(i), message_history=history)
            history = result.all_messages()
            stack.wait_idle(session, timeout=10)
            if verbose:
                print(f"turn {i:3d}: history {len(history):4d} messages, request "
                      f"{model.counts[-1]:5d} tokens (window {window})")
        summarized = sum(1 for req in model.requests if any(
            SUMMARY_OPEN in str(getattr(p, "content", "")) for m in req for p in m.parts))
        out = {"turns": turns, "history_messages": len(history),
               "log_length": stack.store.length(session),
               "max_request_tokens": max(model.counts), "window": window,
               "requests": len(model.requests), "requests_with_summary": summarized,
               "overflows_seen_by_model": model.overflows,
               "summaries": len(stack.store.summaries(session))}
        # An early booking, long summarized away: the model recalls it (an id only that
        # turn's question holds; lookup's records name BK0000-BK0005 in every turn).
        early = f"BK{min(7, turns - 1):04d}"
        model.recall_query = early
        asked = agent.run_sync(f"What did I ask about {early}?", message_history=history)
        model.recall_query = None
        [text] = [str(p.content) for m in asked.new_messages() for p in m.parts
                  if isinstance(p, pm.ToolReturnPart) and p.tool_name == "recall"]
        if verbose:
            print(f"recall({early!r}) -> {text[:160]!r}")
        out["recalled"] = [int(index) for index, passage in re.findall(
            r"\[message (\d+), \w+, score [0-9.]+\]\n([^\n]*)", text) if early in passage]
        stack.store.delete_session(session)
    if verbose:
        print(json.dumps(out, indent=2))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--window", type=int, default=3000)
    args = parser.parse_args(argv)
    run(args.turns, args.window)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
