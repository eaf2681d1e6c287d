"""Reject summarizer replies that must never be stored as summaries.

A stored summary replaces real history, so a bad one is worse than none:
an empty reply, a refusal, a provider error page that came back with HTTP
200, or a model that answered the user instead of summarizing would wipe the
agent's memory. The check is conservative: error, refusal and chat-reply
detection apply only to replies with fewer than two recognised section
headings, so a real summary that quotes an error or an apology still passes.
An update that keeps fewer than half of the previous summary's sections is
rejected too: it stopped early or ignored the format, and would replace a
full summary with a stub.
Cleaning removes wrappers models add around an otherwise good answer
(reasoning blocks, a code fence, ``<summary>`` tags, a "Here is the summary:"
preamble).
"""

from __future__ import annotations

import json
import re

from shared.core.errors import BadSummary, InvalidInput
from shared.core.tokens import DEFAULT_COUNTER, TokenCounter
from workers.summarizer.prompts import SUMMARY_SECTIONS, TURN_PREFIX_SECTIONS

_SECTION_NAMES = (*SUMMARY_SECTIONS, *TURN_PREFIX_SECTIONS, "Done", "In progress")
_HEADING = re.compile(
    r"^[ \t]*(?:#{1,6}[ \t]*)?(?:\*\*|__)?[ \t]*(?:\d+[.)][ \t]*)?("
    + "|".join(re.escape(name) for name in _SECTION_NAMES)
    + r")[ \t]*(?:\*\*|__)?[ \t]*(?::|$)",
    re.I | re.M,
)
_THINKING = re.compile(r"<(think|thinking|reasoning)>.*?</\1>\s*", re.S | re.I)
_OPEN_THINKING = re.compile(r"^\s*<(?:think|thinking|reasoning)>", re.I)
_FENCED = re.compile(r"^```[\w-]*[ \t]*\n(.*?)\n?```$", re.S)
_SUMMARY_TAGS = re.compile(r"^<summary>\s*(.*?)\s*</summary>$", re.S | re.I)
_PREAMBLE = re.compile(
    r"^(?:sure|certainly|of course|okay|ok)?[!,. ]*"
    r"(?:here(?:'s| is) (?:the |an |my |your )?(?:updated |revised |new )?summary"
    r"|(?:the |an )?(?:updated )?summary(?: follows)?)[^\n]{0,80}:[ \t]*\n", re.I)
_ERROR_START = re.compile(
    r"^\W{0,3}(?:error\b|\d{3}\s+[A-Z][\w ]{2,40}$|internal server error|bad gateway|"
    r"service (?:temporarily )?unavailable|gateway time-?out|upstream (?:connect )?error|"
    r"rate limit|too many requests|request (?:failed|timed out)|an error occurred|"
    r"exception\b|traceback \(most recent call last\)|\w+(?:Error|Exception):)",
    re.I | re.M,
)
_HTML = re.compile(r"^\s*(?:<!doctype html|<html\b|<head\b|<body\b)", re.I)
_REFUSAL = re.compile(
    r"^\W{0,3}(?:I'm sorry|I am sorry|sorry\b|I apologi[sz]e|I can(?:no|')t|I cannot|I won't|"
    r"I will not|I'm unable|I am unable|I'm not able|I am not able|as an AI\b|"
    r"as a (?:large )?language model|unfortunately,? I)", re.I)
_CHAT_OPENER = re.compile(
    r"^\W{0,3}(?:sure\b|certainly\b|of course\b|absolutely\b|great\b|okay\b|ok\b|yes\b|no,|"
    r"hello\b|hi\b|thanks\b|thank you\b|I'll\b|I will\b|let me\b|let's\b|here's how\b|"
    r"to (?:fix|do|solve)\b|you can\b|you should\b|(?:user|assistant|human|AI|system)\s*:)",
    re.I)


def clean_summary(text: str) -> str:
    """``text`` without wrappers around the summary itself (reasoning, fence, tags, preamble)."""
    out = _THINKING.sub("", text.replace("\r\n", "\n")).strip()
    if _OPEN_THINKING.match(out):  # reasoning that never closed: nothing after it is usable
        return ""
    for pattern in (_FENCED, _SUMMARY_TAGS):
        match = pattern.match(out)
        if match:
            out = match.group(1).strip()
    preamble = _PREAMBLE.match(out)
    if preamble and section_count(out[preamble.end():]) >= 2:
        out = out[preamble.end():].strip()
    return out


def section_count(text: str) -> int:
    """How many distinct known section headings ``text`` has."""
    return len({m.group(1).lower() for m in _HEADING.finditer(text)})


def _json_error(text: str) -> bool:
    if not text.startswith(("{", "[")):
        return False
    try:
        data = json.loads(text)
    except ValueError:
        return False
    return not isinstance(data, dict) or bool(
        {"error", "errors", "detail", "error_code"} & set(data) or {"code", "message"} <= set(data))


def _required_sections(text: str) -> set[str]:
    """The summary sections (:data:`SUMMARY_SECTIONS`) ``text`` has headings for."""
    names = {name.lower() for name in SUMMARY_SECTIONS}
    return {m.group(1).lower() for m in _HEADING.finditer(text)} & names


MAX_TOKENS_OVERSHOOT = 1.5
"""How far past its token cap a reply may go (our count is an estimate, the model's
own tokenizer set its length) before it is rejected."""


def check_summary(text: str, *, input_tokens: int, counter: TokenCounter | None = None,
                  previous: str | None = None, max_tokens: int | None = None) -> str:
    """The cleaned summary, or :class:`BadSummary` saying why it must not be stored.

    ``input_tokens`` is the size of what was summarized (previous summary plus
    new messages); a summary that is longer than that compressed nothing.
    ``previous``: the summary this one updates; a reply that keeps fewer than
    half of its sections stopped early or ignored the format, and storing it
    would lose the rest of the previous summary. ``max_tokens``: the summary's
    cap (what the compaction plan reserves for it); a reply well past it
    (:data:`MAX_TOKENS_OVERSHOOT`) is rejected.
    """
    if not isinstance(text, str):
        raise InvalidInput(f"expected a string, got {type(text).__name__}", field="text")
    if isinstance(input_tokens, bool) or not isinstance(input_tokens, int) or input_tokens < 1:
        raise InvalidInput("must be a positive integer", field="input_tokens")
    counter = counter or DEFAULT_COUNTER
    cleaned = clean_summary(text)
    if not cleaned:
        raise BadSummary("empty summary" if not text.strip() else
                         "no summary after removing reasoning and wrappers")
    sections = section_count(cleaned)
    head = cleaned[:400]
    if sections < 2:
        if _HTML.match(head):
            raise BadSummary("an HTML page (likely a provider or proxy error), not a summary")
        if _json_error(cleaned):
            raise BadSummary(f"a JSON error body, not a summary: {_excerpt(cleaned)}")
        if _ERROR_START.match(head):
            raise BadSummary(f"error text, not a summary: {_excerpt(cleaned)}")
        if _REFUSAL.match(head):
            raise BadSummary(f"a refusal, not a summary: {_excerpt(cleaned)}")
        if _CHAT_OPENER.match(head):
            raise BadSummary("continues the conversation instead of summarizing: "
                             f"{_excerpt(cleaned)}")
    if sections == 0:
        raise BadSummary("none of the required sections (Goal, Constraints, Progress, ...): "
                         f"{_excerpt(cleaned)}")
    if previous:
        before = _required_sections(previous)
        kept = _required_sections(cleaned) & before
        if len(before) >= 2 and 2 * len(kept) < len(before):
            raise BadSummary(f"the update keeps {len(kept)} of the {len(before)} sections of "
                             f"the previous summary: {_excerpt(cleaned)}")
    tokens = counter.text(cleaned)
    if max_tokens is not None and tokens > max_tokens * MAX_TOKENS_OVERSHOOT:
        raise BadSummary(f"summary of {tokens} tokens, well over its cap of {max_tokens} "
                         "tokens")
    if tokens > input_tokens:
        raise BadSummary(f"summary of {tokens} tokens is longer than its input of "
                         f"{input_tokens} tokens")
    return cleaned


def _excerpt(text: str, limit: int = 80) -> str:
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= limit else flat[:limit] + "...")


__all__ = ["MAX_TOKENS_OVERSHOOT", "check_summary", "clean_summary", "section_count"]
