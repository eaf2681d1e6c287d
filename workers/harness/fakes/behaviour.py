"""What a fake provider answers: replies, scripted faults and the request log.

Both fake servers (OpenAI-compatible and Gemini) share this logic so a test or
the ``compaction replay`` command can script them the same way:

- a *responder* produces the assistant reply for a request: a :class:`Script`
  of recorded assistant messages, any callable ``(request_json) -> reply``, or
  the :class:`DefaultResponder` (echo for agent turns, a short deterministic
  summary when the system prompt carries a marker);
- a :class:`FaultPlan` injects provider failures for the next N requests, for
  one request by sequence number, or for every request; a :class:`Script` may
  also hold :class:`Fault` items in place of replies;
- :mod:`workers.harness.fakes.recording` keeps the request log for assertions.

Replies use the OpenAI assistant message form (``role``, ``content``, optional
``tool_calls`` nested or flat, optional ``finish_reason`` and
``completion_tokens``); the Gemini fake converts them to ``parts``. Everything
here is thread-safe: Celery thread pools hit the fakes from many threads.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from shared.core.errors import InvalidInput

FaultKind = Literal[
    "rate_limit",  # 429 with Retry-After
    "server_error",  # 500
    "unavailable",  # 503
    "overloaded",  # 529-like overloaded (503 UNAVAILABLE on Gemini)
    "http_error",  # any status with a given body
    "refusal",  # 200 with a refusal text
    "stall",  # sleep before answering normally
    "garbage",  # 200 with a body that is not JSON
    "not_completion",  # 200 with JSON that is not a completion
    "empty",  # 200 with empty content
    "endless",  # 200 with very long content cut at the token limit
    "reset",  # the connection is reset without an answer
]
FAULT_KINDS: tuple[str, ...] = FaultKind.__args__  # type: ignore[attr-defined]
REFUSAL_TEXT = "I'm sorry, but I can't help with that."
ERROR_FAULTS = frozenset({"rate_limit", "server_error", "unavailable", "overloaded", "http_error"})

Reply = dict[str, Any]
Responder = Callable[[dict[str, Any]], Reply]


@dataclass(frozen=True)
class Fault:
    """One injected failure. Build with the class methods (``Fault.rate_limit(2)``)."""

    kind: FaultKind
    seconds: float = 0.0  # stall duration, or Retry-After of a rate limit
    status: int | None = None  # http_error only
    body: str | None = None  # http_error only: the raw response body
    tokens: int | None = None  # endless only: completion tokens to claim

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise InvalidInput(f"unknown fault kind {self.kind!r}", field="fault.kind")
        if self.seconds < 0:
            raise InvalidInput("must be >= 0", field="fault.seconds")
        if self.kind == "http_error" and (self.status is None or not 400 <= self.status <= 599):
            raise InvalidInput("an http_error needs a status in 400..599", field="fault.status")
        if self.tokens is not None and self.tokens < 1:
            raise InvalidInput("must be >= 1", field="fault.tokens")

    @classmethod
    def rate_limit(cls, retry_after: float = 1.0) -> Fault:
        return cls("rate_limit", seconds=retry_after)

    @classmethod
    def server_error(cls) -> Fault:
        return cls("server_error")

    @classmethod
    def unavailable(cls) -> Fault:
        return cls("unavailable")

    @classmethod
    def overloaded(cls) -> Fault:
        return cls("overloaded")

    @classmethod
    def http_error(cls, status: int, body: str) -> Fault:
        return cls("http_error", status=status, body=body)

    @classmethod
    def refusal(cls) -> Fault:
        return cls("refusal")

    @classmethod
    def stall(cls, seconds: float) -> Fault:
        return cls("stall", seconds=seconds)

    @classmethod
    def garbage(cls) -> Fault:
        return cls("garbage")

    @classmethod
    def not_completion(cls) -> Fault:
        return cls("not_completion")

    @classmethod
    def empty(cls) -> Fault:
        return cls("empty")

    @classmethod
    def endless(cls, tokens: int | None = None) -> Fault:
        return cls("endless", tokens=tokens)

    @classmethod
    def reset(cls) -> Fault:
        return cls("reset")


class FaultPlan:
    """Which request gets which fault.

    Precedence: a fault pinned to a request's sequence number (:meth:`at`), then the
    queue filled by :meth:`next` (first in, first out), then the :meth:`always` fault.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pinned: dict[int, Fault] = {}
        self._queue: deque[Fault] = deque()
        self._always: Fault | None = None

    def next(self, fault: Fault, times: int = 1) -> None:
        """Fail the next ``times`` requests with ``fault``."""
        if times < 1:
            raise InvalidInput("must be >= 1", field="times")
        with self._lock:
            self._queue.extend([fault] * times)

    def at(self, index: int, fault: Fault) -> None:
        """Fail the request with sequence number ``index`` (0-based, since the last reset)."""
        if index < 0:
            raise InvalidInput("must be >= 0", field="index")
        with self._lock:
            self._pinned[index] = fault

    def always(self, fault: Fault | None) -> None:
        """Fail every request with ``fault`` (``None`` stops it)."""
        with self._lock:
            self._always = fault

    def take(self, index: int) -> Fault | None:
        """The fault for request ``index``, consuming it unless it is the ``always`` fault."""
        with self._lock:
            if index in self._pinned:
                return self._pinned.pop(index)
            if self._queue:
                return self._queue.popleft()
            return self._always

    def clear(self) -> None:
        with self._lock:
            self._pinned.clear()
            self._queue.clear()
            self._always = None


class ScriptExhausted(Exception):
    """A script ran out of replies and has no fallback (the fake answers 500)."""


def normalize_reply(reply: Mapping[str, Any], where: str = "reply") -> Reply:
    """Check a reply and bring its tool calls to OpenAI's nested form.

    Accepts the flat form of the recorded transcripts (``{id, name, arguments}``) as
    well as the nested wire form; ``arguments`` given as an object become JSON text.
    """
    if not isinstance(reply, Mapping):
        raise InvalidInput(f"expected an object, got {type(reply).__name__}", field=where)
    content = reply.get("content")
    if content is not None and not isinstance(content, str):
        if isinstance(content, list):
            content = "\n".join(
                str(p.get("text", "")) for p in content if isinstance(p, Mapping)
            )
        else:
            raise InvalidInput(
                "must be a string, a list of parts or null", field=f"{where}.content"
            )
    calls: list[dict[str, Any]] = []
    for i, call in enumerate(reply.get("tool_calls") or []):
        name_of = f"{where}.tool_calls[{i}]"
        if not isinstance(call, Mapping):
            raise InvalidInput("expected an object", field=name_of)
        fn = call.get("function", call)
        name = fn.get("name") if isinstance(fn, Mapping) else None
        if not isinstance(name, str) or not name:
            raise InvalidInput("a tool call needs a name", field=f"{name_of}.name")
        args = fn.get("arguments", "{}")
        calls.append(
            {
                "id": str(call.get("id") or f"call_{i}"),
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
        )
    out: Reply = {"role": "assistant", "content": content}
    if calls:
        out["tool_calls"] = calls
    for key in ("finish_reason", "completion_tokens"):
        if key in reply:
            out[key] = reply[key]
    return out


def generated_text(reply: Reply) -> str:
    """All text a normalized reply generates (content, tool names and arguments)."""
    calls = reply.get("tool_calls") or []
    return (reply.get("content") or "") + "".join(
        c["function"]["name"] + c["function"]["arguments"] for c in calls
    )


class Script:
    """Replies (or faults) handed out in order: the recorded-session replay.

    ``Script(session_messages)`` keeps only the assistant messages, so a recorded
    session can be passed whole. When the script runs out, ``fallback`` answers; without
    one the fake reports :class:`ScriptExhausted` as a 500.
    """

    def __init__(
        self,
        items: Iterable[Mapping[str, Any] | Fault],
        *,
        fallback: Responder | None = None,
    ) -> None:
        self._items: list[Reply | Fault] = []
        for i, item in enumerate(items):
            if isinstance(item, Fault):
                self._items.append(item)
            elif isinstance(item, Mapping) and item.get("role", "assistant") == "assistant":
                self._items.append(normalize_reply(item, where=f"script[{i}]"))
            elif not isinstance(item, Mapping):
                raise InvalidInput("expected a reply object or a Fault", field=f"script[{i}]")
        self.fallback = fallback
        self._cursor = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def position(self) -> int:
        """How many items have been handed out."""
        with self._lock:
            return self._cursor

    def rewind(self) -> None:
        with self._lock:
            self._cursor = 0

    def next(self, request: dict[str, Any]) -> Reply | Fault:
        with self._lock:
            if self._cursor < len(self._items):
                item = self._items[self._cursor]
                self._cursor += 1
                return item
        if self.fallback is None:
            raise ScriptExhausted(f"the script's {len(self._items)} replies are used up")
        return normalize_reply(self.fallback(request), where="fallback reply")


def request_texts(request: Mapping[str, Any]) -> tuple[str, str, int]:
    """``(system text, last user text, message count)`` of an OpenAI or Gemini request."""
    system: list[str] = []
    last_user = ""
    messages = request.get("messages")
    if isinstance(messages, list):
        for m in messages:
            if not isinstance(m, Mapping):
                continue
            text = _text_of(m.get("content"))
            if m.get("role") in ("system", "developer"):
                system.append(text)
            elif m.get("role") == "user":
                last_user = text
        return "\n".join(system), last_user, len(messages)
    contents = request.get("contents")
    instruction = request.get("systemInstruction") or request.get("system_instruction")
    if isinstance(instruction, Mapping):
        system.append(_text_of(instruction.get("parts")))
    count = 0
    if isinstance(contents, list):
        count = len(contents)
        for c in contents:
            if isinstance(c, Mapping) and c.get("role", "user") == "user":
                text = _text_of(c.get("parts"))
                last_user = text or last_user
    return "\n".join(system), last_user, count


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str)
        )
    return ""


@dataclass(frozen=True)
class DefaultResponder:
    """Echo agent turns; answer a summarization request with a short summary.

    A request is a summarization request when its system prompt contains
    ``summary_marker`` (case-insensitive). The summary is deterministic and always
    shorter than the conversation it stands for, like a usable real summary.
    """

    summary_marker: str = "summar"
    excerpt_chars: int = 200

    def __call__(self, request: dict[str, Any]) -> Reply:
        system, last_user, count = request_texts(request)
        excerpt = " ".join(last_user.split())[: self.excerpt_chars]
        if self.summary_marker and self.summary_marker.lower() in system.lower():
            summary = f"Summary of {count} messages. Latest: {excerpt}"
            return {"role": "assistant", "content": summary}
        return {"role": "assistant", "content": f"Echo: {excerpt}" if excerpt else "OK"}


def as_responder(value: Responder | Script | Iterable[Mapping[str, Any] | Fault] | None) -> (
    Responder | Script
):
    """Accept a callable, a Script, a list of replies (made a Script), or None (default)."""
    if value is None:
        return DefaultResponder()
    if isinstance(value, Script) or callable(value):
        return value
    return Script(value)


__all__ = [
    "ERROR_FAULTS",
    "FAULT_KINDS",
    "REFUSAL_TEXT",
    "DefaultResponder",
    "Fault",
    "FaultKind",
    "FaultPlan",
    "Reply",
    "Responder",
    "Script",
    "ScriptExhausted",
    "as_responder",
    "generated_text",
    "normalize_reply",
    "request_texts",
]
