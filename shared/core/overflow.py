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
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from itertools import combinations, islice
from typing import Literal, Protocol

from shared.core import overflow_kinds as kinds
from shared.core import overflow_language_kinds as language_kinds
from shared.core import overflow_languages as languages
from shared.core import overflow_numbers as numbers
from shared.core import overflow_patterns as patterns

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


_Numbers = tuple[tuple[re.Pattern[str], tuple[str, ...]], ...]


class _Searcher(Protocol):
    def search(self, string: str, /) -> re.Match[str] | None: ...


@dataclass(frozen=True, slots=True)
class _AnyOf:
    """Patterns searched in turn (English, then each script's part of a family): the first
    match wins."""

    patterns: tuple[_Searcher, ...]

    def search(self, string: str, /) -> re.Match[str] | None:
        for pattern in self.patterns:
            found = pattern.search(string)
            if found:
                return found
        return None


@dataclass(frozen=True, slots=True)
class _Families:
    """The phrase families one decision consults, in the order of the module docstring."""

    tool_pairing: _Searcher
    capacity: _Searcher
    quota: _Searcher
    per_short_window: _Searcher
    rate: _Searcher
    output_over_window: _Searcher
    not_a_request: _Searcher
    strong: _Searcher
    secondary: tuple[tuple[ErrorKind, _Searcher], ...]  # after the overflow wording
    weak: _Searcher
    numbers: _Numbers
    output_reserve: _Searcher
    token_word: re.Pattern[str] | None  # None: English alone, where "token" is the word


_NEVER = re.compile(r"(?!)")
_SECONDARY = ((ErrorKind.OTHER, "FILE_UPLOAD"), (ErrorKind.PAYLOAD_SIZE, "PAYLOAD"),
              (ErrorKind.OTHER, "PARAMETER_CONFLICT"),
              (ErrorKind.OTHER, "UNEXPECTED_RESPONSE"), (ErrorKind.OUTPUT_LIMIT, "OUTPUT_LIMIT"),
              (ErrorKind.AUTH, "AUTH"),
              (ErrorKind.CONTENT_FILTER, "CONTENT_FILTER"), (ErrorKind.OVERLOADED, "OVERLOADED"),
              (ErrorKind.SERVER_ERROR, "SERVER"), (ErrorKind.OTHER, "NOT_THE_MODEL"))


def _families(scripts: frozenset[str], english: bool = True) -> _Families:
    """The English families (a bare compiled pattern each: English texts pay for nothing
    else), each followed by the parts of its namesake in the other languages written in
    ``scripts``."""
    def get(name: str) -> _Searcher:
        own = [getattr(patterns, name, None) or getattr(kinds, name)] if english else []
        family: languages.Family = getattr(languages, name, None) \
            or getattr(language_kinds, name, {})
        found = (*own, *(family[script] for script in sorted(scripts) if script in family))
        return found[0] if len(found) == 1 else _AnyOf(found) if found else _NEVER

    return _Families(
        get("TOOL_PAIRING"), get("CAPACITY"), get("QUOTA"), get("PER_SHORT_WINDOW"), get("RATE"),
        get("OUTPUT_OVER_WINDOW"), get("NOT_A_REQUEST"), get("OVERFLOW_STRONG"),
        tuple((kind, get(name)) for kind, name in _SECONDARY), get("OVERFLOW_WEAK"),
        numbers.NUMBERS + languages.NUMBERS if scripts else numbers.NUMBERS,
        get("OUTPUT_RESERVE"), languages.TOKEN_WORD if scripts else None)


_ENGLISH = _families(frozenset())
# Any other text: English with the families of the scripts it is written in (built once).
_BY_SCRIPTS = {frozenset(c): _families(frozenset(c)) for n in range(1, 3)
               for c in combinations(sorted(languages.SCRIPTS), n)}


def _by_scripts(found: frozenset[str]) -> _Families:
    """The families for a text's scripts: one or two built at import, rarer mixes on first
    use."""
    fam = _BY_SCRIPTS.get(found)
    if fam is None:
        fam = _BY_SCRIPTS[found] = _families(found)
    return fam


# An ASCII text that no English wording recognised: Latin-script languages without accents.
_ACCENTLESS = _families(frozenset({"latin"}), english=False)


# --------------------------------------------------------------------------- evidence
# Bounds on what is read from one error: cause-chain links, nesting, nodes, characters.
_MAX_CHAIN, _MAX_DEPTH, _MAX_NODES, _MAX_TEXT = 8, 6, 400, 100_000
@dataclass
class _Evidence:
    texts: list[str]
    status: int | None = None
    module: str = ""
    size: int = 0
    nodes: int = 0

    def add_text(self, text: str) -> None:
        if text and self.size < _MAX_TEXT:
            text = text[: _MAX_TEXT - self.size]
            self.texts.append(text)
            self.size += len(text)

    def add_status(self, value: object) -> None:
        if self.status is None:
            code = _as_status(value)
            if code is not None:
                self.status = code


def _as_status(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.isdigit() and len(value) == 3:
        value = int(value)
    return value if isinstance(value, int) and 100 <= value <= 599 else None


def _attr(obj: object, name: str) -> object:
    try:
        value = getattr(obj, name, None)
    except Exception:  # duck typing: a property may raise anything
        return None
    return None if callable(value) else value


def _safe_str(obj: object) -> str:
    try:
        return str(obj)[:20_000]
    except Exception:  # a broken __str__ must not break classification
        return ""


def _walk(obj: object, ev: _Evidence, depth: int) -> None:
    """Collect texts and an HTTP status from any error-ish value, bounded in depth and size."""
    ev.nodes += 1
    if depth > _MAX_DEPTH or ev.nodes > _MAX_NODES or ev.size >= _MAX_TEXT:
        return
    if isinstance(obj, bytes | bytearray):
        obj = bytes(obj[:20_000]).decode("utf-8", "replace")
    if isinstance(obj, str):
        ev.add_text(obj)
        start = obj.find("{")
        if start >= 0 and len(obj) < 200_000:  # a proxy's JSON wrapped in a string
            try:
                inner, _ = json.JSONDecoder().raw_decode(obj, start)
            except ValueError:
                return
            _walk(inner, ev, depth + 1)
    elif isinstance(obj, Mapping):
        for key, value in islice(obj.items(), 50):
            if str(key).lower() in patterns.STATUS_KEYS:
                ev.add_status(value)
            if key in ("n_ctx", "n_prompt_tokens") and isinstance(value, int):
                ev.add_text(f"{key}={value}")  # llama.cpp states its numbers beside the text
            _walk(value, ev, depth + 1)
    elif isinstance(obj, list | tuple):
        for item in islice(obj, 50):
            _walk(item, ev, depth + 1)
    elif obj is not None and not isinstance(obj, int | float):
        _walk_object(obj, ev, depth)


def _walk_object(obj: object, ev: _Evidence, depth: int) -> None:
    if isinstance(obj, BaseException):
        ev.add_text(_safe_str(obj))
        ev.module = ev.module or type(obj).__module__
    for name in ("status_code", "http_status", "status", "code"):
        ev.add_status(_attr(obj, name))
    for name in ("message", "body", "details", "detail", "error", "errors", "status", "code",
                 "type", "reason", "text", "response"):
        value = _attr(obj, name)
        if value is not None and value is not obj and not isinstance(value, int | float | bool):
            _walk(value, ev, depth + 1)
    if not isinstance(obj, BaseException) and depth == 0:
        ev.add_text(_safe_str(obj))


def _chain(error: object) -> Iterator[object]:
    """The error, then its causes and contexts (and group members), breadth first, bounded."""
    queue: list[object] = [error]
    seen: set[int] = set()
    while queue and len(seen) < _MAX_CHAIN:
        link = queue.pop(0)
        if id(link) in seen:
            continue
        seen.add(id(link))
        yield link
        if isinstance(link, BaseException):
            queue.extend(e for e in (link.__cause__, link.__context__) if e is not None)
            members = _attr(link, "exceptions")
            if isinstance(members, tuple | list):
                queue.extend(m for m in members if isinstance(m, BaseException))


def _normalise(texts: list[str]) -> str:
    text = patterns.ESCAPES.sub(
        lambda m: m.group(1) or patterns.UNICODE_ESCAPES.get(m.group(0)[-2:].lower(), " "),
        "\n".join(texts))
    return re.sub(r"\s+", " ", text).strip()


# --------------------------------------------------------------------------- decisions
@dataclass(frozen=True, slots=True)
class _Verdict:
    kind: ErrorKind
    strength: int  # 3: specific wording, 2: generic wording, 1: HTTP status only, 0: nothing
    text: str
    module: str
    status: int | None = None
    families: _Families = _ENGLISH  # the set that decided: its numbers are read


# A quota offered as a guess beside an auth failure, the word just before it (batch 17).
_GUESS = re.compile(r"\b(?:perhaps|maybe|possibly|probably)\W{1,3}$", re.IGNORECASE)


def _decide(text: str, status: int | None, fam: _Families) -> tuple[ErrorKind, int]:
    if fam.tool_pairing.search(text):
        return ErrorKind.TOOL_PAIRING, 3
    if fam.capacity.search(text):
        return ErrorKind.OVERLOADED, 3
    quota = fam.quota.search(text)
    # "Perhaps billing is not enabled (or API key is invalid)?" beside a 403's own words
    if quota and _GUESS.search(text, max(0, quota.start() - 12), quota.start()) \
            and kinds.AUTH.search(text):
        return ErrorKind.AUTH, 3
    if quota or fam.rate.search(text):
        if patterns.WINDOW_STATED.search(text):  # a retry loop's log around the overflow
            return ErrorKind.CONTEXT_OVERFLOW, 3
        if quota is None or fam.per_short_window.search(text):
            return ErrorKind.RATE_LIMIT, 3
        return ErrorKind.QUOTA, 3
    if fam.output_over_window.search(text):
        return ErrorKind.OUTPUT_LIMIT, 3
    if fam.not_a_request.search(text):
        return ErrorKind.OTHER, 3
    strong = fam.strong.search(text)
    if strong and _guessed(text, strong):
        return ErrorKind.OTHER, 2
    if strong and _parameters_own(text, strong):
        return ErrorKind.OTHER, 3
    if strong and not (
        "string" in strong.group(0).lower() and patterns.NON_MESSAGE_PARAM.search(text)
    ):
        return ErrorKind.CONTEXT_OVERFLOW, 3
    for kind, pattern in fam.secondary:
        if pattern.search(text):  # generic transport / overload wording ranks below the rest
            return kind, 2 if kind in (ErrorKind.OVERLOADED, ErrorKind.SERVER_ERROR) else 3
    by_status = _kind_of_status(status)
    weak = fam.weak.search(text)
    if weak and _parameters_own(text, weak):
        return ErrorKind.OTHER, 3
    if weak and by_status is None:
        return ErrorKind.CONTEXT_OVERFLOW, 2
    if weak and by_status is ErrorKind.PAYLOAD_SIZE:  # 413: tokens named -> window, else bytes
        named = weak.group(0)
        token = "token" in named.lower() or (
            fam.token_word is not None and fam.token_word.search(named) is not None)
        return (ErrorKind.CONTEXT_OVERFLOW if token else ErrorKind.PAYLOAD_SIZE), 2
    return (by_status, 1) if by_status is not None else (ErrorKind.OTHER, 0)


def _guessed(text: str, found: re.Match[str]) -> bool:
    """Overflow wording offered as a guess ("this often happens when the context is too long")
    by a text that names another cause: a model that does not exist."""
    return patterns.HEDGE.search(text, max(0, found.start() - 60), found.start()) is not None \
        and patterns.NOT_FOUND.search(text) is not None


def _parameters_own(text: str, found: re.Match[str]) -> bool:
    """Overflow wording whose subject is a request parameter with a size limit of its own (a
    stop sequence, a tool's description, ``logit_bias``): that parameter is too long, not the
    prompt, and compacting the conversation cannot shorten it."""
    for own in patterns.PARAMETER_OWN_LIMIT.finditer(text, max(0, found.start() - 80),
                                                     found.end() + 40):
        if own.start() < found.end() and found.start() < own.end():
            return True
    return False


def _decide_any_language(text: str, status: int | None) -> tuple[ErrorKind, int, _Families, str]:
    """Decide with the English families, each followed by the other languages' part in the
    scripts of the text's letters (none for ASCII; traditional Chinese read in its simplified
    forms); an ASCII text that no English wording recognised is read once more in the
    Latin-script languages when it names one of their words (Italian, Indonesian, Dutch
    written without accents). Also returns the text as read, for the numbers."""
    found = frozenset() if text.isascii() else languages.scripts(text)
    if "cjk" in found:
        text = languages.simplified(text)
    fam = _by_scripts(found) if found else _ENGLISH
    kind, strength = _decide(text, status, fam)
    if strength < 2 and not found and languages.maybe_accentless(text):
        other, other_strength = _decide(text, status, _ACCENTLESS)
        if other_strength > strength:
            return other, other_strength, _ACCENTLESS, text
    return kind, strength, fam, text


def _kind_of_status(status: int | None) -> ErrorKind | None:
    if status is None or status in (400, 404, 409, 422):
        return None
    table = {401: ErrorKind.AUTH, 403: ErrorKind.AUTH, 402: ErrorKind.QUOTA,
             408: ErrorKind.SERVER_ERROR, 413: ErrorKind.PAYLOAD_SIZE, 429: ErrorKind.RATE_LIMIT,
             529: ErrorKind.OVERLOADED}
    return table.get(status, ErrorKind.SERVER_ERROR if status >= 500 else None)


def _verdict(error: object) -> _Verdict:
    """Classify each link of the chain; the most specific wins, ties go to the outermost.

    A wrapper saying "service unavailable" around a cause that names the
    context window is an overflow, not a server error.
    """
    best = _Verdict(ErrorKind.OTHER, -1, "", "", None)
    for link in _chain(error):
        ev = _Evidence(texts=[])
        _walk(link, ev, 0)
        text = _normalise(ev.texts)
        if ev.status is None:
            found = patterns.STATUS_IN_TEXT.search(text)
            ev.status = _as_status(next((g for g in found.groups() if g), None)) if found else None
        kind, strength, families, read = _decide_any_language(text, ev.status)
        if strength > best.strength:
            best = _Verdict(kind, strength, read, ev.module, ev.status, families)
    return best


def classify_error(error: object) -> ErrorKind:
    """What ``error`` (exception, string, dict, response-like object) means. Never raises."""
    try:
        return _verdict(error).kind
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
    try:
        verdict = _verdict(error)
    except Exception:  # same contract as classify_error
        return False
    return verdict.kind is ErrorKind.OTHER and verdict.strength <= 0 \
        and verdict.status not in (404, 405, 409) \
        and not patterns.NOT_FOUND.search(verdict.text) \
        and not patterns.NON_MESSAGE_PARAM.search(verdict.text) \
        and not patterns.PARAMETER_OWN_LIMIT.search(verdict.text) \
        and not patterns.MALFORMED.search(verdict.text) \
        and not language_kinds.NOT_FOUND.search(verdict.text) \
        and not language_kinds.MALFORMED.search(verdict.text)


def parse_overflow(error: object) -> OverflowInfo | None:
    """The numbers an overflow error stated, or None when ``error`` is not an overflow."""
    try:
        verdict = _verdict(error)
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
        provider=_provider(verdict.text, verdict.module), message=verdict.text[:500],
    )


def _provider(text: str, module: str) -> str | None:
    for name, pattern in patterns.PROVIDER_MARKERS:
        if pattern.search(text):
            return name
    root = module.split(".", 1)[0]
    return next((p for m, p in patterns.MODULE_PROVIDERS if root == m), None)
