"""Sessions for the guard benchmarks: real transcripts, concatenated to a size, in a real Redis.

Messages come from ``../shared/data/transcripts.dev.jsonl`` (OpenAI chat
format; system messages dropped), concatenated transcript after transcript
until the wanted count, cut at a turn start. ``positional_ids`` renames every
tool call per turn as Gemini's adapter does (``gemini-<content>-<part>``
restarting each turn), so ids repeat across turns.
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from _timing import ROOT

from shared.core.config import StoreConfig
from shared.core.messages import Message
from shared.core.records import SummaryRecord
from shared.core.turns import turn_starts
from shared.core.wire import from_openai
from shared.store.sessions import SessionStore, connect

DATA = ROOT.parent / "shared" / "data" / "transcripts.dev.jsonl"
WINDOW_MODEL = "bench-window"
# The whole log fits (before the first summary): these transcripts run ~265 tokens a message,
# so 10k messages are ~2.6M tokens and 100k ~26M.
OVERRIDES = {WINDOW_MODEL: 100_000_000}
SYSTEM = "You are a careful software engineering agent. Use the tools to inspect and fix code."


def transcripts(path: Path = DATA) -> list[list[Message]]:
    out = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            raw = json.loads(line)["messages"]
            out.append([m for m in from_openai(raw) if m.role != "system"])
    return out


def turns_of(messages: list[Message]) -> list[list[Message]]:
    starts = [*turn_starts(messages), len(messages)]
    return [messages[a:b] for a, b in itertools.pairwise(starts) if b > a]


def all_turns() -> list[list[Message]]:
    return [t for tr in transcripts() for t in turns_of(tr)]


def positional(turn: list[Message]) -> list[Message]:
    """The turn with Gemini-style positional call ids (they repeat every turn)."""
    names: dict[str, str] = {}
    out = []
    for i, m in enumerate(turn):
        if m.tool_calls:
            calls = []
            for j, c in enumerate(m.tool_calls):
                names[c.id] = f"gemini-{i}-{j}"
                calls.append(c.model_copy(update={"id": names[c.id]}))
            m = m.model_copy(update={"tool_calls": calls})
        elif m.role == "tool" and m.tool_call_id in names:
            m = m.model_copy(update={"tool_call_id": names[m.tool_call_id]})
        out.append(m)
    return out


def fresh_ids(turn: list[Message]) -> list[Message]:
    """The turn with new random call ids, as a provider makes them for a new response
    (replayed transcripts repeat the ids the session already holds)."""
    names: dict[str, str] = {}
    out = []
    for m in turn:
        if m.tool_calls:
            calls = []
            for c in m.tool_calls:
                names[c.id] = "call_" + uuid.uuid4().hex[:24]
                calls.append(c.model_copy(update={"id": names[c.id]}))
            m = m.model_copy(update={"tool_calls": calls})
        elif m.role == "tool" and m.tool_call_id in names:
            m = m.model_copy(update={"tool_call_id": names[m.tool_call_id]})
        out.append(m)
    return out


def history(n: int, *, repeated_ids: bool = False) -> list[Message]:
    """About ``n`` messages of real turns (whole turns, cut at the last turn start <= n)."""
    out: list[Message] = []
    pool = all_turns()
    k = 0
    while len(out) < n:
        turn = pool[k % len(pool)]
        k += 1
        out.extend(positional(turn) if repeated_ids else turn)
    starts = [s for s in turn_starts(out) if s <= n]
    return out[: starts[-1] if starts and starts[-1] > 0 else n]


def next_turns(repeated_ids: bool = False) -> Iterator[list[Message]]:
    """Turns an agent records between prepares (small real turns, cycled)."""
    small = [t for t in all_turns() if len(t) <= 6] or all_turns()
    k = 0
    while True:
        turn = small[k % len(small)]
        k += 1
        yield positional(turn) if repeated_ids else turn


@dataclass
class Env:
    url: str
    prefix: str = field(default_factory=lambda: "bench" + uuid.uuid4().hex[:8])
    stores: list[SessionStore] = field(default_factory=list)
    ttl_seconds: int | None = None  # sessions expire (a long run's Redis memory stays bounded)

    @property
    def config(self) -> StoreConfig:
        return StoreConfig(key_prefix=self.prefix, max_messages_per_session=400_000,
                           socket_timeout=60.0,  # a cold read of 100k messages is ~100 MB
                           ttl_seconds=self.ttl_seconds)

    def store(self) -> SessionStore:
        s = SessionStore(connect(self.url, self.config), self.config)
        self.stores.append(s)
        return s

    def cleanup(self) -> None:
        client = redis.Redis.from_url(self.url)
        keys = list(client.scan_iter(match=f"{self.prefix}:*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i:i + 500])


def seed(store: SessionStore, sid: str, messages: list[Message], *,
         summary_at: float | None = None) -> int:
    """Append ``messages`` in batches; optionally commit an LLM summary at a turn start
    near ``summary_at`` of the log. Returns the watermark (0: none)."""
    for i in range(0, len(messages), 500):
        store.append(sid, messages[i:i + 500])
    if summary_at is None:
        return 0
    starts = [s for s in turn_starts(messages) if s <= len(messages) * summary_at]
    w = starts[-1] if starts else 0
    record = SummaryRecord(watermark=w, kind="llm", text="Summary of the work so far. " * 40,
                           tokens=400)
    assert store.commit_summary(sid, record, store.state(sid).version).ok
    return w


def lc_messages(messages: list[Message]) -> list[Any]:
    """The same messages as LangChain messages (for trim_messages / middleware)."""
    from langchain_core.messages import convert_to_messages

    from shared.core.wire import to_openai
    return list(convert_to_messages(to_openai([Message(role="system", content=SYSTEM),
                                               *messages])))
