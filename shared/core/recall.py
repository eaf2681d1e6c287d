"""Recall: the other half of "view, not delete" (pure: no I/O).

Compaction hides old messages from the view; recall brings the relevant
ones back on demand. This module holds everything about it that needs no
Redis: tokenization that keeps identifiers matchable, passage splitting,
BM25 ranking and input validation. The ``recall`` tool definition for
OpenAI, Anthropic and Gemini, the :class:`RecallHit` result, its rendering
and the notice a summary carries are in :mod:`shared.core.recall_tool`;
their names are importable from here too.

Tokenization keeps what agents search for whole *and* split: a word of
identifier characters (``src/app/main.py``, ``ERR_CONN_RESET``, ``0x1f``,
``3.14``, ``getUserName``) yields the lowercased whole, then its parts
(split at ``/ . _ - :`` and at camel-case humps), and for a path its file
name (``main.py``). A query tokenized the same way therefore scores an
exact identifier above a message that only shares its parts.

A term of one ASCII character (the ``7`` and ``9`` of ``cust_7Hq2LmP9``, the
``2`` of ``v1.2.3``, a lone ``9`` or ``x``) is *weak*: one of 36 values, in
nearly every session, so it carries no identity of its own. It is still indexed
and scored (a query of just ``9`` finds ``ABC-9`` and ``step 9`` as before, and
it ranks a passage that also holds the query's other words), but it never makes
a hit on its own when the query has a longer term (:attr:`RecallQuery.required`):
``ticket 9`` or ``ABC-9`` absent from the session return nothing, not ``ok 9``.
Terms of two characters or more (``42``, ``8080``, ``hq2``, ``cust``) match on
their own: ports, line and issue numbers are what agents search for.

Tool-call arguments are JSON text: their escapes (``\\n``, ``\\"``, ``\\\\``,
``\\uXXXX``) are decoded before tokenizing (:func:`search_text`), so a command
after an escaped newline is found as itself and no term holds a ``\\n``. The
text a hit shows stays the raw ``name arguments`` (:func:`index_text`): offsets
into it are what the index stores.

Scripts written without spaces (Chinese, Japanese, and Hangul when run
together) have no word boundaries to find without a dictionary: a run of
them yields its whole (as before) and then its character bigrams (a lone
character: itself), the standard dictionary-free approach of CJK full-text
search. So ``接続`` finds ``接続がリセットされました``. An index written
before bigrams holds the whole runs only: a query still matches those
whole, and finds words inside them once the range is indexed again.

An index records the :data:`ANALYZER_VERSION` that wrote it; the worker's next
indexing call rebuilds one written by an older analyzer (bigrams, decoded
arguments), so no index keeps terms a query can no longer produce.
"""

from __future__ import annotations

import functools
import heapq
import math
import re
import zlib
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.core.errors import InvalidInput
from shared.core.messages import Message
from shared.core.recall_tool import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    NOTICE,
    TOOL_NAME,
    RecallHit,
    notice,
    recall_tool,
    render_hits,
)

# -- limits ---------------------------------------------------------------------------
ANALYZER_VERSION = 2
"""Raise when tokenization changes which terms a message yields: indexes written by an
older analyzer (version 1: before the field existed) are rebuilt, not appended to."""
MAX_QUERY_CHARS = 1000
MAX_QUERY_TERMS = 16
"""Terms a query keeps (each costs a key read and up to 64 postings); over it, the most
specific ones (:func:`specific_terms`)."""
MAX_TOKEN_CHARS = 64
"""Longer words (base64, minified code) are indexed by their parts only."""
PASSAGE_CHARS = 1200
"""Upper bound of a passage's length; long messages are split on line boundaries."""
MAX_PASSAGES_PER_MESSAGE = 64
"""A message's text past ``PASSAGE_CHARS * MAX_PASSAGES_PER_MESSAGE`` is not indexed."""
MAX_FIELD = 0xFFFF  # term frequency and passage length are stored in 16 bits
K1 = 1.2
B = 0.75

# -- tokenization ---------------------------------------------------------------------
_WORD = re.compile(r"\w[\w./\\:@#+~\-]*")
_TRAILING = ".:/\\#@+~-"
_SEPARATORS = re.compile(r"[./\\:@#+~\-_]+")
_HUMPS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+|[^\W_]+")
_CJK = re.compile(
    "[\u1100-\u11ff\u3005-\u3007\u3040-\u30ff\u3130-\u318f\u31f0-\u31ff\u3400-\u4dbf"
    "\u4e00-\u9fff\ua960-\ua97f\uac00-\ud7ff\uf900-\ufaff\uff66-\uff9f"
    "\U00020000-\U0003134f]+")
"""Han, kana and Hangul: scripts that may run words together without spaces."""
_MARKED = frozenset("0123456789_./\\:@#+~-")
_STOPWORDS = frozenset((
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "from", "has", "have", "i",
    "if", "in", "is", "it", "its", "me", "my", "of", "on", "or", "our", "so", "that", "the",
    "their", "them", "then", "there", "these", "they", "this", "to", "was", "we", "were",
    "what", "when", "which", "will", "with", "you", "your",
))


def weak_term(term: str) -> bool:
    """A term of one ASCII letter or digit: scored, but never a hit on its own when
    the query holds a longer term (see the module's docstring)."""
    return len(term) == 1 and term.isascii()


def _keep_part(part: str) -> bool:
    return (len(part) >= 2 or part.isdigit()) and part not in _STOPWORDS


def _subwords(word: str) -> list[str]:
    """Coarser pieces first: path segments, their dot-separated pieces (a file's stem),
    then parts at ``_ - + ~ @ #`` and camel-case humps; each distinct piece once."""
    out: list[str] = []
    segments = [x for x in (y.strip(_TRAILING) for y in re.split(r"[/\\:]+", word)) if x]
    for segment in segments:
        pieces = [x for x in (y.strip(_TRAILING) for y in segment.split(".")) if x]
        if len(segments) > 1:
            out.append(segment)
        for piece in pieces:
            if len(pieces) > 1:
                out.append(piece)
            parts: list[str] = []
            for chunk in _SEPARATORS.split(piece):
                if chunk:
                    parts.extend(_HUMPS.findall(chunk))
            if len(parts) > 1 or (parts and parts[0] != piece):
                out.extend(parts)
    return out


def _cjk_terms(word: str, whole: str) -> tuple[str, ...]:
    """A word holding CJK characters: its whole, then each CJK run's bigrams (a lone
    character: itself) and the terms of its other pieces, each distinct term once."""
    out: list[str] = [whole] if len(whole) <= MAX_TOKEN_CHARS else []
    at = 0
    for run in _CJK.finditer(word):
        pieces: list[str] = []
        other = word[at:run.start()].strip(_TRAILING + "_")
        if other:
            pieces.extend(_word_terms(other))
        text = run.group().lower()
        pieces.extend([text] if len(text) == 1 else
                      [text[i:i + 2] for i in range(len(text) - 1)])
        out.extend(p for p in pieces if p not in out)
        at = run.end()
    rest = word[at:].strip(_TRAILING + "_")
    if rest:
        out.extend(p for p in _word_terms(rest) if p not in out)
    return tuple(out)


@functools.lru_cache(maxsize=1 << 16)
def _word_terms(word: str) -> tuple[str, ...]:
    """The terms of one word (words repeat a lot: each is analyzed once)."""
    whole = word.lower()
    if not word.isascii() and _CJK.search(word):
        return _cjk_terms(word, whole)
    out: list[str] = []
    if len(whole) <= MAX_TOKEN_CHARS and whole not in _STOPWORDS:
        out.append(whole)
    if word.isalnum() and (word.islower() or word.isupper() or word.istitle()
                           or word.isdigit()):
        return tuple(out)  # a plain word: no pieces
    seen = {whole}
    for piece in _subwords(word):
        low = piece.lower()
        if low not in seen and _keep_part(low) and len(low) <= MAX_TOKEN_CHARS:
            seen.add(low)
            out.append(low)
    return tuple(out)


def tokenize(text: str) -> list[str]:
    """Search terms of ``text``, in order, with repeats (term frequency counts them).

    Each word yields its lowercased whole (unless longer than
    :data:`MAX_TOKEN_CHARS`, or a stopword), then its distinct pieces: path
    segments (``main.py``), dotted pieces (``main``, ``py``), parts at
    ``_`` or ``-`` and camel-case humps. A run of CJK characters yields its
    character bigrams after its whole.
    """
    out: list[str] = []
    for word in _WORD.findall(text):
        word = word.rstrip(_TRAILING)
        if word:
            out.extend(_word_terms(word))
    return out


# -- passages -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Passage:
    """A bounded slice ``text[start:end]`` of message ``index``'s :func:`index_text`."""

    index: int
    role: str
    start: int
    end: int
    text: str
    calls_at: int | None = None
    """Where in ``text`` the message's tool calls (``name arguments``) begin, if the
    passage holds any: :func:`search_text` decodes their JSON escapes."""


def index_text(message: Message) -> str:
    """The text recall indexes for a message: its content, then each tool call as
    ``name arguments`` (so commands and paths in arguments are found too). Hits show
    it as is; its tool calls are tokenized decoded (:func:`search_text`)."""
    text = message.text()
    calls = [f"{tc.name} {tc.arguments}" for tc in message.tool_calls]
    return "\n".join([text, *calls]) if calls else text


def _calls_start(message: Message) -> int | None:
    """The offset in :func:`index_text` where the tool calls begin (None: no call)."""
    return len(message.text()) + 1 if message.tool_calls else None


_JSON_ESCAPE = re.compile(
    r"\\(?:u([dD][89abAB][0-9a-fA-F]{2})\\u([dD][c-fC-F][0-9a-fA-F]{2})"
    r"|u([0-9a-fA-F]{4})|([\"\\/bfnrt]))")
_SIMPLE_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _unescape(match: re.Match[str]) -> str:
    high, low, code, simple = match.groups()
    if simple is not None:
        return _SIMPLE_ESCAPES.get(simple, simple)
    if high is not None:
        return chr(0x10000 + ((int(high, 16) - 0xD800) << 10) + int(low, 16) - 0xDC00)
    char = chr(int(code, 16))
    return " " if 0xD800 <= ord(char) <= 0xDFFF else char  # a lone surrogate: a gap


def decode_json_escapes(text: str) -> str:
    """``text`` (JSON text, or a slice of it) with its string escapes decoded; what is
    not an escape is kept, so a slice cut inside one loses nothing else."""
    return _JSON_ESCAPE.sub(_unescape, text) if "\\" in text else text


def search_text(passage: Passage) -> str:
    """The text a passage is tokenized from: its text, the tool calls' JSON escapes
    decoded (``\\n`` is a line break, not part of the word before it)."""
    at = passage.calls_at
    if at is None:
        return passage.text
    return passage.text[:at] + decode_json_escapes(passage.text[at:])


def _cuts(text: str, limit: int) -> list[tuple[int, int]]:
    """Offsets of slices of at most ``limit`` characters, cut after a newline when
    one is in the second half of the slice, else after a space, else anywhere."""
    out: list[tuple[int, int]] = []
    start, n = 0, len(text)
    while start < n and len(out) < MAX_PASSAGES_PER_MESSAGE:
        end = min(n, start + limit)
        if end < n:
            half = start + limit // 2
            cut = text.rfind("\n", half, end)
            if cut < 0:
                cut = text.rfind(" ", half, end)
            if cut >= 0:
                end = cut + 1
        if text[start:end].strip():
            out.append((start, end))
        start = end
    return out


def split_passages(index: int, message: Message, *,
                   max_chars: int = PASSAGE_CHARS) -> list[Passage]:
    """The passages of message ``index`` (empty for a message without text)."""
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 16:
        raise InvalidInput("must be an integer >= 16", field="max_chars")
    text = index_text(message)
    calls = _calls_start(message)
    return [Passage(index, message.role, a, b, text[a:b],
                    None if calls is None or calls >= b else max(0, calls - a))
            for a, b in _cuts(text, max_chars)]


def passage_text(message: Message, start: int, end: int) -> str:
    """The text of a stored passage, recomputed from its message (the index keeps
    offsets, not copies: the log is the source)."""
    return index_text(message)[start:end]


def checksum(raw: bytes | str) -> int:
    """CRC-32 of a stored message: a hit is returned only if its message is unchanged."""
    data = raw.encode("utf-8") if isinstance(raw, str) else raw
    return zlib.crc32(data) & 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class IndexedPassage:
    """A passage ready to store: its term frequencies and its length in terms."""

    passage: Passage
    terms: Mapping[str, int]
    length: int


def analyze(passage: Passage) -> IndexedPassage:
    terms = tokenize(search_text(passage))
    counts = Counter(terms)
    return IndexedPassage(passage, {t: min(c, MAX_FIELD) for t, c in counts.items()},
                          min(len(terms), MAX_FIELD))


# -- ranking --------------------------------------------------------------------------
Posting = tuple[int, int, int, int]
"""One passage containing a term: (passage id, message index, term frequency, passage
length in terms). Plain tuples: a query decodes thousands of them."""


def idf(n_docs: int, df: int) -> float:
    """BM25's smoothed inverse document frequency (never negative)."""
    return math.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))


def bm25(postings: Mapping[str, Iterable[Posting]], df: Mapping[str, int], *, n_docs: int,
         avg_length: float, start: int = 0, end: int | None = None,
         k1: float = K1, b: float = B,
         required: Collection[str] = ()) -> dict[int, tuple[float, int]]:
    """``{pid: (score, message index)}`` of the passages in ``[start, end)``.

    ``postings`` may hold only part of a very common term's postings (the
    store reads the newest ones): its ``df`` still comes from ``df``. With
    ``required`` (:attr:`RecallQuery.required`), only passages holding one of
    those terms are returned; the others still add to their score.
    """
    sums: dict[int, float] = {}
    where: dict[int, int] = {}
    avg = avg_length if avg_length > 0 else 1.0
    hi = end if end is not None else math.inf
    norm0 = k1 * (1 - b)
    norm1 = k1 * b / avg
    get = sums.get
    for term, plist in postings.items():
        weight = idf(max(n_docs, 1), max(df.get(term, 1), 1)) * (k1 + 1)
        for pid, index, tf, length in plist:
            if start <= index < hi:
                sums[pid] = get(pid, 0.0) + weight * tf / (tf + norm0 + norm1 * length)
                where[pid] = index
    if required:
        held = {pid for term in required for pid, index, _, _ in postings.get(term, ())
                if start <= index < hi}
        return {pid: (score, where[pid]) for pid, score in sums.items() if pid in held}
    return {pid: (score, where[pid]) for pid, score in sums.items()}


def best_per_message(scores: Mapping[int, tuple[float, int]],
                     n: int | None = None) -> list[tuple[int, float, int]]:
    """``(pid, score, index)`` of each message's best passage, best first (ties: newer
    message first, the one an agent most likely means); the best ``n`` only if given."""
    items = [(score, index, pid) for pid, (score, index) in scores.items()]
    if n is not None and len(items) > 4 * n:
        top = heapq.nlargest(4 * n, items)  # tuples compare in C: no key function
        if len({index for _, index, _ in top}) < n:
            top = sorted(items, reverse=True)
    else:
        top = sorted(items, reverse=True)
    seen: set[int] = set()
    out: list[tuple[int, float, int]] = []
    for score, index, pid in top:
        if index not in seen:
            seen.add(index)
            out.append((pid, score, index))
            if n is not None and len(out) == n:
                break
    return out


# -- validation -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RecallQuery:
    """A validated query: its terms (unique, at most :data:`MAX_QUERY_TERMS`)."""

    text: str
    terms: tuple[str, ...]
    limit: int
    start: int | None
    end: int | None
    required: tuple[str, ...] = ()
    """A hit holds one of these: the terms that are not weak (:func:`weak_term`) when
    the query has weak ones too; empty (any term makes a hit) otherwise."""


def _opt_index(value: object, field: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput("must be a non-negative integer or null", field=field)
    return value


def specific_terms(terms: Sequence[str], n: int = MAX_QUERY_TERMS) -> tuple[str, ...]:
    """The ``n`` most specific of ``terms``, in their order: an identifier, path or
    number (a digit or ``_ . / \\ : @ # + ~ -``) first, then the longest; ties keep
    the earlier. A weak term (one character: :func:`weak_term`) comes last.

    Models ask in sentences and name the thing they look for last ("what was the
    output of test_refund_rounding"): keeping the first terms would drop it for
    the sentence's common words, whose IDF is low anyway.
    """
    if len(terms) <= n:
        return tuple(terms)
    ranked = sorted(range(len(terms)), key=lambda i: (
        weak_term(terms[i]), _MARKED.isdisjoint(terms[i]), -len(terms[i]), i))
    keep = sorted(ranked[:n])
    return tuple(terms[i] for i in keep)


def validate_query(query: object, *, limit: object = DEFAULT_LIMIT, start: object = None,
                   end: object = None) -> RecallQuery:
    """Check a recall request; :class:`InvalidInput` names the bad field."""
    if not isinstance(query, str):
        raise InvalidInput("must be a string", field="query")
    if len(query) > MAX_QUERY_CHARS:
        raise InvalidInput(f"{len(query)} characters; at most {MAX_QUERY_CHARS}", field="query")
    terms = specific_terms(tuple(dict.fromkeys(tokenize(query))))
    if not terms:
        raise InvalidInput("has no searchable words (empty, or only stopwords and "
                           "punctuation)", field="query")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput(f"must be an integer from 1 to {MAX_LIMIT}", field="limit")
    lo, hi = _opt_index(start, "start"), _opt_index(end, "end")
    if lo is not None and hi is not None and hi <= lo:
        raise InvalidInput(f"must be greater than start ({lo}), got {hi}", field="end")
    strong = tuple(t for t in terms if not weak_term(t))
    return RecallQuery(query, terms, limit, lo, hi,
                       strong if strong and len(strong) < len(terms) else ())


def parse_tool_arguments(arguments: str | Mapping[str, Any]) -> RecallQuery:
    """The arguments of a ``recall`` tool call (a JSON string or a mapping), validated."""
    import json

    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except ValueError:
            raise InvalidInput("is not valid JSON", field="arguments") from None
    if not isinstance(arguments, Mapping):
        raise InvalidInput("must be a JSON object", field="arguments")
    unknown = set(arguments) - {"query", "limit", "start", "end"}
    if unknown:
        raise InvalidInput(f"unknown argument(s): {', '.join(sorted(unknown))}",
                           field="arguments")
    return validate_query(arguments.get("query"), limit=arguments.get("limit", DEFAULT_LIMIT),
                          start=arguments.get("start"), end=arguments.get("end"))


__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "MAX_QUERY_CHARS",
    "MAX_QUERY_TERMS",
    "NOTICE",
    "PASSAGE_CHARS",
    "TOOL_NAME",
    "IndexedPassage",
    "Passage",
    "Posting",
    "RecallHit",
    "RecallQuery",
    "analyze",
    "best_per_message",
    "bm25",
    "checksum",
    "decode_json_escapes",
    "idf",
    "index_text",
    "notice",
    "parse_tool_arguments",
    "passage_text",
    "recall_tool",
    "render_hits",
    "search_text",
    "specific_terms",
    "split_passages",
    "tokenize",
    "validate_query",
    "weak_term",
]
