"""The Agents SDK session with the SDK's client-side tools: ``ComputerTool``,
``LocalShellTool``, ``ShellTool``, ``ApplyPatchTool`` and a ``CustomTool``.

The runner executes them in the agent's process and replays each as a call item and an
output item (``computer_call`` + ``computer_call_output``...). They were refused
(``InvalidInput`` naming ``items[i].type``), so every run of such an agent failed in the
session's ``add_items`` and the input filter. A real ``Runner.run`` over the SDK's own
``OpenAIResponsesModel``, its ``AsyncOpenAI`` client talking to a fake Responses API
(an httpx transport that keeps every request body), the guard on a real Redis: the
items are saved, sent back to the model as the runner first sent them, paired, and after
a compaction or a truncation still valid items of their call's type.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import zlib
from typing import Any, cast

import httpx
import pytest

pytest.importorskip("agents")

from agents import (
    Agent,
    ApplyPatchTool,
    ComputerTool,
    CustomTool,
    LocalShellTool,
    Runner,
    ShellTool,
    set_tracing_disabled,
)
from agents.computer import AsyncComputer
from agents.editor import ApplyPatchOperation, ApplyPatchResult
from agents.models.openai_responses import OpenAIResponsesModel
from agents.tool import ShellCommandOutput, ShellCommandRequest, ShellResult
from openai import AsyncOpenAI
from openai.types.responses import Response

from shared.core.config import StoreConfig
from shared.core.errors import InvalidInput
from shared.core.messages import ImagePart, Message
from shared.core.pairs import pairs_intact
from shared.core.repair import repair_tool_pairs
from shared.guard import ContextGuard
from shared.integrations.agents_client_items import CALL_OUTPUT, OUTPUT_CALL, PLACEHOLDER_PNG
from shared.integrations.agents_items import items_to_messages, messages_to_items
from shared.integrations.agents_sdk import GuardedSession
from shared.store.sessions import SessionStore
from workers.compactor import Compactor
from workers.summarizer.engine import SummaryEngine

set_tracing_disabled(True)
MODEL = "gpt-5.4"  # a model the SDK gives the GA computer tool


def png(width: int, height: int) -> str:
    """A real PNG (white), base64: what a computer's screenshot returns."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    rows = b"".join(b"\x00" + b"\xff" * 3 * width for _ in range(height))
    raw = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2,
                                                              0, 0, 0))
           + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
    return base64.b64encode(raw).decode()


SCREEN = png(1024, 768)  # ~765 tokens as an image, 5 KB of base64


class Screen(AsyncComputer):
    """A computer that does nothing but take screenshots."""

    def __init__(self) -> None:
        self.clicks: list[tuple[int, int]] = []

    async def screenshot(self) -> str:
        return SCREEN

    async def click(self, x: int, y: int, button: Any) -> None:
        self.clicks.append((x, y))

    async def double_click(self, x: int, y: int) -> None: ...
    async def scroll(self, x: int, y: int, scroll_x: int, scroll_y: int) -> None: ...
    async def type(self, text: str) -> None: ...
    async def wait(self) -> None: ...
    async def move(self, x: int, y: int) -> None: ...
    async def keypress(self, keys: list[str]) -> None: ...
    async def drag(self, path: list[tuple[int, int]]) -> None: ...


class Editor:
    def __init__(self) -> None:
        self.applied: list[str] = []

    def create_file(self, operation: ApplyPatchOperation) -> ApplyPatchResult:
        self.applied.append(operation.path)
        return ApplyPatchResult(output=f"created {operation.path}")

    def update_file(self, operation: ApplyPatchOperation) -> ApplyPatchResult:
        self.applied.append(operation.path)
        return ApplyPatchResult(output=f"updated {operation.path}")

    def delete_file(self, operation: ApplyPatchOperation) -> ApplyPatchResult:
        return ApplyPatchResult(output=f"deleted {operation.path}")


def local_shell(request: Any) -> str:
    return "a.py\nb.py\n"


def shell(request: ShellCommandRequest) -> ShellResult:
    return ShellResult(output=[ShellCommandOutput(stdout="print('hi')\n", stderr="warn\n",
                                                  command="cat a.py")])


async def grammar(context: Any, text: str) -> str:
    return f"parsed {text!r}"


def response(n: int, output: list[dict[str, Any]], tokens: int) -> dict[str, Any]:
    return Response.model_validate({
        "id": f"resp_{n}", "object": "response", "created_at": 0, "model": MODEL,
        "status": "completed", "output": output, "parallel_tool_calls": True,
        "tool_choice": "auto", "tools": [],
        "usage": {"input_tokens": tokens, "output_tokens": 10, "total_tokens": tokens + 10,
                  "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 0}}}).model_dump(mode="json")


def message(n: int, text: str) -> dict[str, Any]:
    return {"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def script(run: int) -> list[list[dict[str, Any]]]:
    """What the model asks for in each run, request by request: one tool, then two parallel
    pairs, then two more (call ids unique to the run); then it answers."""
    return [
        [{"type": "computer_call", "id": f"cu_{run}", "call_id": f"call_cu_{run}",
          "status": "completed", "pending_safety_checks": [],
          "action": {"type": "click", "x": 10, "y": 20, "button": "left"}}],
        [{"type": "local_shell_call", "id": f"lsh_{run}", "call_id": f"call_lsh_{run}",
          "status": "completed", "action": {"type": "exec", "command": ["ls"], "env": {}}},
         {"type": "shell_call", "id": f"sh_{run}", "call_id": f"call_sh_{run}",
          "status": "completed",
          "action": {"commands": ["cat a.py"], "timeout_ms": 1000, "max_output_length": 4096}}],
        [{"type": "custom_tool_call", "id": f"ctc_{run}", "call_id": f"call_ct_{run}",
          "name": "grammar", "input": "x := 1 + 2"},
         {"type": "apply_patch_call", "id": f"apc_{run}", "call_id": f"call_ap_{run}",
          "status": "completed", "operation": {"type": "update_file", "path": "a.py",
                                               "diff": "@@\n-print('hi')\n+pass\n"}}],
    ]


SCRIPT = script(1)


class FakeResponses:
    """The Responses API as an httpx transport: each run (a new user message) goes through
    :func:`script`, then gets an answer; keeps the body of every request."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.runs: dict[str, int] = {}  # a run's user message -> its number

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path.endswith("/responses")
        body = json.loads(request.content)
        self.bodies.append(body)
        items = body["input"]
        users = [k for k, i in enumerate(items) if i.get("role") == "user"]
        made = sum(1 for i in items[users[-1]:] if i.get("type") in CALL_OUTPUT)
        run = self.runs.setdefault(str(items[users[-1]]["content"]), len(self.runs) + 1)
        n = len(self.bodies)
        output = [message(n, f"done ({n})")]
        for step in script(run):  # the step after the calls made so far
            if made == 0:
                output = step
                break
            made -= len(step)
        return httpx.Response(200, json=response(n, output, len(request.content) // 4))

    def inputs(self, n: int) -> list[dict[str, Any]]:
        return cast(list[dict[str, Any]], self.bodies[n]["input"])


CLIENT = set(CALL_OUTPUT) | set(OUTPUT_CALL)


def client_items(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [i for i in items if i.get("type") in CLIENT]


def assert_paired(items: list[dict[str, Any]]) -> None:
    """Every output follows its call, of the call's type; every call is answered."""
    open_calls: dict[str, str] = {}
    for item in items:
        kind = item.get("type")
        if kind in CALL_OUTPUT or kind == "function_call":
            open_calls[item["call_id"]] = kind
        elif kind in OUTPUT_CALL or kind == "function_call_output":
            call = open_calls.pop(item["call_id"])
            assert OUTPUT_CALL.get(kind, "function_call") == call, (item, call)
    assert not open_calls


@pytest.fixture
def guard(real_redis: Any, key_prefix: str) -> ContextGuard:
    return ContextGuard(SessionStore(real_redis, StoreConfig(key_prefix=key_prefix)))


def build(guard: ContextGuard, session_id: str) -> tuple[Agent[Any], GuardedSession,
                                                         FakeResponses, Any]:
    fake = FakeResponses()
    http = httpx.AsyncClient(transport=httpx.MockTransport(fake))
    client = AsyncOpenAI(api_key="k", base_url="http://responses.test/v1", max_retries=0,
                         http_client=cast(Any, http))
    editor = Editor()
    agent: Agent[Any] = Agent(name="a", instructions="Use the tools.", tools=[
        ComputerTool(computer=Screen()), LocalShellTool(executor=local_shell),
        ShellTool(executor=shell), ApplyPatchTool(editor=editor),
        CustomTool(name="grammar", description="Parse a formula.", on_invoke_tool=grammar)])
    session = GuardedSession.for_agent(guard, session_id, agent, model=MODEL)
    agent.model = session.wrap(OpenAIResponsesModel(model=MODEL, openai_client=client))
    return agent, session, fake, editor


def test_client_tool_items_are_saved_and_sent_back_as_they_came(guard: ContextGuard) -> None:
    agent, session, fake, editor = build(guard, "sdk-client")

    async def turn(text: str) -> Any:
        return await Runner.run(agent, text, session=session, run_config=session.run_config())

    first = asyncio.run(turn("Use every tool."))
    assert first.final_output == "done (4)" and editor.applied == ["a.py"]
    sent = client_items(fake.inputs(3))  # the first run's last request: every pair
    assert [i["type"] for i in sent] == [
        "computer_call", "computer_call_output", "local_shell_call", "shell_call",
        "shell_call_output", "local_shell_call_output", "custom_tool_call", "apply_patch_call",
        "custom_tool_call_output", "apply_patch_call_output"]
    assert sent[1]["output"] == {"type": "computer_screenshot",
                                 "image_url": f"data:image/png;base64,{SCREEN}"}

    log = guard.store.messages("sdk-client", 0, guard.store.length("sdk-client"))
    assert [m.role for m in log] == ["user", "assistant", "tool", "assistant", "tool", "tool",
                                     "assistant", "tool", "tool", "assistant"]
    assert [m.tool_call_id for m in log if m.role == "tool"] == [
        "call_cu_1", "call_sh_1", "call_lsh_1", "call_ct_1", "call_ap_1"]
    assert [[c.name for c in m.tool_calls] for m in log if m.tool_calls] == [
        ["computer_use_preview"], ["local_shell", "shell"], ["grammar", "apply_patch"]]
    assert isinstance(log[2].content, list) and isinstance(log[2].content[0], ImagePart)
    assert log[4].text() == "print('hi')\n\nstderr:\nwarn\n"  # the SDK sends no exit code
    assert SCREEN not in json.dumps(log[2].metadata)  # the screenshot is stored once
    assert pairs_intact(log)

    second = asyncio.run(turn("Again."))
    assert second.final_output == "done (8)"
    again = fake.inputs(4)  # the second run's first request: the first run from the session
    assert client_items(again) == sent  # as the runner first sent them
    assert_paired(again)
    sent_again = client_items(fake.inputs(7))[len(sent):]  # the second run's own pairs

    # the real compaction job summarizes the first run; the second run's pairs stay
    outcome = Compactor(guard.store, SummaryEngine(None)).run(
        "sdk-client", force=True, keep_recent=600)  # tokens: about the second run
    assert outcome.status == "compacted", outcome.reason
    assert outcome.watermark_after in (10, 11)  # the first run (and the second one's ask)
    asyncio.run(turn("And now?"))
    after = fake.inputs(8)
    assert "compacted" in json.dumps(after[0])  # the summary leads
    assert_paired(after)
    assert client_items(after) == sent_again  # as they came, after the compaction
    assert client_items(after)[1]["output"]["image_url"].endswith(SCREEN)


def test_a_truncated_input_keeps_valid_items_of_each_call_type(guard: ContextGuard) -> None:
    """The budget filter cuts the input hard: the screenshot is replaced (by a placeholder
    image: a computer output must carry one), and every output stays an item of its call's
    type, after its call."""
    agent, session, fake, _ = build(guard, "sdk-client-cut")
    asyncio.run(Runner.run(agent, "Use every tool.", session=session,
                           run_config=session.run_config()))
    items = fake.inputs(1)  # the user, the computer call and its screenshot
    kept = session.input_filter.fit(items, "Use the tools.", agent.tools, force_ratio=0.01)
    assert kept.truncated and client_items(kept.items) == client_items(items)
    cut = session.input_filter.fit(items, "Use the tools.", agent.tools, force_ratio=0.0003)
    assert "media part" in cut.note
    assert_paired(cut.items)
    [screenshot] = [i for i in cut.items if i.get("type") == "computer_call_output"]
    assert screenshot["output"] == {"type": "computer_screenshot", "image_url": PLACEHOLDER_PNG}
    assert {k: v for k, v in screenshot.items() if k != "output"} == {
        k: v for k, v in items[2].items() if k != "output"}
    whole = session.input_filter.fit(fake.inputs(3), "Use the tools.", agent.tools,
                                     force_ratio=0.0003)
    assert whole.dropped and whole.truncated
    assert_paired(whole.items)


# -- the mapping -----------------------------------------------------------------------------
TURN: list[dict[str, Any]] = [
    {"role": "user", "content": "Fix it."},
    *SCRIPT[0],
    {"type": "computer_call_output", "call_id": "call_cu_1", "acknowledged_safety_checks": [],
     "output": {"type": "computer_screenshot", "image_url": f"data:image/png;base64,{SCREEN}"}},
    *SCRIPT[1],
    {"type": "local_shell_call_output", "call_id": "call_lsh_1", "output": "a.py\n"},
    {"type": "shell_call_output", "call_id": "call_sh_1", "status": "completed",
     "max_output_length": 4096, "output": [
         {"stdout": "x\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}]},
    *SCRIPT[2],
    {"type": "custom_tool_call_output", "call_id": "call_ct_1", "output": "parsed"},
    {"type": "apply_patch_call_output", "call_id": "call_ap_1", "status": "completed"},
    {"role": "assistant", "content": "Fixed."},
]


def test_client_items_round_trip_through_messages() -> None:
    messages = items_to_messages(TURN)
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant", "tool",
                                          "tool", "assistant", "tool", "tool", "assistant"]
    assert [c.id for c in messages[3].tool_calls] == ["call_lsh_1", "call_sh_1"]  # together
    assert messages[3].tool_calls[0].args() == {"type": "exec", "command": ["ls"], "env": {}}
    assert messages[6].tool_calls[0].args() == {"input": "x := 1 + 2"}
    assert messages[2].media_count() == 1  # a screenshot is an image to count
    assert messages[8].text() == "apply_patch completed"
    assert messages_to_items(messages) == TURN
    stored = [Message.from_json(m.to_json()) for m in messages]  # as the store reads them
    assert messages_to_items(stored) == TURN
    assert pairs_intact(messages)


def test_a_changed_result_is_rebuilt_as_its_calls_type() -> None:
    """Compaction cleared or clipped outputs (text content now): each is rebuilt as a
    valid item of its call's type, not a function_call_output."""
    messages = items_to_messages(TURN)
    cleared = [m.model_copy(update={"content": "[cleared: 2 KB]"}) if m.role == "tool" else m
               for m in messages]
    items = messages_to_items(cleared)
    assert_paired(items)
    by_type = {i["type"]: i for i in items if i.get("type") in OUTPUT_CALL}
    assert by_type["computer_call_output"]["output"] == {"type": "computer_screenshot",
                                                         "image_url": PLACEHOLDER_PNG}
    assert by_type["computer_call_output"]["acknowledged_safety_checks"] == []
    assert by_type["local_shell_call_output"]["output"] == "[cleared: 2 KB]"
    assert by_type["shell_call_output"]["output"] == [
        {"stdout": "[cleared: 2 KB]", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}]
    assert by_type["shell_call_output"]["max_output_length"] == 4096
    assert by_type["custom_tool_call_output"]["output"] == "[cleared: 2 KB]"
    assert by_type["apply_patch_call_output"] == {
        "type": "apply_patch_call_output", "call_id": "call_ap_1", "status": "completed",
        "output": "[cleared: 2 KB]"}


def test_a_missing_result_gets_a_placeholder_of_its_calls_type() -> None:
    """Repair answers a call whose result is gone (no item kept): the placeholder goes
    out as an output of the call's type; a renamed repeated id renames both."""
    messages = items_to_messages(TURN)
    without = [m for m in messages if m.tool_call_id not in ("call_cu_1", "call_sh_1")]
    repaired = repair_tool_pairs(without)
    items = messages_to_items(repaired)
    assert_paired(items)
    placeholder = next(i for i in items if i.get("call_id") == "call_cu_1"
                       and i["type"] == "computer_call_output")
    assert placeholder["output"]["image_url"] == PLACEHOLDER_PNG
    twice = repair_tool_pairs([*messages[:-1], *messages[1:3]])  # the same call id again
    renamed = messages_to_items(twice)
    assert_paired(renamed)
    assert [i["call_id"] for i in renamed if i.get("type") == "computer_call"] == [
        "call_cu_1", "call_cu_1_r2"]


def test_a_local_shell_output_may_name_its_call_by_id() -> None:
    """The API's shape: ``local_shell_call_output`` with ``id`` (the call's) and no
    ``call_id``: paired with the call of the batch whose item id it names, sent back as
    it came."""
    items = [{"role": "user", "content": "ls"}, SCRIPT[1][0],
             {"type": "local_shell_call_output", "id": "lsh_1", "output": "a.py"}]
    messages = items_to_messages(items)
    assert messages[2].tool_call_id == "call_lsh_1" and pairs_intact(messages)
    assert messages_to_items(messages) == items


def test_unknown_items_are_still_refused_and_nothing_is_written(guard: ContextGuard) -> None:
    session = GuardedSession(guard, "client-bad", model=MODEL)
    for bad in ({"type": "item_reference", "id": "msg_1"},
                {"type": "mcp_approval_request", "id": "a", "name": "n", "arguments": "{}",
                 "server_label": "s"}):
        batch = [{"role": "user", "content": "hi"}, bad]
        with pytest.raises(InvalidInput, match=r"items\[1\]\.type: cannot map item type"):
            asyncio.run(session.add_items(cast(Any, batch)))
    with pytest.raises(InvalidInput, match=r"items\[1\]\.action: required"):
        asyncio.run(session.add_items(cast(Any, [
            {"role": "user", "content": "hi"},
            {"type": "shell_call", "call_id": "c", "status": "completed"}])))
    with pytest.raises(InvalidInput, match=r"items\[0\]\.output: expected a list"):
        asyncio.run(session.add_items(cast(Any, [
            {"type": "shell_call_output", "call_id": "c", "output": "x"}])))
    assert guard.store.length("client-bad") == 0


def test_a_limit_keeps_client_outputs_with_their_calls(guard: ContextGuard) -> None:
    session = GuardedSession(guard, "client-limit", model=MODEL)
    asyncio.run(session.add_items(cast(Any, TURN)))
    assert asyncio.run(session.get_items()) == TURN
    for limit in range(len(TURN) + 1):
        items = cast(list[dict[str, Any]], asyncio.run(session.get_items(limit=limit)))
        assert len(items) <= limit
        calls = {i["call_id"] for i in items if i.get("type") in CALL_OUTPUT}
        assert all(i["call_id"] in calls for i in items if i.get("type") in OUTPUT_CALL)
    assert asyncio.run(session.pop_item()) == TURN[-1]
    assert asyncio.run(session.pop_item()) == TURN[-2]


def test_call_ids_the_store_renamed_go_back_as_the_providers(guard: ContextGuard) -> None:
    """The same call ids twice in a session: stored renamed (unique), sent as they came."""
    session = GuardedSession(guard, "client-twice", model=MODEL)
    asyncio.run(session.add_items(cast(Any, TURN)))
    asyncio.run(session.add_items(cast(Any, TURN)))
    log = guard.store.messages("client-twice")
    assert len({c.id for m in log for c in m.tool_calls}) == 10
    assert asyncio.run(session.get_items()) == [*TURN, *TURN]
