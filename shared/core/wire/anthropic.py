"""Anthropic Messages API (``system`` + ``messages``) <-> neutral messages.

``to_anthropic(from_anthropic(m, s)) == (s, m)`` for canonical input:
alternating user/assistant messages, an assistant's content ordered
thinking blocks, then text, then ``tool_use``; the next user message starts
with one ``tool_result`` per call. How the formats map:

- a user message's ``tool_result`` blocks become ``role="tool"`` messages
  (``is_error: true`` as metadata ``is_error``; ``false`` is the default and
  is left out); its other blocks, if any, one user message after them.
  Going out, tool results and the messages around them merge back into one
  user message, results first, as the API requires; any consecutive
  same-role messages merge too, so the output always alternates;
- thinking blocks join into ``Message.reasoning`` (separated by a blank
  line); metadata ``anthropic_thinking`` keeps each block's signature and
  length, and the data of ``redacted_thinking`` blocks, so they go back out
  unchanged. Reasoning without a signature (another provider's, or edited
  since) cannot be sent: the API verifies signatures. It is left out;
- an assistant's blocks in another order than the canonical one (interleaved
  thinking: thinking, tool_use, thinking, tool_use) keep it in metadata
  ``anthropic_order`` (one letter a block: ``r`` thinking, ``p`` text or media,
  ``c`` tool_use), since the API wants the latest turn's thinking back in
  sequence; going out, blocks the message no longer holds are skipped and any
  extra follow in the canonical order;
- a call id outside the API's pattern ``^[a-zA-Z0-9_-]+$`` (``functions.read:0``
  from OpenAI-compatible servers) goes out with each other character as ``_`` and
  ``-`` plus 8 hex digits of its hash (:func:`wire_id`): the same every time, so
  the result carries its call's id, and distinct ids stay distinct;
- ``tool_use.input`` becomes JSON arguments (``json.dumps``, non-ASCII
  kept; a NaN or infinite number, which JSON lacks, is refused); going out,
  arguments must parse to a JSON object;
- the API refuses blank (empty or whitespace-only) text blocks and
  messages, so both are left out (a dropped message lets its neighbours
  merge), as :func:`shared.core.repair.repair_tool_pairs` does; a
  whitespace-only system prompt is not sent; a tool result that is blank, or empty with
  ``is_error`` (which the API refuses), says so in :data:`BLANK_RESULT_TEXT`;
- only leading system messages can become ``system`` (a string for one
  message with string content, else text blocks); a later system message
  goes out as user text. ``name`` on messages has no Anthropic form and is
  left out;
- a document's ``title`` is ``FilePart.filename``; a ``text`` document
  source is stored base64-encoded with its ``text/*`` media type (neutral
  ``data`` is always base64) and rebuilt; an image's ``detail`` has no
  Anthropic form; ``cache_control`` and ``citations`` are request hints
  and are dropped.

Going out, a tool result whose call is not in the preceding assistant
message, or a call without a result in the next message, raises
:class:`~shared.core.errors.InvalidInput`: repair tool pairs first.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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
    build,
    check_keys,
    decode_text,
    encode_text,
    finite_json,
    join_reasoning,
    neutral,
    opt_bool,
    opt_str,
    req_str,
    split_reasoning,
    stored_call,
)

THINKING_KEY = "anthropic_thinking"
ORDER_KEY = "anthropic_order"  # an assistant's block order, where not canonical
MEMO_KEY = "anthropic-turn"  # a message's own turn, in a memo slot (see fold_turns)
BLANK_RESULT_TEXT = "[the tool returned no output]"
_HINTS = ("cache_control", "citations")
System = str | list[dict[str, Any]] | None


def from_anthropic(
    messages: Sequence[WireItem], system: str | Sequence[WireItem] | None = None
) -> list[Message]:
    """Neutral messages from Anthropic ``messages`` and the ``system`` parameter."""
    out: list[Message] = []
    if system is not None:
        loc = Loc("system")
        content = system if isinstance(system, str) else _texts_in(system, loc)
        out.append(build({"role": "system", "content": content}, Loc("system")))
    for i, raw in enumerate(as_sequence(messages, "messages")):
        out.extend(_message_in(raw, Loc.item("messages", i)))
    return out


def to_anthropic(messages: Sequence[Message]) -> tuple[System, list[dict[str, Any]]]:
    """``(system, messages)`` for the Messages API, alternating and tool-paired."""
    items = neutral(messages)
    lead = next((i for i, m in enumerate(items) if m.role != "system"), len(items))
    turns = fold_turns(items[lead:], lead)
    _check_pairs(turns)
    return system_out(items[:lead]), [t.wire() for t in turns]


def fold_turns(items: Sequence[Message], offset: int = 0,
               memo: Sequence[dict[str, Any]] | None = None,
               into: list[Turn] | None = None) -> list[Turn]:
    """The wire turns of consecutive messages (none of them a leading system message):
    each message's own turn (:func:`turn_of`), same-role neighbours joined. Tool pairs are
    not checked (:func:`adjacent_ok`); ``offset``: index of ``items[0]`` in error paths;
    ``memo``: a dict per message keeping its turn (a turn's pending messages, converted
    once across its prepares); ``into``: turns made before ``items``, extended in place."""
    turns: list[Turn] = into if into is not None else []
    for i, m in enumerate(items):
        slot = memo[i] if memo is not None else None
        found = slot.get(MEMO_KEY) if slot is not None else None
        if found is None:
            found = (turn_of(m, Loc.item("messages", offset + i)),)
            if slot is not None:
                slot[MEMO_KEY] = found
        add_turn(turns, found[0])
    return turns


def add_turn(turns: list[Turn], turn: Turn | None) -> None:
    """Append ``turn``, joined to the last one when they share a role (a new object: turns
    already made are shared by cached views and never change)."""
    if turn is None:
        return
    if turns and turns[-1].role == turn.role:
        turns[-1] = turns[-1].joined(turn)
    else:
        turns.append(turn)


# -- in --------------------------------------------------------------------


def _message_in(raw: Any, loc: Loc) -> list[Message]:
    obj = as_mapping(raw, loc)
    check_keys(obj, ("role", "content"), loc)
    role = req_str(obj, "role", loc)
    if role not in ("user", "assistant"):
        raise (loc / "role").error(f"unknown role {role!r} (expected user or assistant)")
    content = obj.get("content")
    if isinstance(content, str):
        return [build({"role": role, "content": content}, loc)]
    blocks = as_list(content, loc / "content")
    if role == "assistant":
        return [_assistant_in(blocks, loc)]
    tools, parts = [], []
    for j, raw_block in enumerate(blocks):
        b_loc = loc / "content" / j
        block = as_mapping(raw_block, b_loc)
        if block.get("type") == "tool_result":
            tools.append(_result_in(block, b_loc))
        else:
            parts.append(_part_in(block, b_loc, "text, image, document or tool_result"))
    if parts or not tools:
        tools.append(build({"role": "user", "content": parts}, loc))
    return tools


def _assistant_in(blocks: Sequence[Any], loc: Loc) -> Message:
    texts: list[str] = []
    layout: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    order: list[str] = []
    for j, raw in enumerate(blocks):
        b_loc = loc / "content" / j
        block = as_mapping(raw, b_loc)
        kind = block.get("type")
        order.append(_ORDER_LETTER.get(kind, "p"))
        if kind == "thinking":
            check_keys(block, ("type", "thinking", "signature", *_HINTS), b_loc)
            texts.append(req_str(block, "thinking", b_loc))
            entry: dict[str, Any] = {"chars": len(texts[-1])}
            if (signature := opt_str(block, "signature", b_loc)) is not None:
                entry["signature"] = signature
            layout.append(entry)
        elif kind == "redacted_thinking":
            check_keys(block, ("type", "data", *_HINTS), b_loc)
            layout.append({"redacted": req_str(block, "data", b_loc)})
        elif kind == "tool_use":
            check_keys(block, ("type", "id", "name", "input", *_HINTS), b_loc)
            args = as_mapping(block.get("input"), b_loc / "input")
            calls.append(
                {
                    "id": req_str(block, "id", b_loc, nonempty=True),
                    "name": req_str(block, "name", b_loc, nonempty=True),
                    "arguments": finite_json(args, b_loc / "input"),
                }
            )
        else:
            expected = "text, image, document, thinking, redacted_thinking or tool_use"
            parts.append(_part_in(block, b_loc, expected))
    # no text or media (tool_use, thinking alone): "" as from the other formats, not []
    # (OpenAI refuses an empty content array; to_openai sends None for "" beside calls)
    data: dict[str, Any] = {"role": "assistant", "content": parts or "", "tool_calls": calls}
    metadata: dict[str, Any] = {}
    if layout:
        data["reasoning"] = join_reasoning(texts)
        metadata[THINKING_KEY] = layout
    if order != sorted(order, key="rpc".index):
        metadata[ORDER_KEY] = "".join(order)
    if metadata:
        data["metadata"] = metadata
    return build(data, loc)


_ORDER_LETTER: dict[Any, str] = {"thinking": "r", "redacted_thinking": "r", "tool_use": "c"}


def _result_in(block: Mapping[str, Any], loc: Loc) -> Message:
    check_keys(block, ("type", "tool_use_id", "content", "is_error", *_HINTS), loc)
    data: dict[str, Any] = {
        "role": "tool",
        "tool_call_id": req_str(block, "tool_use_id", loc, nonempty=True),
    }
    content = block.get("content")
    if content is None or isinstance(content, str):
        data["content"] = content or ""
    else:
        data["content"] = _parts_in(content, loc / "content", "text, image or document")
    if opt_bool(block, "is_error", loc):
        data["metadata"] = {IS_ERROR: True}
    return build(data, loc)


def _parts_in(blocks: Any, loc: Loc, expected: str) -> list[dict[str, Any]]:
    return [_part_in(b, loc / j, expected) for j, b in enumerate(as_list(blocks, loc))]


def _texts_in(blocks: Any, loc: Loc) -> list[dict[str, Any]]:
    """The system parameter: text blocks only."""
    return [_text_in(as_mapping(b, loc / j), loc / j) for j, b in enumerate(as_list(blocks, loc))]


def _text_in(block: Mapping[str, Any], loc: Loc) -> dict[str, Any]:
    if block.get("type") != "text":
        raise (loc / "type").error(f"unknown block type {block.get('type')!r} (expected text)")
    check_keys(block, ("type", "text", *_HINTS), loc)
    return {"type": "text", "text": req_str(block, "text", loc)}


def _part_in(raw: Any, loc: Loc, expected: str) -> dict[str, Any]:
    block = as_mapping(raw, loc)
    kind = block.get("type")
    if kind == "text":
        return _text_in(block, loc)
    if kind not in ("image", "document"):
        raise (loc / "type").error(f"unknown block type {kind!r} (expected {expected})")
    check_keys(block, ("type", "source", "title", *_HINTS), loc)
    s_loc = loc / "source"
    source = as_mapping(block.get("source"), s_loc)
    src = source.get("type")
    part: dict[str, Any] = {"type": "image" if kind == "image" else "file"}
    if src == "base64":
        check_keys(source, ("type", "media_type", "data"), s_loc)
        part["media_type"] = req_str(source, "media_type", s_loc)
        part["data"] = req_str(source, "data", s_loc)
    elif src == "url":
        check_keys(source, ("type", "url"), s_loc)
        part["url"] = req_str(source, "url", s_loc, nonempty=True)
    elif src == "text" and kind == "document":
        check_keys(source, ("type", "media_type", "data"), s_loc)
        part["media_type"] = req_str(source, "media_type", s_loc)
        part["data"] = encode_text(req_str(source, "data", s_loc))
    elif src == "file" and kind == "document":
        check_keys(source, ("type", "file_id"), s_loc)
        part["file_id"] = req_str(source, "file_id", s_loc, nonempty=True)
    else:
        raise (s_loc / "type").error(f"unsupported {kind} source type {src!r}")
    if (title := opt_str(block, "title", loc)) is not None:
        if kind == "image":
            raise (loc / "title").error("only documents have a title")
        part["filename"] = title
    return part


# -- out -------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """One wire message: one neutral message's (:func:`turn_of`), or consecutive same-role
    ones joined. Immutable; the lists are never changed once the turn is made."""

    role: str
    plain: str | None  # string content, while the turn is one message with nothing else
    results: list[dict[str, Any]] = field(default_factory=list)
    blocks: list[dict[str, Any]] = field(default_factory=list)
    result_ids: list[tuple[str, Loc]] = field(default_factory=list)
    call_ids: list[tuple[str, Loc]] = field(default_factory=list)

    @functools.cached_property
    def _wire(self) -> dict[str, Any]:
        content = self.plain if self.plain is not None else self.results + self.blocks
        return {"role": self.role, "content": content}

    def wire(self) -> dict[str, Any]:
        """The wire message, made once per turn (shared: do not mutate it)."""
        return self._wire

    def joined(self, other: Turn) -> Turn:
        """This turn and the next same-role one as one message (results first)."""
        return Turn(self.role, None, self.results + other.results, self.blocks + other.blocks,
                    self.result_ids + other.result_ids, self.call_ids + other.call_ids)


_ID = re.compile(r"[a-zA-Z0-9_-]+")
_NOT_ID = re.compile(r"[^a-zA-Z0-9_-]")


@functools.lru_cache(maxsize=4096)
def _mapped_id(call_id: str) -> str:
    digest = hashlib.blake2s(call_id.encode("utf-8"), digest_size=4).hexdigest()
    return f"{_NOT_ID.sub('_', call_id)}-{digest}"


def wire_id(call_id: str) -> str:
    """``call_id`` as the API takes it (``^[a-zA-Z0-9_-]+$``): unchanged when it matches,
    else its other characters as ``_`` and a hash of the whole, so two ids that differ
    only there stay two (the same id maps the same way in every view)."""
    return call_id if _ID.fullmatch(call_id) else _mapped_id(call_id)


def turn_of(m: Message, loc: Loc) -> Turn | None:
    """The wire turn of one message alone; None when the API would refuse it (blank)."""
    role = "assistant" if m.role == "assistant" else "user"
    reasoning = _reasoning_out(m) if role == "assistant" else []
    parts: list[dict[str, Any] | None]
    if isinstance(m.content, str):
        plain = m.content if not reasoning and not m.tool_calls and m.role != "tool" else None
        parts = [{"type": "text", "text": m.content} if m.content.strip() else None]
    else:
        plain = None
        parts = [_part_out(p, loc / "content" / j) if _sent(p) else None
                 for j, p in enumerate(m.content)]
    order = m.metadata.get(ORDER_KEY) if role == "assistant" else None
    if isinstance(order, str):
        return _ordered_turn(m, loc, order, reasoning, parts)
    blocks = reasoning + [b for b in parts if b is not None]
    if not blocks and not m.tool_calls and m.role != "tool":
        return None  # the API refuses blank messages; dropping one merges its neighbours
    if m.role == "tool":
        assert m.tool_call_id is not None  # guaranteed by Message
        rid = wire_id(m.tool_call_id)
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": rid}
        result["content"] = _result_content(m.content, blocks, bool(m.metadata.get(IS_ERROR)))
        if m.metadata.get(IS_ERROR):
            result["is_error"] = True
        return Turn(role, plain, [result], [], [(rid, loc / "tool_call_id")])
    uses, calls = _calls_out(m, loc)
    return Turn(role, plain, [], blocks + uses, [], calls)


def _calls_out(m: Message, loc: Loc) -> tuple[list[dict[str, Any]], list[tuple[str, Loc]]]:
    """The ``tool_use`` blocks of ``m``'s calls and their ids (with error paths)."""
    blocks: list[dict[str, Any]] = []
    ids: list[tuple[str, Loc]] = []
    for j, c in enumerate(m.tool_calls):
        c_loc = loc / "tool_calls" / j
        args = arguments_object(c.arguments, c_loc / "arguments")
        cid = wire_id(c.id)
        blocks.append({"type": "tool_use", "id": cid, "name": c.name, "input": args})
        ids.append((cid, c_loc / "id"))
    return blocks, ids


def _result_content(content: str | list[ContentPart], blocks: list[dict[str, Any]],
                    is_error: bool) -> str | list[dict[str, Any]]:
    """A tool result's content: a string as it is, parts as ``blocks`` (those sent); one
    that is blank, or empty on an error (which the API refuses), says it is empty."""
    if isinstance(content, str):
        kept = bool(content.strip()) or not (content or is_error)
        return content if kept else BLANK_RESULT_TEXT
    if blocks or not (content or is_error):
        return blocks
    return [{"type": "text", "text": BLANK_RESULT_TEXT}]


def _ordered_turn(m: Message, loc: Loc, order: str, reasoning: list[dict[str, Any]],
                  parts: list[dict[str, Any] | None]) -> Turn | None:
    """An assistant's turn with its blocks in their recorded ``order`` (:data:`ORDER_KEY`);
    blocks the message no longer holds are skipped, extra ones follow canonically."""
    calls, ids = _calls_out(m, loc)
    queues = {"r": iter(reasoning), "p": iter(parts), "c": iter(calls)}
    placed = [next(queues[k], None) for k in order if k in queues]
    placed += [*queues["r"], *queues["p"], *queues["c"]]
    blocks = [b for b in placed if b is not None]
    return Turn("assistant", None, [], blocks, [], ids) if blocks else None


Piece = tuple[str, str | None, list[dict[str, Any]], list[dict[str, Any]], tuple[str, ...],
              tuple[str, ...]]
"""A message's own wire turn as plain parts: (role, plain text, results, blocks, ids of the
results, ids of the calls), what a fold joins into its finished groups (no :class:`Turn`, no
error paths: they are made only for the groups a fold keeps as turns)."""
BLANK: Piece = ("", None, [], [], (), ())
"""The piece of a message the API would refuse (blank): it stays with its group."""


def piece_of_stored(data: Any, index: int) -> Piece | None:
    """:func:`turn_of` of a stored message (``messages[index]``) from its JSON as plain
    data, as a :data:`Piece` (:data:`BLANK` for None); None when only the model can say
    (content parts, thinking blocks, an unexpected shape). Arguments that are no JSON
    object raise the conversion's error.

    A cold cache folds every message of the view: made from the data, the messages
    need not be decoded into models first (which cost as much as the fold itself)."""
    if type(data) is not dict:
        return None
    role_in, content = data.get("role"), data.get("content", "")
    calls, meta = data.get("tool_calls", []), data.get("metadata", {})
    if type(role_in) is not str or type(content) is not str or type(calls) is not list \
            or type(meta) is not dict or THINKING_KEY in meta or ORDER_KEY in meta \
            or (calls and role_in != "assistant"):
        return None
    if role_in == "tool":
        call_id = data.get("tool_call_id")
        if type(call_id) is not str or calls:
            return None
        call_id = wire_id(call_id)
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id,
                                  "content": _result_content(content, [],
                                                             bool(meta.get(IS_ERROR)))}
        if meta.get(IS_ERROR):
            result["is_error"] = True
        return "user", None, [result], [], (call_id,), ()
    role = "assistant" if role_in == "assistant" else "user"
    blocks: list[dict[str, Any]] = [{"type": "text", "text": content}] if content.strip() else []
    if not calls:
        return (role, content, [], blocks, (), ()) if blocks else BLANK
    ids: list[str] = []
    for j, c in enumerate(calls):
        found = stored_call(c, index, j)
        if found is None:
            return None
        call_id, name, args = found
        call_id = wire_id(call_id)
        blocks.append({"type": "tool_use", "id": call_id, "name": name, "input": args})
        ids.append(call_id)
    return role, None, [], blocks, (), tuple(ids)


def piece_of_turn(turn: Turn | None) -> Piece:
    if turn is None:
        return BLANK
    return (turn.role, turn.plain, turn.results, turn.blocks,
            tuple(rid for rid, _ in turn.result_ids), tuple(cid for cid, _ in turn.call_ids))


def turn_of_piece(piece: Piece, index: int) -> Turn | None:
    """The :class:`Turn` of a message (``messages[index]``) from its piece."""
    role, plain, results, blocks, result_ids, call_ids = piece
    if piece is BLANK:
        return None
    return Turn(role, plain, results, blocks,
                [(rid, Loc(f"messages[{index}].tool_call_id", index)) for rid in result_ids],
                [(cid, Loc(f"messages[{index}].tool_calls[{j}].id", index))
                 for j, cid in enumerate(call_ids)])


def group_wire(pieces: Sequence[Piece]) -> dict[str, Any]:
    """The wire message of a group's pieces (one role; blank ones left out), as the turn
    their messages join into makes it (:meth:`Turn.wire`)."""
    kept = [p for p in pieces if p is not BLANK]
    if len(kept) == 1 and kept[0][1] is not None:
        return {"role": kept[0][0], "content": kept[0][1]}
    content = [r for p in kept for r in p[2]]
    content += [b for p in kept for b in p[3]]
    return {"role": kept[0][0], "content": content}


def adjacent_ok(before: Turn | None, turn: Turn) -> bool:
    """Whether ``turn`` answers exactly the calls of the turn ``before`` it (None: the
    first turn, which may answer none): what :func:`to_anthropic` checks, as a yes/no."""
    calls = {cid for cid, _ in before.call_ids} if before is not None else set()
    return {rid for rid, _ in turn.result_ids} == calls


def _check_pairs(turns: list[Turn]) -> None:
    """Each result answers a call of the previous turn; each call is answered in the next."""
    for k, turn in enumerate(turns):
        calls = {cid for cid, _ in turns[k - 1].call_ids} if k else set()
        for rid, r_loc in turn.result_ids:
            if rid not in calls:
                raise r_loc.error(f"no tool_use {rid!r} in the preceding assistant message")
        if k + 1 < len(turns):
            answered = {rid for rid, _ in turns[k + 1].result_ids}
            for cid, c_loc in turn.call_ids:
                if cid not in answered:
                    raise c_loc.error(f"tool_use {cid!r} has no tool_result in the next message")


def _reasoning_out(m: Message) -> list[dict[str, Any]]:
    layout = m.metadata.get(THINKING_KEY)
    if not isinstance(layout, list):
        return []
    entries = [e for e in layout if isinstance(e, dict)]
    lengths = [e.get("chars") for e in entries if "redacted" not in e]
    texts = None
    if m.reasoning is not None and all(isinstance(n, int) for n in lengths):
        texts = split_reasoning(m.reasoning, [n for n in lengths if isinstance(n, int)])
    blocks: list[dict[str, Any]] = []
    for entry in entries:
        if "redacted" in entry:
            blocks.append({"type": "redacted_thinking", "data": entry["redacted"]})
        elif texts is not None:
            block = {"type": "thinking", "thinking": texts.pop(0)}
            if "signature" in entry:
                block["signature"] = entry["signature"]
            blocks.append(block)
    return blocks


def system_out(items: Sequence[Message]) -> System:
    """The ``system`` parameter from the leading system messages."""
    if not items:
        return None
    if len(items) == 1 and isinstance(items[0].content, str):
        text = items[0].content  # "" goes back as it came; blank text is refused
        return text if text.strip() or not text else None
    blocks: list[dict[str, Any]] = []
    for i, m in enumerate(items):
        parts = [TextPart(text=m.content)] if isinstance(m.content, str) else m.content
        for j, p in enumerate(parts):
            if not _sent(p):
                continue
            if not isinstance(p, TextPart):
                loc = Loc.item("messages", i) / "content" / j
                raise loc.error("the system prompt takes text only")
            blocks.append({"type": "text", "text": p.text})
    return blocks


def _sent(part: ContentPart) -> bool:
    """Blank text blocks are refused by the API ("must contain non-whitespace text")."""
    return not isinstance(part, TextPart) or bool(part.text.strip())


def _part_out(part: ContentPart, loc: Loc) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if isinstance(part, ImagePart):
        return {"type": "image", "source": _source(part.data, part.url, None, part.media_type, loc)}
    block: dict[str, Any] = {"type": "document"}
    block["source"] = _source(part.data, part.url, part.file_id, part.media_type, loc)
    if part.filename is not None:
        block["title"] = part.filename
    return block


def _source(
    data: str | None, url: str | None, file_id: str | None, media_type: str | None, loc: Loc
) -> dict[str, Any]:
    if data is not None:
        if media_type is None:
            raise (loc / "media_type").error("inline data needs a media type")
        text = decode_text(data) if media_type.startswith("text/") else None
        if text is not None:
            return {"type": "text", "media_type": media_type, "data": text}
        return {"type": "base64", "media_type": media_type, "data": data}
    if url is not None:
        return {"type": "url", "url": url}
    return {"type": "file", "file_id": file_id}
