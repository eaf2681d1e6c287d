"""Responses input items <-> neutral :class:`Message`: the Agents SDK session's data mapping.

Kept apart from the session and the model wrapper because it needs no SDK
(plain dicts and pydantic items in, messages out), so it is testable and
importable without the ``[openai-agents]`` extra.

Item mapping (Responses input items <-> neutral :class:`Message`), lossless
for what these item types carry:

==============================  ===============================================
item                            message
==============================  ===============================================
``message`` user / system       ``user`` / ``system`` (``developer`` is a system
/ developer (easy or typed)     message with metadata ``agents_role``); parts
                                ``input_text`` / ``input_image`` / ``input_file``
                                (an image by ``file_id``: a file part of media
                                type ``image/*``)
``message`` assistant           ``assistant``; ``output_text`` parts joined, the
                                original parts and item id kept in metadata
``function_call``               a tool call on the assistant message before it
                                (one message per model turn: parallel calls stay
                                together)
``function_call_output``        ``tool`` (``call_id`` -> ``tool_call_id``)
``reasoning``                   ``Message.reasoning`` of the next assistant
                                message; the item itself kept in metadata
hosted tool calls               as ``reasoning``: a note of the call (its
(``web_search_call``,           arguments and result, clipped) in
``file_search_call``,           ``Message.reasoning``, the item itself kept in
``code_interpreter_call``,      metadata and sent back as it was
``image_generation_call``,
``mcp_call``, ``mcp_list_tools``)
==============================  ===============================================

The provider runs a hosted tool itself and returns call and result in one item, so it
goes with its model turn like a reasoning item. Any other item (computer use, local
shell and custom tool calls with their outputs, item references...) is refused with
:class:`InvalidInput` naming ``items[i].type``; a batch is mapped completely before
anything is written, so a refused batch leaves the session as it was.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from shared.core.callids import wire_id
from shared.core.errors import InvalidInput
from shared.core.messages import Message
from shared.integrations.notes import provider_note

ID = "agents_id"  # the item id (msg_..., fc_..., rs_...) of a message
ROLE = "agents_role"  # "developer" for a developer message
PARTS = "agents_content"  # an assistant message's original output parts
CALL_IDS = "agents_call_ids"  # {call_id: function_call item id}
REASONING = "agents_reasoning"  # reasoning and hosted tool items that preceded the message
IMAGE_FILE = "image/*"  # the media type of an image uploaded with the Files API (by id)
HOSTED = ("web_search_call", "file_search_call", "code_interpreter_call",
          "image_generation_call", "mcp_call", "mcp_list_tools")
SUPPORTED = ("message", "function_call", "function_call_output", "reasoning", *HOSTED)

__all__ = ["items_to_messages", "mapped_from", "messages_to_items"]


# -- items -> messages ---------------------------------------------------------------------
def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _mapping(raw: Any, where: str) -> Mapping[str, Any]:
    if hasattr(raw, "model_dump"):  # an SDK pydantic item (ResponseFunctionToolCall...)
        raw = raw.model_dump(mode="json", exclude_none=True)
    if not isinstance(raw, Mapping):
        raise InvalidInput(f"expected an object, got {_kind(raw)}", field=where)
    return raw


def _str(obj: Mapping[str, Any], key: str, where: str, *, nonempty: bool = False) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise InvalidInput("required" if key not in obj else
                           f"expected a string, got {_kind(value)}", field=f"{where}.{key}")
    if nonempty and not value:
        raise InvalidInput("must not be empty", field=f"{where}.{key}")
    return value


def _input_parts(content: Any, where: str) -> str | list[dict[str, Any]]:
    """User/system/tool-output content: a string, or input_text/image/file parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidInput(f"expected a string or a list of parts, got {_kind(content)}",
                           field=where)
    parts: list[dict[str, Any]] = []
    for j, raw in enumerate(content):
        at = f"{where}[{j}]"
        part = _mapping(raw, at)
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": _str(part, "text", at)})
        elif kind == "input_image":
            url = part.get("image_url")
            if isinstance(url, str) and url.startswith("data:") and ";base64," in url:
                media, data = url[5:].split(";base64,", 1)
                image = {"type": "image", "data": data, "media_type": media}
            elif isinstance(url, str) and url:
                image = {"type": "image", "url": url}
            elif isinstance(part.get("file_id"), str) and part["file_id"]:
                # an uploaded image: a file part by id, marked as an image (IMAGE_FILE)
                parts.append({"type": "file", "file_id": part["file_id"],
                              "media_type": IMAGE_FILE})
                continue
            else:
                raise InvalidInput("an image needs image_url (a URL or data URL) or file_id",
                                   field=f"{at}.image_url")
            if isinstance(part.get("detail"), str):
                image["detail"] = part["detail"]
            parts.append(image)
        elif kind == "input_file":
            file: dict[str, Any] = {"type": "file"}
            for src, dst in (("file_url", "url"), ("file_id", "file_id"),
                             ("filename", "filename"), ("file_data", "data")):
                if isinstance(part.get(src), str):
                    file[dst] = part[src]
            if not ({"url", "file_id", "data"} & file.keys()):
                raise InvalidInput("a file needs file_url, file_id or file_data", field=at)
            parts.append(file)
        else:
            raise InvalidInput(f"unknown content part type {kind!r} (expected input_text, "
                               "input_image or input_file)", field=f"{at}.type")
    return parts


def _preceding_texts(item: Mapping[str, Any]) -> list[str]:
    """What a reasoning item (its summary) or a hosted tool call (a note of the call,
    for the log and its summaries) adds to the next assistant message's reasoning."""
    if item.get("type") == "reasoning":
        return [str(s.get("text", "")) for s in item.get("summary") or []
                if isinstance(s, Mapping)]
    return [provider_note(str(item.get("type")), item)]


@dataclass
class _Builder:
    """Folds a flat item list into messages (one assistant message per model turn)."""

    prefix: str
    out: list[Message] = field(default_factory=list)
    reasoning: list[dict[str, Any]] = field(default_factory=list)
    turn: dict[str, Any] | None = None  # the assistant message being built
    turn_at: str = ""

    def start_turn(self, content: str, meta: dict[str, Any], where: str) -> dict[str, Any]:
        """A new assistant message; reasoning items seen since the last one belong to it."""
        self._close()
        turn: dict[str, Any] = {"role": "assistant", "content": content, "tool_calls": [],
                                "metadata": meta}
        if self.reasoning:
            meta[REASONING] = self.reasoning
            texts = [text for r in self.reasoning for text in _preceding_texts(r)]
            if any(texts):
                turn["reasoning"] = "\n\n".join(t for t in texts if t)
            self.reasoning = []
        self.turn, self.turn_at = turn, where
        return turn

    def _close(self) -> None:
        if self.turn is not None:
            turn, self.turn = self.turn, None
            self.out.append(_build(turn, self.turn_at))

    def end_turn(self) -> None:
        """Close the assistant message; reasoning with nothing after it gets its own."""
        if self.turn is None and self.reasoning:
            self.start_turn("", {}, self.turn_at or self.prefix)
        self._close()

    def add(self, raw: Any, i: int) -> None:
        where = f"{self.prefix}[{i}]"
        item = _mapping(raw, where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            self._message(item, where)
        elif kind == "function_call":
            call_id = _str(item, "call_id", where, nonempty=True)
            name = _str(item, "name", where, nonempty=True)
            arguments = _str(item, "arguments", where)
            try:
                json.loads(arguments or "{}")
            except ValueError as exc:
                raise InvalidInput(f"not valid JSON ({exc})", field=f"{where}.arguments") from None
            turn = self.turn if self.turn is not None else self.start_turn("", {}, where)
            turn["tool_calls"].append({"id": call_id, "name": name, "arguments": arguments or "{}"})
            if isinstance(item.get("id"), str):
                turn["metadata"].setdefault(CALL_IDS, {})[call_id] = item["id"]
        elif kind == "function_call_output":
            self.end_turn()
            content = _input_parts(item.get("output"), f"{where}.output")
            meta = {ID: item["id"]} if isinstance(item.get("id"), str) else {}
            self.out.append(_build({"role": "tool", "content": content, "metadata": meta,
                                    "tool_call_id": _str(item, "call_id", where, nonempty=True)},
                                   where))
        elif kind == "reasoning" or kind in HOSTED:
            if self.turn is not None:
                self.end_turn()
            self.turn_at = where
            self.reasoning.append(json.loads(json.dumps(dict(item), default=str)))
        else:
            raise InvalidInput(f"cannot map item type {kind!r} to a message (supported: "
                               f"{', '.join(SUPPORTED)})", field=f"{where}.type")

    def _message(self, item: Mapping[str, Any], where: str) -> None:
        role = item.get("role")
        if role not in ("user", "system", "developer", "assistant"):
            raise InvalidInput(f"unknown role {role!r} (expected user, system, developer or "
                               "assistant)", field=f"{where}.role")
        meta: dict[str, Any] = {}
        if isinstance(item.get("id"), str):
            meta[ID] = item["id"]
        content = item.get("content")
        if role == "assistant":
            text = content if isinstance(content, str) else None
            if text is None:
                if not isinstance(content, list):
                    raise InvalidInput(f"expected a string or a list of parts, got "
                                       f"{_kind(content)}", field=f"{where}.content")
                texts = []
                for j, raw in enumerate(content):
                    part = _mapping(raw, f"{where}.content[{j}]")
                    if part.get("type") in ("output_text", "input_text", "text"):
                        texts.append(_str(part, "text", f"{where}.content[{j}]"))
                    elif part.get("type") == "refusal":
                        texts.append(_str(part, "refusal", f"{where}.content[{j}]"))
                    else:
                        raise InvalidInput(f"unknown content part type {part.get('type')!r} "
                                           "(expected output_text or refusal)",
                                           field=f"{where}.content[{j}].type")
                text = "".join(texts)
                meta[PARTS] = json.loads(json.dumps(content, default=str))
            self.start_turn(text, meta, where)
            return
        self.end_turn()
        if role == "developer":
            role, meta[ROLE] = "system", "developer"
        self.out.append(_build({"role": role, "metadata": meta,
                                "content": _input_parts(content, f"{where}.content")}, where))


def _build(data: dict[str, Any], where: str) -> Message:
    try:
        return Message.model_validate(data)
    except ValueError as exc:
        raise InvalidInput(str(exc).splitlines()[-1].strip() if str(exc) else "invalid",
                           field=where) from None


def items_to_messages(items: Sequence[Any], prefix: str = "items") -> list[Message]:
    """Neutral messages from Responses input items (see the module docstring)."""
    return mapped_from(items, prefix)[0]


def mapped_from(items: Sequence[Any], prefix: str = "items", start: int = 0,
                ) -> tuple[list[Message], list[tuple[int, int]]]:
    """:func:`items_to_messages` of ``items[start:]`` (errors name absolute indices), and its
    cuts: ``(i, n)`` where the first ``i`` items (from ``start``) made ``n`` messages and no
    message is left open, so what follows ``i`` maps the same on its own (an assistant
    turn absorbs the function calls after it; a cut never falls inside one)."""
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Sequence):
        raise InvalidInput(f"expected a list of items, got {_kind(items)}", field=prefix)
    builder = _Builder(prefix)
    cuts: list[tuple[int, int]] = []
    for i in range(start, len(items)):
        builder.add(items[i], i)
        if builder.turn is None and not builder.reasoning:
            cuts.append((i + 1, len(builder.out)))
    builder.end_turn()
    return builder.out, cuts


# -- messages -> items ---------------------------------------------------------------------
def _parts_out(content: Any, *, output: bool = False) -> Any:
    if isinstance(content, str):
        return content
    out: list[dict[str, Any]] = []
    for part in content:
        if part.type == "text":
            out.append({"type": "input_text", "text": part.text})
        elif part.type == "image":
            url = part.url or f"data:{part.media_type};base64,{part.data}"
            image: dict[str, Any] = {"type": "input_image", "image_url": url,
                                     "detail": part.detail or "auto"}
            out.append(image)
        elif part.file_id is not None and part.media_type == IMAGE_FILE:
            out.append({"type": "input_image", "file_id": part.file_id, "detail": "auto"})
        else:
            file: dict[str, Any] = {"type": "input_file"}
            for src, dst in (("url", "file_url"), ("file_id", "file_id"),
                             ("filename", "filename"), ("data", "file_data")):
                if getattr(part, src) is not None:
                    file[dst] = getattr(part, src)
            out.append(file)
    return out


def messages_to_items(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Responses input items from neutral messages (the inverse of :func:`items_to_messages`)."""
    items: list[dict[str, Any]] = []
    for m in messages:
        meta = m.metadata
        if m.role == "tool":
            call_id = wire_id(m, m.tool_call_id) if m.tool_call_id else m.tool_call_id
            item: dict[str, Any] = {"type": "function_call_output", "call_id": call_id,
                                    "output": _parts_out(m.content)}
            if ID in meta:
                item["id"] = meta[ID]
            items.append(item)
        elif m.role == "assistant":
            items.extend(cast(list[dict[str, Any]], meta.get(REASONING, [])))
            text = m.text()
            if text or (not m.tool_calls and REASONING not in meta):
                parts = meta.get(PARTS)
                if ID in meta:
                    joined = ("".join(p.get("text", p.get("refusal", "")) for p in parts)
                              if isinstance(parts, list) else None)
                    content = parts if joined == text else [
                        {"type": "output_text", "text": text, "annotations": []}]
                    items.append({"type": "message", "role": "assistant", "id": meta[ID],
                                  "status": "completed", "content": content})
                else:
                    items.append({"role": "assistant", "content": text})
            calls = meta.get(CALL_IDS, {})
            for c in m.tool_calls:
                provider_id = wire_id(m, c.id)  # the store may have renamed a repeated id
                call: dict[str, Any] = {"type": "function_call", "call_id": provider_id,
                                        "name": c.name, "arguments": c.arguments}
                if provider_id in calls:
                    call["id"] = calls[provider_id]
                items.append(call)
        else:
            role = "developer" if meta.get(ROLE) == "developer" else m.role
            item = {"role": role, "content": _parts_out(m.content)}
            if ID in meta:
                item["id"], item["type"] = meta[ID], "message"
            items.append(item)
    return items
