"""How long a LangChain agent waits for context management, per model call.

One run, one real session (customer-service sessions from
``../shared/data/transcripts.dev.jsonl``, concatenated into one long
conversation), replayed through a real ``create_agent`` graph twice:

- ``SummarizationMiddleware`` (LangChain v1's own): trigger 8k tokens, its
  other settings default, its summarizer a fake chat model answering after
  ``--summarizer-latency`` seconds (2 s);
- ``ContextGuardMiddleware`` (this project): the guard on the real Redis, a
  real ``celery -A workers.app worker`` process (its own queue) summarizing
  through the fake OpenAI server, which answers after the same latency. The
  window is sized so that the guard's trigger (80% of the input budget) is
  the same 8k tokens.

The agent's model replays the transcript's assistant messages (tool calls
included) instantly; its tools replay the recorded results. What is measured
is what the middleware keeps the agent waiting for, per model call: the
time in SummarizationMiddleware's ``before_model`` hook, and the time in our
``wrap_model_call`` minus the model call it wraps (prepare + record + enqueue).

    PYTHONPATH=. .venv/bin/python scripts/bench_frameworks.py \\
        [--data ../shared/data/transcripts.dev.jsonl] [--sessions id,id,...] \\
        [--summarizer-latency 2.0] [--trigger 8000] [--user-pause 0] \\
        [--redis-url redis://127.0.0.1:6379/7] [--broker-url redis://127.0.0.1:6379/8]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import SummarizationMiddleware
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.messages.utils import count_tokens_approximately
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import StructuredTool
from langgraph.checkpoint.memory import InMemorySaver

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shared.core.tokens import estimate_messages_tokens  # noqa: E402
from shared.core.wire import from_openai  # noqa: E402
from shared.guard import ContextGuard  # noqa: E402
from shared.integrations.langchain import ContextGuardMiddleware  # noqa: E402

DEFAULT_DATA = ROOT.parent / "shared" / "data" / "transcripts.dev.jsonl"
# Every customer-service session of the kit, in file order: 580 messages, 127 user messages.
DEFAULT_SESSIONS = "customer-service"
MODEL = "replay-model"
MAX_TOKENS = 2000


# -- the session ---------------------------------------------------------------------------
def load_session(path: Path, ids: list[str]) -> tuple[str, list[dict[str, Any]]]:
    """(system prompt of the first, all non-system messages) of the sessions, in order.

    ``ids == ["customer-service"]``: every session of that domain, in file order.
    """
    found: dict[str, list[dict[str, Any]]] = {}
    domain = ids == ["customer-service"]
    for line in path.read_text(encoding="utf-8").splitlines():
        item = json.loads(line)
        if domain and str(item.get("domain", "")).startswith("customer-service"):
            ids.append(item["id"])
        if item["id"] in ids:
            found[item["id"]] = item["messages"]
    if domain:
        ids.remove("customer-service")
    missing = [i for i in ids if i not in found]
    if missing:
        raise SystemExit(f"sessions not found in {path}: {missing}")
    system = next((m["content"] for m in found[ids[0]] if m["role"] == "system"), "")
    messages = [m for i in ids for m in found[i] if m["role"] != "system"]
    return system, messages


def turns_of(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The conversation cut before each user message that follows a reply."""
    turns: list[list[dict[str, Any]]] = []
    for m in messages:
        if not turns or (m["role"] == "user" and turns[-1][-1]["role"] != "user"):
            turns.append([])
        turns[-1].append(m)
    return turns


class Replay(BaseChatModel):
    """The agent's model: returns the transcript's next assistant message, instantly."""

    script: collections.deque[dict[str, Any]]

    @property
    def _llm_type(self) -> str:
        return "replay"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None,
                  **kwargs: Any) -> ChatResult:
        m = self.script.popleft() if self.script else {"content": "(end of turn)"}
        calls = [{"name": c.get("name") or c["function"]["name"],
                  "args": json.loads(c.get("arguments") or c.get("function", {}).get(
                      "arguments") or "{}"), "id": c["id"], "type": "tool_call"}
                 for c in m.get("tool_calls") or []]
        tokens = count_tokens_approximately(messages)
        message = AIMessage(content=m.get("content") or "", tool_calls=calls,
                            usage_metadata={"input_tokens": tokens, "output_tokens": 50,
                                            "total_tokens": tokens + 50})
        return ChatResult(generations=[ChatGeneration(message=message)])


class SlowSummarizer(BaseChatModel):
    """LangChain's summarizer: answers after ``latency`` seconds; notes what it was shown."""

    latency: float = 2.0
    calls: int = 0
    saw_previous: int = 0

    @property
    def _llm_type(self) -> str:
        return "slow-summarizer"

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None,
                  **kwargs: Any) -> ChatResult:
        time.sleep(self.latency)
        prompt = "\n".join(str(m.content) for m in messages)
        if self.calls and f"SUMMARY#{self.calls}" in prompt:
            self.saw_previous += 1
        self.calls += 1
        text = f"SUMMARY#{self.calls}: the customer and the agent discussed bookings."
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text))])


def replay_tools(messages: list[dict[str, Any]]) -> list[StructuredTool]:
    """One tool per name in the transcript, returning the recorded results in order."""
    results: dict[str, str] = {m["tool_call_id"]: str(m.get("content") or "")
                               for m in messages if m["role"] == "tool"}
    names = sorted({c.get("name") or c["function"]["name"]
                    for m in messages for c in m.get("tool_calls") or []})
    queue = collections.deque(
        results.get(c["id"], "") for m in messages for c in m.get("tool_calls") or [])

    def make(name: str) -> StructuredTool:
        def run(**kwargs: Any) -> str:
            return queue.popleft() if queue else ""
        return StructuredTool.from_function(
            func=run, name=name, description=f"replayed {name}",
            args_schema={"type": "object", "properties": {}, "additionalProperties": True})
    return [make(n) for n in names]


# -- timing -----------------------------------------------------------------------------------
class TimedSummarization(SummarizationMiddleware):
    """SummarizationMiddleware, its ``before_model`` hook timed (that is where it blocks)."""

    waits: list[float]

    def before_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        started = time.perf_counter()
        try:
            return super().before_model(state, runtime)
        finally:
            self.waits.append(time.perf_counter() - started)


class TimedGuard(ContextGuardMiddleware):
    """Our middleware, timed around the model call it wraps (the model call itself excluded)."""

    waits: list[float]
    sent: list[int]

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        inner = [0.0]

        def timed(req: Any) -> Any:
            self.sent.append(count_tokens_approximately(
                [req.system_message, *req.messages] if req.system_message else req.messages))
            started = time.perf_counter()
            try:
                return handler(req)
            finally:
                inner[0] += time.perf_counter() - started

        started = time.perf_counter()
        try:
            return super().wrap_model_call(request, timed)
        finally:
            self.waits.append(time.perf_counter() - started - inner[0])


def drive(agent: Any, script: collections.deque[dict[str, Any]],
          turns: list[list[dict[str, Any]]], session: str,
          after_turn: Callable[[], None] | None = None) -> float:
    """Each turn: its user message(s) in, its recorded replies as the model's script."""
    config: Any = {"configurable": {"thread_id": session}, "recursion_limit": 500}
    started = time.perf_counter()
    for turn in turns:
        users = [HumanMessage(m["content"] or "") for m in turn if m["role"] == "user"]
        script.clear()
        script.extend(m for m in turn if m["role"] == "assistant")
        agent.invoke({"messages": users or [HumanMessage("(continue)")]}, config)
        if after_turn:
            after_turn()
    return time.perf_counter() - started


def pause(args: argparse.Namespace) -> Callable[[], None]:
    """Between user turns: the user reading and typing (not a wait of the agent's)."""
    return lambda: time.sleep(args.user_pause) if args.user_pause else None


def run_langchain(system: str, messages: list[dict[str, Any]], args: argparse.Namespace,
                  ) -> dict[str, Any]:
    summarizer = SlowSummarizer(latency=args.summarizer_latency)
    middleware = TimedSummarization(model=summarizer, trigger=("tokens", args.trigger))
    middleware.waits = []
    model = Replay(script=collections.deque())  # (pydantic copies the deque: use model's)
    agent = create_agent(model, replay_tools(messages), system_prompt=system,
                         middleware=[middleware], checkpointer=InMemorySaver())
    wall = drive(agent, model.script, turns_of(messages), "bench-lc", pause(args))
    return {"waits": middleware.waits, "wall": wall, "summaries": summarizer.calls,
            "saw_previous": summarizer.saw_previous}


@contextlib.contextmanager
def worker_process(settings: Any, queue: str) -> Iterator[None]:
    """A real ``celery -A workers.app worker`` process consuming ``queue`` (stopped on exit)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
           "COMPACTION_BROKER_URL": settings.broker_url, "COMPACTION_REDIS_URL":
           settings.redis_url, "COMPACTION_KEY_PREFIX": settings.key_prefix,
           "COMPACTION_SUMMARIZER": "openai", "COMPACTION_SUMMARIZER_MODEL": "summary-fake",
           "COMPACTION_SUMMARIZER_BASE_URL": str(settings.summarizer_base_url),
           "COMPACTION_SUMMARIZER_API_KEY": "k"}
    fd, name = tempfile.mkstemp(prefix="bench_frameworks_", suffix=".log")
    path = Path(name)
    cmd = [sys.executable, "-m", "celery", "-A", "workers.app", "worker", "--pool", "threads",
           "-c", "2", "-Q", queue, "-n", f"{queue}@%h", "--without-mingle",
           "--without-gossip", "-l", "INFO"]
    with os.fdopen(fd, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while " ready." not in path.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("worker did not start:\n"
                                 + path.read_text(errors="replace")[-2000:])
            time.sleep(0.1)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        path.unlink(missing_ok=True)


def wait_idle(store: Any, session: str, timeout: float) -> None:
    """Until no job of the session is pending or leased (three quiet polls)."""
    deadline, quiet = time.monotonic() + timeout, 0
    while time.monotonic() < deadline and quiet < 3:
        busy = store.is_pending(session) or store.redis.exists(store.keys(session).lease)
        quiet = 0 if busy else quiet + 1
        time.sleep(0.1)


def run_ours(system: str, messages: list[dict[str, Any]], args: argparse.Namespace,
             ) -> dict[str, Any]:
    from shared.enqueue import CeleryEnqueuer, publisher_app
    from shared.store.sessions import SessionStore, connect
    from workers.harness.fakes.openai_server import FakeOpenAIServer
    from workers.harness.fakes.summaries import SummarizerResponder
    from workers.settings import Settings

    prefix = "bench" + secrets.token_hex(4)
    queue = "bench-frameworks-" + secrets.token_hex(4)
    with FakeOpenAIServer(responder=SummarizerResponder(), latency=args.summarizer_latency,
                          model="summary-fake") as server:
        settings = Settings(redis_url=args.redis_url, broker_url=args.broker_url,
                            key_prefix=prefix, summarizer="openai",
                            summarizer_base_url=server.base_url, summarizer_api_key="k",
                            summarizer_model="summary-fake")
        store = SessionStore(connect(args.redis_url), settings.store_config())
        publisher = publisher_app(args.broker_url)
        try:
            with worker_process(settings, queue):
                # The guard triggers at 80% of the input budget: window - reserve = trigger/0.8.
                window = int(args.trigger / 0.8) + MAX_TOKENS
                guard = ContextGuard(store, CeleryEnqueuer(publisher, queue=queue),
                                     overrides={MODEL: window})
                middleware = TimedGuard(guard, model=MODEL, max_tokens=MAX_TOKENS)
                middleware.waits, middleware.sent = [], []
                model = Replay(script=collections.deque())
                agent = create_agent(model, replay_tools(messages),
                                     system_prompt=system, middleware=[middleware],
                                     checkpointer=InMemorySaver())
                wall = drive(agent, model.script, turns_of(messages), "bench-ours",
                             pause(args))
                wait_idle(store, "bench-ours", timeout=120)
            kinds = [s.kind for s in store.summaries("bench-ours")]
            return {"waits": middleware.waits, "wall": wall,
                    "summaries": sum(k != "truncation" for k in kinds),
                    "truncations": kinds.count("truncation"),
                    "max_sent": max(middleware.sent), "window": window}
        finally:
            publisher.close()
            for key in store.redis.scan_iter(match=f"{prefix}:*"):
                store.redis.delete(key)
            broker = connect(args.broker_url)
            broker.delete(queue)
            broker.close()


# -- report ---------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def row(name: str, result: dict[str, Any]) -> str:
    w = [x * 1000 for x in result["waits"]]
    return (f"| {name} | {len(w)} | {statistics.median(w):.1f} | {percentile(w, 0.99):.1f} | "
            f"{max(w):.1f} | {sum(w) / 1000:.2f} | {result['summaries']} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--sessions", default=DEFAULT_SESSIONS,
                        help="comma-separated session ids, concatenated in order (default: "
                             "every customer-service session)")
    parser.add_argument("--summarizer-latency", type=float, default=2.0)
    parser.add_argument("--trigger", type=int, default=8000, help="tokens")
    parser.add_argument("--user-pause", type=float, default=0.0,
                        help="seconds between user turns (not counted)")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/7", help="session store")
    parser.add_argument("--broker-url", default="redis://127.0.0.1:6379/8",
                        help="Celery broker of the worker process (a queue of its own)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not args.data.exists():
        parser.error(f"{args.data} not found (the ../shared/data kit); pass --data")
    ids = [s for s in args.sessions.split(",") if s]
    system, messages = load_session(args.data, ids)
    calls = sum(1 for m in messages if m["role"] == "assistant")
    users = sum(1 for m in messages if m["role"] == "user")
    lc = run_langchain(system, messages, args)
    ours = run_ours(system, messages, args)
    if args.json:
        print(json.dumps({"langchain": lc, "ours": ours}, default=str))
        return 0
    print(f"Session: {len(ids)} sessions concatenated ({len(messages)} messages, {users} "
          f"user messages, "
          f"{calls} model calls, ~{estimate_messages_tokens(from_openai(messages))} tokens); "
          f"summarizer latency {args.summarizer_latency} s; trigger "
          f"{args.trigger} tokens\n")
    print("| middleware | model calls | wait p50 (ms) | p99 (ms) | max (ms) | total wait (s) "
          "| summaries |")
    print("|---|---|---|---|---|---|---|")
    print(row("LangChain SummarizationMiddleware", lc))
    print(row("ContextGuardMiddleware (ours)", ours))
    print(f"\nWall time includes --user-pause {args.user_pause} s per user turn. "
          f"LangChain's summarizer saw the previous summary in {lc['saw_previous']} of "
          f"{max(0, lc['summaries'] - 1)} later calls. Ours: largest request "
          f"{ours['max_sent']} tokens (window {ours['window']}); guard truncations kept "
          f"{ours['truncations']}; wall "
          f"{lc['wall']:.1f} s vs {ours['wall']:.1f} s.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
