"""How :mod:`shared.core.overflow` reads an error: the phrase families in their order of
precedence, the evidence gathered from an error object, the decision.

Kept apart so that importing the classifier's API costs nothing until an error is
classified: the families (thousands of patterns, most of them in other languages) take
~150 ms to compile, which every agent process would otherwise pay at start-up for
errors most turns never see.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import combinations, islice
from typing import Protocol

from shared.core import overflow_kinds as kinds
from shared.core import overflow_language_kinds as language_kinds
from shared.core import overflow_languages as languages
from shared.core import overflow_numbers as numbers
from shared.core import overflow_patterns as patterns
from shared.core.overflow import ErrorKind

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
class Verdict:
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


def read_error(error: object) -> Verdict:
    """Classify each link of the chain; the most specific wins, ties go to the outermost.

    A wrapper saying "service unavailable" around a cause that names the
    context window is an overflow, not a server error.
    """
    best = Verdict(ErrorKind.OTHER, -1, "", "", None)
    for link in _chain(error):
        ev = _Evidence(texts=[])
        _walk(link, ev, 0)
        text = _normalise(ev.texts)
        if ev.status is None:
            found = patterns.STATUS_IN_TEXT.search(text)
            ev.status = _as_status(next((g for g in found.groups() if g), None)) if found else None
        kind, strength, families, read = _decide_any_language(text, ev.status)
        if strength > best.strength:
            best = Verdict(kind, strength, read, ev.module, ev.status, families)
    return best


def names_no_cause(verdict: Verdict) -> bool:
    """Whether ``verdict`` found no wording, no telling status, no lookup failure and no
    malformed part named (:func:`shared.core.overflow.unrecognised`)."""
    return verdict.kind is ErrorKind.OTHER and verdict.strength <= 0 \
        and verdict.status not in (404, 405, 409) \
        and not patterns.NOT_FOUND.search(verdict.text) \
        and not patterns.NON_MESSAGE_PARAM.search(verdict.text) \
        and not patterns.PARAMETER_OWN_LIMIT.search(verdict.text) \
        and not patterns.MALFORMED.search(verdict.text) \
        and not language_kinds.NOT_FOUND.search(verdict.text) \
        and not language_kinds.MALFORMED.search(verdict.text)


def provider(text: str, module: str) -> str | None:
    """The provider an error's text or module names, if any."""
    for name, pattern in patterns.PROVIDER_MARKERS:
        if pattern.search(text):
            return name
    root = module.split(".", 1)[0]
    return next((p for m, p in patterns.MODULE_PROVIDERS if root == m), None)
