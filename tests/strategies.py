"""Hypothesis strategies for conversations, a deterministic counter and data loaders.

Reusable by every test module:

* :func:`conversations` - valid conversations (valid for OpenAI, Anthropic and
  Gemini alike): optional leading system message, turns of ``user ->
  (assistant text | assistant with 1-4 parallel tool calls + their results in
  any order)* -> optional final assistant``, unique call ids, tools that name
  files (``read_file`` with a path, ``bash`` with a command), text sizes from a
  word to a few thousand characters.
* :func:`damaged_conversations` - a valid conversation after random damage of
  the kinds seen in the wild: lost, moved, duplicated or orphaned tool results,
  dropped messages, reused call ids, empty messages, a leading non-user
  message. Every message is still a valid :class:`Message`.
* :class:`CharCounter` - a TokenCounter where one character is one token, for
  tests that need exact numbers whatever the real heuristic does.
* :func:`load_transcripts`, :func:`peer_cases`, :func:`peer_messages` - the real
  sessions and peer cases of ``../shared/data`` as :class:`Message` lists.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from shared.core.messages import Message, ToolCall
from workers.harness.transcripts import load_transcripts as load_transcripts

WORDS = ("alpha", "beta", "gamma", "delta", "error", "value", "return", "import", "config",
         "session", "token", "window", "{", "}", "(x)", "42", "0.5", "\n", "def", "class")


class CharCounter:
    """One token per character; a message costs 1 plus its text and tool calls."""

    def text(self, text: str) -> int:
        return len(text)

    def message(self, message: Message) -> int:
        calls = sum(len(tc.name) + len(tc.arguments) for tc in message.tool_calls)
        return 1 + len(message.text()) + calls

    def messages(self, messages: Sequence[Message]) -> int:
        return 2 + sum(self.message(m) for m in messages)

    def tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        return sum(len(json.dumps(t, sort_keys=True)) for t in tools)


@functools.cache
def texts(min_words: int = 1, max_words: int = 60) -> st.SearchStrategy[str]:
    """Words joined by spaces; cheap to generate and to shrink, never blank if min_words > 0.

    One strategy object per size range, made once (and the two it draws from): hypothesis
    validates every new strategy object it draws from, which cost more than the drawing."""
    sizes, seeds = st.integers(min_words, max_words), st.integers(0, len(WORDS) - 1)

    @st.composite
    def _texts(draw: st.DrawFn) -> str:
        n = draw(sizes)
        seed = draw(seeds)
        words = [WORDS[(seed + 7 * i) % len(WORDS)] for i in range(n)]
        text = " ".join(words).replace(" \n ", "\n")
        return text if text.strip() or not min_words else "x"

    return _texts()


_CALL_KINDS = st.sampled_from(["read_file", "bash", "search"])
_STEMS = st.sampled_from(["main", "utils", "models", "views", "test_api"])


def _call(draw: st.DrawFn, call_id: str) -> ToolCall:
    kind = draw(_CALL_KINDS)
    stem = draw(_STEMS)
    args: dict[str, Any] = {
        "read_file": {"path": f"src/{stem}.py"},
        "bash": {"command": f"grep -n value docs/{stem}.md && python {stem}.py"},
        "search": {"query": draw(texts(1, 4))},
    }[kind]
    return ToolCall(id=call_id, name=kind, arguments=args)


@st.composite
def conversations(
    draw: st.DrawFn,
    /,
    *,
    min_turns: int = 0,
    max_turns: int = 6,
    max_steps: int = 4,
    max_parallel: int = 4,
    max_words: int = 60,
    system: bool | None = None,
) -> list[Message]:
    """A valid conversation (see the module docstring)."""
    # Each strategy looked up once per conversation (they are cached, but the lookup
    # costs about as much as a draw).
    coin, text, result = st.booleans(), texts(1, max_words), texts(0, max_words * 4)
    steps, parallel = st.integers(0, max_steps), st.integers(1, max_parallel)
    messages: list[Message] = []
    if draw(coin) if system is None else system:
        messages.append(Message(role="system", content=draw(text)))
    next_id = 0
    for _ in range(draw(st.integers(min_turns, max_turns))):
        messages.append(Message(role="user", content=draw(text)))
        for _ in range(draw(steps)):
            if draw(coin):
                messages.append(Message(role="assistant", content=draw(text)))
                continue
            calls = []
            for _ in range(draw(parallel)):
                calls.append(_call(draw, f"call_{next_id}"))
                next_id += 1
            messages.append(Message(role="assistant", content=draw(texts(0, 8)), tool_calls=calls))
            for call in draw(st.permutations(calls)):
                messages.append(Message(role="tool", tool_call_id=call.id, name=call.name,
                                        content=draw(result)))
        if draw(coin):
            messages.append(Message(role="assistant", content=draw(text)))
    return messages


def _rename(messages: list[Message], old: str, new: str) -> list[Message]:
    """Give call ``old`` (and its results) the id ``new``: a reused id."""
    out = []
    for x in messages:
        if x.tool_calls:
            calls = [tc.model_copy(update={"id": new}) if tc.id == old else tc
                     for tc in x.tool_calls]
            x = x.model_copy(update={"tool_calls": calls})
        elif x.tool_call_id == old:
            x = x.model_copy(update={"tool_call_id": new})
        out.append(x)
    return out


_DAMAGES = st.sampled_from(["drop", "move", "duplicate", "orphan", "reuse", "empty", "swap",
                            "lead", "system"])
_EMPTY_ROLES = st.sampled_from(["user", "assistant"])
_EMPTY_TEXTS = st.sampled_from(["", "  \n"])


def _damage(draw: st.DrawFn, messages: list[Message]) -> list[Message]:
    kind = draw(_DAMAGES)
    n = len(messages)
    if n == 0:
        return [Message(role="tool", tool_call_id="ghost", content="lost result")]
    i = draw(st.integers(0, n - 1))
    j = draw(st.integers(0, n))
    m = messages[i]
    if kind == "drop":
        return messages[:i] + messages[i + 1:]
    if kind == "move":
        rest = messages[:i] + messages[i + 1:]
        return [*rest[:min(j, len(rest))], m, *rest[min(j, len(rest)):]]
    if kind == "duplicate":
        return [*messages[:j], m, *messages[j:]]
    if kind == "orphan":
        ghost = Message(role="tool", tool_call_id=f"ghost_{i}", content="orphaned result")
        return [*messages[:j], ghost, *messages[j:]]
    if kind == "reuse":
        ids = [tc.id for x in messages for tc in x.tool_calls]
        if len(ids) < 2:
            return messages
        return _rename(messages, draw(st.sampled_from(ids)), draw(st.sampled_from(ids)))
    if kind == "empty":
        role = draw(_EMPTY_ROLES)
        empty = Message(role=role, content=draw(_EMPTY_TEXTS))
        return [*messages[:j], empty, *messages[j:]]
    if kind == "swap" and i + 1 < n:
        return [*messages[:i], messages[i + 1], m, *messages[i + 2:]]
    if kind == "lead":
        return [x for x in messages if x.role == "system"] + [
            Message(role="assistant", content="continuing")] + [
            x for x in messages if x.role != "system"]
    if kind == "system":
        note = Message(role="system", content="note from the operator")
        return [*messages[:j], note, *messages[j:]]
    return messages


@st.composite
def damaged_conversations(draw: st.DrawFn, /, max_damage: int = 4, **kwargs: Any) -> list[Message]:
    """A valid conversation after 1..max_damage random damages (see the module docstring)."""
    messages = draw(conversations(**kwargs))
    for _ in range(draw(st.integers(1, max_damage))):
        messages = _damage(draw, messages)
    return messages


def any_conversations(**kwargs: Any) -> st.SearchStrategy[list[Message]]:
    """Valid or damaged, half and half."""
    return st.one_of(conversations(**kwargs), damaged_conversations(**kwargs))


# -- real data (../shared/data): loaders; tests skip through the data_dir fixture ----------

def peer_cases(data_dir: Path, *functions: str) -> list[dict[str, Any]]:
    """Peer cases (``peer_cases.json``) for the named functions."""
    cases: list[dict[str, Any]] = json.loads(
        (data_dir / "peer_cases.json").read_text(encoding="utf-8"))["cases"]
    return [c for c in cases if c["function"] in functions]


def peer_messages(raw: Sequence[Mapping[str, Any]]) -> list[Message]:
    """Peer messages as ours; neurolink's ``tool_call``/``tool_result`` roles become an
    assistant call and a tool result, a result tied to the latest call of its tool name
    (an unmatched one keeps an id no call has: an orphan)."""
    out: list[Message] = []
    latest: dict[str, str] = {}
    for k, m in enumerate(raw):
        role, content = m["role"], m.get("content") or ""
        if role == "tool_call":
            call_id = str(m.get("id") or f"c{k}")
            latest[str(m.get("tool"))] = call_id
            out.append(Message(role="assistant", content=content, tool_calls=[
                ToolCall(id=call_id, name=str(m.get("tool") or "unknown"))]))
        elif role == "tool_result":
            call_id = latest.pop(str(m.get("tool")), f"orphan_{k}")
            out.append(Message(role="tool", tool_call_id=call_id, content=content))
        else:
            fields = {key: m[key] for key in ("role", "content", "tool_calls", "tool_call_id")
                      if key in m}
            out.append(Message.model_validate(fields))
    return out
