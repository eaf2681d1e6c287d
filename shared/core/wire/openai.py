"""OpenAI Chat Completions messages <-> neutral :class:`~shared.core.messages.Message`.

``to_openai(from_openai(x)) == x`` for canonical input. Canonical means the
shape the API documents, with these normalisations applied on the way in
(each is lossless for meaning):

- tool calls in the flat form ``{id, name, arguments}`` (our transcripts)
  come out in the standard nested form ``{id, type: "function",
  function: {name, arguments}}``; ``tool_calls: []`` or ``null`` is omitted;
- content ``null`` becomes ``""``; on the way out an assistant message with
  tool calls and no text gets ``content: None`` (what the API itself returns
  and what strict OpenAI-compatible servers expect), every other empty
  content stays ``""``; arguments ``""`` become ``"{}"``;
- ``developer`` becomes a ``system`` message with metadata
  ``openai_role="developer"``, so it goes back out as ``developer``;
- ``reasoning_content`` (DeepSeek, vLLM) is ``Message.reasoning``;
- ``refusal``, ``annotations`` and ``audio`` ride in metadata as
  ``openai_<key>`` and go back out; ``usage`` (response data some logs keep
  on assistant messages) is kept as metadata ``usage`` and never sent;
- an image or file given as a ``data:<type>;base64,`` URL is stored as
  ``data`` + ``media_type`` (so other providers can inline it) and rebuilt
  byte for byte; ``prompt_cache_breakpoint`` on a part is a request hint and
  is dropped.

Refused with :class:`~shared.core.errors.InvalidInput`: unknown roles and keys,
the deprecated ``function`` role / ``function_call``, ``input_audio`` and
``refusal`` parts, non-``function`` tool calls, arguments that are not a JSON
string. Going out, media the API cannot take there (images outside user
messages, files known only by URL) is refused the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shared.core.messages import ContentPart, FilePart, ImagePart, Message, TextPart
from shared.core.wire._common import (
    USAGE,
    Loc,
    WireItem,
    as_list,
    as_mapping,
    as_sequence,
    build,
    check_keys,
    data_url,
    json_arguments,
    neutral,
    omitted_text,
    opt_str,
    req_str,
    split_data_url,
)

ROLE_KEY = "openai_role"
PASSTHROUGH = ("refusal", "annotations", "audio")
_ROLES = ("system", "developer", "user", "assistant", "tool")
_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content"})
_MESSAGE_KEYS = _KEYS | {USAGE, *PASSTHROUGH}
_HINTS = ("prompt_cache_breakpoint",)


def from_openai(messages: Sequence[WireItem]) -> list[Message]:
    """Neutral messages from an OpenAI ``messages`` list."""
    items = as_sequence(messages, "messages")
    return [_message_in(raw, Loc.item("messages", i)) for i, raw in enumerate(items)]


def to_openai(
    messages: Sequence[Message], *, include_reasoning: bool = True
) -> list[dict[str, Any]]:
    """An OpenAI ``messages`` list. ``include_reasoning=False`` leaves out
    ``reasoning_content`` for endpoints that refuse it (api.openai.com)."""
    return [
        _message_out(m, Loc.item("messages", i), include_reasoning)
        for i, m in enumerate(neutral(messages))
    ]


# -- in --------------------------------------------------------------------


def _message_in(raw: Any, loc: Loc) -> Message:
    obj = as_mapping(raw, loc)
    if obj.get("role") == "function":
        raise (loc / "role").error("the deprecated function-call format is not supported")
    if obj.get("function_call") is not None:  # the SDK's dump sets it to None: no call
        raise (loc / "function_call").error("the deprecated function-call format is not "
                                            "supported (use tool_calls)")
    check_keys(obj, _MESSAGE_KEYS, loc)
    role = req_str(obj, "role", loc)
    if role not in _ROLES:
        raise (loc / "role").error(f"unknown role {role!r} (expected one of {list(_ROLES)})")
    metadata: dict[str, Any] = {}
    if role == "developer":
        role, metadata[ROLE_KEY] = "system", "developer"
    data: dict[str, Any] = {
        "role": role,
        "content": _content_in(obj.get("content"), loc / "content"),
    }
    if (name := opt_str(obj, "name", loc)) is not None:
        data["name"] = name
    if (reasoning := opt_str(obj, "reasoning_content", loc)) is not None:
        data["reasoning"] = reasoning
    calls = obj.get("tool_calls")
    if calls is not None:
        if role != "assistant" and calls:
            raise (loc / "tool_calls").error("only assistant messages carry tool calls")
        items = as_list(calls, loc / "tool_calls")
        data["tool_calls"] = [_call_in(c, loc / "tool_calls" / j) for j, c in enumerate(items)]
    if role == "tool":
        data["tool_call_id"] = req_str(obj, "tool_call_id", loc, nonempty=True)
    elif obj.get("tool_call_id") is not None:
        raise (loc / "tool_call_id").error("only tool messages carry a tool_call_id")
    for key in PASSTHROUGH:
        if obj.get(key) is not None:
            metadata[f"openai_{key}"] = obj[key]
    if obj.get(USAGE) is not None:
        metadata[USAGE] = dict(as_mapping(obj[USAGE], loc / USAGE))
    data["metadata"] = metadata
    return build(data, loc)


def _call_in(raw: Any, loc: Loc) -> dict[str, Any]:
    obj = as_mapping(raw, loc)
    kind = obj.get("type", "function")
    if kind != "function":
        raise (loc / "type").error(f"only function tool calls are supported, got {kind!r}")
    call_id = req_str(obj, "id", loc, nonempty=True)
    if "function" in obj:  # the standard nested form
        check_keys(obj, ("id", "type", "function"), loc)
        fn_loc = loc / "function"
        fn = as_mapping(obj["function"], fn_loc)
        check_keys(fn, ("name", "arguments"), fn_loc)
    else:  # the flat form {id, name, arguments}
        check_keys(obj, ("id", "type", "name", "arguments"), loc)
        fn, fn_loc = obj, loc
    name = req_str(fn, "name", fn_loc, nonempty=True)
    arguments = json_arguments(fn.get("arguments", "{}"), fn_loc / "arguments")
    return {"id": call_id, "name": name, "arguments": arguments}


def _content_in(value: Any, loc: Loc) -> str | list[dict[str, Any]]:
    if value is None or isinstance(value, str):
        return value or ""
    if not isinstance(value, list):
        raise loc.error(f"expected a string, a list of parts or null, got {type(value).__name__}")
    return [_part_in(p, loc / j) for j, p in enumerate(value)]


def _part_in(raw: Any, loc: Loc) -> dict[str, Any]:
    obj = as_mapping(raw, loc)
    kind = obj.get("type")
    if kind == "text":
        check_keys(obj, ("type", "text", *_HINTS), loc)
        return {"type": "text", "text": req_str(obj, "text", loc)}
    if kind == "image_url":
        check_keys(obj, ("type", "image_url", *_HINTS), loc)
        img = as_mapping(obj.get("image_url"), loc / "image_url")
        check_keys(img, ("url", "detail"), loc / "image_url")
        part = _inline(req_str(img, "url", loc / "image_url", nonempty=True), "url")
        if (detail := opt_str(img, "detail", loc / "image_url")) is not None:
            part["detail"] = detail
        return {"type": "image", **part}
    if kind == "file":
        check_keys(obj, ("type", "file", *_HINTS), loc)
        f_loc = loc / "file"
        f = as_mapping(obj.get("file"), f_loc)
        check_keys(f, ("file_id", "file_data", "filename"), f_loc)
        part = {"type": "file"}
        if (file_data := opt_str(f, "file_data", f_loc)) is not None:
            part.update(_inline(file_data, "data"))
        for key in ("file_id", "filename"):
            if (value := opt_str(f, key, f_loc)) is not None:
                part[key] = value
        if "data" not in part and "file_id" not in part:
            raise f_loc.error("a file needs file_id or file_data")
        return part
    if kind == "input_audio":
        raise (loc / "type").error("audio input is not supported (the neutral model has no audio)")
    raise (loc / "type").error(f"unknown part type {kind!r} (expected text, image_url or file)")


def _inline(value: str, plain_key: str) -> dict[str, str]:
    """A data URL split into data + media_type; anything else kept under ``plain_key``."""
    split = split_data_url(value)
    return {"media_type": split[0], "data": split[1]} if split else {plain_key: value}


# -- out -------------------------------------------------------------------


def _message_out(m: Message, loc: Loc, include_reasoning: bool) -> dict[str, Any]:
    role = "developer" if m.role == "system" and m.metadata.get(ROLE_KEY) == "developer" else m.role
    out: dict[str, Any] = {"role": role}
    if m.role == "assistant" and m.tool_calls and m.content == "":
        out["content"] = None
    else:
        out["content"] = _content_out(m.content, loc / "content", media=m.role == "user")
    if m.name is not None:
        out["name"] = m.name
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if include_reasoning and m.reasoning is not None:
        out["reasoning_content"] = m.reasoning
    for key in PASSTHROUGH:
        if f"openai_{key}" in m.metadata:
            out[key] = m.metadata[f"openai_{key}"]
    return out


def _content_out(content: str | list[ContentPart], loc: Loc, media: bool) -> Any:
    if isinstance(content, str):
        return content
    return [_part_out(p, loc / j, media) for j, p in enumerate(content)]


def _part_out(part: ContentPart, loc: Loc, media: bool) -> dict[str, Any]:
    """A content part on the wire. What OpenAI's chat format cannot carry (an image a
    tool returned, a file known by URL alone) becomes a line of text saying so: a
    message in the log that every later view must hold cannot be refused here without
    making the session unusable, and the model is told what it does not see."""
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if not media:
        return _omitted(part, "OpenAI's chat format takes images and files in user "
                              "messages only")
    if isinstance(part, ImagePart):
        url = part.url or _data_url(part)
        if url is None:
            return _omitted(part, "its media type is not known")
        image: dict[str, Any] = {"url": url}
        if part.detail is not None:
            image["detail"] = part.detail
        return {"type": "image_url", "image_url": image}
    file = _file_out(part)
    if file is None:
        return _omitted(part, "OpenAI takes a file's data or file_id, not a URL")
    return {"type": "file", "file": file}


def _omitted(part: ImagePart | FilePart, why: str) -> dict[str, Any]:
    return {"type": "text", "text": omitted_text(part, why)}


def _file_out(part: FilePart) -> dict[str, str] | None:
    out: dict[str, str] = {}
    if part.data is not None:
        out["file_data"] = (
            part.data if part.media_type is None else data_url(part.media_type, part.data)
        )
    if part.file_id is not None:
        out["file_id"] = part.file_id
    if not out:
        return None
    if part.filename is not None:
        out["filename"] = part.filename
    return out


_IMAGE_MAGIC = (("iVBORw0KGgo", "image/png"), ("/9j/", "image/jpeg"), ("R0lGOD", "image/gif"),
                ("UklGR", "image/webp"))


def _data_url(part: ImagePart) -> str | None:
    """The data URL of an inline image; its media type read from the data's first bytes
    where it was not given (None when they are not an image's OpenAI takes)."""
    if part.data is None:
        return None
    media_type = part.media_type if part.media_type is not None else next(
        (kind for magic, kind in _IMAGE_MAGIC if part.data.startswith(magic)), None)
    return None if media_type is None else data_url(media_type, part.data)
