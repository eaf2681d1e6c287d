"""Cheap stages: what costs nothing to drop, decided before any LLM summary.

Two stages, both on tool results older than the newest few turns:

- ``dedupe_read``: a file read again later keeps only its latest read; the
  earlier results become a one-line pointer to the later one.
- ``clear_tool_output``: a bulky tool result is replaced by a placeholder
  that says what was cleared (tool, size) and how to get it back.

Decisions are made once, in a batch, when the view reaches the trigger
ratio, and are then recorded in the store (first writer wins). Between
two batches the view's prefix is byte-identical, so provider prompt caches
keep hitting. Placeholders are deterministic text: the same decision always
renders the same bytes. The raw log is never changed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Literal

from shared.core.config import CompactionPolicy
from shared.core.fileops import file_ops
from shared.core.messages import Message
from shared.core.records import CheapDecision
from shared.core.tokens import DEFAULT_COUNTER, TokenCounter
from shared.core.turns import turn_starts


def _calls_by_id(messages: Sequence[Message]) -> dict[str, tuple[str, object]]:
    calls: dict[str, tuple[str, object]] = {}
    for m in messages:
        for tc in m.tool_calls:
            try:
                args: object = json.loads(tc.arguments)
            except ValueError:
                args = {}
            calls[tc.id] = (tc.name, args)
    return calls


def _read_path(name: str, args: object) -> str | None:
    """The single file a call only reads, else None."""
    ops = file_ops(name, args)
    if len(ops) == 1 and ops[0][1] == "read":
        return ops[0][0]
    return None


def _protected_from(messages: Sequence[Message], keep_turns: int) -> int:
    if keep_turns <= 0:
        return len(messages)
    starts = turn_starts(messages)
    if len(starts) < keep_turns:
        return 0
    return starts[-keep_turns]


def plan_cheap_stages(messages: Sequence[Message], offset: int,
                      existing: Mapping[int, CheapDecision], *,
                      policy: CompactionPolicy | None = None,
                      counter: TokenCounter | None = None) -> list[CheapDecision]:
    """New decisions for ``messages`` (``messages[0]`` is log index ``offset``)."""
    policy = policy or CompactionPolicy()
    counter = counter or DEFAULT_COUNTER
    protect = _protected_from(messages, policy.clear_keep_recent_turns)
    calls = _calls_by_id(messages)
    decided = set(existing)
    plan: list[CheapDecision] = []

    latest_read: dict[str, int] = {}
    for i, m in enumerate(messages):
        if m.role != "tool" or m.tool_call_id not in calls:
            continue
        name, args = calls[m.tool_call_id]
        path = _read_path(name, args)
        if path is not None:
            latest_read[path] = i

    for i, m in enumerate(messages[:protect]):
        index = offset + i
        if m.role != "tool" or index in decided or m.tool_call_id not in calls:
            continue
        name, args = calls[m.tool_call_id]
        tokens = counter.message(m)
        path = _read_path(name, args)
        later = latest_read.get(path, i) if path is not None else i
        if path is not None and later > i:
            text = (f"[earlier read of {path} omitted: the file was read again at "
                    f"message #{offset + later}, which has the current content]")
            stage: Literal["clear_tool_output", "dedupe_read"] = "dedupe_read"
            refers: int | None = offset + later
        elif tokens > policy.clear_tool_outputs_over_tokens:
            text = (f"[tool output cleared to save context: {name} returned "
                    f"{len(m.text())} characters (~{tokens} tokens). The full output is kept "
                    f"in the session log as message #{index}; call {name} again with the "
                    f"same arguments if you need it.]")
            stage = "clear_tool_output"
            refers = None
        else:
            continue
        saved = tokens - counter.message(m.model_copy(update={"content": text}))
        if saved > 0:
            plan.append(CheapDecision(index=index, stage=stage,
                                      placeholder=text, saved_tokens=saved,
                                      refers_to=refers))
    return plan


__all__ = ["plan_cheap_stages"]
