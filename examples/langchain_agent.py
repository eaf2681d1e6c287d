"""A LangChain v1 agent (``create_agent``) kept inside its context window by the guard.

Runs offline: the chat model is ``WindowedChatModel``, a real LangChain
``BaseChatModel`` that enforces a small context window (it raises
``ContextOverflowError`` when a request does not fit, as a provider would)
and answers by calling a ``lookup`` tool once per question. The compaction
stack is the embedded one (fakeredis, in-memory broker, a Celery worker in
this process with the offline summarizer), so summaries written by the worker
show up in later requests. Last, the model is asked about an early booking
that was summarized away: it calls ``recall`` (the middleware's tool, on by
default) and gets the original message back, verbatim, with its index.

    PYTHONPATH=. python examples/langchain_agent.py --turns 30 --window 3000

With a real model: ``create_agent(ChatOpenAI(...), tools, middleware=[ContextGuardMiddleware(
ContextGuard(SessionStore(connect(REDIS_URL)), CeleryEnqueuer(publisher_app(BROKER_URL))))])``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from langchain.agents import create_agent
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.exceptions import ContextOverflowError
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.messages.utils import count_tokens_approximately
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from shared.core.view import SUMMARY_OPEN
from shared.guard import ContextGuard
from shared.integrations.langchain import ContextGuardMiddleware

SYSTEM = "You are a support agent. Look facts up with the lookup tool before answering."


class WindowedChatModel(BaseChatModel):
    """A fake chat model with a real context window.

    Counts each request with LangChain's approximate counter; over
    ``window`` it raises ``ContextOverflowError`` with an OpenAI-style text
    (which states the limit). Otherwise: a ``lookup`` tool call for a new
    question, a short answer once the tool result is in. Every request it saw
    is kept in ``requests`` (lists of messages), with its token count.
    """

    window: int = 3000
    delay: float = 0.0
    model_name: str = "windowed-fake"
    requests: list[list[BaseMessage]] = []
    counts: list[int] = []
    overflows: int = 0
    reply: Callable[[Sequence[BaseMessage]], AIMessage] | None = None

    @property
    def _llm_type(self) -> str:
        return "windowed-fake"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None,
                  **kwargs: Any) -> ChatResult:
        tokens = count_tokens_approximately(messages)
        if tokens > self.window:
            self.overflows += 1
            raise ContextOverflowError(
                f"This model's maximum context length is {self.window} tokens. However, your "
                f"messages resulted in {tokens} tokens. Please reduce the length of the "
                "messages.")
        if self.delay:
            time.sleep(self.delay)
        self.requests.append(list(messages))
        self.counts.append(tokens)
        message = (self.reply or lookup_then_answer)(messages)
        message.usage_metadata = {"input_tokens": tokens, "output_tokens": 20,
                                  "total_tokens": tokens + 20}
        return ChatResult(generations=[ChatGeneration(message=message)])


def lookup_then_answer(messages: Sequence[BaseMessage]) -> AIMessage:
    """Call ``lookup`` for the newest question; answer once its result arrived."""
    last = messages[-1]
    if isinstance(last, ToolMessage):
        return AIMessage(content=f"Here is what I found: {str(last.content)[:80]}")
    question = str(last.content)[:40] if isinstance(last, HumanMessage) else "?"
    call_id = f"call_{len(messages)}_{abs(hash(question)) % 10**8}"
    return AIMessage(content="", tool_calls=[{"name": "lookup", "args": {"query": question},
                                              "id": call_id, "type": "tool_call"}])


def recall_then_answer(query: str) -> Callable[[Sequence[BaseMessage]], AIMessage]:
    """A reply policy: call ``recall`` with ``query``; answer from its result."""
    def reply(messages: Sequence[BaseMessage]) -> AIMessage:
        last = messages[-1]
        if isinstance(last, ToolMessage) and last.name == "recall":
            return AIMessage(content=f"From the recalled message: {str(last.content)[:200]}")
        return AIMessage(content="", tool_calls=[{"name": "recall", "args": {"query": query},
                                                  "id": "call_recall", "type": "tool_call"}])
    return reply


@tool
def lookup(query: str) -> str:
    """Look a customer-service fact up (a long record, as real tools return)."""
    return json.dumps({"query": query, "record": [
        {"booking": f"BK{i:04d}", "status": "confirmed", "fare": 120 + i,
         "notes": "Passenger requested an aisle seat and a vegetarian meal."}
        for i in range(6)]})


def run(turns: int = 30, window: int = 3000, session: str = "langchain-example",
        verbose: bool = True) -> dict[str, Any]:
    """Drive the agent through ``turns`` questions; what the model saw, summarized."""
    from workers.harness.stack.demo import choose_backends, open_stack
    from workers.settings import Settings

    settings = Settings()
    with open_stack(settings, choose_backends(settings, "embedded"), concurrency=1) as stack:
        guard = ContextGuard(stack.store, stack.enqueuer, overrides={"windowed-fake": window})
        model = WindowedChatModel(window=window, requests=[], counts=[])
        agent = create_agent(model, [lookup], system_prompt=SYSTEM,
                             middleware=[ContextGuardMiddleware(guard, max_tokens=256)],
                             checkpointer=InMemorySaver())
        config: Any = {"configurable": {"thread_id": session}}
        for i in range(turns):
            question = (f"Question {i}: my booking reference is BK{i:04d}; can you check the "
                        "fare, the seat and the meal, and tell me what changes are possible? "
                        * 3)
            state = agent.invoke({"messages": [HumanMessage(question)]}, config)
            stack.wait_idle(session, timeout=10)
            if verbose:
                print(f"turn {i:3d}: state {len(state['messages']):4d} messages, request "
                      f"{model.counts[-1]:5d} tokens (window {window})")
        summarized = sum(1 for req in model.requests
                         if any(SUMMARY_OPEN in str(m.content) for m in req))
        result = {"turns": turns, "state_messages": len(state["messages"]),
                  "log_length": stack.store.length(session),
                  "max_request_tokens": max(model.counts), "window": window,
                  "requests": len(model.requests), "requests_with_summary": summarized,
                  "overflows_seen_by_model": model.overflows,
                  "summaries": len(stack.store.summaries(session))}
        # An early booking, long summarized away: the model recalls it (an id only that
        # turn's question holds; lookup's records name BK0000-BK0005 in every turn).
        early = f"BK{min(7, turns - 1):04d}"
        model.reply = recall_then_answer(early)
        state = agent.invoke({"messages": [HumanMessage(f"What did I ask about {early}?")]},
                             config)
        recalled = next(m for m in state["messages"] if isinstance(m, ToolMessage)
                        and m.name == "recall")
        model.reply = None
        if verbose:
            print(f"recall({early!r}) -> {str(recalled.content)[:160]!r}")
        result["recalled"] = [h["index"] for h in recalled.artifact or []
                              if early in h["text"]]
        stack.store.delete_session(session)
    if verbose:
        print(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--window", type=int, default=3000)
    args = parser.parse_args(argv)
    run(args.turns, args.window)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
