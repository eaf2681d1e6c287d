"""Splitting of ranges the summarizer cannot read at once (:func:`chunk_for_window`)."""

from __future__ import annotations

from collections.abc import Sequence

from shared.core.errors import InvalidInput, LimitExceeded
from shared.core.ledger import Ledger
from shared.core.messages import Message
from shared.core.tokens import DEFAULT_COUNTER, MESSAGE_OVERHEAD, REQUEST_OVERHEAD, TokenCounter
from shared.core.turns import leading_system_count, tool_units
from workers.summarizer.prompts import (
    DEFAULT_MESSAGE_CHARS,
    DEFAULT_TOOL_CHARS,
    _check_rendered,
    _validated,
    build_summary_request,
    render_messages,
    request_tokens,
)


def fits_by_bytes(request: Sequence[dict[str, str]], max_input_tokens: int,
                  reserve: int = 0) -> bool:
    """True when ``request`` fits ``max_input_tokens`` whatever the tokenizer: its
    UTF-8 bytes plus chat framing plus ``reserve`` are within the limit.

    Byte-level BPE (OpenAI, Anthropic) and SentencePiece with byte fallback
    (Gemini, Llama) emit tokens of at least one byte each, so a text never
    has more tokens than bytes. A summary request of a few tens of kilobytes
    against a 128k-token summarizer needs no count at all; counting it was
    the job's largest token estimate.
    """
    size = REQUEST_OVERHEAD + reserve
    for message in request:
        size += len(message["content"].encode("utf-8", "surrogatepass")) + MESSAGE_OVERHEAD
        if size > max_input_tokens:
            return False
    return True


def chunk_for_window(messages: Sequence[Message], max_input_tokens: int,
                     counter: TokenCounter | None = None, *, previous_summary_tokens: int = 0,
                     ledger: Ledger | None = None, max_summary_tokens: int = 2000,
                     start: int = 0,
                     rendered: Sequence[str] | None = None) -> list[list[Message]]:
    """Split ``messages`` so each chunk's summary request fits ``max_input_tokens``.

    Chunks end on unit boundaries (:func:`shared.core.turns.tool_units`): a tool
    call is never separated from its results. Each chunk's request is counted
    as an UPDATE request carrying ``ledger`` plus ``previous_summary_tokens``
    for the running summary of the previous fold, and verified after packing.
    A range whose whole request fits is one chunk, counted once (the common
    case, and what packing would verify), or not at all when its bytes alone
    show that it fits (:func:`fits_by_bytes`). A single unit that cannot fit
    raises :class:`LimitExceeded` naming it. ``rendered``: the messages as
    :func:`render_messages` returned them (same ``start``).
    """
    counter = counter or DEFAULT_COUNTER
    for name, value, low in (("max_input_tokens", max_input_tokens, 1),
                             ("previous_summary_tokens", previous_summary_tokens, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InvalidInput(f"must be an integer >= {low}", field=name)
    msgs = _validated(messages)
    _check_rendered(msgs, rendered)
    if not msgs:
        return []
    texts = list(rendered) if rendered is not None else render_messages(msgs, start=start)
    prev = "x" if previous_summary_tokens else None

    def request(lo: int, hi: int) -> list[dict[str, str]]:
        return build_summary_request(msgs[lo:hi], prev, ledger=ledger, start=start + lo,
                                     max_summary_tokens=max_summary_tokens,
                                     rendered=texts[lo:hi])

    def cost(lo: int, hi: int) -> int:
        return request_tokens(request(lo, hi), counter) + previous_summary_tokens

    whole = request(0, len(msgs))
    if fits_by_bytes(whole, max_input_tokens, previous_summary_tokens) or (
            request_tokens(whole, counter) + previous_summary_tokens <= max_input_tokens):
        return [msgs]
    fixed = _fixed_cost(cost(0, 0), max_input_tokens)
    spans = _spans(msgs)
    groups: list[list[tuple[int, int]]] = []
    used = fixed
    for lo, hi in spans:
        size = counter.text("\n".join(texts[lo:hi])) + 1
        if fixed + size > max_input_tokens:
            raise LimitExceeded(f"messages {lo}..{hi - 1} cannot be separated and need "
                                f"{fixed + size} tokens, more than {max_input_tokens}",
                                field=f"messages[{lo}]", index=lo)
        if groups and used + size <= max_input_tokens:
            groups[-1].append((lo, hi))
            used += size
        else:
            groups.append([(lo, hi)])
            used = fixed + size
    # Summed per-unit counts can undercount a whole (tokenizers merge across joins):
    # re-count each chunk as the request it will be, and shed trailing units if needed.
    chunks: list[list[Message]] = []
    for group in groups:
        while group:
            take = len(group)
            while take > 1 and cost(group[0][0], group[take - 1][1]) > max_input_tokens:
                take -= 1
            chunks.append(msgs[group[0][0]:group[take - 1][1]])
            group = group[take:]
    return chunks


def _fixed_cost(fixed: int, max_input_tokens: int) -> int:
    if fixed >= max_input_tokens:
        raise InvalidInput(f"{max_input_tokens} tokens leave no room beside the {fixed}-token "
                           "prompt", field="max_input_tokens")
    return fixed


def _spans(msgs: Sequence[Message]) -> list[tuple[int, int]]:
    """What a chunk never splits: each leading system message, each tool unit."""
    head = leading_system_count(msgs)
    return [(i, i + 1) for i in range(head)] + [(u.start, u.end) for u in tool_units(msgs)]


MIN_CLIP_CHARS = 200
"""The least of a text a harder clip keeps (head and tail), so the summarizer still sees
what it was."""


def clip_to_fit(messages: Sequence[Message], rendered: Sequence[str], max_input_tokens: int,
                counter: TokenCounter | None = None, *, previous_summary_tokens: int = 0,
                ledger: Ledger | None = None, max_summary_tokens: int = 2000,
                start: int = 0) -> tuple[list[str], int]:
    """``rendered`` with each unit too large for any request rendered again, clipped
    harder until it fits one, and how many units were clipped.

    A pasted log or a parallel read can exceed a request even after the default
    clips; failing the range for it sent the whole job to the offline summarizer.
    Each text of such a unit keeps its head and tail (:func:`render_messages`'s clip,
    at a lower limit). A unit that does not fit even at :data:`MIN_CLIP_CHARS` per text
    (hundreds of calls in one message) raises :class:`LimitExceeded` naming it.
    """
    counter = counter or DEFAULT_COUNTER
    msgs = _validated(messages)
    _check_rendered(msgs, rendered)
    texts = list(rendered)
    empty = build_summary_request([], "x" if previous_summary_tokens else None, ledger=ledger,
                                  max_summary_tokens=max_summary_tokens, rendered=[])
    fixed = _fixed_cost(request_tokens(empty, counter) + previous_summary_tokens,
                        max_input_tokens)
    room = max_input_tokens - fixed - 1
    clipped = 0
    for lo, hi in _spans(msgs):
        size = counter.text("\n".join(texts[lo:hi]))
        if size > room:
            texts[lo:hi] = _clipped_unit(msgs[lo:hi], start + lo, size, room, counter)
            clipped += 1
    return texts, clipped


def _clipped_unit(unit: Sequence[Message], start: int, size: int, room: int,
                  counter: TokenCounter) -> list[str]:
    """``unit`` rendered with clip limits lowered until it fits ``room`` tokens."""
    limit = min(DEFAULT_MESSAGE_CHARS, max(
        [len(m.text()) for m in unit] + [len(tc.arguments) for m in unit for tc in m.tool_calls]))
    while True:
        limit = max(MIN_CLIP_CHARS, int(limit * min(0.9, max(0.1, room / size))))
        texts = render_messages(unit, start=start, max_message_chars=limit,
                                max_tool_chars=min(limit, DEFAULT_TOOL_CHARS))
        size = counter.text("\n".join(texts))
        if size <= room:
            return texts
        if limit == MIN_CLIP_CHARS:
            raise LimitExceeded(f"messages {start}..{start + len(unit) - 1} need {size} "
                                f"tokens clipped to {limit} characters a text, more than "
                                f"the {room} a request leaves", field=f"messages[{start}]",
                                index=start)


__all__ = ["MIN_CLIP_CHARS", "chunk_for_window", "clip_to_fit", "fits_by_bytes"]
