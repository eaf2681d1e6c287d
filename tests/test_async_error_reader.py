"""The async adapters classify a provider's first error without stalling the event loop.

``shared.core.overflow`` imports its pattern tables (``overflow_read``) on the
first error it reads, ~135 ms of module code and regex compilation. In an
async adapter that import ran on the event loop, so the first overflow of a
process stalled every other coroutine on it that long. The adapters now import
it in a worker thread before the guard reads the error, and so does
``AsyncContextGuard.recover`` for a caller of its own. Each case runs in a
fresh interpreter (the module must not be imported yet) and records the thread
that imports it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SPY = """
import sys, threading
IMPORTED = []
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "shared.core.overflow_read":
            IMPORTED.append(threading.current_thread() is threading.main_thread())
        return None
sys.meta_path.insert(0, Spy())
"""

LANGCHAIN = """
import asyncio, fakeredis
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from examples.langchain_agent import SYSTEM, WindowedChatModel, lookup
from shared.core.config import StoreConfig
from shared.guard import AsyncContextGuard
from shared.integrations.langchain import ContextGuardMiddleware
from shared.store.aio import AsyncSessionStore

guard = AsyncContextGuard(AsyncSessionStore(fakeredis.FakeAsyncRedis(),
                                            StoreConfig(key_prefix="reader")),
                          overrides={"windowed-fake": 40_000})
model = WindowedChatModel(window=3000, requests=[], counts=[])
agent = create_agent(model, [lookup], system_prompt=SYSTEM, checkpointer=InMemorySaver(),
                     middleware=[ContextGuardMiddleware(guard, max_tokens=256)])

async def drive():
    for i in range(14):
        await agent.ainvoke({"messages": [HumanMessage(f"Question {i}: booking BK{i:04d}. " * 8)]},
                            {"configurable": {"thread_id": "s"}})
        if model.overflows:
            return

asyncio.run(drive())
assert model.overflows >= 1, "no overflow: nothing was classified"
"""

AGENTS = """
import asyncio, json
import fakeredis
from openai import AsyncOpenAI
from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, RunConfig, Runner,
                    set_tracing_disabled)
from shared.core.config import StoreConfig
from shared.guard import AsyncContextGuard
from shared.integrations.agents_sdk import GuardedModel, InputBudget
from shared.store.aio import AsyncSessionStore
from workers.harness.fakes.openai_server import FakeOpenAIServer

set_tracing_disabled(True)
guard = AsyncContextGuard(AsyncSessionStore(fakeredis.FakeAsyncRedis(),
                                            StoreConfig(key_prefix="reader")),
                          overrides={"gpt-4o-fake": 40_000})
with FakeOpenAIServer(window=600) as server:
    client = AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0)
    budget = InputBudget(guard, model="gpt-4o-fake", max_tokens=100)
    model = GuardedModel(OpenAIChatCompletionsModel(model="gpt-4o-fake", openai_client=client),
                         budget)
    agent = Agent(name="a", instructions="Be terse.", model=model,
                  model_settings=ModelSettings(max_tokens=100))

    async def drive():
        result = Runner.run_streamed(agent, "Summarise this. " * 400,
                                     run_config=RunConfig(call_model_input_filter=budget))
        async for _ in result.stream_events():
            pass

    try:
        asyncio.run(drive())
    except Exception:
        pass  # a prompt that cannot shrink enough is refused twice: the import is the point
    assert any(r.status == 400 for r in server.requests), "no overflow"
"""


DIRECT = """
import asyncio, fakeredis
from shared.core.config import StoreConfig
from shared.guard import AsyncContextGuard
from shared.store.aio import AsyncSessionStore

guard = AsyncContextGuard(AsyncSessionStore(fakeredis.FakeAsyncRedis(),
                                            StoreConfig(key_prefix="reader")))

async def drive():
    await guard.record_turn("s", [{"role": "user", "content": "hello " * 50},
                                  {"role": "assistant", "content": "hi " * 50}])
    error = RuntimeError("This model's maximum context length is 8192 tokens. However, "
                         "your messages resulted in 9000 tokens.")
    return await guard.recover("s", error, "system", max_tokens=100, model="gpt-4")

assert asyncio.run(drive()) is not None, "not read as an overflow"
"""


@pytest.mark.parametrize(("name", "scenario"),
                         [("langchain", LANGCHAIN), ("agents", AGENTS), ("direct", DIRECT)])
def test_the_first_overflow_reads_the_error_patterns_off_the_event_loop(
        name: str, scenario: str) -> None:
    code = SPY + textwrap.dedent(scenario) + (
        "\nassert IMPORTED, 'the patterns were never imported'"
        "\nprint('on the loop thread:', IMPORTED[0])"
        "\nassert IMPORTED[0] is False, 'imported on the event loop thread'\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
