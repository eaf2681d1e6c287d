"""Escaping of wrapper-like tags in untrusted transcript text.

The transcript is wrapped in tags that no message content can close: every
wrapper-like tag in content is escaped, whatever its case, spacing or
invisible characters (see :func:`escape_wrappers`).
"""

from __future__ import annotations

import re
import unicodedata

WRAPPER_TAGS: tuple[str, ...] = (
    "transcript", "message", "tool_call", "previous_summary", "facts", "summary",
)


# Characters a model may not "see" inside a tag: every Unicode format character
# (category Cf, read from unicodedata at run time: zero-widths, bidi controls and
# marks, word joiners, the BOM, the tag block, interlinear annotation marks, the
# deprecated format controls, prepended concatenation marks...) plus the other
# default-ignorable code points, which render as nothing although they are not Cf
# (combining grapheme joiner, Hangul fillers, Khmer inherent vowels, Mongolian
# variation selectors, variation selectors, unassigned ignorables, the tag block's
# unassigned rest). A deny list of known characters always misses some, so the
# category decides; these ranges only add what the category does not cover.
_IGNORABLE_RANGES: tuple[tuple[int, int], ...] = (
    (0x034F, 0x034F), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F),
    (0x2065, 0x2065), (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF),
)


_TAG_NAMES: tuple[str, ...] = tuple(tag.casefold() for tag in WRAPPER_TAGS)


_TAG_PREFIXES = frozenset(tag[:n] for tag in _TAG_NAMES for n in range(1, len(tag) + 1))


_LONGEST_TAG = max(len(tag) for tag in _TAG_NAMES)


# What a model may read as the ``<`` or the ``/`` of a tag besides the ASCII ones: the
# compatibility forms NFKC folds to them (fullwidth, small) and the common angle-bracket
# look-alikes (single guillemet, CJK and mathematical angle brackets, modifier and
# syllabics arrowheads, ornaments). Letters of a name are compared after NFKC, so
# fullwidth or mathematical letters spell a wrapper name as well.
_OPEN_LOOKALIKES = "\uff1c\ufe64\u2039\u2329\u3008\u27e8\u02c2\u1438\u276e\u29fc"


_SLASHES = "/\uff0f\u2044\u2215\u29f8"


# A bracket worth a closer look: followed by a slash, a space, a character outside
# ASCII (invisible, or a letter that folds to ASCII) or the first letter of a wrapper.
_CANDIDATE = re.compile(
    f"[<{_OPEN_LOOKALIKES}](?=[/\\s\\x80-\\U0010ffff"
    + "".join(sorted({t[0] for t in _TAG_NAMES})) + "])", re.I)


def _fold(char: str) -> str:
    """How a model may read ``char`` in a tag name: case-folded, compatibility forms
    (fullwidth, mathematical letters) folded to what they look like."""
    if char.isascii():
        return char.casefold()
    return unicodedata.normalize("NFKC", char).casefold()


def is_invisible(char: str) -> bool:
    """True for a character a model may read past: a format (Cf) or default-ignorable one."""
    if char < "\xad":  # ASCII and Latin-1 up to the soft hyphen: the common case, fast
        return False
    if unicodedata.category(char) == "Cf":
        return True
    code = ord(char)
    return any(low <= code <= high for low, high in _IGNORABLE_RANGES)


def _skip_gap(text: str, i: int) -> int:
    """Index of the first character at or after ``i`` that is neither space nor invisible."""
    while i < len(text) and (text[i].isspace() or is_invisible(text[i])):
        i += 1
    return i


def _starts_wrapper(text: str, at: int) -> bool:
    """Whether the bracket at ``at`` reads as a wrapper tag once spacing and invisibles go.

    The bracket is ``<`` or a look-alike (U+FF1C fullwidth, U+2039, U+3008...).
    Between it, an optional ``/`` (or a look-alike) and the name any run of
    whitespace or invisible characters is allowed; inside the name, invisible
    characters. Letters compare after NFKC and case-folding (fullwidth and
    mathematical letters read as ASCII, the Kelvin sign as ``k``). A name
    that merely starts like a wrapper (``<messages>``) is escaped too: a
    spare ``&lt;`` costs nothing.
    """
    i = _skip_gap(text, at + 1)
    if i < len(text) and text[i] in _SLASHES:
        i = _skip_gap(text, i + 1)
    name = ""
    while i < len(text) and len(name) < _LONGEST_TAG:
        char = text[i]
        i += 1
        if is_invisible(char):
            continue
        name += _fold(char)
        if name in _TAG_NAMES:
            return True
        if name not in _TAG_PREFIXES:  # (a fold of several letters may step past a name)
            return any(name.startswith(tag) for tag in _TAG_NAMES)
    return False


# ASCII text has no invisible characters and ASCII letters case-fold to themselves, so
# there a wrapper tag is exactly: ``<``, whitespace (str.isspace: \x1c-\x1f included, as
# in ``_skip_gap``), an optional ``/`` and more whitespace, then a wrapper name (or a
# name that starts like one). One regex pass replaces the per-``<`` scan, which was the
# costliest part of rendering a transcript.
_ASCII_SPACE = "[ \\t\\n\\r\\x0b\\x0c\\x1c-\\x1f]"


_ASCII_WRAPPER = re.compile(
    f"<(?={_ASCII_SPACE}*(?:/{_ASCII_SPACE}*)?(?:"
    + "|".join(re.escape(tag) for tag in sorted(_TAG_NAMES, key=len, reverse=True)) + "))",
    re.I | re.A)


def escape_wrappers(text: str) -> str:
    """``text`` with every tag that could open or close a wrapper made inert (``&lt;``).

    Only the bracket of such a tag changes (``<`` or a look-alike); everything else, invisible
    characters included, is kept as written (the summary may quote it).
    """
    if text.isascii():
        return _ASCII_WRAPPER.sub("&lt;", text) if "<" in text else text
    out: list[str] = []
    done = 0
    for found in _CANDIDATE.finditer(text):
        at = found.start()
        if _starts_wrapper(text, at):
            out += (text[done:at], "&lt;")
            done = at + 1
    if not out:
        return text
    out.append(text[done:])
    return "".join(out)


__all__ = ["WRAPPER_TAGS", "escape_wrappers", "is_invisible"]
