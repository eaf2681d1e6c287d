"""Gemini ``contents`` (+ ``system_instruction``) <-> neutral messages.

``to_gemini(from_gemini(c, s)) == (s, c)`` for canonical input: snake_case
keys (camelCase, as in the REST API, is accepted and comes out snake_case,
what ``google.genai.types`` takes), base64 text for bytes (raw ``bytes``
are accepted and come out encoded), ``role`` always present, a model
content ordered thought parts, then text and media, then function calls,
function responses in user contents of their own, and contents that
alternate between user and model (but for user text after function
responses). How the formats map:

- ``thought: true`` text parts join into ``Message.reasoning`` (blank-line
  separated; metadata ``gemini_thought_lengths`` splits them back when there
  are several); ``thought_signature`` of any part is kept in metadata
  ``gemini_signatures`` keyed ``thought:<n>``, ``content:<n>``,
  ``call:<id>`` or ``response``;
- a content holding exactly one text part is a string; several parts, or
  any media, a list. The API refuses empty text parts and contents without
  parts, so empty texts (and reasoning) are left out, and so are messages
  left with nothing to send; an empty text part that carries a thought
  signature (streamed turns end with one) goes back as received;
- calls without an ``id`` get a deterministic one (``gemini-<content>-<part>``)
  and a response without one is matched to the oldest unanswered call of
  its name; metadata ``gemini_synthetic_ids`` remembers which ids were made
  up so they are not sent. Neutral ids of other providers are sent as ids;
- a response ``{"output": str}`` is the tool message's text,
  ``{"error": str}`` the text plus metadata ``is_error``; any other object
  is stored as JSON text with metadata ``gemini_response="json"`` and sent
  back as that object. Media of a result travel in
  ``function_response.parts``. A tool message's ``name`` is the function
  name; going out a missing one is looked up from its call;
- consecutive tool messages merge into one user content, and other
  neighbours of one role into one content (parts in order): the API wants
  multi-turn contents to alternate. Function responses share a content with
  nothing else (Gemini 3 refuses text after them in one content), so tool
  results then user text stay two user contents; leading system
  messages become ``system_instruction`` (a later one goes out as a user
  content); a plain-string ``system_instruction`` comes out as
  ``{"parts": [...]}``, a content without ``role`` is a user content;
- ``inline_data``/``file_data`` with an ``image/*`` type and no
  ``display_name`` is an image, anything else a file (``display_name`` is
  ``FilePart.filename``); an image URL without a media type gets one guessed
  from its extension; an image's ``detail`` has no Gemini form.

Refused: unknown roles, part kinds and keys, function responses in a model
content, arguments or responses that are not objects, OpenAI file ids.
"""

from __future__ import annotations

import json
import mimetypes
import re
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

from shared.core.messages import ContentPart, ImagePart, Message, TextPart
from shared.core.wire._common import (
    IS_ERROR,
    Loc,
    WireItem,
    arguments_object,
    as_list,
    as_mapping,
    as_sequence,
    b64_text,
    build,
    check_keys,
    content_dicts,
    finite_json,
    join_reasoning,
    neutral,
    opt_bool,
    opt_str,
    req_str,
    split_reasoning,
    stored_call,
)

SIGNATURES_KEY = "gemini_signatures"
THOUGHTS_KEY = "gemini_thought_lengths"
SYNTHETIC_KEY = "gemini_synthetic_ids"
RESPONSE_KEY = "gemini_response"
_PART_KINDS = ("text", "inline_data", "file_data", "function_call", "function_response")
_MEDIA_KINDS = ("inline_data", "file_data")  # what a function response's own parts hold
_CAMEL = re.compile(r"(?<=[a-z0-9])([A-Z])")


def from_gemini(
    contents: Sequence[WireItem],
    system_instruction: str | WireItem | None = None,
) -> list[Message]:
    """Neutral messages from Gemini ``contents`` and ``system_instruction``."""
    out: list[Message] = []
    if system_instruction is not None:
        out.append(_system_in(system_instruction, Loc("system_instruction")))
    pending: dict[str, list[str]] = {}  # function name -> ids of calls awaiting a response
    for i, raw in enumerate(as_sequence(contents, "contents")):
        loc = Loc.item("contents", i)
        obj = _snake(raw, loc)
        check_keys(obj, ("role", "parts"), loc)
        role = req_str(obj, "role", loc) if "role" in obj else "user"
        parts = [
            _snake(p, loc / "parts" / j)
            for j, p in enumerate(as_list(obj.get("parts"), loc / "parts"))
        ]
        if role == "model":
            message = _model_in(parts, loc)
            pending = {}
            for c in message.tool_calls:
                pending.setdefault(c.name, []).append(c.id)
            out.append(message)
        elif role == "user":
            out.extend(_user_in(parts, loc, pending))
        else:
            raise (loc / "role").error(f"unknown role {role!r} (expected user or model)")
    return out


MEMO_KEY = "gemini-part"  # a message's content or result part, in a memo slot (fold_contents)


def to_gemini(messages: Sequence[Message]) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """``(system_instruction, contents)`` for ``generate_content``."""
    items = neutral(messages)
    lead = next((i for i, m in enumerate(items) if m.role != "system"), len(items))
    contents = fold_contents(items[lead:], lead, {})
    return system_instruction(items[:lead]), contents


def system_instruction(items: Sequence[Message]) -> dict[str, Any] | None:
    """``system_instruction`` from the leading system messages (None: there are none)."""
    system = [p for i, m in enumerate(items) for p in _parts_out(m, Loc.item("messages", i),
                                                                   False)]
    return {"parts": system} if system else None


def fold_contents(items: Sequence[Message], offset: int, names: MutableMapping[str, str],
                  memo: Sequence[dict[str, Any]] | None = None,
                  starts: list[int] | None = None) -> list[dict[str, Any]]:
    """The contents of consecutive messages (none of them a leading system message), joined
    as :class:`Contents` joins them: a run of tool results is one user content, other
    neighbours of one role one content. ``names``: function name of each call id seen
    before ``items``, updated with their calls; ``offset``: index of ``items[0]`` in error
    paths; ``memo``: a dict per message keeping its content or result part (with the
    function name it used), made once across a turn's prepares; ``starts``: filled with
    the index in ``items`` of the message each content starts at."""
    out = Contents(starts)
    for i, m in enumerate(items):
        slot = memo[i] if memo is not None else None
        kept = slot.get(MEMO_KEY) if slot is not None else None
        if m.role == "tool":
            name = m.name or names.get(m.tool_call_id or "")
            if kept is None or kept[0] != name:
                kept = (name, _result_out(m, Loc.item("messages", offset + i), names))
                if slot is not None:
                    slot[MEMO_KEY] = kept
            out.response(kept[1], i)
            continue
        if m.tool_calls:
            names.update((c.id, c.name) for c in m.tool_calls)
        if kept is None:  # (its error path made only here: a memo holds most turns)
            loc = Loc.item("messages", offset + i)
            parts = _model_out(m, loc) if m.role == "assistant" else _parts_out(m, loc)
            role = "model" if m.role == "assistant" else "user"
            kept = (None, {"role": role, "parts": parts} if parts else None)
            if slot is not None:
                slot[MEMO_KEY] = kept
        if kept[1] is not None:  # the API refuses a content without parts
            out.add(kept[1], i)
    return out.items


def _responses(content: Mapping[str, Any]) -> bool:
    """A content of function responses (a tool-result content holds nothing else)."""
    parts = content["parts"]
    return bool(parts) and "function_response" in parts[0]


def joins(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    """Whether ``after`` goes out in the content ``before`` (see :class:`Contents`)."""
    return before["role"] == after["role"] and _responses(before) == _responses(after)


def joined(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """A new content: the parts of ``before`` then those of ``after`` (both left as they
    are: a memo's or an earlier view's)."""
    return {"role": before["role"], "parts": [*before["parts"], *after["parts"]]}


def join_all(before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]],
             ) -> list[dict[str, Any]]:
    """``[*before, *after]`` with the two joined where they meet (a new list; the contents
    of both, each joined already, left as they are)."""
    if before and after and joins(before[-1], after[0]):
        return [*before[:-1], joined(before[-1], after[0]), *after[1:]]
    return [*before, *after]


class Contents:
    """Contents as they are made, each joined to the one before where the API wants one
    content: multi-turn contents alternate between user and model, the function responses
    to a model content's calls all in the one user content after it. A content of
    function responses is joined to no other kind of part, though: Gemini 3 refuses a
    user content with text after its function responses (on Vertex AI at least), where
    two user contents in a row, responses then text, pass. The last content is copied
    before it grows (copy on write: it may be a memo's, in an earlier view too)."""

    __slots__ = ("_mine", "items", "starts")

    def __init__(self, starts: list[int] | None = None) -> None:
        self.items: list[dict[str, Any]] = []
        self.starts = starts
        self._mine = False  # the last content was made here (its parts list may grow)

    def add(self, content: dict[str, Any], at: int) -> None:
        """``content`` (a message's, at index ``at``) after the others."""
        items = self.items
        if items and joins(items[-1], content):
            if not self._mine:
                items[-1], self._mine = joined(items[-1], content), True
            else:
                items[-1]["parts"].extend(content["parts"])
            return
        items.append(content)
        self._mine = False
        if self.starts is not None:
            self.starts.append(at)

    def response(self, part: dict[str, Any], at: int) -> None:
        """A function response part (a tool message's, at index ``at``) after the others."""
        items = self.items
        if items and items[-1]["role"] == "user" and _responses(items[-1]):
            if not self._mine:
                items[-1], self._mine = {"role": "user", "parts": [*items[-1]["parts"]]}, True
            items[-1]["parts"].append(part)
            return
        items.append({"role": "user", "parts": [part]})
        self._mine = True
        if self.starts is not None:
            self.starts.append(at)


# -- in --------------------------------------------------------------------


def _snake(raw: Any, loc: Loc) -> dict[str, Any]:
    """A structural dict with camelCase keys renamed (values are left alone)."""
    out: dict[str, Any] = {}
    for key, value in as_mapping(raw, loc).items():
        name = _CAMEL.sub(lambda m: "_" + m.group(1).lower(), key)
        if name in out:
            raise (loc / key).error(f"given twice (as {name} and camelCase)")
        out[name] = value
    return out


def _kind(part: Mapping[str, Any], loc: Loc, kinds: tuple[str, ...] = _PART_KINDS) -> str:
    """Which one of ``kinds`` the part holds (Part is a oneof in the API)."""
    found = [k for k in kinds if part.get(k) is not None]
    if len(found) != 1:
        raise loc.error(f"a part holds exactly one of {list(kinds)}, got {found or 'none'}")
    extra = {"thought_signature"} if kinds == _PART_KINDS else set()
    check_keys(part, {found[0], *extra} | ({"thought"} if found[0] == "text" else set()), loc)
    return found[0]


def _system_in(raw: str | WireItem, loc: Loc) -> Message:
    if isinstance(raw, str):
        return build({"role": "system", "content": raw}, loc)
    obj = _snake(raw, loc)
    check_keys(obj, ("role", "parts"), loc)
    texts = []
    for j, p in enumerate(as_list(obj.get("parts"), loc / "parts")):
        part = _snake(p, loc / "parts" / j)
        check_keys(part, ("text",), loc / "parts" / j)
        texts.append({"type": "text", "text": req_str(part, "text", loc / "parts" / j)})
    return build({"role": "system", "content": content_dicts(texts, True)}, loc)


def _model_in(parts: list[dict[str, Any]], loc: Loc) -> Message:
    thoughts: list[str] = []
    content: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    signatures: dict[str, str] = {}
    synthetic: list[str] = []
    for j, part in enumerate(parts):
        p_loc = loc / "parts" / j
        kind = _kind(part, p_loc)
        if kind == "function_call":
            call = _snake(part["function_call"], p_loc / "function_call")
            check_keys(call, ("id", "name", "args"), p_loc / "function_call")
            call_id = opt_str(call, "id", p_loc / "function_call")
            if not call_id:
                call_id = f"gemini-{loc.index}-{j}"
                synthetic.append(call_id)
            args = as_mapping(call.get("args", {}), p_loc / "function_call" / "args")
            name = req_str(call, "name", p_loc / "function_call", nonempty=True)
            calls.append({"id": call_id, "name": name, "arguments": dict(args)})
            key = f"call:{call_id}"
        elif kind == "function_response":
            raise p_loc.error("function responses belong in a user content")
        elif kind == "text" and opt_bool(part, "thought", p_loc):
            key = f"thought:{len(thoughts)}"
            thoughts.append(req_str(part, "text", p_loc))
        else:
            key = f"content:{len(content)}"
            content.append(_media_in(part, kind, p_loc))
        if part.get("thought_signature") is not None:
            signatures[key] = b64_text(part["thought_signature"], p_loc / "thought_signature")
    metadata: dict[str, Any] = {}
    if signatures:
        metadata[SIGNATURES_KEY] = signatures
    if len(thoughts) > 1:
        metadata[THOUGHTS_KEY] = [len(t) for t in thoughts]
    if synthetic:
        metadata[SYNTHETIC_KEY] = synthetic
    data = {"role": "assistant", "content": content_dicts(content, True), "tool_calls": calls}
    return build({**data, "reasoning": join_reasoning(thoughts), "metadata": metadata}, loc)


def _user_in(parts: list[dict[str, Any]], loc: Loc, pending: dict[str, list[str]]) -> list[Message]:
    tools: list[Message] = []
    content: list[dict[str, Any]] = []
    for j, part in enumerate(parts):
        p_loc = loc / "parts" / j
        kind = _kind(part, p_loc)
        if kind == "function_response":
            tools.append(_result_in(part, p_loc, pending, f"gemini-{loc.index}-{j}"))
        elif kind == "function_call":
            raise p_loc.error("function calls belong in a model content")
        else:
            content.append(_media_in(part, kind, p_loc))
    if content or not tools:
        tools.append(build({"role": "user", "content": content_dicts(content, True)}, loc))
    return tools


def _result_in(
    part: Mapping[str, Any], loc: Loc, pending: dict[str, list[str]], fresh: str
) -> Message:
    r_loc = loc / "function_response"
    fr = _snake(part["function_response"], r_loc)
    check_keys(fr, ("id", "name", "response", "parts"), r_loc)
    name = req_str(fr, "name", r_loc, nonempty=True)
    response = dict(as_mapping(fr.get("response"), r_loc / "response"))
    queue = pending.get(name, [])
    metadata: dict[str, Any] = {}
    call_id = opt_str(fr, "id", r_loc)
    if call_id:
        if call_id in queue:
            queue.remove(call_id)
    else:
        call_id = queue.pop(0) if queue else fresh
        metadata[SYNTHETIC_KEY] = True
    text = response.get("output") if list(response) == ["output"] else None
    if list(response) == ["error"] and isinstance(response["error"], str):
        text, metadata[IS_ERROR] = response["error"], True
    if not isinstance(text, str):
        text, metadata[RESPONSE_KEY] = finite_json(response, r_loc / "response"), "json"
    media = []
    for k, raw in enumerate(as_list(fr.get("parts") or [], r_loc / "parts")):
        m_part, m_loc = _snake(raw, r_loc / "parts" / k), r_loc / "parts" / k
        media.append(_media_in(m_part, _kind(m_part, m_loc, _MEDIA_KINDS), m_loc))
    content: Any = text if not media else ([{"type": "text", "text": text}] if text else []) + media
    if part.get("thought_signature") is not None:
        signature = b64_text(part["thought_signature"], loc / "thought_signature")
        metadata[SIGNATURES_KEY] = {"response": signature}
    data = {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}
    return build({**data, "metadata": metadata}, loc)


def _media_in(part: Mapping[str, Any], kind: str, loc: Loc) -> dict[str, Any]:
    """A text, inline_data or file_data part as a neutral part dict."""
    if kind == "text":
        return {"type": "text", "text": req_str(part, "text", loc)}
    m_loc = loc / kind
    blob = _snake(part[kind], m_loc)
    source = "data" if kind == "inline_data" else "file_uri"
    check_keys(blob, ("mime_type", source, "display_name"), m_loc)
    mime = opt_str(blob, "mime_type", m_loc)
    out: dict[str, Any] = {}
    if kind == "inline_data":
        out["data"] = b64_text(blob.get("data"), m_loc / "data")
    else:
        out["url"] = req_str(blob, "file_uri", m_loc, nonempty=True)
    if mime is not None:
        out["media_type"] = mime
    filename = opt_str(blob, "display_name", m_loc)
    if filename is None and mime is not None and mime.startswith("image/"):
        return {"type": "image", **out}
    return {"type": "file", **out, **({"filename": filename} if filename is not None else {})}


# -- out -------------------------------------------------------------------


def _signed(part: dict[str, Any], m: Message, key: str) -> dict[str, Any]:
    signatures = m.metadata.get(SIGNATURES_KEY)
    if isinstance(signatures, dict) and isinstance(signatures.get(key), str):
        part["thought_signature"] = signatures[key]
    return part


def _model_out(m: Message, loc: Loc) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    if m.reasoning is not None:
        lengths = m.metadata.get(THOUGHTS_KEY)
        texts = None
        if isinstance(lengths, list) and all(isinstance(n, int) for n in lengths):
            texts = split_reasoning(m.reasoning, lengths)
        for n, text in enumerate(texts or [m.reasoning]):
            if text:
                parts.append(_signed({"text": text, "thought": True}, m, f"thought:{n}"))
    parts += _parts_out(m, loc)
    synthetic = m.metadata.get(SYNTHETIC_KEY)
    for j, c in enumerate(m.tool_calls):
        call: dict[str, Any] = {
            "name": c.name,
            "args": arguments_object(c.arguments, loc / "tool_calls" / j / "arguments"),
        }
        if not (isinstance(synthetic, list) and c.id in synthetic):
            call["id"] = c.id
        parts.append(_signed({"function_call": call}, m, f"call:{c.id}"))
    return parts


def _parts_out(m: Message, loc: Loc, media: bool = True) -> list[dict[str, Any]]:
    """Text and media parts, without empty texts (the API refuses an empty text part)
    except one that carries a thought signature (streamed turns end so; it goes back as
    received)."""
    parts = [TextPart(text=m.content)] if isinstance(m.content, str) else m.content
    out = []
    for j, p in enumerate(parts):
        if isinstance(p, TextPart) and not p.text and not _has_signature(m, f"content:{j}"):
            continue
        if not media and not isinstance(p, TextPart):
            raise (loc / "content" / j).error("the system instruction takes text only")
        out.append(_signed(_part_out(p, loc / "content" / j), m, f"content:{j}"))
    return out


def _has_signature(m: Message, key: str) -> bool:
    signatures = m.metadata.get(SIGNATURES_KEY)
    return isinstance(signatures, dict) and isinstance(signatures.get(key), str)


def _part_out(part: ContentPart, loc: Loc) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"text": part.text}
    name = None if isinstance(part, ImagePart) else part.filename
    extra = {} if name is None else {"display_name": name}
    if part.data is not None:
        if part.media_type is None:
            raise (loc / "media_type").error("inline data needs a media type")
        return {"inline_data": {"mime_type": part.media_type, "data": part.data, **extra}}
    if part.url is not None:
        blob = {"file_uri": part.url, **extra}
        mime = part.media_type or mimetypes.guess_type(part.url)[0]
        return {"file_data": {**({"mime_type": mime} if mime else {}), **blob}}
    raise (loc / "file_id").error("Gemini cannot reference a provider file id; give data or a URL")


Kept = tuple[str | None, dict[str, Any] | None]  # a memo slot's entry (see fold_contents)


def _signed_stored(part: dict[str, Any], signatures: Any, key: str) -> dict[str, Any]:
    if isinstance(signatures, dict) and isinstance(signatures.get(key), str):
        part["thought_signature"] = signatures[key]
    return part


def kept_of_stored(data: Any, index: int, name: str | None) -> Kept | None:
    """What :func:`fold_contents` keeps in a stored message's memo slot
    (``messages[index]``), made from its JSON as plain data; ``name``: the function name
    a result answers (its own, or its call's). None when only the model can say
    (reasoning, content parts, an unnamed result, an unexpected shape)."""
    if type(data) is not dict:
        return None
    role_in, content = data.get("role"), data.get("content", "")
    calls, meta = data.get("tool_calls", []), data.get("metadata", {})
    if type(role_in) is not str or type(content) is not str or type(calls) is not list \
            or type(meta) is not dict or data.get("reasoning") is not None \
            or (calls and role_in != "assistant"):
        return None
    signatures = meta.get(SIGNATURES_KEY) if meta else None
    if role_in == "tool":
        call_id = data.get("tool_call_id")
        if type(call_id) is not str or calls or not name:
            return None
        response = _json_object(content) if meta.get(RESPONSE_KEY) == "json" else None
        if response is None:
            response = {"error" if meta.get(IS_ERROR) else "output": content}
        fr: dict[str, Any] = {"name": name, "response": response}
        if meta.get(SYNTHETIC_KEY) is not True:
            fr["id"] = call_id
        return name, _signed_stored({"function_response": fr}, signatures, "response")
    signed = isinstance(signatures, dict) and isinstance(signatures.get("content:0"), str)
    parts = ([_signed_stored({"text": content}, signatures, "content:0")]
             if content or signed else [])
    synthetic = meta.get(SYNTHETIC_KEY)
    for j, c in enumerate(calls):
        found = stored_call(c, index, j)
        if found is None:
            return None
        call_id, fn, args = found
        call: dict[str, Any] = {"name": fn, "args": args}
        if not (isinstance(synthetic, list) and call_id in synthetic):
            call["id"] = call_id
        parts.append(_signed_stored({"function_call": call}, signatures, f"call:{call_id}")
                     if signatures is not None else {"function_call": call})
    role = "model" if role_in == "assistant" else "user"
    return None, ({"role": role, "parts": parts} if parts else None)


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _result_out(m: Message, loc: Loc, names: Mapping[str, str]) -> dict[str, Any]:
    assert m.tool_call_id is not None  # guaranteed by Message
    name = m.name or names.get(m.tool_call_id)
    if not name:
        raise (loc / "name").error(
            f"no function name: no call {m.tool_call_id!r} precedes this result"
        )
    text = m.text()
    response = _json_object(text) if m.metadata.get(RESPONSE_KEY) == "json" else None
    if response is None:  # plain text, or JSON edited into something else since
        response = {"error" if m.metadata.get(IS_ERROR) else "output": text}
    fr: dict[str, Any] = {"name": name, "response": response}
    if m.metadata.get(SYNTHETIC_KEY) is not True:
        fr["id"] = m.tool_call_id
    if not isinstance(m.content, str):
        media = [
            _part_out(p, loc / "content" / j)
            for j, p in enumerate(m.content)
            if not isinstance(p, TextPart)
        ]
        if media:
            fr["parts"] = media
    return _signed({"function_response": fr}, m, "response")
