"""The OpenAI Agents SDK integration: a real ``Runner.run`` over a fake ``Model``
that enforces its context window and fails like OpenAI when it is exceeded."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, cast

import httpx
import openai
import pytest

pytest.importorskip("agents")

from agents import Agent, ModelSettings, RunConfig, Runner, function_tool, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseUsage,
)

from shared.core.config import CompactionPolicy, StoreConfig
from shared.core.errors import InvalidInput
from shared.enqueue import CallbackEnqueuer
from shared.guard import ContextGuard
from shared.integrations.agents_sdk import (
    GuardedModel,
    GuardedSession,
    InputBudget,
    items_to_messages,
    messages_to_items,
)
from shared.store.sessions import SessionStore

set_tracing_disabled(True)  # no trace export from tests
MODEL = "fake-window-6k"
WINDOW = 6000
BULK = "def handler(event):\n    return process(event['payload'])  # line\n" * 60  # ~3.9k chars


def overflow_error(window: int, prompt: int) -> openai.BadRequestError:
    """What the openai SDK raises for context_length_exceeded."""
    message = (f"This model's maximum context length is {window} tokens. However, your "
               f"messages resulted in {prompt} tokens. Please reduce the length of the messages.")
    body = {"error": {"message": message, "type": "invalid_request_error",
                      "param": "messages", "code": "context_length_exceeded"}}
    request = httpx.Request("POST", "https://api.openai.com/v1/responses")
    return openai.BadRequestError(f"Error code: 400 - {body}",
                                  response=cast(Any, httpx.Response(400, request=request,
                                                                    json=body)),
                                  body=body["error"])


def _chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_chars(v) for v in value.values())
    if isinstance(value, list):
        return sum(_chars(v) for v in value)
    return 0


def count(instructions: str | None, items: Any, tools: list[Any]) -> int:
    """The fake's tokenizer: ~4 characters a token, 4 tokens of framing per item."""
    schemas = [json.dumps(getattr(t, "params_json_schema", {})) for t in tools]
    framing = 4 * len(items) if isinstance(items, list) else 4
    return (_chars([instructions or "", items, schemas])) // 4 + framing


class WindowModel(Model):
    """Calls ``read_file`` ``steps`` times, then answers; refuses requests over its window."""

    def __init__(self, window: int, steps: int) -> None:
        self.window, self.steps = window, steps
        self.calls = 0
        self.overflows = 0
        self.largest = 0

    async def get_response(self, system_instructions: str | None, input: Any,
                           model_settings: Any, tools: list[Any], output_schema: Any,
                           handoffs: Any, tracing: Any, **_: Any) -> ModelResponse:
        prompt = count(system_instructions, input, tools)
        reserve = model_settings.max_tokens or 0
        if prompt + reserve > self.window:
            self.overflows += 1
            raise overflow_error(self.window, prompt)
        self.largest = max(self.largest, prompt)
        self.calls += 1
        usage = Usage(requests=1, input_tokens=prompt, output_tokens=20,
                      total_tokens=prompt + 20)
        if self.calls <= self.steps:
            call = ResponseFunctionToolCall(
                type="function_call", call_id=f"call_{self.calls}", id=f"fc_{self.calls}",
                name="read_file", arguments=json.dumps({"path": f"src/mod_{self.calls}.py"}),
                status="completed")
            return ModelResponse(output=[call], usage=usage, response_id=None)
        text = ResponseOutputText(type="output_text", text="All files read.", annotations=[])
        message = ResponseOutputMessage(id=f"msg_{self.calls}", type="message",
                                        role="assistant", status="completed", content=[text])
        return ModelResponse(output=[message], usage=usage, response_id=None)

    async def stream_response(self, system_instructions: str | None, input: Any,
                              *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        """The same answer as one ``response.completed`` event (errors before any event)."""
        answer = await self.get_response(system_instructions, input, *args, **kwargs)
        usage = ResponseUsage(input_tokens=answer.usage.input_tokens, output_tokens=20,
                              total_tokens=answer.usage.input_tokens + 20,
                              input_tokens_details={"cached_tokens": 0,
                                                    "cache_write_tokens": 0},
                              output_tokens_details={"reasoning_tokens": 0})
        response = Response(id=f"resp_{self.calls}", created_at=0, model=MODEL,
                            object="response", output=answer.output, tool_choice="auto",
                            tools=[], parallel_tool_calls=False, status="completed",
                            usage=usage)
        yield ResponseCompletedEvent(type="response.completed", response=response,
                                     sequence_number=0)


@function_tool
def read_file(path: str) -> str:
    """Read a source file."""
    return f"# {path}\n{BULK}"


@pytest.fixture
def guard(real_redis: Any, key_prefix: str) -> ContextGuard:
    jobs: list[str] = []
    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))
    g = ContextGuard(store, CallbackEnqueuer(lambda tenant, sid: jobs.append(sid)),
                     overrides={MODEL: WINDOW})
    g.jobs = jobs  # type: ignore[attr-defined]
    return g


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_run_longer_than_the_window_never_overflows(guard: ContextGuard) -> None:
    model = WindowModel(WINDOW, steps=24)  # 24 bulky tool results: ~6x the window
    session = GuardedSession(guard, "long-run", model=MODEL, max_tokens=500,
                             instructions="You read files.")
    agent = Agent(name="reader", instructions="You read files.", tools=[read_file],
                  model=session.wrap(model), model_settings=ModelSettings(max_tokens=500))
    result = run(Runner.run(agent, "Read every module.", session=session,
                            run_config=session.run_config(), max_turns=40))
    assert result.final_output == "All files read."
    assert model.calls == 25
    assert model.largest + 500 <= WINDOW
    assert session.input_filter.truncations > 0  # the filter did the work...
    tool_results = 24 * len(BULK) // 4
    assert tool_results > 3 * WINDOW  # ...on a run far longer than the window
    # everything the run produced is stored (the raw log is never truncated by the view)
    assert guard.store.length("long-run") >= 2 + 24 * 2
    assert guard.jobs  # type: ignore[attr-defined]  # and the workers were asked to summarize

    # The next run starts from the guard's view, which fits.
    items = run(session.get_items())
    assert session.last_view.report.budget.within_budget
    assert count("You read files.", items, [read_file]) + 500 <= WINDOW


def run_believing_4x(guard: ContextGuard, model: WindowModel, session_id: str) -> GuardedModel:
    """A 12-step run whose budget believes the window is 4x the model's; the wrapped model."""
    guard.overrides[MODEL] = WINDOW * 4
    session = GuardedSession(guard, session_id, model=MODEL, max_tokens=500)
    wrapped = session.wrap(model)
    agent = Agent(name="reader", instructions="You read files.", tools=[read_file],
                  model=wrapped, model_settings=ModelSettings(max_tokens=500))
    result = run(Runner.run(agent, "Read every module.", session=session,
                            run_config=session.run_config(), max_turns=30))
    assert result.final_output == "All files read."
    return wrapped


def test_an_overflow_the_filter_missed_is_recovered_once(guard: ContextGuard) -> None:
    """The budget believes the window is 4x larger: the provider's error teaches it."""
    model = WindowModel(WINDOW, steps=12)
    wrapped = run_believing_4x(guard, model, "wrong-window")
    assert model.overflows == 1 and wrapped.recoveries == 1  # learned once, then filtered
    assert wrapped.budget.learned_window == WINDOW
    assert guard.store.state("wrong-window").learned_window == WINDOW
    # the override knows the window: one session's refusal does not shrink every session's
    assert MODEL not in guard.limits.as_mapping()


class QuietWindowModel(WindowModel):
    """A llama.cpp server started with less context than the model has: its refusal
    states no window."""

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        try:
            return await super().get_response(*args, **kwargs)
        except openai.BadRequestError:
            body = {"error": {"code": 400, "type": "exceed_context_size_error", "message":
                              "the request exceeds the available context size, try "
                              "increasing it"}}
            request = httpx.Request("POST", "http://127.0.0.1:8080/v1/responses")
            raise openai.BadRequestError(
                f"Error code: 400 - {body}", body=body["error"],
                response=cast(Any, httpx.Response(400, request=request, json=body))) from None


def test_an_overflow_that_states_no_window_is_bounded_by_the_input_let_through(
        guard: ContextGuard) -> None:
    """The filter made the refused input fit the window it believed: the real one is
    smaller, and each refusal teaches a smaller bound until the calls fit."""
    model = QuietWindowModel(WINDOW, steps=12)
    wrapped = run_believing_4x(guard, model, "quiet-window")
    assert 1 <= model.overflows == wrapped.recoveries <= 3
    learned = wrapped.budget.learned_window
    assert learned and learned < WINDOW * 4
    assert guard.store.state("quiet-window").learned_window == learned
    assert MODEL not in guard.limits.as_mapping()  # this session's, not the process's


def test_streamed_runs_recover_too(guard: ContextGuard) -> None:
    model = WindowModel(WINDOW, steps=12)
    guard.overrides[MODEL] = WINDOW * 4  # the filter lets an overflow through once
    session = GuardedSession(guard, "streamed", model=MODEL, max_tokens=500)
    wrapped = session.wrap(model)
    agent = Agent(name="reader", instructions="You read files.", tools=[read_file],
                  model=wrapped, model_settings=ModelSettings(max_tokens=500))

    async def scenario() -> Any:
        result = Runner.run_streamed(agent, "Read every module.", session=session,
                                     run_config=session.run_config(), max_turns=30)
        async for _ in result.stream_events():
            pass
        return result.final_output

    assert run(scenario()) == "All files read."
    assert model.overflows == 1 and wrapped.recoveries == 1
    assert session.input_filter.calibration.samples == model.calls  # usage from the stream


class DenseModel(WindowModel):
    """A provider whose tokenizer counts 1.6x what the fake's (and about what the guard's
    heuristic) counts: its window is reached far sooner than estimated."""

    DENSITY = 1.6

    async def get_response(self, system_instructions: str | None, input: Any,
                           model_settings: Any, tools: list[Any], *args: Any,
                           **kwargs: Any) -> ModelResponse:
        prompt = int(count(system_instructions, input, tools) * self.DENSITY)
        if prompt + (model_settings.max_tokens or 0) > self.window:
            self.overflows += 1
            raise overflow_error(self.window, prompt)
        window, self.window = self.window, 10**9  # the check above is this provider's
        try:
            answer = await super().get_response(system_instructions, input, model_settings,
                                                tools, *args, **kwargs)
        finally:
            self.window = window
        self.dense_largest = max(getattr(self, "dense_largest", 0), prompt)
        answer.usage = Usage(requests=1, input_tokens=prompt, output_tokens=20,
                             total_tokens=prompt + 20)
        return answer


@pytest.mark.parametrize("learn", [True, False])
def test_the_filter_learns_a_denser_tokenizer_from_usage(guard: ContextGuard,
                                                         learn: bool) -> None:
    model = DenseModel(WINDOW, steps=24)
    session = GuardedSession(guard, f"dense-{learn}", model=MODEL, max_tokens=500)
    wrapped = session.wrap(model)
    if not learn:
        session.input_filter.calibrate = lambda usage: None  # type: ignore[method-assign]
    agent = Agent(name="reader", instructions="You read files.", tools=[read_file],
                  model=wrapped, model_settings=ModelSettings(max_tokens=500))
    result = run(Runner.run(agent, "Read every module.", session=session,
                            run_config=session.run_config(), max_turns=60))
    assert result.final_output == "All files read."
    if learn:  # learned from the first responses, before the window was ever reached
        assert model.overflows == 0 and wrapped.recoveries == 0
        assert model.dense_largest + 500 <= WINDOW  # type: ignore[attr-defined]
        assert session.input_filter.calibration.ratio > 1.3
    else:  # every call past the window overflows and is recovered
        assert model.overflows > 3 and wrapped.recoveries == model.overflows


class UnwordedModel(WindowModel):
    """A server whose real window is a little smaller than the one the guard believes and
    whose refusal names neither a window nor an overflow."""

    async def get_response(self, system_instructions: str | None, input: Any,
                           model_settings: Any, tools: list[Any], *args: Any,
                           **kwargs: Any) -> ModelResponse:
        if count(system_instructions, input, tools) + (model_settings.max_tokens or 0) \
                > self.window:
            self.overflows += 1
            body = {"error": {"message": "Request could not be processed by the inference "
                              "engine.", "type": "invalid_request_error", "code": None}}
            request = httpx.Request("POST", "https://llm.internal/v1/responses")
            raise openai.BadRequestError(
                f"Error code: 400 - {body}", body=body["error"],
                response=cast(Any, httpx.Response(400, request=request, json=body)))
        return await super().get_response(system_instructions, input, model_settings, tools,
                                           *args, **kwargs)


@pytest.mark.parametrize("net", [True, False])
def test_an_unworded_refusal_of_a_nearly_full_input_is_recovered(
        real_redis: Any, key_prefix: str, net: bool) -> None:
    policy = CompactionPolicy(unrecognised_overflow_at=0.9 if net else None)
    guard = ContextGuard(SessionStore(real_redis, StoreConfig(key_prefix=key_prefix)),
                         overrides={MODEL: WINDOW}, policy=policy)
    model = UnwordedModel(int(WINDOW * 0.94), steps=24)
    session = GuardedSession(guard, f"unworded-{net}", model=MODEL, max_tokens=500)
    wrapped = session.wrap(model)
    agent = Agent(name="reader", instructions="You read files.", tools=[read_file],
                  model=wrapped, model_settings=ModelSettings(max_tokens=500))
    running = Runner.run(agent, "Read every module.", session=session,
                         run_config=session.run_config(), max_turns=60)
    if not net:
        with pytest.raises(openai.BadRequestError, match="inference engine"):
            run(running)
        return
    assert run(running).final_output == "All files read."
    assert model.overflows >= 1 and wrapped.recoveries == model.overflows


def test_without_the_guard_the_same_run_overflows(guard: ContextGuard) -> None:
    model = WindowModel(WINDOW, steps=24)
    agent = Agent(name="reader", instructions="You read files.", tools=[read_file],
                  model=model, model_settings=ModelSettings(max_tokens=500))
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        run(Runner.run(agent, "Read every module.", run_config=RunConfig(), max_turns=40))


def test_a_second_overflow_reaches_the_caller(guard: ContextGuard) -> None:
    class AlwaysOver(WindowModel):
        async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
            self.overflows += 1
            raise overflow_error(1000, 5000)

    model = AlwaysOver(WINDOW, steps=0)
    session = GuardedSession(guard, "hopeless", model=MODEL)
    run(session.add_items(cast(Any, [{"role": "user" if i % 2 == 0 else "assistant",
                                        "content": f"turn {i} " + "word " * 100}
                                       for i in range(8)])))
    wrapped = session.wrap(model)
    agent = Agent(name="a", instructions="x", model=wrapped)
    with pytest.raises(openai.BadRequestError):
        run(Runner.run(agent, "hi", session=session, run_config=session.run_config()))
    assert model.overflows == 2 and wrapped.recoveries == 1


def test_other_errors_are_not_retried(guard: ContextGuard) -> None:
    class RateLimited(WindowModel):
        async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
            self.calls += 1
            raise ValueError("rate limit reached for requests")

    model = RateLimited(WINDOW, steps=0)
    session = GuardedSession(guard, "other", model=MODEL)
    agent = Agent(name="a", instructions="x", model=session.wrap(model))
    with pytest.raises(ValueError, match="rate limit"):
        run(Runner.run(agent, "hi", session=session))
    assert model.calls == 1


# -- the Session protocol ------------------------------------------------------------------
TURN = [
    {"role": "user", "content": "list files"},
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "ls"}]},
    {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
     "content": [{"type": "output_text", "text": "Listing.", "annotations": []}]},
    {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}", "id": "fc_1"},
    {"type": "function_call", "call_id": "c2", "name": "pwd", "arguments": "{}", "id": "fc_2"},
    {"type": "function_call_output", "call_id": "c1", "output": "a.py b.py"},
    {"type": "function_call_output", "call_id": "c2", "output": "/src"},
    {"role": "assistant", "content": "Two files in /src."},
]


def test_items_round_trip_through_messages() -> None:
    messages = items_to_messages(TURN)
    assert [m.role for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert [c.id for c in messages[1].tool_calls] == ["c1", "c2"]  # parallel calls together
    assert messages[1].reasoning == "ls"
    assert messages_to_items(messages) == TURN


def test_media_and_developer_items_round_trip() -> None:
    items = [
        {"role": "developer", "content": "Prefer short answers."},
        {"role": "user", "content": [
            {"type": "input_text", "text": "What is on this page?"},
            {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=",
             "detail": "auto"},
            {"type": "input_file", "file_id": "file-abc", "filename": "spec.pdf"}]},
        {"type": "function_call_output", "call_id": "c9", "output": [
            {"type": "input_text", "text": "rendered"}]},
    ]
    messages = items_to_messages(items)
    assert messages[0].role == "system" and messages[0].metadata["agents_role"] == "developer"
    assert messages[1].media_count() == 2
    assert messages_to_items(messages) == items


def test_session_protocol(guard: ContextGuard) -> None:
    from agents.memory.session import Session

    session = GuardedSession(guard, "proto", model=MODEL)
    assert isinstance(session, Session)
    assert run(session.get_items()) == []
    run(session.add_items(cast(Any, TURN)))
    assert run(session.get_items()) == TURN
    assert run(session.get_items(limit=1)) == TURN[-1:]
    assert run(session.get_items(limit=2)) == TURN[-1:]  # no output without its call
    assert run(session.get_items(limit=4)) == [TURN[4], *TURN[-2:]]
    assert run(session.pop_item()) == TURN[-1]
    assert run(session.get_items()) == TURN[:-1]
    # popping one call of a two-call assistant message keeps the other
    assert run(session.pop_item()) == TURN[-2]
    assert run(session.pop_item()) == TURN[-3]
    assert run(session.pop_item()) == TURN[-4]
    raw = guard.store.messages("proto")
    assert messages_to_items(raw) == TURN[:-4]  # the log: c1 call without its output
    view = run(session.get_items())  # the view: a placeholder answers it
    assert view[:-1] == TURN[:-4] and view[-1]["call_id"] == "c1"
    run(session.clear_session())
    assert run(session.get_items()) == []
    assert run(session.pop_item()) is None


def test_an_unmappable_item_is_refused_and_nothing_is_written(guard: ContextGuard) -> None:
    session = GuardedSession(guard, "bad", model=MODEL)
    batch = [{"role": "user", "content": "click"}, {"type": "item_reference", "id": "cu_1"}]
    with pytest.raises(InvalidInput, match=r"items\[1\]\.type: cannot map item type "
                                           r"'item_reference'"):
        run(session.add_items(cast(Any, batch)))
    assert guard.store.length("bad") == 0
    with pytest.raises(InvalidInput, match=r"items\[0\]\.call_id: required"):
        run(session.add_items(cast(Any, [{"type": "function_call_output", "output": "x"}])))
    with pytest.raises(InvalidInput, match="limit"):
        run(session.get_items(limit=-1))


def test_get_items_is_the_summary_then_the_items_after_the_watermark(
        guard: ContextGuard) -> None:
    from shared.core.records import SummaryRecord

    session = GuardedSession(guard, "summarized", model=MODEL, instructions="Be brief.")
    run(session.add_items(cast(Any, TURN)))
    run(session.add_items(cast(Any, TURN)))
    record = SummaryRecord(watermark=5, kind="llm", text="## Goal\nList files.", tokens=12)
    version = guard.store.state("summarized").version
    assert guard.store.commit_summary("summarized", record, version).ok  # as a worker would
    items = run(session.get_items())
    assert items[0]["role"] == "system" and "List files." in items[0]["content"]
    assert not items[0]["content"].startswith("Be brief.")  # the runner sends instructions
    assert items[1:] == TURN  # the second turn, from the watermark on


def test_for_agent_counts_instructions_and_tools(guard: ContextGuard) -> None:
    agent = Agent(name="a", instructions="Read files.", tools=[read_file])
    session = GuardedSession.for_agent(guard, "fa", agent, model=MODEL, max_tokens=100)
    assert session.instructions == "Read files."
    assert session.tools and session.tools[0]["name"] == "read_file"
    run(session.add_items(cast(Any, TURN[:1])))
    assert run(session.get_items()) == TURN[:1]  # the instructions are the runner's to send
    assert session.last_view.report.budget.tools > 0


def test_the_filter_leaves_input_alone_within_budget(guard: ContextGuard) -> None:
    budget = InputBudget(guard, model=MODEL, max_tokens=500)
    fitted = budget.fit(TURN, "sys", [])
    assert not fitted.truncated and fitted.items == TURN and budget.truncations == 0
    forced = budget.fit(TURN, "sys", [], force_ratio=0.01)
    assert forced.truncated


# -- get_items(limit) ------------------------------------------------------------------------
def test_a_limit_above_the_history_returns_all_of_it_to_a_real_run(guard: ContextGuard) -> None:
    """SessionSettings(limit=8) on a 5-item history: the model gets all five (not the last
    three a negative slice start gave)."""
    from agents.memory import SessionSettings
    from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
    from openai import AsyncOpenAI

    from workers.harness.fakes.openai_server import FakeOpenAIServer

    session = GuardedSession(guard, "limit-run")
    history = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"}
               for i in range(5)]
    run(session.add_items(cast(Any, history)))
    assert run(session.get_items(limit=8)) == history
    assert run(session.get_items(limit=3)) == history[-3:]

    async def ask() -> list[dict[str, Any]]:
        with FakeOpenAIServer(window=100_000, responder=lambda req: {"content": "done"},
                              model="gpt-4o") as server:
            client = AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
            agent = Agent(name="a", instructions="SYS", model=OpenAIChatCompletionsModel(
                model="gpt-4o", openai_client=client))
            await Runner.run(agent, "what did I say first?", session=session,
                             run_config=session.run_config(
                                 session_settings=SessionSettings(limit=8)))
            return cast(list[dict[str, Any]], server.requests[-1].body["messages"])

    sent = run(ask())
    assert [m["content"] for m in sent[1:-1]] == [h["content"] for h in history]


def test_a_limit_keeps_the_newest_outputs_with_their_calls(guard: ContextGuard) -> None:
    session = GuardedSession(guard, "limit-pairs", model=MODEL)
    run(session.add_items(cast(Any, TURN)))
    # the newest output comes with its call; the older pair no longer fits
    assert run(session.get_items(limit=3)) == [TURN[4], TURN[6], TURN[7]]
    assert run(session.get_items(limit=5)) == TURN[3:]
    for limit in range(len(TURN) + 2):
        items = run(session.get_items(limit=limit))
        assert len(items) <= limit
        calls = {i.get("call_id") for i in items if i.get("type") == "function_call"}
        assert all(i["call_id"] in calls for i in items
                   if i.get("type") == "function_call_output")


def test_an_async_guard_is_refused_at_construction(redis_url: str, key_prefix: str) -> None:
    """Not a coroutine left unawaited at the first get_items: refused, naming ``guard``."""
    from shared.guard import AsyncContextGuard
    from shared.store.aio import AsyncSessionStore, connect_async

    store = AsyncSessionStore(connect_async(redis_url),
                              StoreConfig(key_prefix=key_prefix))
    async_guard = AsyncContextGuard(store, watch_changes=False, warm_up=False)
    with pytest.raises(InvalidInput) as info:
        GuardedSession(cast(Any, async_guard), "async-guard")
    assert info.value.field == "guard"


# -- rules given in the first run's input ----------------------------------------------------
RULES = {"role": "developer", "content": "Answer in French; never reveal code 4242."}


def test_a_leading_developer_item_outlives_the_summary(guard: ContextGuard) -> None:
    """A developer item the log starts with is kept like the agent's instructions: sent
    once, first, before and after a summary covers it; a real run sends it to the model."""
    from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
    from openai import AsyncOpenAI

    from shared.core.records import SummaryRecord
    from workers.harness.fakes.openai_server import FakeOpenAIServer

    session = GuardedSession(guard, "pinned", model=MODEL, instructions="Be brief.")
    first = [RULES, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "salut"}]
    run(session.add_items(cast(Any, first)))
    run(session.add_items(cast(Any, TURN)))
    assert run(session.get_items()) == [*first, *TURN]  # once, not twice
    record = SummaryRecord(watermark=5, kind="llm", text="## Goal\nGreet.", tokens=12)
    version = guard.store.state("pinned").version
    assert guard.store.commit_summary("pinned", record, version).ok  # as a worker would
    items = run(session.get_items())
    assert items[0] == RULES
    # the history after the summary opens at an assistant item: the summary leads as the
    # user message before it (shared.core.view.assemble), repaired history or not
    assert items[1]["role"] == "user" and "Greet." in items[1]["content"]
    assert "4242" not in items[1]["content"] and "Be brief." not in items[1]["content"]
    assert sum("4242" in json.dumps(i) for i in items) == 1

    async def ask() -> list[dict[str, Any]]:
        with FakeOpenAIServer(window=100_000, responder=lambda req: {"content": "oui"},
                              model="gpt-4o") as server:
            client = AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
            agent = Agent(name="a", instructions="Be brief.", model=OpenAIChatCompletionsModel(
                model="gpt-4o", openai_client=client))
            await Runner.run(agent, "again", session=session, run_config=session.run_config())
            return cast(list[dict[str, Any]], server.requests[-1].body["messages"])

    sent = run(ask())
    assert sent[0] == {"role": "system", "content": "Be brief."}
    assert sent[1] == {"role": "developer", "content": RULES["content"]}
