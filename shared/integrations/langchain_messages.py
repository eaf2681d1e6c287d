"""LangChain messages <-> the session log's neutral messages (no hooks: the mapping).

Apart from :mod:`shared.integrations.langchain` (the middleware's hooks) as
:mod:`~shared.integrations.agents_items` is apart from the Agents SDK session:
what changes when LangChain's message types do, not when the hooks do. Each
state message becomes one neutral message tagged with its state index (and
its LangChain id, ``ID_KEY``); a view message compaction left untouched goes
back as the state's own object.

Reasoning blocks of an ``AIMessage`` (Anthropic ``thinking`` /
``redacted_thinking``, LangChain v1 standard ``reasoning``) become
``Message.reasoning``; Anthropic's signatures and redacted data ride in
metadata ``anthropic_thinking`` as :mod:`shared.core.wire.anthropic` keeps
them, so a message compaction rebuilt still carries its signed thinking.
The state's leading system messages are the system prompt
(:func:`leading_system`, :func:`join_system`), never log messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    SystemMessage,
    convert_to_messages,
    convert_to_openai_messages,
)

from shared.core.errors import InvalidInput
from shared.core.messages import Message
from shared.core.prepared import PreparedView
from shared.core.tokens import EXTRA_TOKENS
from shared.core.wire import from_openai, to_openai
from shared.core.wire._common import join_reasoning, split_reasoning
from shared.core.wire.anthropic import THINKING_KEY
from shared.integrations._common import FW_KEY, origin, tag
from shared.integrations.notes import provider_note, sent_tokens

ID_KEY = "lc_id"
SERVER_KEY = "lc_server_tools"  # notes of server-side tool blocks beside signed thinking
REASONING_BLOCKS = frozenset({"thinking", "redacted_thinking", "reasoning"})
# Blocks of a tool the provider ran itself: LangChain v1's standard ones, the Responses
# API's (ChatOpenAI's legacy output), Anthropic's (and every ``*_tool_result`` of its).
SERVER_BLOCKS = frozenset({
    "server_tool_call", "server_tool_call_chunk", "server_tool_result", "non_standard",
    "web_search_call", "file_search_call", "code_interpreter_call", "image_generation_call",
    "mcp_call", "mcp_list_tools", "server_tool_use", "mcp_tool_use", "mcp_tool_result"})


def _server_block(kind: Any) -> bool:
    return isinstance(kind, str) and (kind in SERVER_BLOCKS or kind.endswith("_tool_result"))


def leading_system(state: Sequence[Any]) -> int:
    """How many messages at the head of the state are system messages (the prompt)."""
    count = 0
    while count < len(state) and isinstance(state[count], SystemMessage):
        count += 1
    return count


def _blocks(message: SystemMessage) -> list[Any]:
    content = message.content
    return list(content) if isinstance(content, list) else [{"type": "text", "text": content}]


def join_system(parts: Sequence[SystemMessage]) -> SystemMessage | None:
    """One system message from several (``system_prompt=`` first, then the state's leading
    ones): one is kept as it is (its blocks, ``cache_control``); several are joined with a
    blank line, each keeping its blocks."""
    if len(parts) <= 1:
        return parts[0] if parts else None
    if all(isinstance(p.content, str) for p in parts):
        return SystemMessage(content="\n\n".join(str(p.content) for p in parts))
    blocks: list[Any] = []
    for part in parts:
        own = _blocks(part)
        first = own[0] if own else None
        if blocks and isinstance(first, dict) and first.get("type") == "text":
            own[0] = {**first, "text": "\n\n" + str(first.get("text", ""))}
        elif blocks and isinstance(first, str):
            own[0] = "\n\n" + first
        blocks.extend(own)
    return SystemMessage(content=blocks)


def _reasoning_text(block: dict[str, Any]) -> str:
    """A reasoning block's text: v1 ``reasoning``, or the Responses API's ``summary`` list."""
    if isinstance(block.get("reasoning"), str):
        return str(block["reasoning"])
    summary = block.get("summary")
    if isinstance(summary, list):
        return "\n\n".join(str(s.get("text", "")) for s in summary
                            if isinstance(s, dict) and s.get("text"))
    return ""


def _split_reasoning(message: AIMessage) -> tuple[AIMessage, dict[str, Any]]:
    """The message without its reasoning blocks (and v1 ``tool_call`` blocks, which repeat
    ``tool_calls``), and the neutral fields they become (``reasoning``, metadata). A
    server-side tool's blocks become notes (:func:`provider_note`) in ``reasoning``, or in
    metadata beside signed thinking (whose signature covers the reasoning's text): the
    provider answered them itself, and the state's own message carries them back (counted
    as sent: metadata ``extra_tokens``)."""
    content = message.content
    if not isinstance(content, list):
        return message, {}
    kept: list[Any] = []
    texts: list[str] = []
    notes: list[str] = []
    server: list[dict[str, Any]] = []  # the server tool blocks, as they go back
    layout: list[dict[str, Any]] = []
    anthropic = True  # every text-bearing block has an Anthropic form (else no layout)
    found = False
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_call" and message.tool_calls:
            found = True
            continue
        if isinstance(block, dict) and _server_block(kind):
            found = True
            notes.append(provider_note(str(kind), block))
            server.append(block)
            continue
        if not isinstance(block, dict) or kind not in REASONING_BLOCKS:
            kept.append(block)
            continue
        found = True
        if kind == "redacted_thinking":
            if isinstance(block.get("data"), str):
                layout.append({"redacted": block["data"]})
            continue
        text = str(block.get("thinking", "")) if kind == "thinking" else _reasoning_text(block)
        extras = block.get("extras")
        signature = block.get("signature") if kind == "thinking" else \
            extras.get("signature") if isinstance(extras, dict) else None
        if kind != "thinking" and signature is None:
            anthropic = False
            if not text:
                continue
        texts.append(text)
        entry: dict[str, Any] = {"chars": len(text)}
        if isinstance(signature, str):
            entry["signature"] = signature
        layout.append(entry)
    if not found:
        return message, {}
    fields: dict[str, Any] = {}
    signed = bool(layout) and anthropic
    counted = ""  # the notes counted as reasoning: the blocks are counted beyond them
    if signed and notes:  # the reasoning must stay the signed blocks' text, exactly
        fields["metadata"] = {SERVER_KEY: notes}
    elif notes:
        texts.extend(notes)
        counted = "\n\n".join(notes)
    if server and (extra := sent_tokens(server, counted)):
        fields["metadata"] = {**fields.get("metadata", {}), EXTRA_TOKENS: extra}
    if texts:
        fields["reasoning"] = join_reasoning(texts)
    if signed:
        fields["metadata"] = {**fields.get("metadata", {}), THINKING_KEY: layout}
    return message.model_copy(update={"content": kept or ""}), fields


MEDIA_BLOCKS = frozenset({"audio", "input_audio", "video"})


def _media_placeholder(block: dict[str, Any]) -> dict[str, Any]:
    """A text block standing for an audio or video block (the neutral model holds neither)."""
    kind = "video" if block.get("type") == "video" else "audio"
    nested = block.get("input_audio")
    inner: dict[str, Any] = nested if isinstance(nested, dict) else block
    what = inner.get("mime_type") or inner.get("format") or ""
    source = block.get("url") or block.get("file_id")
    data = inner.get("base64") or inner.get("data")
    size = f"{len(data) * 3 // 4} bytes, " if isinstance(data, str) else ""
    detail = ", ".join(str(x) for x in (what, source) if x)
    return {"type": "text", "text": f"[{kind} attachment: {detail + ', ' if detail else ''}"
                                    f"{size}not kept in the history]"}


def _without_media(message: BaseMessage) -> BaseMessage:
    """``message`` with its audio and video blocks as text placeholders: logged and summarized
    as a note, while the model gets the state's original message as long as it is in the
    view (as pydantic-ai's capability does)."""
    content = message.content
    if not isinstance(content, list) or not any(
            isinstance(b, dict) and b.get("type") in MEDIA_BLOCKS for b in content):
        return message
    return message.model_copy(update={"content": [
        _media_placeholder(b) if isinstance(b, dict) and b.get("type") in MEDIA_BLOCKS else b
        for b in content]})


def _mapped(message: BaseMessage) -> Message:
    """One LangChain message as a neutral one, through OpenAI's chat format."""
    wire = convert_to_openai_messages(_without_media(message))
    (neutral,) = from_openai([wire])
    return neutral


def _attachment_note(block: dict[str, Any]) -> dict[str, Any]:
    """A text block standing for an attachment OpenAI's chat format cannot carry (an image
    by ``file_id``, a file by URL, Anthropic's ``document``): its kind and source."""
    raw = block.get("source")
    source: dict[str, Any] = raw if isinstance(raw, dict) else {}
    kind = str(block.get("type") or "unknown")
    found = [block.get(k) or source.get(k) for k in ("url", "file_id")]
    found += [block.get("mime_type") or source.get("media_type"), block.get("filename")]
    data = block.get("base64") or block.get("data") or source.get("data")
    if isinstance(data, str):
        found.append(f"{len(data) * 3 // 4} bytes")
    detail = ", ".join(str(x) for x in found if isinstance(x, str) and x)
    return {"type": "text", "text": f"[{kind} attachment: {detail + ', ' if detail else ''}"
                                    "not kept in the history]"}


def _with_notes(message: BaseMessage) -> BaseMessage:
    """``message`` with each block the chat format refuses as a note (``text-plain`` as its
    text): logged and summarized, while the model gets the state's original message as
    long as it is in the view. ``message`` itself when no block is refused alone."""
    content = message.content
    if not isinstance(content, list):
        return message
    blocks: list[Any] = []
    changed = False
    for block in content:
        if not isinstance(block, dict):
            blocks.append(block)
            continue
        if block.get("type") == "text-plain" and isinstance(block.get("text"), str):
            blocks.append({"type": "text", "text": block["text"]})
            changed = True
            continue
        try:
            _mapped(message.model_copy(update={"content": [block]}))
            blocks.append(block)
        except (ValueError, TypeError, KeyError, InvalidInput):
            blocks.append(_attachment_note(block))
            changed = True
    return message.model_copy(update={"content": blocks}) if changed else message


def _way_out(message: BaseMessage) -> str:
    """How a thread gets past a message nothing maps: the graph's checkpoint kept it, so
    every later call of the thread meets it again."""
    remove = f"RemoveMessage(id={message.id!r})" if message.id else "RemoveMessage"
    return (f" (the thread's state keeps this message, and every later call meets it: "
            f"remove it with {remove}, or start a new thread)")


def to_neutral(messages: Sequence[Any], start: int = 0) -> list[Message]:
    """LangChain messages as tagged neutral ones; InvalidInput names ``state.messages[i]``."""
    out: list[Message] = []
    for offset, message in enumerate(messages):
        index = start + offset
        where = f"state.messages[{index}]"
        if not isinstance(message, BaseMessage):
            raise InvalidInput(f"expected a LangChain message, got {type(message).__name__}",
                               field=where, index=index)
        fields: dict[str, Any] = {}
        if isinstance(message, AIMessage):
            message, fields = _split_reasoning(message)
        try:
            neutral = _mapped(message)
        except (ValueError, TypeError, KeyError, InvalidInput) as exc:
            noted = _with_notes(message)
            try:
                if noted is message:
                    raise exc
                neutral = _mapped(noted)
            except InvalidInput:
                inner = (exc.field or "") if isinstance(exc, InvalidInput) else ""
                reason = str(exc).removeprefix(f"{inner}: ")[:200]
                raise InvalidInput(f"cannot map {type(message).__name__}: {reason}"
                                   f"{_way_out(message)}",
                                   field=where + inner.removeprefix("messages[0]"),
                                   index=index) from None
            except (ValueError, TypeError, KeyError):
                raise InvalidInput(f"cannot map {type(message).__name__}: {str(exc)[:200]}"
                                   f"{_way_out(message)}", field=where, index=index) from None
        if fields:
            neutral = neutral.model_copy(update={
                **fields, "metadata": {**neutral.metadata, **fields.get("metadata", {})}})
        extra = {ID_KEY: message.id} if message.id else {}
        out.append(tag(neutral, index, extra=extra))
    return out


def from_view(view: PreparedView, state: Sequence[AnyMessage],
              system: SystemMessage | None) -> tuple[SystemMessage | None, list[AnyMessage]]:
    """The view as LangChain messages: untouched ones are the state's own objects."""
    messages = list(view.messages)
    new_system = system
    if messages and messages[0].role == "system" and FW_KEY not in messages[0].metadata:
        # The guard's system message (prompt + summary); a tagged one is the state's own.
        text = messages.pop(0).text()
        if system is not None and text != system.text and text.startswith(system.text):
            # The summary follows the caller's system prompt: keep its blocks as they were
            # (cache_control and the like), the summary as one more text block.
            blocks = (list(system.content) if isinstance(system.content, list)
                      else [{"type": "text", "text": system.content}])
            new_system = SystemMessage(content=[
                *blocks, {"type": "text", "text": text[len(system.text):].lstrip("\n")}])
        elif system is None or text != system.text:
            new_system = SystemMessage(content=text)
    out: list[AnyMessage] = []
    for message in messages:
        found = origin(message)
        if found is not None and found[0] < len(state):
            original = state[found[0]]
            if original.id is None or original.id == message.metadata.get(ID_KEY):
                out.append(original)
                continue
        out.extend(_rebuilt(message))
    return new_system, out


def _thinking_blocks(message: Message) -> list[dict[str, Any]]:
    """Anthropic's thinking blocks of a recorded message, signatures intact (none if its
    reasoning was edited since: a signature covers the text)."""
    layout = message.metadata.get(THINKING_KEY)
    if not isinstance(layout, list) or message.role != "assistant":
        return []
    entries = [e for e in layout if isinstance(e, dict)]
    lengths = [e.get("chars") for e in entries if "redacted" not in e]
    texts = split_reasoning(message.reasoning, [n for n in lengths if isinstance(n, int)]) \
        if message.reasoning is not None and lengths \
        and all(isinstance(n, int) for n in lengths) else None
    blocks: list[dict[str, Any]] = []
    for entry in entries:
        if "redacted" in entry:
            blocks.append({"type": "redacted_thinking", "data": entry["redacted"]})
        elif texts and "signature" in entry:
            blocks.append({"type": "thinking", "thinking": texts.pop(0),
                           "signature": entry["signature"]})
        elif texts:
            texts.pop(0)  # unsigned: no provider takes it back
    return blocks


def _rebuilt(message: Message) -> list[AnyMessage]:
    """A view message compaction changed, as LangChain messages (signed thinking kept)."""
    built = cast("list[AnyMessage]",
                 convert_to_messages(to_openai([message], include_reasoning=False)))
    thinking = _thinking_blocks(message)
    if thinking and len(built) == 1 and isinstance(built[0], AIMessage):
        content = built[0].content
        rest = content if isinstance(content, list) else \
            [{"type": "text", "text": content}] if content else []
        built = [built[0].model_copy(update={"content": [*thinking, *rest]})]
    return built


__all__ = ["ID_KEY", "from_view", "join_system", "leading_system", "to_neutral"]
