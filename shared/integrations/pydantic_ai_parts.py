"""pydantic-ai message parts <-> neutral messages (the mapping of :mod:`.pydantic_ai`).

Two directions:

- to neutral: a request part (a user prompt, a tool's return, a retry prompt, speech)
  becomes a neutral message; a ``ModelResponse`` becomes one assistant message (text,
  tool calls, and its thinking and provider-made parts as ``reasoning``);
- back: a view message compaction left untouched goes back as its original (the
  capability finds it by its framework index); one compaction changed is rebuilt **from
  its original** (:func:`rebuilt_response`, :func:`rebuilt_request_part`): only what the
  compaction changed (clipped text, a placeholder result, a renamed call id) is replaced,
  and every other part and field is kept. A provider needs them: Anthropic refuses a
  tool_use turn without its signed thinking, OpenAI Responses and Gemini check their
  encrypted reasoning and thought signatures, and pydantic-ai itself sends provider data
  back only to the provider the response's ``provider_name`` names.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Sequence
from typing import Any, cast

try:
    from pydantic_ai import messages as pm
except ModuleNotFoundError as exc:  # tests/test_install.py runs this without the extra
    raise ModuleNotFoundError("shared.integrations.pydantic_ai_parts needs the 'pydantic-ai' "
                              "extra: pip install 'context-compaction[pydantic-ai]'",
                              name=exc.name) from exc

from shared.core.errors import InvalidInput
from shared.core.messages import ContentPart, FilePart, ImagePart, Message, TextPart, ToolCall
from shared.integrations.notes import kept_notes, with_sent

# Request parts that carry no conversation content (pydantic-ai's own bookkeeping).
BOOKKEEPING = ("tool-availability-delta", "capability-load-delta", "model-settings-delta",
               "instruction-delta", "instruction-baseline")
NOTE_CHARS = 2000  # the most of a native tool's arguments or result a note keeps
SPEECH_WITHOUT_TRANSCRIPT = "[speech without a transcript]"


# -- to neutral --------------------------------------------------------------------------
def request_part(part: Any, where: str, index: int) -> Message | None:
    """One request part as a neutral message; None for a part with no conversation content."""
    kind = getattr(part, "part_kind", type(part).__name__)
    try:
        if isinstance(part, pm.SystemPromptPart) or kind in BOOKKEEPING:
            return None
        if isinstance(part, pm.UserPromptPart):
            if isinstance(part.content, str):
                return Message(role="user", content=part.content)
            items: list[ContentPart] = []
            for k, item in enumerate(part.content):
                mapped = _user_content(item, f"{where}.content[{k}]", index)
                if mapped is not None:
                    items.append(mapped)
            return Message(role="user", content=items)
        if isinstance(part, pm.ToolReturnPart):
            return Message(role="tool", tool_call_id=part.tool_call_id, name=part.tool_name,
                           content=part.model_response_str())
        if isinstance(part, pm.SpeechPart):
            return Message(role="user", content=transcript(part))
        if isinstance(part, (pm.RetryPromptPart, pm.RetryFeedbackPart)):
            text = part.model_response()
            name = getattr(part, "tool_name", None)
            call_id = getattr(part, "tool_call_id", None)
            if name and call_id:
                return Message(role="tool", tool_call_id=call_id, name=name, content=text)
            return Message(role="user", content=text)
    except InvalidInput:
        raise
    except (ValueError, TypeError) as exc:
        raise InvalidInput(f"cannot map {kind}: {str(exc)[:200]}", field=where,
                           index=index) from None
    raise InvalidInput(f"cannot map a {kind} part", field=where, index=index)


def _media_type(item: Any) -> str | None:
    """A URL's media type, or None where pydantic-ai cannot infer one (no extension)."""
    try:
        return cast(str, item.media_type)
    except ValueError:
        return None


def _user_content(item: Any, where: str, index: int) -> ContentPart | None:
    """One item of a user prompt as a neutral part; None for a marker (``CachePoint``).

    Images and documents (inline, by URL, uploaded) become image and file parts. The
    neutral model holds no audio or video: those become a text placeholder naming the
    media, so the log and the summaries say something was there (the model itself still
    gets the original part while the message is in the view).
    """
    if isinstance(item, str):
        return TextPart(text=item)
    if isinstance(item, (pm.TextContent, pm.StructuredContent)):
        return TextPart(text=item.content)
    if isinstance(item, pm.CachePoint):
        return None
    if isinstance(item, pm.BinaryContent):
        if item.is_image:
            return ImagePart(data=item.base64, media_type=item.media_type)
        if item.is_audio or item.is_video:
            kind = "audio" if item.is_audio else "video"
            return TextPart(text=f"[{kind} attachment: {item.media_type}, "
                                 f"{len(item.data)} bytes, not kept in the history]")
        return FilePart(data=item.base64, media_type=item.media_type)
    if isinstance(item, pm.ImageUrl):
        return ImagePart(url=item.url)
    if isinstance(item, pm.DocumentUrl):
        return FilePart(url=item.url, media_type=_media_type(item))
    if isinstance(item, (pm.AudioUrl, pm.VideoUrl)):
        kind = "audio" if isinstance(item, pm.AudioUrl) else "video"
        return TextPart(text=f"[{kind} attachment: {item.url}]")
    if isinstance(item, pm.UploadedFile):
        return FilePart(file_id=item.file_id, media_type=item.media_type)
    raise InvalidInput(f"cannot map user content {type(item).__name__}", field=where,
                       index=index)


def _clip(text: str) -> str:
    return text if len(text) <= NOTE_CHARS else f"{text[:NOTE_CHARS]}... [{len(text)} chars]"


def note(part: Any) -> str | None:
    """A text note for a response part the provider made and answers itself: native
    tool calls and results (web search, code execution), a provider's compaction, a
    generated image or document. Recorded as the message's reasoning, so the log and its
    summaries say what happened; never sent as the answer's text (the response goes back
    with its original parts, ids and all). None: not such a part."""
    if isinstance(part, pm.NativeToolCallPart):
        return _clip(f"[{part.tool_name} call: {part.args_as_json_str()}]")
    if isinstance(part, pm.NativeToolReturnPart):
        return _clip(f"[{part.tool_name} result: {part.model_response_str()}]")
    if isinstance(part, pm.CompactionPart):
        return _clip(f"[provider compaction: {part.content}]") if part.content \
            else "[provider compaction (opaque)]"
    if isinstance(part, pm.FilePart):
        return (f"[generated file: {part.content.media_type}, {len(part.content.data)} bytes, "
                "not kept in the history]")
    return None


def _sent(part: Any) -> str:
    """What of a noted part goes back to the provider (and is read again): a native call's
    arguments, its result's content (Anthropic gets it inline, OpenAI re-reads it by the
    item's id), a compaction's summary; nothing for a generated file (not kept)."""
    if isinstance(part, pm.NativeToolCallPart):
        return part.args_as_json_str()
    if isinstance(part, pm.NativeToolReturnPart):
        return part.model_response_str()
    if isinstance(part, pm.CompactionPart):
        return part.content or ""
    return ""


def transcript(part: pm.SpeechPart) -> str:
    """What a realtime session's spoken part says, as pydantic-ai gives it to a standard
    model (a user prompt, a text part): its transcript."""
    return part.transcript if part.transcript else SPEECH_WITHOUT_TRANSCRIPT


def _said(part: Any) -> str | None:
    """The answer text a response part holds (a text part, the model's speech), else None."""
    if isinstance(part, pm.TextPart):
        return part.content
    if isinstance(part, pm.SpeechPart):
        return transcript(part)
    return None


def response_message(message: pm.ModelResponse, where: str) -> Message:
    """A ``ModelResponse`` as one assistant message: its text parts (and speech) joined as
    the content, its tool calls, its thinking and provider-made parts as reasoning."""
    texts: list[str] = []
    reasoning: list[str] = []
    notes: list[str] = []
    sent: list[str] = []
    calls: list[ToolCall] = []
    for j, part in enumerate(message.parts):
        if (said := _said(part)) is not None:
            texts.append(said)
        elif isinstance(part, pm.ThinkingPart):
            reasoning.append(part.content)
        elif (found := note(part)) is not None:
            reasoning.append(found)
            notes.append(found)
            sent.append(_sent(part))
        elif isinstance(part, pm.ToolCallPart):
            try:
                calls.append(ToolCall(id=part.tool_call_id, name=part.tool_name,
                                      arguments=part.args_as_json_str()))
            except ValueError as exc:
                raise InvalidInput(f"cannot map the tool call: {str(exc)[:200]}",
                                   field=f"{where}.parts[{j}]") from None
        else:
            raise InvalidInput(f"cannot map a {getattr(part, 'part_kind', '?')} part",
                               field=f"{where}.parts[{j}]")
    neutral = Message(role="assistant", content="".join(texts), tool_calls=calls,
                      reasoning="\n".join(reasoning) or None)
    return with_sent(neutral, sent, "\n".join(notes))  # counted as sent, not as noted


# -- back --------------------------------------------------------------------------------
def user_prompt(message: Message) -> Any:
    """A neutral user message rebuilt as a ``UserPromptPart`` (images and files kept)."""
    if isinstance(message.content, str):
        return pm.UserPromptPart(content=message.content)
    content: list[Any] = []
    for part in message.content:
        if isinstance(part, TextPart):
            content.append(part.text)
        elif part.data is not None and part.media_type is not None:
            content.append(pm.BinaryContent(data=base64.b64decode(part.data),
                                            media_type=part.media_type))
        elif part.url is not None:
            content.append(pm.ImageUrl(url=part.url) if isinstance(part, ImagePart)
                           else pm.DocumentUrl(url=part.url, media_type=part.media_type))
        elif isinstance(part, FilePart) and part.file_id is not None:
            content.append(f"[file attachment: {part.file_id}]")
    return pm.UserPromptPart(content=content)


def rebuilt_request_part(message: Message, original: Any) -> Any:
    """The request part for a view message compaction changed; ``original``: the history
    part it was recorded from (None when there is none).

    A tool's return keeps its ``tool_kind``, outcome, metadata and timestamp: only the
    content (a cleared or clipped result) and a renamed call id are the view's. A return
    of a kind with typed content (a tool search's, a capability load's: pydantic-ai reads
    their content as a structure) becomes a plain return, as a text cannot be that
    content. A user prompt keeps its timestamp."""
    if message.role == "tool":
        if (type(original) is pm.ToolReturnPart and message.name == original.tool_name
                and message.tool_call_id):
            return dataclasses.replace(original, content=message.text(),
                                       tool_call_id=message.tool_call_id)
        return pm.ToolReturnPart(tool_name=message.name or "tool", content=message.text(),
                                 tool_call_id=message.tool_call_id or "")
    if message.role == "system":
        return pm.SystemPromptPart(content=message.text())
    rebuilt = user_prompt(message)
    if isinstance(original, pm.UserPromptPart):
        return dataclasses.replace(original, content=rebuilt.content)
    return rebuilt


def rebuilt_response(message: Message, original: pm.ModelResponse | None) -> pm.ModelResponse:
    """The response for an assistant view message compaction changed.

    With its ``original`` (the history's response it was recorded from), the original
    with only the changed parts replaced: the text parts the view's text no longer
    matches (:func:`_merged_text`) and the tool calls it renamed (:func:`_merged_calls`).
    Thinking (signatures, ids), native tool parts, generated files, compaction parts (each
    while its note is in the view's reasoning: :func:`_noted_kept`) and the response's own
    fields (``provider_name``, ``provider_response_id``, ``model_name``,
    ``finish_reason``, ``usage``, ``timestamp``...) are the original's: no compaction
    stage changes reasoning. Without one (a message this history does not hold), a
    response of the text and the calls alone."""
    if original is None:
        return pm.ModelResponse(parts=[
            *([pm.TextPart(content=message.text())] if message.text() else []),
            *(pm.ToolCallPart(tool_name=c.name, args=c.arguments, tool_call_id=c.id)
              for c in message.tool_calls)])
    parts = _merged_calls(_merged_text(_noted_kept(list(original.parts), message.reasoning),
                                       message.text()), message.tool_calls)
    return dataclasses.replace(original, parts=parts)


def _noted_kept(parts: list[Any], reasoning: str | None) -> list[Any]:
    """``parts`` without the noted ones (native calls and results, compactions, generated
    files) whose note the view's ``reasoning`` no longer holds, and without the native
    call or result paired with one of them (same ``tool_call_id``): a provider refuses a
    result without its call, and a stage that cleared the note took its tokens out of the
    count. The others as they are."""
    noted = [(j, found) for j, p in enumerate(parts) if (found := note(p)) is not None]
    kept = kept_notes([found for _, found in noted], reasoning)
    gone = {j for (j, _), keep in zip(noted, kept, strict=True) if not keep}
    if not gone:
        return parts
    native = (pm.NativeToolCallPart, pm.NativeToolReturnPart)
    ids = {parts[j].tool_call_id for j in gone if isinstance(parts[j], native)}
    return [p for j, p in enumerate(parts)
            if j not in gone and not (isinstance(p, native) and p.tool_call_id in ids)]


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    low, high = 0, n  # binary search on slices: C speed on long texts
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _common_suffix(a: str, b: str, limit: int) -> int:
    low, high = 0, limit
    while low < high:
        middle = (low + high + 1) // 2
        if a[len(a) - middle:] == b[len(b) - middle:]:
            low = middle
        else:
            high = middle - 1
    return low


def _merged_text(parts: list[Any], new: str) -> list[Any]:
    """``parts`` whose text parts say ``new``: the parts wholly inside the text's unchanged
    head and tail are kept as they are; those the change touches become one text part at
    the first one's place (a text part keeps its provider fields, not its ``id``, which
    OpenAI Responses would answer with its stored copy, nor its citations, whose
    positions were in the old text), or none when the changed middle is empty."""
    slots = [(j, said) for j, p in enumerate(parts) if (said := _said(p)) is not None]
    old = "".join(said for _, said in slots)
    if new == old:
        return parts
    head = _common_prefix(old, new)
    tail = _common_suffix(old, new, min(len(old), len(new)) - head)
    cut_end = len(old) - tail  # old[head:cut_end] became new[head:len(new) - tail]
    touched: list[tuple[int, int, int]] = []  # (part index, start, end) in old
    start = 0
    for j, said in slots:
        end = start + len(said)
        if start < cut_end and end > head:
            touched.append((j, start, end))
        start = end
    if not touched:  # an insertion at a part boundary (or no text part at all)
        at = _boundary(slots, head)
        if at is None:
            return _inserted(parts, new[head:len(new) - tail])
        touched = [at]
    first, begin, _ = touched[0]
    stop = touched[-1][2]
    middle = new[begin:len(new) - (len(old) - stop)]
    drop = {j for j, _, _ in touched}
    out: list[Any] = []
    for j, part in enumerate(parts):
        if j == first and middle:
            out.append(dataclasses.replace(part, content=middle, id=None, citations=None)
                       if isinstance(part, pm.TextPart) else pm.TextPart(content=middle))
        elif j not in drop:
            out.append(part)
    return out


def _boundary(slots: Sequence[tuple[int, str]], at: int) -> tuple[int, int, int] | None:
    """The text part that ends (else starts) at offset ``at`` of the joined text."""
    start, found = 0, None
    for j, said in slots:
        end = start + len(said)
        if end == at or (found is None and start == at):
            found = (j, start, end)
        start = end
    return found


def _inserted(parts: list[Any], text: str) -> list[Any]:
    """``parts`` with a text part saying ``text`` before the first tool call (where a
    provider puts its text), for a response that had no text part."""
    if not text:
        return parts
    at = next((j for j, p in enumerate(parts) if isinstance(p, pm.ToolCallPart)), len(parts))
    return [*parts[:at], pm.TextPart(content=text), *parts[at:]]


def _merged_calls(parts: list[Any], calls: Sequence[ToolCall]) -> list[Any]:
    """``parts`` whose tool calls are ``calls``: a call the view left alone is the original
    part; one it renamed (a repeated id made unique) or changed is the original part
    with the new id, name or arguments, without its provider item ``id`` (which names
    the original); its kind, ``provider_details`` (a Gemini thought signature) and
    ``provider_name`` stay. Calls are paired in order when the counts match, else by id;
    an original the view does not hold is left out, a call it adds goes after the last."""
    at = [j for j, p in enumerate(parts) if isinstance(p, pm.ToolCallPart)]
    if len(at) == len(calls):
        pairs: dict[int, ToolCall | None] = dict(zip(at, calls, strict=True))
        extra: list[ToolCall] = []
    else:
        by_id = {c.id: c for c in calls}
        pairs = {j: by_id.pop(parts[j].tool_call_id, None) for j in at}
        extra = list(by_id.values())
    out: list[Any] = []
    for j, part in enumerate(parts):
        if j not in pairs:
            out.append(part)
            continue
        call = pairs[j]
        if call is None:
            continue
        was = ToolCall(id=part.tool_call_id, name=part.tool_name,
                       arguments=part.args_as_json_str())  # as it was recorded
        if call == was:
            out.append(part)
            continue
        args = part.args if call.arguments == was.arguments else call.arguments
        out.append(dataclasses.replace(part, tool_call_id=call.id, tool_name=call.name,
                                       args=args, id=None))
    last = max((k for k, p in enumerate(out) if isinstance(p, pm.ToolCallPart)),
               default=len(out) - 1)
    added = [pm.ToolCallPart(tool_name=c.name, args=c.arguments, tool_call_id=c.id)
             for c in extra]
    return [*out[:last + 1], *added, *out[last + 1:]]


__all__ = ["BOOKKEEPING", "NOTE_CHARS", "SPEECH_WITHOUT_TRANSCRIPT", "note",
           "rebuilt_request_part", "rebuilt_response", "request_part", "response_message",
           "transcript", "user_prompt"]
