"""The pydantic-ai capability, driven through a real ``Agent`` with ``FunctionModel``.

The model is pydantic-ai's own ``FunctionModel`` around ``WindowedModel``
(examples/pydantic_ai_agent.py), which enforces a context window and raises
``ModelHTTPError`` 400 with OpenAI's overflow text past it. Nothing of
pydantic-ai is mocked; the compaction side is the real guard on a real Redis
(random key prefix), summaries come from the embedded stack's Celery worker.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import fakeredis
import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import messages as pm

from examples.pydantic_ai_agent import WindowedModel, build_agent, question
from shared.core.config import StoreConfig
from shared.core.errors import InvalidInput
from shared.core.records import SummaryRecord
from shared.core.view import SUMMARY_OPEN
from shared.guard import ContextGuard
from shared.integrations.pydantic_ai import from_view, to_neutral
from shared.store.sessions import SessionStore

MODEL = "windowed-fake"


def has_summary(request: list[pm.ModelMessage]) -> bool:
    return any(SUMMARY_OPEN in str(getattr(p, "content", "")) for m in request for p in m.parts)


def converse(agent: Any, turns: int, start: int = 0,
             history: list[pm.ModelMessage] | None = None,
             after: Any = None) -> list[pm.ModelMessage]:
    history = list(history or [])
    for i in range(start, start + turns):
        history = agent.run_sync(question(i), message_history=history).all_messages()
        if after is not None:
            after()
    return history


@pytest.fixture
def fake_store() -> SessionStore:
    return SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="t" + secrets.token_hex(4)))


@pytest.fixture
def stack(redis_url: str, key_prefix: str) -> Iterator[Any]:
    from workers.harness.stack.demo import choose_backends, open_stack
    from workers.settings import Settings

    settings = Settings(redis_url=redis_url, key_prefix=key_prefix)
    with open_stack(settings, choose_backends(settings, "embedded"), concurrency=1) as found:
        yield found
        for key in found.store.redis.scan_iter(match=f"{key_prefix}:*"):
            found.store.redis.delete(key)


@pytest.mark.redis
@pytest.mark.celery
def test_a_session_longer_than_the_window_never_overflows_and_sees_worker_summaries(
        stack: Any) -> None:
    guard = ContextGuard(stack.store, stack.enqueuer, overrides={MODEL: 3000})
    model = WindowedModel(window=3000)
    agent = build_agent(guard, model, session_id="pai-long")
    history = converse(agent, 30, after=lambda: stack.wait_idle("pai-long", timeout=20))
    # View, not delete: the run history keeps every message pydantic-ai made.
    assert len(history) == 4 * 30
    assert history[0].parts[-1].content == question(0)
    assert model.overflows == 0 and max(model.counts) <= 3000
    assert sum(len(str(getattr(p, "content", ""))) for m in history
               for p in m.parts) > 3 * 3000 * 4  # chars: over three windows
    assert stack.store.length("pai-long") == len(history)
    assert any(s.kind != "truncation" for s in stack.store.summaries("pai-long"))
    assert all(has_summary(r) for r in model.requests[-5:])


def test_a_provider_overflow_is_recovered_and_retried_once(fake_store: SessionStore) -> None:
    guard = ContextGuard(fake_store, overrides={MODEL: 40_000})  # believes 40k; the model has 3k
    model = WindowedModel(window=3000)
    agent = build_agent(guard, model, session_id="pai-recover")
    history = converse(agent, 14)
    assert model.overflows >= 1
    assert len(history) == 4 * 14
    assert fake_store.state("pai-recover").learned_window == 3000
    assert max(model.counts) <= 3000


def test_the_conversation_id_is_the_default_session(fake_store: SessionStore) -> None:
    agent = build_agent(ContextGuard(fake_store), WindowedModel())
    first = agent.run_sync(question(0))
    agent.run_sync(question(1), message_history=first.all_messages())
    assert first.conversation_id
    assert fake_store.length(first.conversation_id) == 8


def test_other_errors_propagate_and_record_nothing(fake_store: SessionStore) -> None:
    model = WindowedModel()
    agent = build_agent(ContextGuard(fake_store), model, session_id="pai-error")
    history = converse(agent, 1)
    model.fail = RuntimeError("rate limited, not an overflow")
    with pytest.raises(RuntimeError, match="rate limited"):
        agent.run_sync(question(1), message_history=history)
    assert fake_store.length("pai-error") == 4


def test_async_runs_with_the_threaded_stopgap(fake_store: SessionStore) -> None:
    """agent.run (async). STOPGAP: no shared.guard.AsyncContextGuard yet, so the sync guard
    runs through asyncio.to_thread (ThreadedAsyncGuard)."""
    model = WindowedModel(window=3000)
    agent = build_agent(ContextGuard(fake_store, overrides={MODEL: 40_000}), model,
                        session_id="pai-async")

    async def drive() -> list[pm.ModelMessage]:
        history: list[pm.ModelMessage] = []
        for i in range(12):
            history = (await agent.run(question(i), message_history=history)).all_messages()
        return history

    assert len(asyncio.run(drive())) == 48
    assert model.overflows >= 1 and max(model.counts) <= 3000


# -- bad input -------------------------------------------------------------------------------
def test_a_history_that_does_not_continue_the_session_is_refused(
        fake_store: SessionStore) -> None:
    agent = build_agent(ContextGuard(fake_store), WindowedModel(), session_id="pai-gap")
    converse(agent, 2)
    with pytest.raises(InvalidInput) as info:
        agent.run_sync(question(5))  # no message_history: not the session's continuation
    assert info.value.field == "message_history"
    assert fake_store.length("pai-gap") == 8


@dataclass
class Hologram:
    part_kind: str = "hologram"


def test_a_part_it_cannot_map_is_named_and_nothing_is_written(
        fake_store: SessionStore) -> None:
    agent = build_agent(ContextGuard(fake_store), WindowedModel(), session_id="pai-bad")
    generated = Hologram()  # a part kind of a later pydantic-ai (every kind known is mapped)
    history: list[pm.ModelMessage] = [pm.ModelRequest(parts=[pm.UserPromptPart("speak")]),
                                      pm.ModelResponse(parts=[generated])]  # type: ignore[list-item]
    with pytest.raises(InvalidInput) as info:
        agent.run_sync("again", message_history=history)
    assert info.value.field is not None
    assert info.value.field.startswith("messages[1].parts[0]")
    assert fake_store.length("pai-bad") == 0


def test_untouched_parts_go_back_as_the_originals(fake_store: SessionStore) -> None:
    history: list[Any] = [
        pm.ModelRequest(parts=[pm.SystemPromptPart("be brief"), pm.UserPromptPart("hello")]),
        pm.ModelResponse(parts=[pm.ToolCallPart("lookup", {"q": "x"}, tool_call_id="c1")]),
        pm.ModelRequest(parts=[pm.ToolReturnPart("lookup", "result", tool_call_id="c1")]),
    ]
    neutral = to_neutral(history)
    assert [m.role for m in neutral] == ["user", "assistant", "tool"]
    guard = ContextGuard(fake_store)
    guard.record_turn("pai-map", neutral[:2])
    view = guard.prepare("pai-map", "be brief", pending=neutral[2:])
    out = from_view(view, history, "be brief", "be brief")
    assert out[1] is history[1]
    assert out[0].parts[1] is history[0].parts[1]
    assert out[2].parts[0] is history[2].parts[0]
    assert out[0].parts[0].content == "be brief"


@pytest.mark.parametrize("fully_summarized", [False, True])
def test_a_new_process_continues_the_session_from_the_store(
        fake_store: SessionStore, fully_summarized: bool) -> None:
    guard = ContextGuard(fake_store, overrides={MODEL: 40_000})
    model = WindowedModel(window=40_000)
    history = converse(build_agent(guard, model, session_id="pai-restart"), 3)
    if fully_summarized:  # a summary that covers the whole log: the view holds no message
        state = fake_store.state("pai-restart")
        record = SummaryRecord(watermark=12, kind="offline", text="all of it", tokens=5,
                               source_version=state.version)
        assert fake_store.commit_summary("pai-restart", record, state.version).ok
    # a fresh capability: no cursor in memory, as after a restart
    history = converse(build_agent(guard, model, session_id="pai-restart"), 1, 3, history)
    assert len(history) == 16
    assert fake_store.length("pai-restart") == 16


# -- multimodal user content -----------------------------------------------------------------
PNG = b"\x89PNG\r\n\x1a\n0000"


def test_multimodal_user_content_is_recorded_and_the_model_gets_the_originals(
        fake_store: SessionStore) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from shared.core.messages import FilePart, ImagePart
    from shared.integrations.pydantic_ai import ContextGuardCapability

    seen: list[list[pm.ModelMessage]] = []

    def answer(messages: list[pm.ModelMessage], info: AgentInfo) -> pm.ModelResponse:
        seen.append(messages)
        return pm.ModelResponse(parts=[pm.TextPart("I see it")])

    image = pm.BinaryContent(data=PNG, media_type="image/png")
    pdf = pm.BinaryContent(data=b"%PDF-1.4", media_type="application/pdf")
    audio = pm.BinaryContent(data=b"\x00\x01", media_type="audio/wav")
    prompt: list[Any] = ["What is in these?", image, pm.CachePoint(), pdf,
                         pm.ImageUrl(url="https://example.com/a.png"),
                         pm.DocumentUrl(url="https://example.com/spec.pdf"),
                         pm.AudioUrl(url="https://example.com/a.mp3"),
                         pm.VideoUrl(url="https://example.com/v.mp4"), audio,
                         pm.UploadedFile(file_id="file-1", provider_name="openai")]
    agent = Agent(FunctionModel(answer, model_name="gpt-4o"),
                  capabilities=[ContextGuardCapability(ContextGuard(fake_store), recall=False)])
    result = agent.run_sync(prompt, conversation_id="pai-media")
    assert result.output == "I see it"
    sent = seen[-1][-1].parts[-1]
    assert isinstance(sent, pm.UserPromptPart) and sent.content == prompt  # the originals
    user = fake_store.messages("pai-media")[0]
    assert not isinstance(user.content, str)
    kinds = [type(p).__name__ for p in user.content]
    assert kinds == ["TextPart", "ImagePart", "FilePart", "ImagePart", "FilePart", "TextPart",
                     "TextPart", "TextPart", "FilePart"]  # the cache point is a marker
    first = user.content[1]
    assert isinstance(first, ImagePart) and first.media_type == "image/png" and first.data
    assert isinstance(user.content[2], FilePart) and user.content[2].media_type \
        == "application/pdf"
    assert "[audio attachment: https://example.com/a.mp3]" in user.text()
    assert "[video attachment: https://example.com/v.mp4]" in user.text()
    assert "[audio attachment: audio/wav, 2 bytes" in user.text()


def test_a_rebuilt_user_message_keeps_its_images_and_files(fake_store: SessionStore) -> None:
    from shared.core.messages import FilePart, ImagePart, Message, TextPart

    guard = ContextGuard(fake_store)
    message = Message(role="user", content=[
        TextPart(text="look"), ImagePart(data="iVBORw0KGgo=", media_type="image/png"),
        ImagePart(url="https://example.com/a.png"),
        FilePart(url="https://example.com/spec.pdf", media_type="application/pdf")])
    guard.record_turn("pai-rebuild", [message])  # untagged: no original to reuse
    out = from_view(guard.prepare("pai-rebuild"), [], "", "")
    part = out[0].parts[0]
    assert isinstance(part, pm.UserPromptPart) and not isinstance(part.content, str)
    assert part.content[0] == "look"
    assert isinstance(part.content[1], pm.BinaryContent)
    assert part.content[1].media_type == "image/png" and part.content[1].is_image
    assert part.content[2] == pm.ImageUrl(url="https://example.com/a.png")
    assert isinstance(part.content[3], pm.DocumentUrl)


def test_cancelled_runs_leave_no_request_in_flight(fake_store: SessionStore) -> None:
    """Runs cancelled mid-request (timed out) reach neither after_model_request nor
    on_model_request_error: the run's entry goes when the run ends."""
    from pydantic_ai import Agent
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from shared.integrations.pydantic_ai import ContextGuardCapability

    async def slow(messages: list[pm.ModelMessage], info: AgentInfo) -> pm.ModelResponse:
        await asyncio.sleep(10)
        return pm.ModelResponse(parts=[pm.TextPart("late")])

    capability = ContextGuardCapability(ContextGuard(fake_store), recall=False)
    agent = Agent(FunctionModel(slow, model_name="gpt-4o"), capabilities=[capability])

    async def cancel_many() -> int:
        largest = 0
        for i in range(20):
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(agent.run("hello", conversation_id=f"pai-cancel-{i}"),
                                       timeout=0.05)
            largest = max(largest, len(capability._runs))
        return largest

    assert asyncio.run(cancel_many()) == 0
    assert capability._runs == {}
