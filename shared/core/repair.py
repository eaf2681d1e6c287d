"""Tool-pair repair and per-provider validity checks for views.

Orphaned tool calls after trimming are the most reported failure of context
management, and each provider rejects them differently. Every view sent to a
provider goes through :func:`repair_tool_pairs`; :func:`validate_view` states
what each provider requires, so tests (and paranoid callers) can assert it.

What a repaired list guarantees, for OpenAI, Anthropic and Gemini alike:

* each assistant message with tool calls is directly followed by exactly one
  tool message per call, before any other message. Results keep the relative
  order they had (it need not match the calls); a result found further away
  is moved back next to its call; a call without a result gets a placeholder
  result (:data:`MISSING_RESULT_TEXT`) after the results it does have;
* a result with no earlier call of its id is **dropped** (its call is gone, so
  the model could not relate it, and turning it into user text would forge a
  turn), as is every result after the first for one call;
* tool call ids are unique in the whole list (Anthropic requires it): a reused
  id is renamed ``<id>_r<k>`` and its result follows it;
* assistant messages without tool calls that carry no text and no media are
  dropped, unless they carry hosted tool parts the adapters send with them (a
  response that was only a web search and its results, a provider's compaction item:
  :func:`shared.core.pairs.sends_hosted`), and user messages without text or media get
  :data:`EMPTY_USER_TEXT`
  (Anthropic and Gemini reject empty content; dropping the user's message
  would leave the model answering its own last message, or, on Anthropic,
  continuing it as a prefill);
* the first non-system message is a user message: when it is not, a
  placeholder user message (:data:`CONVERSATION_START_TEXT`) is inserted.

Anthropic alternation: adapters send tool results as one user message and
merge consecutive same-role messages (as Anthropic's API does itself), so the
roles alternate by construction; what can still break is a tool_use not
answered at the start of the next user turn, which the pairing rule covers.

Repair is idempotent (``repair(repair(x)) == repair(x)``) and never mutates
its input. The leading system messages are passed through untouched.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from itertools import count
from typing import Any

from shared.core.callids import SYNTHETIC_KEY
from shared.core.errors import InvalidInput
from shared.core.messages import Message, ToolCall
from shared.core.pairs import sends_hosted
from shared.core.turns import leading_system_count

MISSING_RESULT_TEXT = "[tool result missing: the call was interrupted or its result was dropped]"
CONVERSATION_START_TEXT = "[the conversation opens with the assistant's message that follows]"
"""The user message put first where the history opens with the assistant (a greeting, a
blank first message dropped): Anthropic and Gemini need one. Not a claim that anything
was left out: a view cut from a longer log opens with its summary instead."""
EMPTY_USER_TEXT = "[the user sent an empty message]"
"""What a user message without text or media says in a view (a turn the user did take)."""
PROVIDERS: tuple[str, ...] = ("openai", "anthropic", "gemini")


@dataclass(frozen=True, slots=True)
class RepairReport:
    """What :func:`repair_tool_pairs_with_report` changed (ids, not messages)."""

    missing_results: tuple[str, ...] = ()
    orphan_results: tuple[str, ...] = ()
    duplicate_results: tuple[str, ...] = ()
    moved_results: tuple[str, ...] = ()
    renamed_calls: tuple[tuple[str, str], ...] = ()
    empty_dropped: int = 0
    inserted_user: bool = False
    empty_filled: int = 0

    @property
    def changed(self) -> bool:
        return bool(
            self.missing_results or self.orphan_results or self.duplicate_results
            or self.moved_results or self.renamed_calls or self.empty_dropped
            or self.inserted_user or self.empty_filled
        )

    def describe(self) -> str:
        """One line for logs, e.g. ``"2 placeholder results, 1 orphan result dropped"``."""
        counts = [(len(self.missing_results), "placeholder result", ""),
                  (len(self.orphan_results), "orphan result", " dropped"),
                  (len(self.duplicate_results), "duplicate result", " dropped"),
                  (len(self.moved_results), "result", " moved back to its call"),
                  (len(self.renamed_calls), "reused call id", " renamed"),
                  (self.empty_dropped, "empty message", " dropped"),
                  (self.empty_filled, "empty user message", " given placeholder text"),
                  (int(self.inserted_user), "placeholder user message", " inserted first")]
        parts = [f"{n} {what}{'s' if n != 1 else ''}{tail}" for n, what, tail in counts if n]
        return ", ".join(parts) or "no change"


@dataclass(slots=True)
class _Slot:
    """One tool call and the result assigned to it (body index, message)."""

    position: int
    call: ToolCall
    final_id: str
    result: tuple[int, Message] | None = field(default=None)


def _is_empty(message: Message) -> bool:
    return (
        message.role in ("user", "assistant")
        and not message.tool_calls
        and message.media_count() == 0
        and not message.text().strip()
        and not (message.role == "assistant" and sends_hosted(message))
    )


def _fresh_id(original: str, taken: set[str]) -> str:
    base = original[:240]
    return next(c for k in count(2) if (c := f"{base}_r{k}") not in taken)


_Assignment = tuple[dict[int, list[_Slot]], list[str], list[str], list[tuple[str, str]]]


def _assign(body: Sequence[Message]) -> _Assignment:
    """Give every tool result to the latest earlier unanswered call with its id."""
    taken = {tc.id for m in body for tc in m.tool_calls}
    used: set[str] = set()
    slots_at: dict[int, list[_Slot]] = {}
    open_by_id: dict[str, list[_Slot]] = {}
    seen: set[str] = set()
    orphans: list[str] = []
    duplicates: list[str] = []
    renamed: list[tuple[str, str]] = []
    for j, message in enumerate(body):
        if message.role == "assistant" and message.tool_calls:
            slots = []
            for call in message.tool_calls:
                final = call.id
                if final in used:
                    final = _fresh_id(call.id, taken | used)
                    renamed.append((call.id, final))
                used.add(final)
                slot = _Slot(j, call, final)
                slots.append(slot)
                open_by_id.setdefault(call.id, []).append(slot)
                seen.add(call.id)
            slots_at[j] = slots
        elif message.role == "tool":
            call_id = message.tool_call_id or ""
            waiting = open_by_id.get(call_id)
            if waiting:
                newest = waiting[-1].position
                k = next(i for i, s in enumerate(waiting) if s.position == newest)
                waiting.pop(k).result = (j, message)
            elif call_id in seen:
                duplicates.append(call_id)
            else:
                orphans.append(call_id)
    return slots_at, orphans, duplicates, renamed


def repair_tool_pairs_with_report(
    messages: Sequence[Message], *, opened: bool = False,
) -> tuple[list[Message], RepairReport]:
    """Repair a view (see the module docstring) and say what changed.

    ``opened``: the view opens with something the caller puts before these messages (a
    summary, which then leads as the user message): no placeholder user message is
    inserted, which would tell the model the conversation starts here."""
    head = leading_system_count(messages)
    body = list(messages[head:])
    slots_at, orphans, duplicates, renamed = _assign(body)
    last_other: list[int] = []
    latest = -1
    for j, message in enumerate(body):
        last_other.append(latest)
        if message.role != "tool":
            latest = j
    out: list[Message] = list(messages[:head])
    missing: list[str] = []
    moved: list[str] = []
    empty = filled = 0
    for j, message in enumerate(body):
        if message.role == "tool":
            continue
        if _is_empty(message):
            if message.role == "user":
                filled += 1
                out.append(message.model_copy(update={"content": EMPTY_USER_TEXT}))
            else:
                empty += 1
            continue
        slots = slots_at.get(j)
        if slots is None:
            out.append(message)
            continue
        if any(s.final_id != s.call.id for s in slots):
            calls = [s.call.model_copy(update={"id": s.final_id}) for s in slots]
            message = message.model_copy(update={"tool_calls": calls})
        out.append(message)
        answered = sorted(((s.result, s) for s in slots if s.result is not None),
                          key=lambda pair: pair[0][0])
        for (where, result), slot in answered:
            if result.tool_call_id != slot.final_id:
                result = result.model_copy(update={"tool_call_id": slot.final_id})
            if last_other[where] != j:
                moved.append(slot.final_id)
            out.append(result)
        made_up = message.metadata.get(SYNTHETIC_KEY)
        for slot in slots:
            if slot.result is None:
                missing.append(slot.final_id)
                out.append(_placeholder(slot, isinstance(made_up, list)
                                        and slot.final_id in made_up))
    first = leading_system_count(out)
    inserted = not opened and first < len(out) and out[first].role != "user"
    if inserted:
        out.insert(first, Message(role="user", content=CONVERSATION_START_TEXT,
                                  metadata={"repair": "conversation_start"}))
    report = RepairReport(tuple(missing), tuple(orphans), tuple(duplicates), tuple(moved),
                          tuple(renamed), empty, inserted, filled)
    return out, report


def without_conversation_start(messages: Sequence[Message]) -> tuple[list[Message], Message | None]:
    """``messages`` without the user message repair put first (:data:`CONVERSATION_START_TEXT`),
    and that message (None: there was none). For a view a summary opens after all (an
    emergency cut was repaired before it knew it would leave a note): the summary leads as
    the user message, which the inserted one would push into the system message."""
    first = leading_system_count(messages)
    lead = messages[first] if first < len(messages) else None
    if lead is not None and lead.role == "user" and lead.text() == CONVERSATION_START_TEXT \
            and lead.metadata.get("repair") == "conversation_start":
        return [*messages[:first], *messages[first + 1:]], messages[first]
    return list(messages), None


def _placeholder(slot: _Slot, made_up: bool) -> Message:
    """The result of a call that has none; ``made_up``: its call's id is one the guard made
    for Gemini (never sent), so the result goes without one too."""
    metadata: dict[str, Any] = {"repair": "missing_result"}
    if made_up:
        metadata[SYNTHETIC_KEY] = True
    return Message(role="tool", tool_call_id=slot.final_id, name=slot.call.name,
                   content=MISSING_RESULT_TEXT, metadata=metadata)


def repair_tool_pairs(messages: Sequence[Message], *, opened: bool = False) -> list[Message]:
    """The repaired view alone; see :func:`repair_tool_pairs_with_report`."""
    return repair_tool_pairs_with_report(messages, opened=opened)[0]


_ANCHOR = Message(role="user", content="-")  # stands for the repaired prefix's start


def call_ids(messages: Iterable[Message]) -> set[str]:
    """Every tool call id the messages use, and every id their results name."""
    ids = {c.id for m in messages for c in m.tool_calls}
    ids.update(m.tool_call_id for m in messages if m.role == "tool" and m.tool_call_id)
    return ids


def repair_continued(tail: Sequence[Message], taken: AbstractSet[str]) -> list[Message] | None:
    """``repair_tool_pairs(prefix + tail)[len(repair_tool_pairs(prefix)):]``, in time
    proportional to ``tail``: the prefix's repair is kept and only the tail repaired.

    ``taken``: the ids of the prefix and of its repair (:func:`call_ids` of both); the
    prefix holds a non-system message and ends with no call waiting for its results
    (:func:`open_unit_start`). None when the tail reaches back into the prefix (a result
    for one of its calls, a call reusing one of its ids, a renamed id that would meet
    one of them): then only a repair of the whole says what changes.
    """
    for m in tail:
        if m.role == "tool" and (m.tool_call_id or "") in taken:
            return None
        if any(c.id in taken for c in m.tool_calls):
            return None
    out = repair_tool_pairs([_ANCHOR, *tail])[1:]  # the anchor: the prefix began the body
    if any(c.id in taken for m in out for c in m.tool_calls):
        return None
    return out


def open_unit_start(messages: Sequence[Message], floor: int = 0) -> int:
    """Where a trailing assistant message with a call not answered by the tool results
    after it begins (results may still come), else ``len(messages)``; not below ``floor``."""
    end = len(messages)
    k = end - 1
    while k >= floor and messages[k].role == "tool":
        k -= 1
    if k < floor or not messages[k].tool_calls:
        return end
    answered = {messages[j].tool_call_id for j in range(k + 1, end)}
    return k if any(c.id not in answered for c in messages[k].tool_calls) else end


def _pairing_violations(messages: Sequence[Message]) -> list[str]:
    problems: list[str] = []
    i, n = 0, len(messages)
    while i < n:
        message = messages[i]
        if message.role == "tool":
            problems.append(
                f"messages[{i}]: tool result {message.tool_call_id!r} does not directly follow "
                "the assistant message that called it"
            )
        if message.role != "assistant" or not message.tool_calls:
            i += 1
            continue
        ids = [tc.id for tc in message.tool_calls]
        problems += [
            f"messages[{i}].tool_calls[{k}]: id {cid!r} is used twice in one message"
            for k, cid in enumerate(ids) if cid in ids[:k]
        ]
        answered: set[str] = set()
        j = i + 1
        while j < n and messages[j].role == "tool":
            cid = messages[j].tool_call_id or ""
            if cid not in ids:
                problems.append(
                    f"messages[{j}]: tool result {cid!r} answers no call of messages[{i}]"
                )
            elif cid in answered:
                problems.append(f"messages[{j}]: second tool result for call {cid!r}")
            answered.add(cid)
            j += 1
        after = f"messages[{j}]" if j < n else "the end"
        problems += [
            f"messages[{i}].tool_calls[{k}]: call {cid!r} has no result before {after}"
            for k, cid in enumerate(ids) if cid not in answered
        ]
        i = j
    return problems


def validate_view(messages: Sequence[Message], provider: str) -> list[str]:
    """Violations of ``provider``'s rules in ``messages``; an empty list means valid.

    All providers: tool results directly follow their call, one per call.
    Anthropic and Gemini also: the first non-system message is a user message,
    and no user/assistant message without tool calls is empty. Anthropic also:
    tool call ids are unique across the whole list. System messages after the
    first turn are not flagged: each adapter folds them (Anthropic and Gemini
    have no system role inside the conversation), which pairing does not touch.
    """
    if provider not in PROVIDERS:
        raise InvalidInput(f"unknown provider {provider!r}; expected one of {PROVIDERS}",
                           field="provider")
    problems = _pairing_violations(messages)
    if provider in ("anthropic", "gemini"):
        first = leading_system_count(messages)
        if first < len(messages) and messages[first].role != "user":
            problems.append(f"messages[{first}]: the first non-system message must be a user "
                            f"message, not {messages[first].role}")
        problems += [f"messages[{i}]: empty {m.role} message" for i, m in enumerate(messages)
                     if _is_empty(m)]
    if provider == "anthropic":
        seen: set[str] = set()
        for i, message in enumerate(messages):
            for k, call in enumerate(message.tool_calls):
                if call.id in seen:
                    problems.append(f"messages[{i}].tool_calls[{k}]: id {call.id!r} was used "
                                    "by an earlier call")
                seen.add(call.id)
    return problems


__all__ = [
    "CONVERSATION_START_TEXT",
    "EMPTY_USER_TEXT",
    "MISSING_RESULT_TEXT",
    "PROVIDERS",
    "RepairReport",
    "call_ids",
    "open_unit_start",
    "repair_continued",
    "repair_tool_pairs",
    "repair_tool_pairs_with_report",
    "validate_view",
    "without_conversation_start",
]
