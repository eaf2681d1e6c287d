"""Cheap stages: what costs nothing to drop, decided before any LLM summary.

Two stages, both on tool results older than the newest few turns:

- ``dedupe_read``: a read of a file that a later read holds entirely (a
  later whole-file read, or the same read again: the same range, the same
  grep) becomes a one-line pointer to the later one. A partial read never
  stands for a different read.
- ``clear_tool_output``: a bulky tool result is replaced by a placeholder
  that says what was cleared (tool, size) and how to get it back. So are the
  bulky hosted tool parts of an assistant message (web search results, code
  interpreter output the adapters send back with it, counted as its
  ``extra_tokens``): their notes in its reasoning become one placeholder note
  and the figure goes with them, so the adapters stop sending the parts.

Decisions are made once, in a batch, when the view reaches the trigger
ratio, and are then recorded in the store (first writer wins). Between
two batches the view's prefix is byte-identical, so provider prompt caches
keep hitting. Placeholders are deterministic text: the same decision always
renders the same bytes. The raw log is never changed.

A session stays above the trigger until a worker's summary lands, and it
keeps growing meanwhile: planning reads each message once
(:class:`CheapScan`), so a plan costs what was appended since the last one,
not the view (a 10k-message view took ~300 ms to plan from scratch).
"""

from __future__ import annotations

import bisect
import heapq
import json
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from shared.core import fastjson
from shared.core.config import CompactionPolicy
from shared.core.fileops import read_scope
from shared.core.messages import Message
from shared.core.records import CheapDecision, decode_messages
from shared.core.tokens import DEFAULT_COUNTER, EXTRA_TOKENS, TokenCounter, extra_tokens

Read = tuple[str, str]
"""(path, scope) of a call that only reads one file: see :func:`read_scope`."""


def _read_path(name: str, arguments: str) -> Read | None:
    """The single file a call only reads and what of it, else None."""
    try:
        args: object = json.loads(arguments)
    except ValueError:
        args = {}
    return read_scope(name, args)


Fields = tuple[str, str | None, list[tuple[str, str, str]], float]
"""What planning reads of a message: its role, the call its result answers, its calls
(id, name, arguments), its :data:`EXTRA_TOKENS` figure (hosted parts sent with it)."""


def _fields(message: Message) -> Fields:
    return (message.role, message.tool_call_id,
            [(c.id, c.name, c.arguments) for c in message.tool_calls], extra_tokens(message))


def _stored_extra(data: dict[str, object]) -> float:
    """:func:`extra_tokens` of a stored message's JSON (its rules: a positive number)."""
    metadata = data.get("metadata")
    value = metadata.get(EXTRA_TOKENS) if type(metadata) is dict else None
    if (type(value) is int or type(value) is float) and value > 0:  # not a bool; NaN is not
        return min(float(value), 100_000_000.0)  # (extra_tokens' cap: a note prints it)
    return 0.0


_NOTE_START = re.compile(r"\[([^\[\]\n]{1,120}?)(?:: | \(opaque\)\]$)")
"""The first line of a hosted note as the adapters write them
(:mod:`shared.integrations.notes`): ``[kind: ...`` (``[web_search_call: {...}]``,
pydantic-ai's ``[web_search result: ...``, ``[provider compaction: ...``, ``[generated
file: ...``) or ``[provider compaction (opaque)]``; group 1 is the kind."""


def without_notes(reasoning: str) -> tuple[str, list[str]]:
    """``reasoning`` without its hosted notes, and the kinds of the notes taken out.

    Reasoning holds thinking text and notes, joined by newlines; a note starts a line
    (``[kind: ...``) and ends at the first line that ends with ``]`` (a pydantic-ai
    result note may span lines). Taking out a note's first line is enough to stop its
    part being sent (the adapters look for the whole note:
    :func:`shared.integrations.notes.kept_notes`); the rest of a note cut short by an
    inner line ending in ``]`` stays as text (counted, not sent: the safe side). A
    thinking line of the note form is taken out too: deterministic, and only ever text
    of an old message."""
    kept: list[str] = []
    kinds: list[str] = []
    inside = False
    for line in reasoning.split("\n"):
        if not inside and (found := _NOTE_START.match(line)) is not None:
            kinds.append(found.group(1))
            inside = True
        if inside:
            inside = not line.endswith("]")
            continue
        kept.append(line)
    if not kinds:
        return reasoning, []
    return re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).strip("\n"), kinds


def _decoded(item: Message | bytes) -> Message:
    return item if isinstance(item, Message) else decode_messages(b"[" + item + b"]")[0]


def _read(item: Message | bytes) -> tuple[Message | None, Fields]:
    """(the model where one was needed, :data:`Fields`) of a message or its stored JSON."""
    if isinstance(item, Message):
        return item, _fields(item)
    found = _stored_fields(item)
    if found is None:  # not as the store writes it: its model says
        m = _decoded(item)
        return m, _fields(m)
    return None, found


def _stored_fields(raw: bytes) -> Fields | None:
    """:func:`_fields` of a stored message from its JSON, without a model (a cold view's
    chunks are not decoded for planning); None when it is not as the store writes it."""
    data = fastjson.loads_unchecked(raw)  # (no number of it is read)
    if type(data) is not dict:
        return None
    role, call_id, calls = data.get("role"), data.get("tool_call_id"), data.get("tool_calls", [])
    extra = _stored_extra(data) if role == "assistant" else 0.0
    if type(role) is not str or type(calls) is not list \
            or (call_id is not None and type(call_id) is not str):
        return None
    out: list[tuple[str, str, str]] = []
    for c in calls:
        if type(c) is not dict:
            return None
        cid, name, arguments = c.get("id"), c.get("name"), c.get("arguments", "{}")
        if type(cid) is not str or type(name) is not str or type(arguments) is not str:
            return None
        out.append((cid, name, arguments))
    return role, call_id, out, extra


@dataclass(frozen=True, slots=True)
class _Result:
    """A tool result not decided yet: its call's tool, file and scope, its tokens; or
    (``hosted``: its figure) an assistant message's hosted parts."""

    name: str
    read: Read | None
    tokens: int
    hosted: float = 0.0


@dataclass
class CheapScan:
    """What planning knows of ``log[start:end)``: the next plan reads only what follows.

    Kept per session view (the log is append-only while its epoch and
    generation last); :meth:`advance` takes the messages appended since,
    :meth:`decide` the decisions they made possible. A tool result answers the
    nearest earlier call with its id (as :func:`shared.core.turns.tool_units`
    ties them); turn starts are maintained as ``turn_starts`` finds them.
    """

    start: int
    keep_turns: int
    threshold: int
    end: int = -1
    calls: dict[str, tuple[str, Read | None, int]] = field(default_factory=dict)
    starts: list[int] = field(default_factory=list)  # turn starts, log indexes
    latest_read: dict[Read, int] = field(default_factory=dict)  # (file, scope) -> newest
    open_reads: dict[str, dict[int, str]] = field(default_factory=dict)  # not superseded
    undecided: dict[int, _Result] = field(default_factory=dict)
    big: list[int] = field(default_factory=list)  # heap: results over the threshold
    superseded: list[int] = field(default_factory=list)  # heap: reads read again later
    read_tokens: dict[int, int] = field(default_factory=dict)  # a read's result's tokens
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.end < 0:
            self.end = self.start

    @classmethod
    def for_policy(cls, start: int, policy: CompactionPolicy) -> CheapScan:
        return cls(start, policy.clear_keep_recent_turns, policy.clear_tool_outputs_over_tokens)

    def fits(self, start: int, end: int, policy: CompactionPolicy) -> bool:
        """Whether this scan can continue to a view ``log[start:end)`` under ``policy``."""
        return (self.start == start and self.end <= end
                and self.keep_turns == policy.clear_keep_recent_turns
                and self.threshold == policy.clear_tool_outputs_over_tokens)

    def advance(self, messages: Sequence[Message | bytes], tokens: Sequence[int] | None,
                counter: TokenCounter) -> None:
        """Read ``messages``, log indexes ``end`` on (``tokens``: their counts, if known);
        an item may be a message's stored JSON (a cold view's history not decoded yet),
        read without a model."""
        for k, item in enumerate(messages):
            i = self.end + k
            m, (role, call_id, calls, extra) = _read(item)
            if role == "assistant":
                for cid, name, arguments in calls:
                    self.calls[cid] = (name, _read_path(name, arguments), i)
                if extra > self.threshold:  # bulky hosted parts: cleared like a result
                    self.undecided[i] = _Result("", None, 0, extra)
                    heapq.heappush(self.big, i)
            elif role == "user":
                self.starts.append(i)
            elif role == "tool" and call_id in self.calls:
                name, read, at = self.calls[call_id]
                # everything between the call and its result is one unit: no turn starts
                del self.starts[bisect.bisect_right(self.starts, at):]
                if tokens is not None:
                    count = tokens[k]
                else:
                    count = counter.message(m if m is not None else _decoded(item))
                self._result(i, name, read, count)
        self.end += len(messages)

    def _result(self, i: int, name: str, read: Read | None, tokens: int) -> None:
        self.undecided[i] = _Result(name, read, tokens)
        if tokens > self.threshold:
            heapq.heappush(self.big, i)
        if read is not None:
            path, scope = read
            self.read_tokens[i] = tokens
            open_reads = self.open_reads.setdefault(path, {})
            if scope:  # a partial read holds only the same read's output
                gone = [j for j, seen in open_reads.items() if seen == scope]
            else:  # a whole read holds every earlier read of its file
                gone = list(open_reads)
            for j in gone:
                if self._holds(i, j):
                    del open_reads[j]
                    if j in self.undecided:
                        heapq.heappush(self.superseded, j)
            open_reads[i] = scope
            self.latest_read[read] = i

    def _holds(self, later: int, i: int) -> bool:
        """Whether read ``later``'s result can stand for read ``i``'s: not a failed or empty
        read of the file ("No such file", "permission denied"), which holds far less."""
        return self.read_tokens.get(later, 0) * 2 >= self.read_tokens.get(i, 0)

    def _later_read(self, i: int, read: Read) -> int:
        """The newest read that holds all read ``i`` held (``i`` itself when none): the
        newest same read or whole read of its file, unless it holds far less."""
        found = i
        for j in (self.latest_read.get(read, i), self.latest_read.get((read[0], ""), i)):
            if j > found and self._holds(j, i):
                found = j
        return found

    def protected_from(self) -> int:
        """The first log index of the newest ``keep_turns`` turns (``end``: none kept)."""
        if self.keep_turns <= 0:
            return self.end
        if len(self.starts) < self.keep_turns:
            return self.start
        return self.starts[-self.keep_turns]

    def decide(self, history: Sequence[Message], existing: Mapping[int, CheapDecision],
               counter: TokenCounter) -> list[CheapDecision]:
        """Decisions for the results now older than the protected turns (once each);
        ``history``: the view's messages, ``history[0]`` at log index ``start``."""
        protect = self.protected_from()
        plan: list[CheapDecision] = []
        for queue in (self.big, self.superseded):
            while queue and queue[0] < protect:
                i = heapq.heappop(queue)
                result = self.undecided.pop(i, None)
                if result is None or i in existing:
                    continue
                decision = self._hosted(i, history[i - self.start], result, counter) \
                    if result.hosted else \
                    self._decision(i, history[i - self.start], result, counter)
                if decision is not None:
                    plan.append(decision)
                elif result.read is not None and self._later_read(i, result.read) == i:
                    # a later read of its file may drop it yet: open again, since the read
                    # that superseded it is no longer the newest (a failed read came after)
                    self.undecided[i] = result
                    self.open_reads.setdefault(result.read[0], {})[i] = result.read[1]
        plan.sort(key=lambda d: d.index)
        return plan

    @staticmethod
    def _hosted(i: int, m: Message, result: _Result,
                counter: TokenCounter) -> CheapDecision | None:
        """Clear an old message's bulky hosted parts: their notes in its reasoning become
        one placeholder note, its content stays (``placeholder`` is the content itself: a
        version that only replaces content shows the message as it was, and counts it so:
        :attr:`CheapDecision.hosted_tokens`)."""
        if not isinstance(m.content, str) or not m.reasoning:
            return None
        kept, kinds = without_notes(m.reasoning)
        if not kinds:  # its notes are not in its reasoning (beside signed thinking)
            return None
        note = (f"[hosted tool output cleared to save context: "
                f"{', '.join(dict.fromkeys(kinds))} (~{round(result.hosted)} tokens sent "
                f"back with this message). The full parts are kept in the session log as "
                f"message #{i}; run the tool again if you need them.]")
        reasoning = f"{kept}\n\n{note}" if kept else note
        decision = CheapDecision(index=i, stage="clear_tool_output", placeholder=m.content,
                                 saved_tokens=0, reasoning=reasoning)
        saved = counter.message(m) - counter.message(decision.apply(m))
        if saved <= 0:
            return None
        return decision.model_copy(update={"saved_tokens": saved, "hosted_tokens": saved})

    def _decision(self, i: int, m: Message, result: _Result,
                  counter: TokenCounter) -> CheapDecision | None:
        read = result.read
        later = self._later_read(i, read) if read is not None else i
        if read is not None and later > i:
            path = read[0]
            if self.latest_read.get((path, "")) == later:
                text = (f"[earlier read of {path} omitted: the file was read again at "
                        f"message #{later}, which has the current content]")
            else:
                text = (f"[earlier read of {path} omitted: the same read was run again at "
                        f"message #{later}, which has its current output]")
            stage: Literal["clear_tool_output", "dedupe_read"] = "dedupe_read"
            refers: int | None = later
        elif result.tokens > self.threshold:
            text = (f"[tool output cleared to save context: {result.name} returned "
                    f"{len(m.text())} characters (~{result.tokens} tokens). The full output "
                    f"is kept in the session log as message #{i}; call {result.name} again "
                    f"with the same arguments if you need it.]")
            stage = "clear_tool_output"
            refers = None
        else:
            return None
        saved = result.tokens - counter.message(m.model_copy(update={"content": text}))
        if saved <= 0:
            return None
        return CheapDecision(index=i, stage=stage, placeholder=text, saved_tokens=saved,
                             refers_to=refers)


def plan_cheap_stages(messages: Sequence[Message], offset: int,
                      existing: Mapping[int, CheapDecision], *,
                      policy: CompactionPolicy | None = None,
                      counter: TokenCounter | None = None) -> list[CheapDecision]:
    """New decisions for ``messages`` (``messages[0]`` is log index ``offset``)."""
    policy = policy or CompactionPolicy()
    counter = counter or DEFAULT_COUNTER
    scan = CheapScan.for_policy(offset, policy)
    scan.advance(messages, None, counter)
    return scan.decide(messages, existing, counter)


__all__ = ["CheapScan", "plan_cheap_stages"]
