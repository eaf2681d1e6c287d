"""Recognise provider errors: context overflow, broken tool pairs, and what else went wrong.

The guard's reactive path (compact harder, retry once) must fire on every real
overflow and on nothing else: a rate limit retried after a forced compaction
throws away context for no reason, a missed overflow kills the agent. So the
classifier reads everything an error carries (``str()``, ``message``,
``body``, ``details``, ``response`` text and status, the ``__cause__`` /
``__context__`` chain, JSON bodies wrapped as strings by proxies such as
LiteLLM and OpenRouter) and decides in a fixed order of precedence:

1. tool-pairing errors (the request is malformed, compaction is not the fix);
2. rate limits, quotas and capacity ("tokens per minute", RESOURCE_EXHAUSTED,
   "Too many tokens, please wait"): they veto every overflow phrase, because
   their texts talk about tokens and "request too large" too, except the provider's own
   overflow sentence stating both the window and the request (a retry loop's "Hit rate
   limit; retrying" logged after it);
3. specific overflow wording (context window / length named, or a provider's
   own overflow code), even under HTTP 500/503 (llama.cpp, LiteLLM fallbacks), unless
   offered as a guess beside another named cause ("this often happens when the context
   is too long ... is not a valid model ID");
4. a file over an upload endpoint's own cap ("File is too large.": no kind), then
   request-body size (HTTP 413, "payload too large");
5. a parameter conflict or a response of the wrong shape (no kind), output-limit, auth,
   content-filter, overloaded and server errors, then a limit that is not the model's (a chat
   platform's own message cap, an agent's iterations, a call stack: no kind);
6. generic overflow wording ("too many tokens", "token limit") only when the
   HTTP status does not say otherwise (429, 401/403, 5xx);
7. the HTTP status alone.

Decisions documented here because callers depend on them:

- *Output-reserve overflow* (prompt fits, prompt + max_tokens does not) is an
  overflow: ``is_context_overflow`` is true and ``OverflowInfo.kind`` says
  ``output_reserve_overflow`` so the guard can lower the reserve or compact.
- *Payload size* (HTTP 413, body bytes over a proxy's or provider's cap) is
  reported as ``ErrorKind.PAYLOAD_SIZE`` and counts as an overflow: the guard's
  recovery sizes its cut by the body's bytes, not tokens (older turns go, with their
  media and bulky tool outputs), which is the only automatic way to shrink the body;
  its byte limits never reach the token ``LimitBook`` (``OverflowInfo.limit`` stays
  None).

Other languages than English (``shared.core.overflow_languages``) are read in the same
order: for a text with letters beyond ASCII, each English family is followed by its
namesake's part in those letters' scripts; an ASCII text that no English wording
recognised is read once more in the Latin-script languages when it names one of their
words (Italian or Indonesian need no accents). English errors pay nothing for them.

Nothing here imports openai, anthropic or google-genai: errors are duck-typed.

The reading itself (:mod:`shared.core.overflow_read`, with the pattern tables) is imported
on the first error classified: compiling the families takes ~150 ms, which a process that
imports the guard would otherwise pay at start-up for errors most turns never see.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

__all__ = [
    "ErrorKind",
    "OverflowInfo",
    "OverflowKind",
    "classify_error",
    "is_context_overflow",
    "is_tool_pairing_error",
    "parse_overflow",
    "stated_count",
    "unrecognised",
]


class ErrorKind(StrEnum):
    """What a provider error means for the caller."""

    CONTEXT_OVERFLOW = "context_overflow"
    TOOL_PAIRING = "tool_pairing"
    RATE_LIMIT = "rate_limit"
    QUOTA = "quota"
    OUTPUT_LIMIT = "output_limit"
    AUTH = "auth"
    CONTENT_FILTER = "content_filter"
    OVERLOADED = "overloaded"
    PAYLOAD_SIZE = "payload_size"
    SERVER_ERROR = "server_error"
    OTHER = "other"

    @property
    def retryable(self) -> bool:
        """Worth retrying unchanged later (transport, throttling, capacity)."""
        return self in (ErrorKind.RATE_LIMIT, ErrorKind.OVERLOADED, ErrorKind.SERVER_ERROR)


OverflowKind = Literal["context_overflow", "output_reserve_overflow", "payload_size"]


@dataclass(frozen=True, slots=True)
class OverflowInfo:
    """What an overflow error stated. Numbers are None where the text did not say them.

    ``limit`` is the context window in tokens, ``requested`` the total the
    provider said the request needs (prompt, plus output when it counted it),
    ``prompt_tokens`` / ``output_tokens`` the parts it named, ``excess`` an
    overshoot stated as such ("exceeded ... by N tokens").
    """

    kind: OverflowKind
    limit: int | None = None
    requested: int | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    excess: int | None = None
    provider: str | None = None
    message: str = ""

    def overshoot(self) -> int | None:
        """Tokens over the window: stated excess, else requested - limit."""
        if self.excess is not None:
            return self.excess
        if self.requested is not None and self.limit is not None:
            return max(0, self.requested - self.limit)
        return None



def classify_error(error: object) -> ErrorKind:
    """What ``error`` (exception, string, dict, response-like object) means. Never raises."""
    from shared.core.overflow_read import read_error  # the patterns: on the first error only
    try:
        return read_error(error).kind
    except Exception:  # a classifier on the error path must not raise a second error
        return ErrorKind.OTHER


def is_context_overflow(error: object) -> bool:
    """True when compacting the request is the fix: context, output-reserve or payload overflow."""
    return classify_error(error) in (ErrorKind.CONTEXT_OVERFLOW, ErrorKind.PAYLOAD_SIZE)


def is_tool_pairing_error(error: object) -> bool:
    """True when the provider rejected orphaned or unmatched tool calls/results."""
    return classify_error(error) is ErrorKind.TOOL_PAIRING


_SUFFIX = {"k": 1_000, "m": 1_000_000}


def stated_count(raw: str) -> int:
    """A count as an error states it: ``"131,072"``, ``"128k"`` (128,000: the smaller
    reading of a rounded window, the safe one to learn), ``"1.5M"``."""
    scale = _SUFFIX.get(raw[-1].lower())
    if scale is None:
        return int(raw.replace(",", ""))
    return round(float(raw[:-1]) * scale)


def unrecognised(error: object) -> bool:
    """True when nothing in ``error`` says what went wrong (no wording any kind knows, not
    even one that names no kind: a parameter conflict, a response of the wrong shape, a
    server's startup warning, overflow wording offered as a guess; no telling HTTP status),
    and it is neither a lookup failure (an unknown model or route,
    404) nor a request that names what is malformed in it (a parameter, a value, a type,
    a parameter over its own size limit):
    what a provider's overflow looks like when no pattern knows its wording. The guard
    takes such an error for an overflow only when the refused request was nearly as large
    as the window (``CompactionPolicy.unrecognised_overflow_at``)."""
    from shared.core.overflow_read import names_no_cause, read_error
    try:
        verdict = read_error(error)
    except Exception:  # same contract as classify_error
        return False
    return names_no_cause(verdict)


def parse_overflow(error: object) -> OverflowInfo | None:
    """The numbers an overflow error stated, or None when ``error`` is not an overflow."""
    from shared.core.overflow_read import provider, read_error
    try:
        verdict = read_error(error)
    except Exception:  # same contract as classify_error
        return None
    if verdict.kind not in (ErrorKind.CONTEXT_OVERFLOW, ErrorKind.PAYLOAD_SIZE):
        return None
    found: dict[str, int] = {}
    if verdict.kind is ErrorKind.CONTEXT_OVERFLOW:
        for pattern, fields in verdict.families.numbers:
            match = pattern.search(verdict.text)
            for name, raw in zip(fields, match.groups() if match else (), strict=False):
                if raw is not None:
                    found.setdefault(name, stated_count(raw))
    limit, prompt, output = found.get("limit"), found.get("prompt"), found.get("output")
    # the whole input: the messages and whatever else a total counted besides the output
    # ("6683 in the messages, 730 in the functions, and 800 in the completion")
    total = found.get("total")
    body = max(prompt or 0, total - output) if total is not None and output is not None \
        else prompt
    reserve = limit is not None and output is not None and (
        body < limit <= body + output  # the prompt fits; with its output it does not
        if body is not None else bool(verdict.families.output_reserve.search(verdict.text)))
    kind: OverflowKind = "payload_size" if verdict.kind is ErrorKind.PAYLOAD_SIZE else (
        "output_reserve_overflow" if reserve else "context_overflow")
    # what was asked in all: the stated total, else the prompt and the output it reserved
    requested = found.get("total", prompt + output if prompt is not None and output is not None
                          else prompt)
    return OverflowInfo(
        kind=kind, limit=limit, requested=requested,
        # input named besides the messages: the prompt is everything the total counted but the
        # output ("119886 of text input, 4729 of tool input, 10000 in the output" of 134615)
        prompt_tokens=body if "other_input" in found else prompt,
        output_tokens=output, excess=found.get("excess"),
        provider=provider(verdict.text, verdict.module), message=verdict.text[:500],
    )
