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
``code_interpreter_call``,      metadata and sent back as it was (counted as
``image_generation_call``,      such: metadata ``extra_tokens``); left out, with
``mcp_call``, ``mcp_list_tools``)
                                the turn's reasoning items, once its note is not
                                in the reasoning
client tool calls               as ``function_call``: a tool call (name: the SDK
(``computer_call``,             tool's or the custom tool's, arguments: the
``local_shell_call``,           call's payload) on the model turn's assistant
``shell_call``,                 message, the item kept in metadata
``custom_tool_call``,           (:mod:`~shared.integrations.agents_client_items`)
``apply_patch_call``)
their outputs                   ``tool`` (``call_id`` -> ``tool_call_id``); a
(``computer_call_output``...)   screenshot is an image part, shell output text;
                                the item kept, rebuilt as its call's type when
                                compaction changed the content
==============================  ===============================================

The provider runs a hosted tool itself and returns call and result in one item, so it
goes with its model turn like a reasoning item; the SDK runs a client tool in the agent's
process, and its call and output pair like a function call's. Any other item (item
references, MCP approval requests...) is refused with :class:`InvalidInput` naming
``items[i].type``; a batch is mapped completely before anything is written, so a refused
batch leaves the session as it was.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from shared.core.callids import wire_id
from shared.core.errors import InvalidInput
from shared.core.messages import Message
from shared.core.tokens import EXTRA_TOKENS
from shared.integrations import agents_client_items as client
from shared.integrations.agents_parts import IMAGE_FILE, json_copy, kind_of, parts_out
from shared.integrations.agents_parts import input_parts as _input_parts
from shared.integrations.agents_parts import mapping as _mapping
from shared.integrations.agents_parts import string as _str
from shared.integrations.notes import kept_notes, provider_note, sent_tokens

ID = "agents_id"  # the item id (msg_..., fc_..., rs_...) of a message
ROLE = "agents_role"  # "developer" for a developer message
PARTS = "agents_content"  # an assistant message's original output parts
CALL_IDS = "agents_call_ids"  # {call_id: function_call item id}
REASONING = "agents_reasoning"  # reasoning and hosted tool items that preceded the message
HOSTED = ("web_search_call", "file_search_call", "code_interpreter_call",
          "image_generation_call", "mcp_call", "mcp_list_tools")
CALL_TYPES = frozenset({"function_call", *client.CALL_OUTPUT})
"""Items that are a model's tool call (answered by an output item with its ``call_id``)."""
OUTPUT_TYPES = frozenset({"function_call_output", *client.OUTPUT_CALL})
"""Items that answer a tool call."""
SUPPORTED = ("message", "function_call", "function_call_output", "reasoning", *HOSTED,
             *client.CALL_OUTPUT, *client.OUTPUT_CALL)

__all__ = ["CALL_TYPES", "IMAGE_FILE", "OUTPUT_TYPES", "items_to_messages", "mapped_from",
           "messages_to_items"]
_kind = kind_of


# -- items -> messages ---------------------------------------------------------------------
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
    call_ids: dict[str, str] = field(default_factory=dict)  # a call's item id -> call id

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
            hosted = [r for r in self.reasoning if r.get("type") in HOSTED]
            # counted as sent (the items go back whole), not as noted
            extra = sent_tokens(hosted, "\n\n".join(_preceding_texts(r)[0] for r in hosted))
            if extra:
                meta[EXTRA_TOKENS] = extra
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
        elif kind in client.CALL_OUTPUT:
            call, stored = client.read_call(item, where)
            turn = self.turn if self.turn is not None else self.start_turn("", {}, where)
            turn["metadata"].setdefault(client.CLIENT_CALLS, {})[
                str(len(turn["tool_calls"]))] = stored
            turn["tool_calls"].append(call)
            if isinstance(item.get("id"), str):
                self.call_ids[item["id"]] = call["id"]
        elif kind in client.OUTPUT_CALL:
            self.end_turn()
            content, call_id = client.read_output(item, where, self.call_ids)
            message = _build({"role": "tool", "content": content, "tool_call_id": call_id},
                             where)
            self.out.append(message.model_copy(update={
                "metadata": {client.CLIENT_ITEM: client.stored_output(item, message)}}))
        elif kind == "reasoning" or kind in HOSTED:
            if self.turn is not None:
                self.end_turn()
            self.turn_at = where
            self.reasoning.append(json_copy(dict(item)))
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
                meta[PARTS] = json_copy(content)
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
def _preceding_items(m: Message) -> list[dict[str, Any]]:
    """The reasoning and hosted tool items a message was recorded with, as they were; when
    the message's reasoning no longer holds a hosted item's note (a stage cleared it, and
    its tokens with it), without that item and without the turn's reasoning items (the
    Responses API refuses a reasoning item without the item that followed it)."""
    stored = cast(list[dict[str, Any]], m.metadata.get(REASONING, []))
    hosted = [r for r in stored if isinstance(r, dict) and r.get("type") in HOSTED]
    kept = kept_notes([_preceding_texts(r)[0] for r in hosted], m.reasoning)
    if all(kept):
        return stored
    gone = {id(r) for r, keep in zip(hosted, kept, strict=True) if not keep}
    return [r for r in stored if id(r) not in gone and r.get("type") != "reasoning"]


def messages_to_items(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Responses input items from neutral messages (the inverse of :func:`items_to_messages`)."""
    items: list[dict[str, Any]] = []
    kinds: dict[str, str] = {}  # call id -> the type of the call item sent for it
    call_item_ids: dict[str, str] = {}  # a client call's item id -> its call id
    for m in messages:
        meta = m.metadata
        if m.role == "tool":
            call_id = wire_id(m, m.tool_call_id) if m.tool_call_id else m.tool_call_id
            stored = meta.get(client.CLIENT_ITEM)
            kind = kinds.get(call_id or "")
            if kind in client.CALL_OUTPUT or (kind is None and isinstance(stored, dict)):
                items.append(client.output_item(stored if isinstance(stored, dict) else None,
                                                m, kind, call_id or "", call_item_ids))
                continue
            item: dict[str, Any] = {"type": "function_call_output", "call_id": call_id,
                                    "output": parts_out(m.content)}
            if ID in meta:
                item["id"] = meta[ID]
            items.append(item)
        elif m.role == "assistant":
            items.extend(_preceding_items(m))
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
            stored_calls = meta.get(client.CLIENT_CALLS, {})
            for n, c in enumerate(m.tool_calls):
                provider_id = wire_id(m, c.id)  # the store may have renamed a repeated id
                stored = stored_calls.get(str(n))  # by place: repair may rename the id too
                if isinstance(stored, dict):
                    call = client.call_item(stored, c, provider_id)
                    if isinstance(stored.get("id"), str):
                        call_item_ids[stored["id"]] = provider_id
                else:
                    call = {"type": "function_call", "call_id": provider_id,
                            "name": c.name, "arguments": c.arguments}
                    if provider_id in calls:
                        call["id"] = calls[provider_id]
                kinds[provider_id] = call["type"]
                items.append(call)
        else:
            role = "developer" if meta.get(ROLE) == "developer" else m.role
            item = {"role": role, "content": parts_out(m.content)}
            if ID in meta:
                item["id"], item["type"] = meta[ID], "message"
            items.append(item)
    return items
