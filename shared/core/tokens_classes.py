"""The heuristic's byte-level features: character classes as bits of one big integer.

The weights and why they are what they are: :mod:`shared.core.tokens`.
"""

from __future__ import annotations

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


# Tokens per non-ASCII character, by UTF-8 lead byte (see module docstring).
_SCRIPT_WEIGHTS = (0.0, 0.62, 0.31, 0.82, 0.4, 0.75, 0.6, 1.0, 1.7)


def _script_of(byte: int) -> int:
    if 0xC3 <= byte <= 0xCA:  # U+00C0-02AF Latin letters with diacritics, IPA
        return 1
    if 0xCB <= byte <= 0xDF:  # U+02C0-07FF Greek, Cyrillic, Armenian, Hebrew, Arabic...
        return 2
    if byte in (0xC2, 0xE2):  # U+0080-00BF and U+2000-2FFF: symbols, quotes, box drawing
        return 3
    if byte in (0xE0, 0xE1):  # U+0800-1FFF Indic, Thai, Georgian, Ethiopic...
        return 4
    if 0xE3 <= byte <= 0xE9:  # U+3000-9FFF CJK, kana
        return 5
    if 0xEA <= byte <= 0xED:  # U+A000-DFFF Hangul, Yi...
        return 6
    if byte in (0xEE, 0xEF):  # private use, compatibility forms, fullwidth
        return 7
    if 0xF0 <= byte <= 0xF4:  # 4-byte: emoji, historic scripts, rare CJK
        return 8
    return 0


_SCRIPT_TABLE = bytes(_script_of(b) for b in range(256))


_BLOB_TABLE = bytes(
    1 if chr(b).isascii() and (chr(b).isalnum() or chr(b) in "+/=_-") else 0 for b in range(256)
)


_NOT_LEAD = bytes(b for b in range(256) if not _script_of(b))


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


def _count_chunk(text: str) -> tuple[float, float]:
    """(tokens of the ASCII part, tokens of other scripts) at the o200k baseline."""
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
    latin = (
        0.028 * letters.bit_count()
        + 0.094 * (packed & _M_UPPER).bit_count()
        + 0.64 * word_pieces
        + 0.11 * _deep(letters, 8)
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
    if size >= 32:
        latin += 0.125 * _deep(((packed >> 4) | (packed >> 5)) & _M_LOWER, 32)
    if size >= 64:
        latin += 0.16 * _deep(int.from_bytes(raw.translate(_BLOB_TABLE), "big"), 64)
    if size == len(text):
        return latin, 0.0
    leads = raw.translate(_SCRIPT_TABLE, _NOT_LEAD)  # one code per non-ASCII character
    if len(leads) <= 32:
        return latin, sum(_SCRIPT_WEIGHTS[code] for code in leads)
    counts = leads.count
    return latin, sum(w * counts(code) for code, w in enumerate(_SCRIPT_WEIGHTS) if w)
