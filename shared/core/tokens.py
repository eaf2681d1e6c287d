"""The one token estimator of the project: guard and workers count with this code.

Why a heuristic: the guard counts every appended message on the agent's hot
path, for providers whose tokenizers are not public (Anthropic) or not local
(Gemini). A few microseconds per message and no dependency beat exactness;
provider-reported usage corrects the rest (``Calibration``, ``hybrid_estimate``).

How text is counted. BPE tokenizers split text into pre-tokens (words, digit
groups, punctuation runs, whitespace runs) and then merge bytes inside each
pre-token; so the count depends on *character classes and their runs*, not
on length alone. Prose, code and JSON differ because they mix these classes
differently (about 4.7, 3.9 and 2.8 characters per o200k token here). The
UTF-8 bytes are mapped to one class bit each with ``bytes.translate`` and
read as one big integer, so every feature is a masked population count at C
speed, with no regular expression and no Python loop over characters: a byte
starts a run when the byte before it has another class (``x & ~(x >> 8)``).
The tokens are a linear function of these counts:

=====================  =====  ==================================================
feature                weight why
=====================  =====  ==================================================
letter                 0.028  long words and identifiers split into more pieces
uppercase letter       0.094  acronyms and CONSTANTS merge worse
word piece             0.64   a letter run (split at camelCase) starts a token
letter 8+ into a run   0.11   rare long words / identifiers split into pieces
digit                  0.27   o200k splits numbers into groups of 1-3 digits
digit run              1.16
punctuation            0.10   punctuation merges into runs (``"},{"``...)
punctuation run        0.59
space run              0.22   a single space joins the next word for free...
run of 2+ spaces       0.32   ...a longer run leaves a token of spaces behind
space before digit     0.78   such a space is a token of its own
space before punct     0.39
newline run            0.89   ``\\s*[\r\n]+`` is one pre-token
backslash, control     0.78   escapes (``\n``, ``\"``) break the word after;
                              control bytes (ANSI codes, NUL) are rare tokens
whitespace 32+ deep    0.125  BPE merges whitespace runs only up to 8-128 chars
blob char 64+ deep     0.16   long runs of ``[A-Za-z0-9+/=_-]`` (base64, hex, keys)
                              find few merges: ~1.5 chars per token, not ~4
markup pairs           0.3-   ``</`` 0.6, ``">`` 0.6, ``/>`` 0.4, ``="`` 0.3 in a text
                       0.6    holding a ``<``: o200k keeps each whole, apart
=====================  =====  ==================================================

The whitespace and blob terms are set by hand from synthetic inputs (whitespace runs,
random base64/hex) and do not fire on ordinary text. The markup pairs were fitted on HTML
and XML files (documentation generators' pages, SVG, config) with code, JSON and Markdown
beside them, which they leave unchanged; held out, 150 pages of Python's and Debian's HTML
documentation went from a median -10.0% (141 under by more than 5%) to +0.4% (none).
The other weights are a non-negative least-squares fit of the relative error against o200k on a
neutral corpus (Python sources, licence texts, Markdown and JSON files
shipped with common packages) plus the even-numbered half of the 40 dev
sessions; the other half is held out (BENCHMARKS.md, "Token estimation").
Other scripts count per character, by script (UTF-8 lead byte, refined by the second
byte where one page holds several scripts), because BPE vocabularies hold far fewer of
their merges: Cyrillic and Arabic 0.34, Greek, Hebrew, Devanagari and Thai 0.42, kana
0.75, CJK 0.85, Hangul 0.68, Latin letters with diacritics 0.78, symbols (curly quotes,
box drawing, arrows) 0.82, emoji and other 4-byte characters 1.7, and scripts o200k
barely merges (Lao, Tibetan, Ethiopic, Syriac, Yi...) 1.5-2.8. Measured on real text in
~60 widely used languages (Django's message catalogs, the UDHR's translations; Debian's
translated manual pages held out): ``scripts/bench_tokens_languages.py``. Within a
script, languages differ by up to ~30% (Russian costs less than Serbian): the weights
err on the side of the costlier ones. Other languages written in Latin letters: see
``_raw_text``.

Providers scale the result (``PROVIDERS``): ``openai`` is the o200k
baseline; ``gemini`` counts ~18% more than o200k on the same text (the data
kit's measurement on the dev sessions); ``anthropic`` publishes no
tokenizer, third-party comparisons put Claude 16-30% above GPT-4o (more for
code), so 1.30;
``generic`` (any unknown name) 1.25 on Latin text and twice that on other
scripts, which covers 32k-vocabulary SentencePiece models and cl100k-era BPEs.
A safety margin (default ``DEFAULT_SAFETY_MARGIN`` = 5%) multiplies content.
Overheads copy OpenAI's published chat framing (see ``tokens_exact``).

Provider usage beats any heuristic: ``Calibration`` learns the ratio of
reported to estimated prompt tokens, and ``hybrid_estimate`` adds the
calibrated estimate of what was appended since the last report to that
report. After a compaction the anchor (the report) no longer describes the
view and is dropped; the ratio describes the tokenizer and survives.

What one report cannot fix: the heuristic's remaining error on a session is
set by the session's words, not by a content class or a content mix. Within
a coding session, assistant text, tool-call arguments and tool results err
together (an identifier that recurs hundreds of times costs one o200k token
in one repository, three in another), and the first few thousand tokens a
report covers predict the rest's error poorly (correlation +0.1). Better
use of the report (class split, shrinkage toward a prior) stays at
4.4-4.6% p95 over the rest of the session where one ratio gives 5.0%
(held-out). A pre-token-aware estimator does little better: splitting text
exactly as o200k does and costing each pre-token by its shape (case,
length, what precedes it) leaves 4.3%, 4.5% in a form Python's ``re`` can
run, at ~7x this heuristic's cost. Given the true cost of every *word*
pre-token, 1.6% remains: the gap to 3% is o200k's vocabulary (knowing its
50k commonest entries gives 3.3%, all of them 1.4%), which only the
tokenizer has (``scripts/bench_calibration.py``, BENCHMARKS.md).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from shared.core.calibration import Calibration, hybrid_estimate
from shared.core.errors import InvalidInput
from shared.core.messages import FilePart, ImagePart, Message
from shared.core.tokens_classes import _CHUNK as _CHUNK  # tests slice with a smaller one
from shared.core.tokens_classes import _CONTEXT, _SIGN_HEAD, _count_chunk, may_hold_signs
from shared.core.tokens_media import file_text, image_cost, pdf_pages
from shared.core.tokens_profiles import (
    DEFAULT_SAFETY_MARGIN,
    MESSAGE_OVERHEAD,
    NAME_OVERHEAD,
    PROVIDERS,
    REQUEST_OVERHEAD,
    TOOL_CALL_OVERHEAD,
    TOOL_DEFINITION_OVERHEAD,
    TOOLS_BLOCK_OVERHEAD,
    ProviderProfile,
    TokenCounter,
    provider_for_model,
    provider_profile,
)

_OTHER_LANGUAGE_LETTER = 0.16
"""Tokens a letter 4+ deep into a word adds in a language other than English."""

_LETTERS_PER_DIACRITIC = 40
"""How many such letters one letter with a diacritic vouches for (see ``_raw_text``)."""


def _raw_text(text: str, profile: ProviderProfile) -> float:
    """Unrounded provider-scaled tokens of ``text`` (no safety margin).

    o200k's merges favour English: in another language written in Latin letters a long
    word splits into two to four pieces where an English one stays whole, and the
    features above (fitted on English text and code) undercount it by 10-30%. Letters
    with diacritics (``é``, ``ł``, ``ö``: 1-7% of the letters of most European languages,
    next to none in English, code, logs and JSON) are the sign: each vouches for up to
    ``_LETTERS_PER_DIACRITIC`` letters deep into a word, which cost
    ``_OTHER_LANGUAGE_LETTER`` more. Languages written without them (Indonesian, Malay,
    Dutch, Swahili, Tagalog) have their commonest words instead ("yang", "het", "kwa",
    "ang": ``tokens_classes._SIGN_WORDS``), each a sign as a diacritic is; they are
    counted only in a text whose first 2,048 characters hold one of a few of them
    (:func:`~shared.core.tokens_classes.may_hold_signs`), so that English text pays one
    short search, not thirty passes. A count, not a ratio: appending text never lowers
    the estimate, and slicing never changes it (a text that starts in English and goes on
    in Indonesian is counted as before).
    """
    if not text:
        return 0.0
    if len(text) <= _SHORT and len(text) <= _CHUNK:  # one slice: the memo cannot differ
        found = _SHORT_SEEN.get(text)
        if found is None:
            if len(_SHORT_SEEN) >= _SHORT_KEEP:
                _SHORT_SEEN.clear()
            found = _SHORT_SEEN[text] = _features(text)
        latin, other = found
    else:
        latin, other = _features(text)
    return profile.factor * (latin + profile.non_latin_factor * other)


_SHORT = 64
"""Texts up to this long are counted once per process (:data:`_SHORT_SEEN`, bounded by
:data:`_SHORT_KEEP` entries): tool names and short arguments repeat call after call,
and a few characters cost the heuristic nearly as many integer operations as a
kilobyte (~3 µs against ~20)."""

_SHORT_KEEP = 4096
_SHORT_SEEN: dict[str, tuple[float, float]] = {}


def _features(text: str) -> tuple[float, float]:
    """:func:`_raw_text` before the provider's scaling: (Latin-script tokens, tokens of
    other scripts) at the o200k baseline."""
    markup = "<" in text
    signs = may_hold_signs(text[:_SIGN_HEAD])
    latin, other, deep, diacritics = _count_chunk(text[:_CHUNK], markup, signs)
    for start in range(_CHUNK, len(text), _CHUNK):
        context = max(0, start - _CONTEXT)
        a, b, c, d = _count_chunk(text[context : start + _CHUNK], markup, signs)
        context_a, context_b, context_c, context_d = _count_chunk(text[context:start], markup,
                                                                  signs)
        latin += a - context_a
        other += b - context_b
        deep += c - context_c
        diacritics += d - context_d
    if diacritics:
        latin += _OTHER_LANGUAGE_LETTER * min(deep, _LETTERS_PER_DIACRITIC * diacritics)
    return latin, other


def _check_margin(safety_margin: float) -> float:
    if (
        isinstance(safety_margin, bool)
        or not isinstance(safety_margin, (int, float))
        or not 0.0 <= safety_margin <= 1.0
    ):
        raise InvalidInput("expected a number between 0 and 1", field="safety_margin")
    return float(safety_margin)


def _tokens(raw: float, safety_margin: float) -> int:
    return math.ceil(raw * (1.0 + safety_margin) - 1e-9) if raw > 0 else 0


def estimate_tokens(
    text: str, provider: str = "openai", *, safety_margin: float = DEFAULT_SAFETY_MARGIN
) -> int:
    """Estimated tokens of ``text`` for ``provider``, safety margin included."""
    if not isinstance(text, str):
        raise InvalidInput(f"expected a string, got {type(text).__name__}", field="text")
    return _tokens(_raw_text(text, provider_profile(provider)), _check_margin(safety_margin))


def image_tokens(part: ImagePart, provider: str = "openai") -> int:
    """One image: by its pixel size where it is inline and the provider's rule uses it,
    else the provider's flat figure (``detail="low"`` honoured where it exists)."""
    return image_cost(part, provider_profile(provider))


def file_tokens(
    part: FilePart, provider: str = "openai", *, safety_margin: float = DEFAULT_SAFETY_MARGIN
) -> int:
    """One attached file: an inline PDF by its pages, an inline text file by its text
    (safety margin included), else the profile's flat figure (see ``PROVIDERS``)."""
    content, fixed = _file_cost(part, provider_profile(provider))
    return fixed + (_tokens(content, _check_margin(safety_margin)) if content else 0)


def _file_cost(part: FilePart, profile: ProviderProfile) -> tuple[float, int]:
    """(text tokens before margin, fixed tokens) of one file: a flat 3,000 was 35k for
    nine PDFs a provider counted at 225k, and a retry sized by it was refused again."""
    pages = pdf_pages(part)
    if pages is not None:
        return 0.0, pages * profile.file_page_tokens
    text = file_text(part)
    if text is not None:
        return _raw_text(text[0], profile) * text[1], 0
    return 0.0, profile.file_tokens


EXTRA_TOKENS = "extra_tokens"
"""Metadata key: tokens of what an adapter sends with a message beyond the message's own
fields, at the o200k baseline (before a provider's factor and the safety margin).

A hosted tool's call and result (web search results, code interpreter output, a hosted
MCP tool's output) go back to the provider as it returned them, while the log keeps a
short note of them as the message's reasoning: without this figure a 30k-character
result was counted at a note's ~600 tokens against ~9,400 sent, and the guard let an
over-window request through. The adapter that records the message sets it
(:func:`baseline_tokens` of what it sends, less the note); metadata is read with unknown
keys ignored, so an older process reads such a message and counts it as before. A stage
that clears or clips a message's notes must drop the figure with them; the adapters send
a hosted part only while its note is in the message's reasoning."""

_EXTRA_CAP = 100_000_000.0  # far beyond any window: a caller's absurd figure stays finite


def extra_tokens(message: Message) -> float:
    """The :data:`EXTRA_TOKENS` figure of ``message`` (0 when absent or not a positive
    finite number: it can only add to a count)."""
    value = message.metadata.get(EXTRA_TOKENS) if message.metadata else None
    if type(value) is int:  # not a bool, whose type is its own
        return min(float(value), _EXTRA_CAP) if value > 0 else 0.0
    if type(value) is float and value > 0:  # NaN is not
        return min(value, _EXTRA_CAP)
    return 0.0


def baseline_tokens(text: str) -> float:
    """Tokens of ``text`` at the o200k baseline, unrounded, without a margin: the unit of
    :data:`EXTRA_TOKENS`."""
    return _raw_text(text, PROVIDERS["openai"])


def _message_parts(message: Message, profile: ProviderProfile) -> tuple[float, int]:
    """(content tokens before margin, fixed tokens) of one message."""
    if not isinstance(message, Message):
        raise InvalidInput(f"expected a Message, got {type(message).__name__}", field="message")
    content = _raw_text(message.text(), profile) + profile.factor * extra_tokens(message)
    fixed = MESSAGE_OVERHEAD
    if message.name:
        content += _raw_text(message.name, profile)
        fixed += NAME_OVERHEAD
    if message.reasoning:
        content += _raw_text(message.reasoning, profile)
    for call in message.tool_calls:
        content += _raw_text(call.name, profile) + _raw_text(call.arguments, profile)
        fixed += TOOL_CALL_OVERHEAD
    if not isinstance(message.content, str):
        for part in message.content:
            if isinstance(part, ImagePart):
                fixed += image_cost(part, profile)
            elif isinstance(part, FilePart):
                text, flat = _file_cost(part, profile)
                content, fixed = content + text, fixed + flat
    return content, fixed


def estimate_message_tokens(
    message: Message, provider: str = "openai", *, safety_margin: float = DEFAULT_SAFETY_MARGIN
) -> int:
    """One message: text, name, reasoning, tool calls (name + JSON arguments), media, what
    an adapter sends beside it (:data:`EXTRA_TOKENS`), framing."""
    content, fixed = _message_parts(message, provider_profile(provider))
    return fixed + _tokens(content, _check_margin(safety_margin))


def estimate_messages_tokens(
    messages: Sequence[Message],
    provider: str = "openai",
    *,
    safety_margin: float = DEFAULT_SAFETY_MARGIN,
) -> int:
    """A whole request: the sum of its messages plus the per-request overhead."""
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise InvalidInput("expected a sequence of messages", field="messages")
    margin = _check_margin(safety_margin)
    profile = provider_profile(provider)
    total = REQUEST_OVERHEAD
    for index, message in enumerate(messages):
        if not isinstance(message, Message):
            raise InvalidInput(
                f"expected a Message, got {type(message).__name__}",
                field=f"messages[{index}]",
                index=index,
            )
        content, fixed = _message_parts(message, profile)
        total += fixed + _tokens(content, margin)
    return total


_SCHEMA_KEYS = ("parameters", "input_schema")


def normalize_tool(
    tool: Mapping[str, Any], index: int = 0
) -> tuple[str, str, Mapping[str, Any] | None]:
    """(name, description, JSON schema or None) of one tool definition.

    Accepts the OpenAI form ``{"type": "function", "function": {...}}``, the
    bare form ``{name, description, parameters | input_schema}`` (Anthropic,
    Gemini function declarations) and provider built-ins such as
    ``{"type": "web_search"}`` (named by their type; their other settings
    count as the schema, they cost prompt tokens too). Anything else raises
    ``InvalidInput`` naming ``tools[index]``.
    """
    where = f"tools[{index}]"
    if not isinstance(tool, Mapping):
        raise InvalidInput(
            f"expected an object, got {type(tool).__name__}", field=where, index=index
        )
    body: Any = tool
    if "function" in tool:
        body, where = tool["function"], f"{where}.function"
        if not isinstance(body, Mapping):
            raise InvalidInput("expected an object", field=where, index=index)
    name = body.get("name")
    kind = tool.get("type")
    builtin = name is None and isinstance(kind, str) and kind not in ("", "function")
    if builtin:
        name = kind
    if not isinstance(name, str) or not name:
        raise InvalidInput("a tool needs a non-empty name", field=f"{where}.name", index=index)
    description = body.get("description") or ""
    if not isinstance(description, str):
        raise InvalidInput("expected a string", field=f"{where}.description", index=index)
    if builtin:
        settings = {k: v for k, v in tool.items() if k not in ("type", "description")}
        return name, description, settings or None
    key = next((k for k in _SCHEMA_KEYS if k in body), _SCHEMA_KEYS[0])
    schema = body.get(key)
    if schema is not None and not isinstance(schema, Mapping):
        raise InvalidInput("expected a JSON schema object", field=f"{where}.{key}", index=index)
    return name, description, schema


def estimate_tool_tokens(
    tools: Sequence[Mapping[str, Any]],
    provider: str = "openai",
    *,
    safety_margin: float = DEFAULT_SAFETY_MARGIN,
) -> int:
    """Tool definitions: name, description and compact JSON schema of each, plus framing."""
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise InvalidInput("expected a sequence of tool definitions", field="tools")
    if not tools:
        return 0
    margin = _check_margin(safety_margin)
    profile = provider_profile(provider)
    content = 0.0
    for index, tool in enumerate(tools):
        name, description, schema = normalize_tool(tool, index)
        content += _raw_text(name, profile) + _raw_text(description, profile)
        if schema is not None:
            try:
                schema_text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
            except (TypeError, ValueError) as exc:
                raise InvalidInput(
                    f"schema is not JSON: {exc}", field=f"tools[{index}]", index=index
                ) from None
            content += _raw_text(schema_text, profile)
    fixed = TOOLS_BLOCK_OVERHEAD + TOOL_DEFINITION_OVERHEAD * len(tools)
    return fixed + _tokens(content, margin)


class HeuristicCounter:
    """The default ``TokenCounter``: the heuristic for one provider, with a margin."""

    def __init__(
        self, provider: str = "openai", safety_margin: float = DEFAULT_SAFETY_MARGIN
    ) -> None:
        provider_profile(provider)
        self.provider = provider
        self.safety_margin = _check_margin(safety_margin)

    def __repr__(self) -> str:
        return f"HeuristicCounter(provider={self.provider!r}, safety_margin={self.safety_margin})"

    def text(self, text: str) -> int:
        return estimate_tokens(text, self.provider, safety_margin=self.safety_margin)

    def message(self, message: Message) -> int:
        return estimate_message_tokens(message, self.provider, safety_margin=self.safety_margin)

    def messages(self, messages: Sequence[Message]) -> int:
        return estimate_messages_tokens(messages, self.provider, safety_margin=self.safety_margin)

    def tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        return estimate_tool_tokens(tools, self.provider, safety_margin=self.safety_margin)


DEFAULT_COUNTER: TokenCounter = HeuristicCounter()


__all__ = [
    "DEFAULT_COUNTER",
    "DEFAULT_SAFETY_MARGIN",
    "EXTRA_TOKENS",
    "MESSAGE_OVERHEAD",
    "NAME_OVERHEAD",
    "PROVIDERS",
    "REQUEST_OVERHEAD",
    "TOOLS_BLOCK_OVERHEAD",
    "TOOL_CALL_OVERHEAD",
    "TOOL_DEFINITION_OVERHEAD",
    "Calibration",
    "HeuristicCounter",
    "ProviderProfile",
    "TokenCounter",
    "baseline_tokens",
    "estimate_message_tokens",
    "estimate_messages_tokens",
    "estimate_tokens",
    "estimate_tool_tokens",
    "extra_tokens",
    "file_tokens",
    "hybrid_estimate",
    "image_tokens",
    "normalize_tool",
    "provider_for_model",
    "provider_profile",
]
