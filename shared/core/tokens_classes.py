"""The heuristic's byte-level features: character classes as bits of one big integer.

The weights and why they are what they are: :mod:`shared.core.tokens`.
"""

from __future__ import annotations

import re

# -- character classes ---------------------------------------------------------
# One bit per class, so that "byte i starts a run" is ``packed & ~(packed >> 8)``
# and "class a right after class b" is a shifted AND, all on one big integer.
_LOWER, _UPPER, _DIGIT, _PUNCT, _SPACE, _NEWLINE, _ESCAPE, _OTHER = (1 << i for i in range(8))


def _class_of(byte: int) -> int:
    char = chr(byte)
    if byte >= 0x80:
        return _OTHER
    if "a" <= char <= "z":
        return _LOWER
    if "A" <= char <= "Z":
        return _UPPER
    if "0" <= char <= "9":
        return _DIGIT
    if char in " \t\x0b\x0c":
        return _SPACE
    if char in "\r\n":
        return _NEWLINE
    if char == "\\" or byte < 0x20 or byte == 0x7F:  # escapes, ANSI codes, NUL...
        return _ESCAPE
    return _PUNCT


_CLASS_TABLE = bytes(_class_of(b) for b in range(256))


# Tokens per non-ASCII character at the o200k baseline, by script (see tokens.py).
# A 2-byte character's lead byte names its script; a 3-byte one's names a 4096-code-point
# page, refined by its second byte (64 code points) where scripts of one page differ.
_LEAD_WEIGHTS: tuple[tuple[int, int, float], ...] = (
    (0xC2, 0xC2, 0.82),  # U+0080-00BF: Latin-1 punctuation and symbols
    (0xC3, 0xCA, 0.78),  # U+00C0-02BF: Latin letters with diacritics, IPA (they break the word)
    (0xCB, 0xCD, 0.9),   # U+02C0-036F: modifier letters, combining diacritical marks
    (0xCE, 0xCF, 0.42),  # Greek
    (0xD0, 0xD4, 0.34),  # Cyrillic
    (0xD5, 0xD7, 0.42),  # Armenian, Hebrew
    (0xD8, 0xDB, 0.34),  # Arabic, Persian, Urdu
    (0xDC, 0xDF, 2.1),   # Syriac, Thaana, N'Ko...: few merges
    (0xE0, 0xE0, 0.42),  # U+0800-0FFF: Indic scripts, Thai (refined below)
    (0xE1, 0xE1, 2.5),   # U+1000-1FFF: Myanmar, Georgian, Ethiopic, Khmer... (refined below)
    (0xE2, 0xE2, 0.82),  # U+2000-2FFF: curly quotes, dashes, arrows, box drawing
    (0xE3, 0xE3, 0.75),  # U+3000-3FFF: CJK punctuation, kana
    (0xE4, 0xE9, 0.85),  # U+4000-9FFF: CJK ideographs
    (0xEA, 0xEA, 2.8),   # U+A000-AFFF: Yi, Vai, Javanese... and the first Hangul (refined below)
    (0xEB, 0xED, 0.68),  # U+B000-DFFF: Hangul syllables
    (0xEE, 0xEF, 1.0),   # private use, compatibility and fullwidth forms
    (0xF0, 0xF4, 1.7),   # 4-byte: emoji, rare CJK, historic scripts
)

# (lead, first second byte, last second byte, weight) where a page's scripts differ.
_PAGE_WEIGHTS: tuple[tuple[int, int, int, float], ...] = (
    (0xE0, 0xA0, 0xA3, 1.5),   # Samaritan, Mandaic, Arabic extensions
    (0xE0, 0xA8, 0xA9, 0.7),   # Gurmukhi
    (0xE0, 0xAC, 0xAD, 0.5),   # Oriya
    (0xE0, 0xAE, 0xAF, 0.45),  # Tamil
    (0xE0, 0xB0, 0xB3, 0.5),   # Telugu, Kannada
    (0xE0, 0xB6, 0xB7, 0.6),   # Sinhala
    (0xE0, 0xBA, 0xBB, 1.9),   # Lao
    (0xE0, 0xBC, 0xBF, 1.5),   # Tibetan
    (0xE1, 0x80, 0x81, 0.75),  # Myanmar
    (0xE1, 0x82, 0x83, 0.37),  # Georgian
    (0xE1, 0x84, 0x87, 0.7),   # Hangul jamo
    (0xE1, 0x9E, 0x9F, 0.62),  # Khmer
    (0xE1, 0xB8, 0xBB, 0.78),  # Latin Extended Additional (Vietnamese)
    (0xE1, 0xBC, 0xBF, 1.0),   # Greek Extended
    (0xEA, 0xB0, 0xBF, 0.68),  # Hangul syllables U+AC00-AFFF
)


def _lead_weight(byte: int) -> float:
    return next((w for low, high, w in _LEAD_WEIGHTS if low <= byte <= high), 0.0)


_SCRIPT_WEIGHTS = (0.0, *sorted({w for _, _, w in _LEAD_WEIGHTS}))
"""The weight of each script code (code 0: not the first byte of a non-ASCII character)."""

_SCRIPT_TABLE = bytes(_SCRIPT_WEIGHTS.index(_lead_weight(b)) for b in range(256))

_NOT_LEAD = bytes(b for b in range(256) if not _lead_weight(b))

_DIACRITIC_CODE = _SCRIPT_TABLE[0xC3]
"""The code of U+00C0-02BF (accented Latin letters): no other lead byte shares its weight."""

_SIGN_WORDS: tuple[bytes, ...] = tuple(
    f" {word} ".encode()
    for word in (
        # Indonesian and Malay
        "yang", "dengan", "untuk", "tidak", "adalah", "dalam", "kepada", "sebagai", "telah",
        "atau", "akan",
        # Dutch
        "het", "een", "niet", "wordt", "worden", "zijn", "deze", "naar", "moet", "ook",
        # Swahili
        "kwa", "katika", "kila", "ya", "za",
        # Tagalog
        "ang", "mga", "ay", "nang",
    )
)
"""Frequent words of languages written in Latin letters without diacritics and rare in
English, code and logs: each is a sign of such a language, as a diacritic is of others."""

_SIGN_HEAD = 2048
"""Bytes at the start of a text where a few of those words decide whether it is counted
for them at all (each count costs a pass over the text)."""

def may_hold_signs(head: str) -> bool:
    """Whether a text whose start is ``head`` (its first :data:`_SIGN_HEAD` characters) is
    counted for sign words, by the commonest of them (and ``dan``, ``na``, ``ng``: too
    common elsewhere to count as signs, telling enough to look further). Decided once per
    text, on its start, so that appending never turns it off and English text pays eight
    short searches."""
    return _HEAD_SIGNS(head) is not None


_HEAD_SIGNS = re.compile(" (?:yang|het|een|kwa|ang|dan|na|ng) ").search

_REFINED: tuple[tuple[int, tuple[tuple[bytes, float], ...]], ...] = tuple(
    (lead, tuple((bytes((lead, second)), weight - _lead_weight(lead))
                 for low_lead, first, last, weight in _PAGE_WEIGHTS if low_lead == lead
                 for second in range(first, last + 1)))
    for lead in sorted({lead for lead, _, _, _ in _PAGE_WEIGHTS})
)
"""Per refined lead byte: each (lead, second byte) prefix and what its script adds to the
lead's weight. Counted only when the lead occurs: ``bytes.count`` at C speed."""


_BLOB_TABLE = bytes(
    1 if chr(b).isascii() and (chr(b).isalnum() or chr(b) in "+/=_-") else 0 for b in range(256)
)


_CHUNK = 1 << 14
"""Texts are counted in slices of this many characters: bounded memory and
linear time on huge inputs."""


_CONTEXT = 64
"""Characters of history any feature looks at (the blob term looks 63 bytes
back): each slice is counted with this much context before it, and the
context's own count subtracted, so slicing never changes the result."""


_ONES = int.from_bytes(b"\x01" * (4 * (_CHUNK + _CONTEXT)), "big")


_M_LOWER, _M_UPPER, _M_DIGIT, _M_PUNCT, _M_SPACE, _M_NEWLINE, _M_ESCAPE = (
    _ONES << i for i in range(7)
)


def _deep(flags: int, depth: int) -> int:
    """How many flagged bytes have at least ``depth - 1`` flagged bytes right before them
    (``flags`` has bit 0 of each byte set or clear; ``depth`` is a power of two)."""
    shift = 8
    while shift < 8 * depth:
        flags &= flags >> shift
        shift *= 2
    return flags.bit_count()


def _count_chunk(text: str, markup: bool = False,
                 signs: bool = False) -> tuple[float, float, int, int]:
    """(tokens of the ASCII part, tokens of other scripts, ASCII letters with three or more
    letters before them in their word, Latin letters with diacritics) at the o200k baseline.

    The last two tell a language other than English written in Latin letters, whose long
    words split into more pieces (``tokens._raw_text`` adds them). ``markup``: the whole
    text holds a ``<``, so its markup pairs are counted (decided once per text, so that
    every slice of it is counted alike).
    """
    raw = text.encode("utf-8", "surrogatepass")
    size = len(raw)
    packed = int.from_bytes(raw.translate(_CLASS_TABLE), "big")
    prev = packed >> 8  # byte i holds the class of byte i-1
    starts = packed & ~prev
    after_upper_or_space = prev >> 1  # upper (bit 1) -> bit 0, space (bit 4) -> bit 3
    letters = (packed | (packed >> 1)) & _M_LOWER
    word_pieces = (
        (starts & _M_LOWER).bit_count()
        + (starts & _M_UPPER).bit_count()
        - (packed & after_upper_or_space & _M_LOWER).bit_count()  # "Word" is one piece
    )
    spaces = packed & _M_SPACE
    spaces_after_space = spaces & (spaces >> 8)  # a space with a space right before it
    deep2 = letters & (letters >> 8)
    deep4 = deep2 & (deep2 >> 16)  # a letter with 3+ letters right before it
    latin = (
        0.028 * letters.bit_count()
        + 0.094 * (packed & _M_UPPER).bit_count()
        + 0.64 * word_pieces
        + 0.11 * (deep4 & (deep4 >> 32)).bit_count()  # 7+ letters before it
        + 0.27 * (packed & _M_DIGIT).bit_count()
        + 1.16 * (starts & _M_DIGIT).bit_count()
        + 0.10 * (packed & _M_PUNCT).bit_count()
        + 0.59 * (starts & _M_PUNCT).bit_count()
        + 0.22 * (starts & _M_SPACE).bit_count()
        + 0.32 * (spaces_after_space & ~(spaces_after_space >> 8)).bit_count()  # 2+ spaces
        + 0.78 * (packed & (prev >> 2) & _M_DIGIT).bit_count()  # space then digit
        + 0.39 * (packed & after_upper_or_space & _M_PUNCT).bit_count()  # space then punct
        + 0.89 * (starts & _M_NEWLINE).bit_count()
        + 0.78 * (packed & _M_ESCAPE).bit_count()
    )
    if markup:  # o200k keeps "</", "\">", "=\"" and "/>" whole, apart from the names
        count = raw.count
        latin += (0.6 * count(b"</") + 0.3 * count(b'="') + 0.6 * count(b'">')
                  + 0.4 * count(b"/>"))
    if size >= 32:
        latin += 0.125 * _deep(((packed >> 4) | (packed >> 5)) & _M_LOWER, 32)
    if size >= 64:
        latin += 0.16 * _deep(int.from_bytes(raw.translate(_BLOB_TABLE), "big"), 64)
    deep = deep4.bit_count()
    found = sum(map(raw.count, _SIGN_WORDS)) if signs else 0
    if size == len(text):
        return latin, 0.0, deep, found
    leads = raw.translate(_SCRIPT_TABLE, _NOT_LEAD)  # one code per non-ASCII character
    if len(leads) <= 32:
        other = sum(_SCRIPT_WEIGHTS[code] for code in leads)
    else:
        counts = leads.count
        other = sum(w * counts(code) for code, w in enumerate(_SCRIPT_WEIGHTS) if w)
    for lead, prefixes in _REFINED:
        if lead in raw:
            other += sum(extra * raw.count(prefix) for prefix, extra in prefixes)
    return latin, other, deep, leads.count(_DIACRITIC_CODE) + found
