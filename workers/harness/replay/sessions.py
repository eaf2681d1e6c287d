"""Recorded agent sessions for ``compaction replay``: read, check, cut into turns.

The replay runs on files nobody here wrote, so reading is forgiving where
the meaning is clear and strict where it is not:

- one JSON object per line with ``messages`` in OpenAI chat format (flat
  ``{id, name, arguments}`` or nested tool calls); ``id`` and ``tools`` are
  optional; blank lines are ignored;
- a line that is not such an object, has no assistant message to replay,
  or holds a message the neutral model refuses (after the repairs below) is
  *skipped with its reason*, never fatal: one bad session must not cost the
  measurement of forty good ones;
- repairs that keep the meaning, each noted on the session: keys the
  OpenAI adapter does not know are dropped (recorders add their own), tool
  call arguments that are not JSON are wrapped as ``{"raw_arguments": ...}``
  (models do emit broken JSON; the guard's model only stores JSON), a tool
  call without an id gets a generated one, a content that is a JSON object
  or number (some recorders store tool results that way) is sent as its text;
- leading system (or developer) messages become the system prompt; a
  session without one replays with none;
- sessions without ``tools`` get definitions derived from the calls they
  make (name and argument keys), because a real agent sends its tool schemas
  with every request and they take part of the window; a session without
  tool calls sends none;
- reused tool-call ids are left as recorded (the guard's repair renames
  them in the view) and counted, so the report shows how often it happened.

A *turn* is one recorded assistant message: what precedes it since the
previous assistant message (user message, tool results) is the turn's
``pending`` input, the assistant message is what the fake provider answers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from shared.core.errors import InvalidInput
from shared.core.messages import Message
from shared.core.wire import from_openai

ToolsSource = Literal["recorded", "derived", "none"]
_KNOWN_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id",
                         "reasoning_content", "refusal", "annotations", "audio", "usage"})
_CALL_KEYS = frozenset({"id", "type", "function", "name", "arguments"})
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:\-]+")
_JSON_TYPES = {str: "string", bool: "boolean", int: "integer", float: "number",
               list: "array", dict: "object"}


@dataclass(frozen=True, slots=True)
class Turn:
    """One recorded assistant message and the input that led to it."""

    index: int
    """Position of the assistant message in the session body."""
    pending: tuple[Message, ...]
    reply: Message


@dataclass(frozen=True, slots=True)
class ReplaySession:
    """A usable session: system prompt, tool definitions and the message body."""

    key: str
    """Unique and key-safe: the store's session id and the request's prompt_cache_key."""
    source_id: str
    line: int
    system_prompt: str
    tools: list[dict[str, Any]] | None
    tools_source: ToolsSource
    messages: tuple[Message, ...]
    """The body: every message after the leading system messages."""
    repairs: tuple[str, ...] = ()
    reused_tool_ids: int = 0

    def turns(self) -> list[Turn]:
        """The assistant messages in order, each with its pending input."""
        out: list[Turn] = []
        start = 0
        for i, message in enumerate(self.messages):
            if message.role == "assistant":
                out.append(Turn(i, tuple(self.messages[start:i]), message))
                start = i + 1
        return out


@dataclass(frozen=True, slots=True)
class SkippedSession:
    """A line that could not be replayed, and why."""

    line: int
    source_id: str
    reason: str


@dataclass(slots=True)
class LoadResult:
    sessions: list[ReplaySession] = field(default_factory=list)
    skipped: list[SkippedSession] = field(default_factory=list)


def session_key(position: int, source_id: str) -> str:
    """A store-safe, unique session id: ``<position>-<id with odd characters replaced>``."""
    cleaned = _UNSAFE.sub("_", source_id).strip("_.:-")[:100] or "session"
    return f"{position:04d}-{cleaned}"


def _clean_call(raw: Any, repairs: list[str], where: str, fresh: Iterator[int]) -> Any:
    if not isinstance(raw, Mapping):
        return raw
    call = {k: v for k, v in raw.items() if k in _CALL_KEYS}
    if len(call) != len(raw):
        repairs.append(f"{where}: dropped keys {sorted(set(raw) - _CALL_KEYS)}")
    if not call.get("id"):
        call["id"] = f"call_replay_{next(fresh)}"
        repairs.append(f"{where}: generated a missing id")
    fn = call.get("function")
    holder = dict(fn) if isinstance(fn, Mapping) else call
    args = holder.get("arguments")
    if isinstance(args, Mapping | list):
        holder["arguments"] = json.dumps(args, ensure_ascii=False)
    elif isinstance(args, str) and args.strip():
        try:
            json.loads(args)
        except ValueError:
            holder["arguments"] = json.dumps({"raw_arguments": args}, ensure_ascii=False)
            repairs.append(f"{where}.arguments: not JSON, wrapped as raw_arguments")
    elif args is None:
        holder["arguments"] = "{}"
    if isinstance(fn, Mapping):
        call["function"] = holder
    return call


def _clean_message(raw: Any, index: int, repairs: list[str], fresh: Iterator[int]) -> Any:
    if not isinstance(raw, Mapping):
        return raw
    where = f"messages[{index}]"
    message = {k: v for k, v in raw.items() if k in _KNOWN_KEYS and v is not None}
    dropped = sorted(k for k in raw if k not in _KNOWN_KEYS)
    if dropped:
        repairs.append(f"{where}: dropped keys {dropped}")
    if not isinstance(message.get("usage", {}), Mapping):
        message.pop("usage")
    content = message.get("content")
    if isinstance(content, Mapping | int | float) and not isinstance(content, bool):
        message["content"] = json.dumps(content, ensure_ascii=False)
        repairs.append(f"{where}.content: a JSON value, sent as its text")
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        message["tool_calls"] = [_clean_call(c, repairs, f"{where}.tool_calls[{j}]", fresh)
                                 for j, c in enumerate(calls)]
        if not calls:
            message.pop("tool_calls")
    return message


def _derive_tools(messages: Sequence[Message]) -> list[dict[str, Any]] | None:
    """Minimal function schemas for the tools the session calls (first-seen order)."""
    seen: dict[str, dict[str, Any]] = {}
    for message in messages:
        for call in message.tool_calls:
            props = seen.setdefault(call.name, {})
            args = call.args()
            if isinstance(args, dict):
                for key, value in args.items():
                    props.setdefault(str(key), {"type": _JSON_TYPES.get(type(value), "string")})
    if not seen:
        return None
    return [{"type": "function", "function": {
        "name": name, "description": f"The {name} tool (schema derived from recorded calls).",
        "parameters": {"type": "object", "properties": props}}} for name, props in seen.items()]


def _tools(raw: Any, body: Sequence[Message],
           repairs: list[str]) -> tuple[list[dict[str, Any]] | None, ToolsSource]:
    if isinstance(raw, list) and raw and all(isinstance(t, Mapping) for t in raw):
        return [dict(t) for t in raw], "recorded"
    if raw not in (None, []):
        repairs.append("tools: not a list of objects, derived from the calls instead")
    derived = _derive_tools(body)
    return derived, "derived" if derived else "none"


def _reused_ids(body: Sequence[Message]) -> int:
    seen: set[str] = set()
    reused = 0
    for message in body:
        for call in message.tool_calls:
            reused += call.id in seen
            seen.add(call.id)
    return reused


def parse_session(obj: Any, line: int, position: int) -> ReplaySession:
    """One session from a decoded JSONL line; InvalidInput names what is wrong."""
    if not isinstance(obj, Mapping):
        raise InvalidInput(f"expected a JSON object, got {type(obj).__name__}", field="line")
    source_id = str(obj.get("id") or f"line-{line}")
    raw_messages = obj.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise InvalidInput("expected a non-empty list", field="messages")
    repairs: list[str] = []
    fresh = iter(range(1, 1 << 30))
    cleaned = [_clean_message(m, i, repairs, fresh) for i, m in enumerate(raw_messages)]
    messages = from_openai(cleaned)
    head = 0
    while head < len(messages) and messages[head].role == "system":
        head += 1
    system_prompt = "\n\n".join(m.text() for m in messages[:head] if m.text())
    body = tuple(messages[head:])
    if not any(m.role == "assistant" for m in body):
        raise InvalidInput("no assistant message to replay", field="messages")
    tools, tools_source = _tools(obj.get("tools"), body, repairs)
    return ReplaySession(
        key=session_key(position, source_id), source_id=source_id, line=line,
        system_prompt=system_prompt, tools=tools, tools_source=tools_source, messages=body,
        repairs=tuple(repairs), reused_tool_ids=_reused_ids(body))


def truncate_session(session: ReplaySession, max_messages: int) -> ReplaySession:
    """The session cut after its first ``max_messages`` body messages (a short CI replay)."""
    if max_messages < 1:
        raise InvalidInput("must be >= 1", field="max_messages")
    return ReplaySession(
        key=session.key, source_id=session.source_id, line=session.line,
        system_prompt=session.system_prompt, tools=session.tools,
        tools_source=session.tools_source, messages=session.messages[:max_messages],
        repairs=session.repairs, reused_tool_ids=_reused_ids(session.messages[:max_messages]))


def _load_line(result: LoadResult, text: str, number: int, max_messages: int | None,
               select: Sequence[str]) -> None:
    """Add the session of one line to ``result``, or its reason to be skipped."""
    source_id = f"line-{number}"
    try:
        obj = json.loads(text)
        if isinstance(obj, Mapping) and obj.get("id"):
            source_id = str(obj["id"])
        if select and not any(part in source_id for part in select):
            return
        session = parse_session(obj, number, len(result.sessions))
    except ValueError as exc:  # JSON errors and InvalidInput alike
        result.skipped.append(SkippedSession(number, source_id, str(exc)[:300]))
        return
    if max_messages is not None:
        session = truncate_session(session, max_messages)
        if not session.turns():
            result.skipped.append(SkippedSession(
                number, source_id, f"no assistant message in the first {max_messages} messages"))
            return
    result.sessions.append(session)


def load_sessions(path: str | Path, *, limit: int | None = None,
                  max_messages: int | None = None, select: Sequence[str] = ()) -> LoadResult:
    """Usable sessions of a JSONL file (the first ``limit``) and the skipped lines.

    ``select``: keep only sessions whose id contains one of these strings.

    Raises InvalidInput naming ``path`` when the file cannot be read at all.
    """
    if limit is not None and limit < 1:
        raise InvalidInput("must be >= 1", field="sessions")
    result = LoadResult()
    try:
        with Path(path).open(encoding="utf-8", errors="replace") as handle:
            for number, text in enumerate(handle, start=1):
                if limit is not None and len(result.sessions) >= limit:
                    break
                if text.strip():
                    _load_line(result, text, number, max_messages, select)
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror}", field="path") from None
    return result


__all__ = [
    "LoadResult",
    "ReplaySession",
    "SkippedSession",
    "ToolsSource",
    "Turn",
    "load_sessions",
    "parse_session",
    "session_key",
    "truncate_session",
]
