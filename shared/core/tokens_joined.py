"""The heuristic's count of a text joined from parts kept from call to call (pure).

A tool chain that outgrows the window truncates on every call, and each call's truncation
record is the previous summary, a blank line and a new note: counted whole, the summary
cost a third of such a call. The heuristic's features
(:mod:`shared.core.tokens_classes`) look at most :data:`_CONTEXT` characters back, so
the parts kept are counted once and only the new middle, with that much context either
side, on every call (:func:`joined_tokens`), with the same figure as the whole.
"""

from __future__ import annotations

from shared.core.tokens import (
    _LETTERS_PER_DIACRITIC,
    _OTHER_LANGUAGE_LETTER,
    HeuristicCounter,
    TokenCounter,
    _tokens,
)
from shared.core.tokens_classes import _CHUNK, _CONTEXT, _SIGN_HEAD, _count_chunk, may_hold_signs
from shared.core.tokens_profiles import provider_profile

JOINED = True  # tests compare a world that counts every block whole

_Features = tuple[float, float, int, int]  # tokens_classes._count_chunk's, summed
_JOINED_KEEP = 64  # heads and tails kept: a few per live session
# head -> (whether its start holds sign words, where it is that long; its features less
# those of its last _CONTEXT characters, by markup)
_HEAD_PARTS: dict[str, tuple[bool | None, dict[bool, _Features]]] = {}
_TAIL_PARTS: dict[tuple[str, bool], _Features] = {}
_MARGIN = 1e-6  # how close to a token boundary an estimate summed from parts is recounted


def joined_tokens(counter: TokenCounter, head: str, middle: str, tail: str) -> int:
    """``counter.text(head + middle + tail)``, the same figure, with ``head`` and ``tail``
    (kept from call to call) counted once and ``middle`` on every call.

    The heuristic's features (:mod:`shared.core.tokens_classes`) of a byte look at most
    :data:`~shared.core.tokens_classes._CONTEXT` characters back, so a text's features
    are the sum of its parts' counted with that much context before each, less the
    context's own count (the heuristic slices long texts so). They are counts, but the
    heuristic sums them as floats, weighted, so parts summed can differ from the whole
    by rounding (~1e-10 of a token): the figure is taken only when it is further than
    :data:`_MARGIN` of itself from a boundary where rounding up would change it, else the
    whole is counted. Only for the :class:`~shared.core.tokens.HeuristicCounter` itself
    (not a subclass, not another counter), and not for a text counted for sign words
    (:func:`~shared.core.tokens_classes.may_hold_signs`: counted as non-overlapping
    substrings, they are not local).
    """
    text = head + middle + tail
    if type(counter) is not HeuristicCounter or len(head) <= _CONTEXT:
        return counter.text(text)
    entry = _HEAD_PARTS.get(head)
    if entry is None:
        if len(_HEAD_PARTS) >= _JOINED_KEEP:
            _HEAD_PARTS.clear()
        entry = _HEAD_PARTS[head] = (
            may_hold_signs(head[:_SIGN_HEAD]) if len(head) >= _SIGN_HEAD else None, {})
    signs = entry[0]
    if signs is None:
        signs = may_hold_signs(text[:_SIGN_HEAD])
    if signs:
        return counter.text(text)
    markup = "<" in text
    before = entry[1].get(markup)
    if before is None:  # head less its last _CONTEXT characters (context of the middle)
        before = entry[1][markup] = _head_parts(head, markup)
    after = _TAIL_PARTS.get((tail, markup))
    if after is None:  # tail less its first _CONTEXT characters (counted with the middle)
        after = _less(_parts(tail, markup), _parts(tail[:_CONTEXT], markup))
        if len(_TAIL_PARTS) >= _JOINED_KEEP:
            _TAIL_PARTS.clear()
        _TAIL_PARTS[(tail, markup)] = after
    here = _parts(head[-_CONTEXT:] + middle + tail[:_CONTEXT], markup)
    latin = before[0] + here[0] + after[0]
    other = before[1] + here[1] + after[1]
    deep, diacritics = before[2] + here[2] + after[2], before[3] + here[3] + after[3]
    if diacritics:
        latin += _OTHER_LANGUAGE_LETTER * min(deep, _LETTERS_PER_DIACRITIC * diacritics)
    profile = provider_profile(counter.provider)
    raw = profile.factor * (latin + profile.non_latin_factor * other)
    tokens = _tokens(raw, counter.safety_margin)
    if raw <= _MARGIN or _tokens(raw * (1 - _MARGIN), counter.safety_margin) != tokens \
            or _tokens(raw * (1 + _MARGIN), counter.safety_margin) != tokens:
        return counter.text(text)
    return tokens


def _head_parts(head: str, markup: bool) -> _Features:
    """The features of ``head`` less those of its last :data:`_CONTEXT` characters, from
    the longest head kept that it continues (a turn's truncation committed: the next
    record's text is the last one's, a blank line and its note), else counted whole."""
    tail = head[-_CONTEXT:]
    best: tuple[str, _Features] | None = None
    for known, (_, parts) in list(_HEAD_PARTS.items()):
        found = parts.get(markup)
        if (found is not None and _CONTEXT < len(known) < len(head)
                and (best is None or len(known) > len(best[0])) and head.startswith(known)):
            best = known, found
    if best is None:
        return _less(_parts(head, markup), _parts(tail, markup))
    known, found = best
    grown = _parts(known[-_CONTEXT:] + head[len(known):], markup)
    return _less((found[0] + grown[0], found[1] + grown[1], found[2] + grown[2],
                  found[3] + grown[3]), _parts(tail, markup))


def _parts(text: str, markup: bool) -> _Features:
    """The heuristic's features of ``text`` before the diacritic term, sliced as
    :func:`shared.core.tokens._features` slices (no sign words)."""
    latin, other, deep, diacritics = _count_chunk(text[:_CHUNK], markup, False)
    for start in range(_CHUNK, len(text), _CHUNK):
        context = max(0, start - _CONTEXT)
        a, b, c, d = _count_chunk(text[context:start + _CHUNK], markup, False)
        e, f, g, h = _count_chunk(text[context:start], markup, False)
        latin, other, deep, diacritics = (latin + a - e, other + b - f, deep + c - g,
                                          diacritics + d - h)
    return latin, other, deep, diacritics


def _less(a: _Features, b: _Features) -> _Features:
    return a[0] - b[0], a[1] - b[1], a[2] - b[2], a[3] - b[3]


__all__ = ["JOINED", "joined_tokens"]
