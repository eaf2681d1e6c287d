"""What each framework adapter adds to a model call, paired against the framework alone.

Per framework (pydantic-ai, LangChain v1, the OpenAI Agents SDK), ``--sessions``
sessions of ``--turns`` turns each: a fixed user message, a fake model answering
at once (no network), the guard on the real Redis. Each session runs twice,
back to back: the framework alone (its own history: ``message_history=`` /
a checkpointer / the run's input list), then with the adapter
(``ContextGuardCapability`` / ``ContextGuardMiddleware`` / ``GuardedSession`` with
its model wrapper and input filter). The delta of call ``i`` is the guarded call
minus the bare call ``i`` of the same pair, so drift in machine load cancels out.
The garbage collector runs as usual (not frozen). The window is large enough that
nothing is compacted: every call's view is the whole history, the worst case for
work that follows the history's length.

Reported per framework, in ms: median bare and guarded call, median paired delta and
its p90, the median delta of the last quarter of the turns (a delta that grows with
the history shows there) and the median paired delta of the process's CPU time (all
threads: steadier than wall time on a shared machine). Each measurement runs in a child
process, ``--rounds`` of them. ``--baseline DIR``: the same measurement of another
checkout's code (``DIR`` holds its ``shared/``), its children alternating with this
checkout's, and both rows in the table.

    PYTHONPATH=. .venv/bin/python scripts/bench_adapters.py [--turns 20] [--sessions 10]
        [--frameworks pydantic-ai,langchain,agents-sdk] [--baseline ../main] [--rounds 2]
        [--redis-url redis://127.0.0.1:6379/0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _timing import ROOT, loadavg, percentile

TEXT = "Question about booking BK0042: fare, seat and meal please. " * 8
ANSWER = "Answer: " + "ok " * 60
WINDOW = 10_000_000  # nothing compacts: the view is the whole history
FRAMEWORKS = ("pydantic-ai", "langchain", "agents-sdk")
Times = list[tuple[float, float]]  # per call: (wall seconds, process CPU seconds)
Session = Callable[[str, bool], Times]  # (session id, guarded) -> per call


def pydantic_ai_runner(guard: Any, turns: int) -> Session:
    from pydantic_ai import Agent
    from pydantic_ai import messages as pm
    from pydantic_ai.models.function import FunctionModel

    from shared.integrations.pydantic_ai import ContextGuardCapability

    def answer(messages: Any, info: Any) -> Any:
        return pm.ModelResponse(parts=[pm.TextPart(ANSWER)])

    bare = Agent(FunctionModel(answer, model_name="fake"))
    guarded = Agent(FunctionModel(answer, model_name="fake"),
                    capabilities=[ContextGuardCapability(guard, recall=False)])

    def session(sid: str, with_guard: bool) -> Times:
        agent = guarded if with_guard else bare
        history: list[Any] = []
        out: Times = []
        for _ in range(turns):
            start, cpu = time.perf_counter(), time.process_time()
            result = agent.run_sync(TEXT, message_history=history, conversation_id=sid)
            out.append((time.perf_counter() - start, time.process_time() - cpu))
            history = result.all_messages()
        return out

    return session


def langchain_runner(guard: Any, turns: int) -> Session:
    from langchain.agents import create_agent
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langgraph.checkpoint.memory import InMemorySaver

    from shared.integrations.langchain import ContextGuardMiddleware

    class Fake(BaseChatModel):
        """A new answer each call (a provider's reply is a new object)."""

        @property
        def _llm_type(self) -> str:
            return "fake"

        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None,
                      **kwargs: Any) -> ChatResult:
            return ChatResult(generations=[ChatGeneration(message=AIMessage(ANSWER))])

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

    def model() -> Fake:
        return Fake()

    bare = create_agent(model(), [], checkpointer=InMemorySaver())
    guarded = create_agent(model(), [], checkpointer=InMemorySaver(), middleware=[
        ContextGuardMiddleware(guard, model="fake", recall=False)])

    def session(sid: str, with_guard: bool) -> Times:
        agent = guarded if with_guard else bare
        config: Any = {"configurable": {"thread_id": sid}}
        out: Times = []
        for _ in range(turns):
            start, cpu = time.perf_counter(), time.process_time()
            agent.invoke({"messages": [HumanMessage(TEXT)]}, config)
            out.append((time.perf_counter() - start, time.process_time() - cpu))
        return out

    return session


def agents_sdk_runner(guard: Any, turns: int) -> Session:
    from agents import Agent, Runner, set_tracing_disabled
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import ResponseOutputMessage, ResponseOutputText

    from shared.integrations.agents_sdk import GuardedSession

    set_tracing_disabled(True)

    class Fake(Model):
        async def get_response(self, system_instructions: Any, input: Any, *args: Any,
                               **kwargs: Any) -> ModelResponse:
            text = ResponseOutputText(type="output_text", text=ANSWER, annotations=[])
            message = ResponseOutputMessage(id="msg_1", type="message", role="assistant",
                                            status="completed", content=[text])
            sent = len(json.dumps(input, default=str)) // 4  # a provider's count, roughly
            return ModelResponse(output=[message], response_id=None, usage=Usage(
                requests=1, input_tokens=sent, output_tokens=20, total_tokens=sent + 20))

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    async def bare(turns: int) -> Times:
        agent = Agent(name="bench", instructions="Answer.", model=Fake())
        items: list[Any] = []
        out: Times = []
        for _ in range(turns):
            start, cpu = time.perf_counter(), time.process_time()
            result = await Runner.run(agent, [*items, {"role": "user", "content": TEXT}])
            out.append((time.perf_counter() - start, time.process_time() - cpu))
            items = result.to_input_list()
        return out

    async def guarded(sid: str, turns: int) -> Times:
        session = GuardedSession(guard, sid, model="fake", instructions="Answer.")
        agent = Agent(name="bench", instructions="Answer.", model=session.wrap(Fake()))
        out: Times = []
        for _ in range(turns):
            start, cpu = time.perf_counter(), time.process_time()
            await Runner.run(agent, TEXT, session=session, run_config=session.run_config())
            out.append((time.perf_counter() - start, time.process_time() - cpu))
        return out

    def session(sid: str, with_guard: bool) -> Times:
        return asyncio.run(guarded(sid, turns) if with_guard else bare(turns))

    return session


RUNNERS: dict[str, Callable[[Any, int], Session]] = {
    "pydantic-ai": pydantic_ai_runner, "langchain": langchain_runner,
    "agents-sdk": agents_sdk_runner}


Results = dict[str, dict[str, Times]]  # framework -> "bare"/"guarded" -> per call


def measure(frameworks: list[str], turns: int, sessions: int, redis_url: str) -> Results:
    """Per framework: the bare and the guarded calls, session after session (call ``i``
    of one is paired with call ``i`` of the other)."""
    import redis

    from shared.core.config import StoreConfig
    from shared.guard import ContextGuard
    from shared.store.sessions import SessionStore

    prefix = "benchad" + secrets.token_hex(4)
    client = redis.Redis.from_url(redis_url)
    guard = ContextGuard(SessionStore(client, StoreConfig(key_prefix=prefix)),
                         overrides={"fake": WINDOW})
    results: Results = {}
    try:
        for name in frameworks:
            run = RUNNERS[name](guard, turns)
            run(f"warm-{name}", False)  # imports, caches, first-call costs
            run(f"warm-{name}", True)
            bare: Times = []
            guarded: Times = []
            for s in range(sessions):
                bare += run(f"b{s}-{name}", False)
                guarded += run(f"g{s}-{name}", True)
            results[name] = {"bare": bare, "guarded": guarded}
    finally:
        for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            client.delete(key)
    return results


def summary(bare: Times, guarded: Times, turns: int) -> dict[str, float]:
    """Medians in ms: wall (bare, guarded, paired delta, its p90, the delta over the last
    quarter of the turns) and the paired delta of the process's CPU time (all threads)."""
    deltas = [g[0] - b[0] for b, g in zip(bare, guarded, strict=True)]
    cpu = [g[1] - b[1] for b, g in zip(bare, guarded, strict=True)]
    late = [d for i, d in enumerate(deltas) if i % turns >= turns - max(1, turns // 4)]
    return {"bare": statistics.median(b[0] for b in bare) * 1e3,
            "guarded": statistics.median(g[0] for g in guarded) * 1e3,
            "delta": statistics.median(deltas) * 1e3, "p90": percentile(deltas, 90) * 1e3,
            "late": statistics.median(late) * 1e3, "cpu": statistics.median(cpu) * 1e3,
            "n": len(deltas)}


def child(code: Path, args: argparse.Namespace) -> Results:
    """One measurement of ``code``'s adapters in a fresh process (its JSON on stdout)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--json", "--code", str(code),
               "--turns", str(args.turns), "--sessions", str(args.sessions),
               "--frameworks", args.frameworks, "--redis-url", args.redis_url]
    done = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True)
    data = json.loads(done.stdout.splitlines()[-1])
    return {name: {k: [(w, c) for w, c in v] for k, v in runs.items()}
            for name, runs in data.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    parser.add_argument("--baseline", type=Path, help="another checkout to compare with")
    parser.add_argument("--rounds", type=int, default=2,
                        help="child processes per checkout (alternating with --baseline)")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--code", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = [n for n in args.frameworks.split(",") if n]
    if unknown := set(names) - set(RUNNERS):
        parser.error(f"unknown frameworks: {sorted(unknown)}")
    if args.json:
        sys.path.insert(0, str(args.code or ROOT))
        print(json.dumps(measure(names, args.turns, args.sessions, args.redis_url)))
        return
    trees = {"this": ROOT}
    if args.baseline is not None:
        trees["baseline"] = args.baseline.resolve()
    merged: dict[tuple[str, str], dict[str, Times]] = {}
    for _ in range(args.rounds):
        for label, tree in trees.items():
            for name, data in child(tree, args).items():
                entry = merged.setdefault((label, name), {"bare": [], "guarded": []})
                entry["bare"] += data["bare"]
                entry["guarded"] += data["guarded"]
    print(f"turns={args.turns} sessions={args.sessions} load={loadavg()} "
          f"(ms per model call; delta = guarded - bare, paired call for call)")
    print(f"{'framework':12} {'code':9} {'bare':>7} {'guarded':>8} {'delta':>7} {'p90':>7} "
          f"{'late':>7} {'cpu':>7} {'n':>5}")
    for name in names:
        for label in trees:
            row = summary(merged[label, name]["bare"], merged[label, name]["guarded"],
                          args.turns)
            print(f"{name:12} {label:9} {row['bare']:7.2f} {row['guarded']:8.2f} "
                  f"{row['delta']:7.2f} {row['p90']:7.2f} {row['late']:7.2f} {row['cpu']:7.2f} "
                  f"{row['n']:5.0f}")


if __name__ == "__main__":
    main()
