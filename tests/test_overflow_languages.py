"""The other languages' phrase families (shared.core.overflow_languages): each part is written in
the script it is filed under, English texts are read with the English families alone, and an
ASCII text is read again in the Latin-script languages only when it names one of their words."""

from __future__ import annotations

import re
from re import _parser  # the pattern tree: which alternatives can match plain ASCII text

import pytest

from shared.core import overflow_language_kinds as language_kinds
from shared.core import overflow_languages as languages
from shared.core import overflow_patterns as patterns
from shared.core import overflow_read
from shared.core.overflow import ErrorKind, classify_error, is_context_overflow, unrecognised

FAMILIES = ("TOOL_PAIRING", "CAPACITY", "QUOTA", "PER_SHORT_WINDOW", "RATE", "OUTPUT_OVER_WINDOW",
            "NOT_A_REQUEST", "OVERFLOW_STRONG", "PAYLOAD", "OUTPUT_LIMIT", "AUTH",
            "CONTENT_FILTER", "OVERLOADED", "SERVER", "OVERFLOW_WEAK", "OUTPUT_RESERVE")


def _alternatives(pattern: str) -> list[str]:
    """The top-level alternatives of a family part ("(?:a)|(?:b)|...")."""
    parts, depth, in_class, current, i = [], 0, False, "", 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            current, i = current + pattern[i:i + 2], i + 2
            continue
        if char == "[" and not in_class:
            in_class = True
        elif char == "]" and in_class:
            in_class = False
        elif not in_class and char in "()":
            depth += 1 if char == "(" else -1
        elif not in_class and char == "|" and depth == 0:
            parts.append(current)
            current, i = "", i + 1
            continue
        current, i = current + char, i + 1
    return [*parts, current]


def _matches_ascii(items: object) -> bool:
    """Whether some path through a parsed pattern needs no letter beyond ASCII."""
    for op, arg in items:  # type: ignore[attr-defined]
        name = str(op)
        if name == "LITERAL" and arg >= 128:
            return False
        if name == "IN" and not any(
            str(o) in ("CATEGORY", "NEGATE") or (str(o) == "LITERAL" and a < 128)
            or (str(o) == "RANGE" and a[0] < 128) for o, a in arg
        ):
            return False
        if name == "BRANCH" and not any(_matches_ascii(branch) for branch in arg[1]):
            return False
        if name == "SUBPATTERN" and not _matches_ascii(arg[3]):
            return False
        if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT") and arg[0] > 0 \
                and not _matches_ascii(arg[2]):
            return False
    return True


@pytest.mark.parametrize("name", ["OVERFLOW_STRONG", "OVERFLOW_WEAK", "PAYLOAD"])
def test_accentless_words_cover_every_latin_wording_ascii_can_match(name: str) -> None:
    """An ASCII text is read in the Latin-script languages only when it names one of
    ACCENTLESS_WORDS: every overflow wording that plain ASCII could match must name one."""
    family: languages.Family = getattr(languages, name)
    for alternative in _alternatives(family["latin"].pattern):
        if _matches_ascii(_parser.parse(alternative, re.IGNORECASE)):
            assert any(word in alternative.lower() for word in languages.ACCENTLESS_WORDS), \
                alternative


@pytest.mark.parametrize("name", FAMILIES)
def test_each_part_is_written_in_its_own_script(name: str) -> None:
    """A part is read only for texts with its script's letters: a wording filed under another
    script than its letters' would never be read."""
    family: languages.Family = getattr(languages, name, None) or getattr(language_kinds, name)
    assert set(family) <= languages.SCRIPTS
    for script, pattern in family.items():
        for alternative in _alternatives(pattern.pattern):
            outside_lookahead = re.sub(r"\(\?!.*$", "", alternative)
            assert languages.scripts(outside_lookahead) <= {script}, (script, alternative)


@pytest.mark.parametrize(("text", "scripts"), [
    ("The prompt\u2019s too long … ❌ “context” — 128 000 \u00d7 2", set()),
    ("上下文长度超过限制", {"cjk"}), ("コンテキスト制限を超えました", {"cjk"}),
    ("컨텍스트 크기 제한을 초과했습니다", {"cjk"}), ("Превышена длина контекста", {"cyrillic"}),
    ("تجاوزت محادثتك الحد الأقصى", {"arabic"}), ("Le contenu dépasse la longueur", {"latin"}),
    ("Độ dài vượt quá giới hạn", {"latin"}), ("API error: 上下文溢出 (Jan)", {"cjk"}),
])
def test_scripts_of_a_text(text: str, scripts: set[str]) -> None:
    assert languages.scripts(text) == scripts


def test_english_text_is_read_with_the_english_families_alone() -> None:
    """Typographic quotes, dashes and emoji are not another language: the English families
    decide alone (a compiled pattern, or one whose rarer branches wait for their words: no
    other language's part is searched)."""
    for text in ("❌ Conversation context too long for claude-3-5-sonnet",
                 "The model\u2019s maximum context length is 8192 tokens — reduce the prompt",
                 "Rate limit reached for requests … retry in 20s"):
        assert overflow_read._decide_any_language(text, None)[2] is overflow_read._ENGLISH
    assert isinstance(overflow_read._ENGLISH.strong, re.Pattern | patterns.Gated)


@pytest.mark.parametrize(("text", "expected"), [
    ("Il messaggio supera il limite di contesto del modello", True),  # Italian, no accent
    ("Pesan terlalu panjang untuk model ini", True),  # Indonesian
    ("Het bericht is te lang voor dit model", True),  # Dutch
    ("Internal error while loading the context of the request", False),  # English
    ("Bad gateway", False),  # nothing of the other languages
])
def test_ascii_text_is_read_again_only_when_it_names_their_words(text: str,
                                                                  expected: bool) -> None:
    assert languages.maybe_accentless(text) is expected


def test_accentless_text_keeps_the_order_of_decisions() -> None:
    """Read again, an ASCII text still meets the negatives before the overflow wording."""
    assert is_context_overflow("Il messaggio supera il limite di contesto del modello")
    assert classify_error("Troppe richieste: troppo traffico, riprova tra un minuto") \
        is ErrorKind.RATE_LIMIT
    assert classify_error("Saldo insufficiente: il contesto non e stato elaborato") \
        is ErrorKind.QUOTA


@pytest.mark.parametrize(("text", "expected"), [
    ("モデルが見つかりません", False),  # a lookup that failed
    ("Désolé, le fournisseur a rejeté la requête comme étant mal formée.", False),
    ("令牌名称过长", False),  # a field too long, not the conversation
    ("Неизвестная ошибка при обработке запроса", True),  # says nothing: the net may act
])
def test_unrecognised_reads_other_languages(text: str, expected: bool) -> None:
    assert unrecognised(text) is expected
