"""Hosted (server-side) tool results are counted as sent, and dropped consistently.

A hosted tool's call and result (web search, code interpreter, hosted MCP) go back to the
provider as it returned them, while the log keeps a clipped note of them as the message's
reasoning. The guard counted the note: a 30k-character result at ~600 tokens against
~9,400 sent, so an over-window request got through. Each adapter now records the tokens
of what it sends beyond the note (metadata ``extra_tokens``), and sends a hosted part only
while its note is in the view message's reasoning. Real frameworks (pydantic-ai, the Agents
SDK, LangChain) with fake models; the wire side is counted with o200k itself.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import secrets
from collections.abc import Sequence
from typing import Any

import fakeredis
import pytest

pytest.importorskip("pydantic_ai")
pytest.importorskip("agents")
pytest.importorskip("langchain.agents")

from agents import Agent as SdkAgent
from agents import Model, ModelResponse, Runner, Usage, set_tracing_disabled
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from openai.types.responses import ResponseOutputMessage, ResponseOutputText
from pydantic_ai import Agent
from pydantic_ai import messages as pm
from pydantic_ai.models.function import AgentInfo, FunctionModel

from shared.core.config import StoreConfig
from shared.core.messages import Message
from shared.core.tokens import DEFAULT_COUNTER, EXTRA_TOKENS, HeuristicCounter, extra_tokens
from shared.core.tokens_exact import TiktokenCounter
from shared.guard import ContextGuard
from shared.integrations import agents_items, langchain_messages
from shared.integrations.agents_sdk import GuardedSession
from shared.integrations.langchain import ContextGuardMiddleware
from shared.integrations.pydantic_ai import ContextGuardCapability
from shared.integrations.pydantic_ai_parts import rebuilt_response, response_message
from shared.store.sessions import SessionStore
from workers.harness.transcripts import DATA_DIR

set_tracing_disabled(True)
TOKENIZER = DATA_DIR / "tokenizers"
if not (TOKENIZER / "o200k_base.tiktoken").exists():
    pytest.skip(f"needs the o200k file in {TOKENIZER}", allow_module_level=True)
O200K = TiktokenCounter(encoding_dir=TOKENIZER)

PAGE = ("the weather in Paris forecast is expected to remain sunny with temperatures "
        "around 24 degrees Celsius during the afternoon while a light breeze from the "
        "north-west keeps humidity at 45% and no rain is likely before Thursday, when "
        "a cold front may bring showers; visitors should check local updates at "
        "meteo-france.fr or the city's official site for alerts and events")
WORDS = PAGE.split()


def prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def web_results(n: int = 15) -> list[dict[str, Any]]:
    """Anthropic's ``web_search_tool_result`` content: ``n`` results, each with its
    encrypted page content (sent back verbatim)."""
    rng = random.Random(n)
    return [{"type": "web_search_result", "url": f"https://example.com/paris/{i}",
             "title": f"Paris weather, page {i}: {prose(rng, 8)}", "page_age": "2 days ago",
             "encrypted_content": base64.b64encode(rng.randbytes(1500)).decode()}
            for i in range(n)]


def search_sources(n: int = 20) -> list[dict[str, Any]]:
    rng = random.Random(n)
    return [{"type": "url", "url": f"https://news.example.org/{rng.randrange(10**6)}/paris-"
                                  f"weather-{i}"} for i in range(n)]


def interpreter_logs() -> str:
    rng = random.Random(7)
    rows = [f"{i:>4}  {rng.uniform(-5, 35):8.3f}  {rng.randrange(1000):>5}  {prose(rng, 4)}"
            for i in range(200)]
    return "   day      temp  count  note\n" + "\n".join(rows)


def mcp_output() -> str:
    """A hosted MCP tool's output of ~30k characters (issue records as JSON text)."""
    rng = random.Random(30)
    issues = [{"number": 1000 + i, "title": prose(rng, 9), "state": rng.choice(["open", "closed"]),
               "labels": rng.sample(["bug", "docs", "perf", "ui", "api"], 2),
               "body": prose(rng, 40)} for i in range(78)]
    return json.dumps(issues, indent=1)


# -- the three adapters' hosted shapes -------------------------------------------------------
def pydantic_parts(kind: str) -> list[Any]:
    if kind == "web_search":
        args: dict[str, Any] = {"query": "weather in Paris"}
        content: Any = web_results()
        name = "web_search"
    elif kind == "code":
        args, content, name = ({"code": "print(table)", "container_id": "cntr_1"},
                               {"status": "completed", "logs": [interpreter_logs()]},
                               "code_execution")
    else:
        args, content, name = ({"action": "call_tool", "tool_name": "list_issues",
                                "tool_args": {"repo": "acme/app"}}, mcp_output(),
                               "mcp_server:github")
    return [pm.NativeToolCallPart(name, args, tool_call_id=f"{kind}_1", provider_name="anthropic"),
            pm.NativeToolReturnPart(name, content, tool_call_id=f"{kind}_1",
                                    provider_name="anthropic")]


def pydantic_sent(parts: Sequence[Any]) -> list[Any]:
    """What goes back for native parts: the call's arguments and the result's content
    (Anthropic's blocks hold them; OpenAI re-reads them by the item's id)."""
    return [p.args_as_dict() if isinstance(p, pm.NativeToolCallPart)
            else p.content for p in parts if not isinstance(p, pm.TextPart)]


def agents_item(kind: str) -> dict[str, Any]:
    if kind == "web_search":
        return {"id": "ws_1", "type": "web_search_call", "status": "completed",
                "action": {"type": "search", "query": "weather in Paris",
                           "sources": search_sources()}}
    if kind == "code":
        return {"id": "ci_1", "type": "code_interpreter_call", "status": "completed",
                "code": "print(table)", "container_id": "cntr_1",
                "outputs": [{"type": "logs", "logs": interpreter_logs()}]}
    return {"id": "mcp_1", "type": "mcp_call", "server_label": "github", "name": "list_issues",
            "arguments": '{"repo": "acme/app"}', "output": mcp_output()}


def langchain_blocks(kind: str) -> list[Any]:
    if kind == "web_search":
        return [{"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
                 "input": {"query": "weather in Paris"}},
                {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1",
                 "content": web_results()}]
    if kind == "code":
        return [{"type": "server_tool_use", "id": "srvtoolu_2", "name": "code_execution",
                 "input": {"code": "print(table)"}},
                {"type": "code_execution_tool_result", "tool_use_id": "srvtoolu_2",
                 "content": {"type": "code_execution_result", "stdout": interpreter_logs(),
                             "stderr": "", "return_code": 0}}]
    return [{"type": "mcp_tool_use", "id": "mcptoolu_1", "name": "list_issues",
             "server_name": "github", "input": {"repo": "acme/app"}},
            {"type": "mcp_tool_result", "tool_use_id": "mcptoolu_1", "is_error": False,
             "content": [{"type": "text", "text": mcp_output()}]}]


def read(value: Any) -> int:
    """o200k tokens of a JSON value as the model reads it: the provider parses the request,
    so a long string (a tool's output) is read as it is, not JSON-escaped; the rest as JSON."""
    texts: list[str] = []

    def out(v: Any) -> Any:
        if isinstance(v, str) and len(v) >= 64:
            texts.append(v)
            return ""
        if isinstance(v, dict):
            return {k: out(x) for k, x in v.items()}
        return [out(x) for x in v] if isinstance(v, list) else v
    skeleton = out(value)
    return O200K.text(json.dumps(skeleton)) + sum(O200K.text(t) for t in texts)


KINDS = ["web_search", "code", "mcp"]
TEXT = "It is sunny in Paris."


def neutral(adapter: str, kind: str) -> tuple[Message, int]:
    """(the message an adapter records for a turn with a hosted tool, the o200k tokens of
    what it sends back for that turn)."""
    if adapter == "pydantic-ai":
        parts = [*pydantic_parts(kind), pm.TextPart(TEXT)]
        return response_message(pm.ModelResponse(parts=parts), "x"), \
            O200K.text(TEXT) + read(pydantic_sent(parts))
    if adapter == "agents":
        item = agents_item(kind)
        (message,) = agents_items.items_to_messages([item, {"role": "assistant", "content": TEXT}])
        return message, O200K.text(TEXT) + read(item)
    blocks = langchain_blocks(kind)
    (message,) = langchain_messages.to_neutral([AIMessage(
        content=[*blocks, {"type": "text", "text": TEXT}])])
    return message, O200K.text(TEXT) + read(blocks)


ADAPTERS = ["pydantic-ai", "agents", "langchain"]


def ratio(counter: Any, adapter: str, kind: str) -> float:
    message, sent = neutral(adapter, kind)
    return float(counter.message(message)) / sent


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_hosted_result_is_counted_as_what_goes_back(adapter: str, kind: str) -> None:
    """The heuristic (with its 5% margin) and the exact counter both count at least what
    o200k makes of what goes back, and not wildly more."""
    heuristic = ratio(DEFAULT_COUNTER, adapter, kind)
    assert 0.97 <= heuristic <= 1.35, heuristic
    assert 0.97 <= ratio(O200K, adapter, kind) <= 1.35
    message, _ = neutral(adapter, kind)
    # Anthropic's tokenizer counts ~30% more: the figure is scaled like text
    anthropic = HeuristicCounter("anthropic").message(message)
    assert anthropic >= 1.25 * DEFAULT_COUNTER.message(message) - 60


# -- through each framework's run: the store's count of the turn vs what the model got --------
@pytest.fixture
def store() -> SessionStore:
    return SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="t" + secrets.token_hex(4)))


def test_pydantic_ai_run_counts_the_native_result_as_sent(store: SessionStore) -> None:
    parts = [*pydantic_parts("mcp"), pm.TextPart(TEXT)]
    requests: list[list[pm.ModelMessage]] = []

    def answer(messages: list[pm.ModelMessage], info: AgentInfo) -> pm.ModelResponse:
        requests.append(list(messages))
        return pm.ModelResponse(parts=list(parts))

    guard = ContextGuard(store, overrides={"fn": 128_000})
    agent = Agent(FunctionModel(answer, model_name="fn"), instructions="be brief",
                  capabilities=[ContextGuardCapability(guard, session_id="pai")])
    first = agent.run_sync("Open issues?")
    agent.run_sync("Which are bugs?", message_history=first.all_messages())
    (sent,) = [m for m in requests[1] if isinstance(m, pm.ModelResponse)]
    assert len(json.dumps(pydantic_sent(sent.parts))) > 30_000  # the whole result went back
    counted = store.range_tokens("pai", 1, 2)
    assert counted >= O200K.text(TEXT) + read(pydantic_sent(sent.parts))
    assert store.messages("pai", 1, 2)[0].metadata[EXTRA_TOKENS] > 5_000


class Hosted(Model):
    """Each call: a hosted MCP call, then the answer; keeps what it was sent."""

    def __init__(self) -> None:
        self.inputs: list[list[dict[str, Any]]] = []

    async def get_response(self, system_instructions: str | None, input: Any, *args: Any,
                           **kwargs: Any) -> ModelResponse:
        self.inputs.append([dict(i) if isinstance(i, dict) else i.model_dump(exclude_none=True)
                            for i in input])
        n = len(self.inputs)
        from openai.types.responses.response_output_item import McpCall
        call = McpCall.model_validate({**agents_item("mcp"), "id": f"mcp_{n}"})
        text = ResponseOutputMessage(id=f"msg_{n}", type="message", role="assistant",
                                     status="completed", content=[ResponseOutputText(
                                         type="output_text", text=TEXT, annotations=[])])
        return ModelResponse(output=[call, text], response_id=f"resp_{n}",
                             usage=Usage(requests=1, input_tokens=50, output_tokens=5,
                                         total_tokens=55))

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def test_agents_sdk_run_counts_the_hosted_item_as_sent(store: SessionStore) -> None:
    guard = ContextGuard(store)
    model = Hosted()
    agent = SdkAgent(name="a", instructions="be brief")
    session = GuardedSession.for_agent(guard, "sdk", agent, model="gpt-4o")
    agent.model = session.wrap(model)

    async def runs() -> None:
        for text in ("Open issues?", "Which are bugs?"):
            await Runner.run(agent, text, session=session, run_config=session.run_config())

    asyncio.run(runs())
    back = [i for i in model.inputs[1] if i.get("type") == "mcp_call"]
    assert len(back) == 1 and len(back[0]["output"]) > 30_000
    assert store.range_tokens("sdk", 1, 2) >= O200K.text(TEXT) + read(back[0])


class Replies(FakeMessagesListChatModel):
    sent: list[list[BaseMessage]] = []

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        self.sent.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


@pytest.mark.parametrize("signed", [False, True], ids=["plain", "signed-thinking"])
def test_langchain_run_counts_the_server_blocks_as_sent(store: SessionStore,
                                                        signed: bool) -> None:
    """With Anthropic's signed thinking the notes are kept in metadata (the reasoning must
    stay the signed text): they were not counted at all."""
    thinking = [{"type": "thinking", "thinking": "search it", "signature": "sig=="}] \
        if signed else []
    blocks = [*thinking, *langchain_blocks("web_search"), {"type": "text", "text": TEXT}]
    model = Replies(responses=[AIMessage(content=blocks, id="ai-1"), AIMessage("More.")],
                    sent=[])
    guard = ContextGuard(store, overrides={"fake": 128_000})
    agent = create_agent(model, [], system_prompt="be brief", checkpointer=InMemorySaver(),
                         middleware=[ContextGuardMiddleware(guard, model="fake")])
    config: Any = {"configurable": {"thread_id": "lc"}}
    for text in ("Weather in Paris?", "Tomorrow?"):
        agent.invoke({"messages": [HumanMessage(text)]}, config)
    (back,) = [m for m in model.sent[1] if isinstance(m, AIMessage)]
    assert back.content == blocks  # sent back as it was
    assert store.range_tokens("lc", 1, 2) >= read(blocks)


# -- a cleared note: what goes back shrinks with the count ------------------------------------
def cleared(message: Message) -> Message:
    """``message`` as a stage that cleared its notes leaves it (figure dropped with them)."""
    meta = {k: v for k, v in message.metadata.items() if k != EXTRA_TOKENS}
    return message.model_copy(update={"reasoning": None, "metadata": meta})


def test_pydantic_ai_drops_the_native_pair_whose_note_was_cleared() -> None:
    parts = [*pydantic_parts("web_search"), *pydantic_parts("mcp"), pm.TextPart(TEXT)]
    original = pm.ModelResponse(parts=parts, provider_name="anthropic")
    message = response_message(original, "x")
    whole = rebuilt_response(message.model_copy(update={"content": TEXT + "!"}), original)
    native = [pm.NativeToolCallPart, pm.NativeToolReturnPart]
    assert [type(p) for p in whole.parts[:4]] == native * 2

    gone = rebuilt_response(cleared(message), original)
    assert [type(p) for p in gone.parts] == [pm.TextPart]
    assert DEFAULT_COUNTER.message(cleared(message)) < 40
    # one note cleared (the MCP result's): its call and result go, the search stays
    notes = (message.reasoning or "").split("\n")
    kept = message.model_copy(update={"reasoning": "\n".join(
        n for n in notes if not n.startswith("[mcp_server:github result"))})
    partial = rebuilt_response(kept, original)
    assert [getattr(p, "tool_call_id", None) for p in partial.parts
            if not isinstance(p, pm.TextPart)] == \
        ["web_search_1", "web_search_1"]
    assert read(pydantic_sent(partial.parts)) == read(pydantic_sent(parts[:2]))


def test_agents_items_drop_the_hosted_item_whose_note_was_cleared() -> None:
    reasoning = {"id": "rs_1", "type": "reasoning", "summary": [
        {"type": "summary_text", "text": "look it up"}], "encrypted_content": "opaque"}
    items = [reasoning, agents_item("mcp"), {"role": "assistant", "content": TEXT}]
    (message,) = agents_items.items_to_messages(items)
    assert extra_tokens(message) > 5_000
    whole = agents_items.messages_to_items([message])
    assert [i.get("type") for i in whole[:2]] == ["reasoning", "mcp_call"]

    after = agents_items.messages_to_items([cleared(message)])
    assert [i.get("type", i.get("role")) for i in after] == ["assistant"]  # no orphan reasoning
    assert len(json.dumps(after)) < len(json.dumps(whole)) // 20


def test_langchain_rebuilds_a_changed_reply_without_its_server_blocks() -> None:
    blocks = [*langchain_blocks("mcp"), {"type": "text", "text": TEXT}]
    state: list[Any] = [HumanMessage("issues?", id="h"), AIMessage(content=blocks, id="ai")]
    _, reply = langchain_messages.to_neutral(state)
    view = type("View", (), {"messages": [reply]})()
    (same,) = langchain_messages.from_view(view, state, None)[1]
    assert same is state[1]
    view.messages = [cleared(reply)]
    (rebuilt,) = langchain_messages.from_view(view, state, None)[1]
    assert rebuilt.text == TEXT and "mcp_tool_result" not in json.dumps(rebuilt.content)
    assert DEFAULT_COUNTER.message(cleared(reply)) < 40


# -- the figure itself -------------------------------------------------------------------------
@pytest.mark.parametrize("value", [True, -5, float("nan"), "9000", None, [1]])
def test_a_figure_that_is_not_a_positive_number_adds_nothing(value: Any) -> None:
    plain = Message(role="assistant", content=TEXT)
    odd = plain.model_copy(update={"metadata": {EXTRA_TOKENS: value}})
    assert DEFAULT_COUNTER.message(odd) == DEFAULT_COUNTER.message(plain)
    assert O200K.message(odd) == O200K.message(plain)


def test_a_huge_figure_is_capped_and_a_stored_message_keeps_it() -> None:
    huge = Message(role="assistant", content=TEXT, metadata={EXTRA_TOKENS: 10**300})
    assert 10**8 <= DEFAULT_COUNTER.message(huge) < 2 * 10**8
    again = Message.from_json(huge.model_copy(update={"metadata": {EXTRA_TOKENS: 1234}})
                              .to_json())
    assert DEFAULT_COUNTER.message(again) > 1234


def test_a_generated_image_counts_as_an_image_not_as_its_base64() -> None:
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + random.Random(1).randbytes(400_000)).decode()
    item = {"id": "ig_1", "type": "image_generation_call", "status": "completed",
            "result": png}
    (message,) = agents_items.items_to_messages([item, {"role": "assistant", "content": TEXT}])
    assert 765 <= DEFAULT_COUNTER.message(message) <= 1_100  # the note and one image


def test_pydantic_ai_requests_stay_inside_the_window_with_hosted_results(
        store: SessionStore) -> None:
    """Each answer carries a hosted MCP result of ~8k tokens; with a 24k window the guard
    must drop older turns before the request outgrows it (it let 4+ of them through, each
    counted as its ~600-token note, and the provider refused the request)."""
    parts = [*pydantic_parts("mcp"), pm.TextPart(TEXT)]
    requests: list[list[pm.ModelMessage]] = []

    def answer(messages: list[pm.ModelMessage], info: AgentInfo) -> pm.ModelResponse:
        requests.append(list(messages))
        return pm.ModelResponse(parts=list(parts))

    guard = ContextGuard(store, overrides={"fn": 24_000})
    agent = Agent(FunctionModel(answer, model_name="fn"), instructions="be brief",
                  capabilities=[ContextGuardCapability(guard, session_id="window")])
    history: list[pm.ModelMessage] = []
    for n in range(6):
        history = agent.run_sync(f"Issues, page {n}?", message_history=history).all_messages()
    for sent in requests:
        hosted = sum(read(pydantic_sent(m.parts)) for m in sent
                     if isinstance(m, pm.ModelResponse))
        assert hosted < 24_000
    assert sum(isinstance(m, pm.ModelResponse) for m in requests[-1]) < 5
