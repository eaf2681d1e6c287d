"""The patterns and text scanners behind :func:`shared.core.facts.extract_facts`.

What each pattern matches, and the regions of a text that can hold a match
(so a batch scans only those): the extraction itself and its contract are
in :mod:`shared.core.facts`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from typing import Any

from shared.core.fileops import (
    is_program,
    looks_like_path,
    strip_heredocs,
)
from shared.core.ledger import (
    MAX_CONSTRAINT_CHARS,
    MAX_FACT_CHARS,
)

_URL = re.compile(r"https?://[^\s<>\"'`\])}]+")


_PATH = re.compile(
    r"(?<![\w@:/.~-])(?:~/|\.\.?/|/)?[\w@+-][\w.@+-]*(?:/[\w.@+-]+)+/?"
    r"|(?<![\w@:/.-])[\w@+-][\w.@+-]*\.(?:py|pyi|js|jsx|ts|tsx|json|md|rst|txt|toml|ya?ml|cfg|"
    r"ini|sh|html?|css|c|h|cc|cpp|hpp|go|rs|java|kt|rb|php|sql|csv|xml|lock|ipynb|log)\b"
)


# Every alternative of _NUMBER starts at a word boundary or a currency sign, and of
# _STRONG_ID at a word boundary or "#": the leading group says so once, so the engine
# rejects a position with one test instead of trying each alternative there (a third
# of the extraction's CPU went into these two scans). Matches are unchanged.
_NUMBER = re.compile(
    r"(?:\b|(?=[$€£¥]))(?:"
    r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d{2,5})?\b"  # IPv4 (optionally with port)
    r"|\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2})?(?:Z|[+-]\d{2}:?\d{2})?)?\b"  # ISO date
    r"|\b(?:January|February|March|April|May|June|July|August|September|October|November|"
    r"December|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept?|Oct|Nov|Dec)\.? \d{1,2}(?:st|nd|rd|th)?\b"
    r"(?:,? \d{4}\b)?|\b\d{1,2}(?::\d{2})? ?(?:am|pm|AM|PM)\b"
    r"|\b\d{1,2}/\d{1,2}/\d{4}\b"
    # Whitespace inside a fact is never a line break (a fact is one line).
    r"|[$€£¥][^\S\r\n]?\d[\d,]*(?:\.\d+)?(?:[^\S\r\n]?(?:k|K|M|bn|million|billion)\b)?"
    r"|\b\d[\d,]*(?:\.\d+)?[^\S\r\n]?(?:USD|EUR|GBP|JPY|CHF|CAD|AUD|dollars|euros|pounds)\b"
    # A version with its pre-release tag (v1.2.3-rc.1, 2.0.1-beta.2, 1.2.3rc1), whole.
    r"|\bv\d+(?:\.\d+){1,3}(?:-[0-9A-Za-z]+(?:\.[0-9A-Za-z]+)*)?\b"
    r"|\b\d+\.\d+\.\d+(?:-[0-9A-Za-z]+(?:\.[0-9A-Za-z]+)*|\.?(?:rc|a|b|dev|post)\d*)?\b"
    r"|\b(?:[Vv]ersion|Python|python) \d+(?:\.\d+)+\b"
    r"|\b(?:localhost|[\w-]+\.[\w.-]+):\d{2,5}\b|\b[Pp]ort:? ?\d{2,5}\b"
    r"|\b(?:HTTP|[Ee]rror|[Ss]tatus(?: code)?|[Ee]xit (?:code|status)|errno|returncode)"
    r"[ :=]*\d{1,4}\b"
    r"|\b\d+(?:\.\d+)?%)"
)


_DIGIT = re.compile(r"\d")  # every _NUMBER match has one (the same \d, Unicode digits)


_STRONG_ID = re.compile(
    r"(?:\b|(?=#))(?:"
    r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b"  # e-mail address
    r"|\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"  # UUID
    r"|\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,64}\b"  # hash
    # A ticket id with its further segments (ORD-2024-0001-XZ), whole: a prefix names
    # another ticket.
    r"|\b(?!(?:UTF|ISO|SHA|MD|AES|GMT|UTC)-)[A-Z][A-Z0-9]{1,9}-\d{1,7}(?:-[A-Za-z0-9]+)*\b"
    r"|(?<![\w&])#\d{2,}\b"
    r"|\b(?=[A-Z0-9]*\d)(?=[A-Z0-9]*[A-Z])[A-Z0-9]{5,12}\b"  # booking / flight codes
    r"|\b[a-z][a-z0-9]*(?:_[a-z0-9]+)*_\d{3,}\b)"  # user_name_1234, credit_card_42
)


_CODE_ID = re.compile(
    r"\b_*[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b|\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b"
    r"|\b[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+\b|\b[a-z]+(?:[A-Z][a-z0-9]+)+\b"
    r"|\b[A-Za-z_]\w*(?:\.[A-Za-z_]\w*){2,}\b"
)


_FENCE = re.compile(r"```([\w+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)


_PROGRAM_NAME = re.compile(r"^[a-z][\w.-]*$")


_SHELL_LANGS = {"bash", "sh", "shell", "console", "zsh", "terminal"}


_BACKTICK = re.compile(r"(?<!`)`([^`\r\n]{3,200})`(?!`)")


_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(*])")


_BULLET = re.compile(r"^\s*(?:[-*•>]|\d+[.)])\s+")


# Keywords of an explicit constraint. "don't", "make sure" and "only" are so common in
# chat ("I don't have my ID", "I'll make sure to...", "the only thing") that they count
# only in an imperative position; system-like instructions count at the sentence start.
# A clause break (";", ",", ":", a dash) opens an imperative position for "do not" too
# ("Fix app.py; do not touch tests/"), except for the chat formulas "don't worry/mind".
# An apostrophe is either the straight one or the curly one phones and word processors type.
_CONSTRAINT = re.compile(
    r"\b(?:must|mustn['\u2019]t|never|always|ensure|without|required?|mandatory|forbidden|"
    r"not allowed|avoid|should not|shouldn['\u2019]t|no more than|at most|at least|from now on|"
    r"going forward|"
    r"remember to|keep in mind|I (?:do not|don['\u2019]t) want)\b"
    r"|\bprefer(?:red|ably)?\b"
    r"|(?:^|\b(?:please|you|and|but|so|just)\s+)"
    r"(?:do not|don['\u2019]t|make sure|only|keep|use|stick to)\b"
    r"|(?:[;,:]|\s[-\u2013\u2014]+)\s*(?:do not|don['\u2019]t)\b(?!\s+(?:worry|mind)\b)"
    r"|(?<!the )(?<!not )(?<!I )(?<!I'll )\bonly\b(?! if\b)"
    r"|^(?:You are|Act as|Respond in|Answer in|Reply in|Write in|Use only)\b",
    re.I,
)


_TAG = re.compile(r"</?[A-Za-z][\w-]*>")  # markup such as <pr_description>, not identifiers


_ID_KEY = re.compile(r"(?:^|_)(?:id|ids|number|code|key|ref|sku)$", re.I)


def _mask(text: str, pattern: re.Pattern[str], out: list[tuple[str, str]], kind: str,
          keep: Any = None) -> str:
    """Record every match of ``pattern`` as ``kind`` and blank it out for later passes."""
    def repl(m: re.Match[str]) -> str:
        value = m.group(0).rstrip(".,;:!?")
        if value and len(value) <= MAX_FACT_CHARS and (keep is None or keep(value)):
            out.append((kind, value))
        return " " * len(m.group(0))
    return pattern.sub(repl, text)


def _scan(text: str, ids: re.Pattern[str] | None, *, code_ids: bool,
          paths: bool = True) -> list[tuple[str, str]]:
    """The facts of one text, pass by pass: what ``facts._ScanBatch`` gives, by definition.

    Each pass blanks its matches so that later ones do not re-read them (a URL's
    path is not also a path, a date's digits not also an identifier).
    """
    out: list[tuple[str, str]] = []
    text = _mask(_TAG.sub(lambda m: " " * len(m.group(0)), text), _URL, out, "url")
    text = _mask(text, _PATH, [] if not paths else out, "path", looks_like_path)
    if _DIGIT.search(text):
        text = _mask(text, _NUMBER, out, "number")
    if ids is not None:
        text = _mask(text, ids, out, "identifier")
    if code_ids:
        _mask(text, _CODE_ID, out, "identifier")
    return out


# Every _CONSTRAINT match holds one of these, case aside: an ASCII sentence
# without any cannot match (a non-ASCII one might, through Unicode case
# folding such as U+017F, the long s, for "s", and always gets the full search).
_CONSTRAINT_WORDS = (
    "must", "never", "always", "ensure", "without", "require", "mandatory", "forbidden",
    "not allowed", "avoid", "should", "no more than", "at most", "at least", "from now on",
    "going forward", "remember to", "keep", "prefer", "do not", "don't", "make sure",
    "only", "use", "stick to", "you are", "act as", "respond in", "answer in", "reply in",
    "write in",
)


def _may_constrain(sentence: str) -> bool:
    if not sentence.isascii():
        return True
    lowered = sentence.lower()
    return any(word in lowered for word in _CONSTRAINT_WORDS)


def _constraints(prose: str) -> list[tuple[str, str]]:
    out = []
    for line in prose.splitlines():
        for sentence in _SENTENCE_SPLIT.split(_BULLET.sub("", line).strip()):
            s = sentence.strip()
            sized = 8 <= len(s) <= MAX_CONSTRAINT_CHARS and len(s.split()) >= 3
            if sized and _may_constrain(s) and _CONSTRAINT.search(s):
                out.append(("constraint", s))
    return out


def _shell_commands(text: str, prose: str) -> list[tuple[str, str]]:
    """Commands the user wrote in shell code fences or inline backticks.

    ``prose`` is ``text`` with its fences blanked (the caller has it already).
    """
    out = []
    if "```" in text:
        for m in _FENCE.finditer(text):
            if m.group(1).lower() in _SHELL_LANGS:
                for line in strip_heredocs(m.group(2)).splitlines():
                    cmd = line.strip().removeprefix("$ ").strip()
                    words = cmd.split()
                    plausible = len(words) > 1 and _PROGRAM_NAME.match(words[0])
                    if words and len(cmd) <= MAX_FACT_CHARS and (
                            is_program(words[0]) or plausible):
                        out.append(("command", cmd))
    if "`" in prose:
        for m in _BACKTICK.finditer(prose):
            cmd = m.group(1).strip()
            if len(cmd.split()) >= 2 and is_program(cmd.split()[0]):
                out.append(("command", cmd))
    return out


def _short_strings(value: Any, key: str = "") -> Iterable[tuple[str, str]]:
    """(key, string) for every short string inside a parsed tool-call argument."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _short_strings(v, str(k))
    elif isinstance(value, list):
        for v in value:
            yield from _short_strings(v, key)
    elif isinstance(value, str) and len(value) <= MAX_FACT_CHARS and "\n" not in value:
        yield key, value
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and _id_key(key):
        yield key, str(value)


_Found = list[tuple[str, str]]


@functools.lru_cache(maxsize=1024)
def _id_key(key: str) -> bool:
    """Whether an argument's key names an identifier (``user_id``); a tool's keys repeat."""
    return _ID_KEY.search(key) is not None


# Put between two texts of a batch. No pattern of :func:`_scan` matches across it
# or any part of it: _TAG, _URL, _PATH, _STRONG_ID and _CODE_ID never match
# whitespace; _NUMBER takes whitespace only as single ``[^\S\r\n]?`` each followed by a
# required non-space, or as literal " " (never "\n"), so no match holds "\n\n"
# or starts or ends inside it. Both characters are non-word and outside every
# lookbehind class, so ``\b`` and the lookarounds at a joint see what they see
# at a string's start or end. No pattern matches the empty string.
_JOINT = "\n\n"


# What a match needs (a text or region without it is skipped): _TAG a "<",
# _URL "://", _PATH a "/", or a "." before the first letter of one of its file
# extensions, _NUMBER a digit, _STRONG_ID a digit, "@" (e-mail) or "-" (a UUID
# of letters only), _CODE_ID a "_", a "." or a capital.
_CODE_GATE = re.compile(r"[A-Z_.]")


class _Regions:
    """The parts of a text that may hold a match of one pattern.

    A region is ``body`` at the text's start or right after a whitespace
    character matching ``cut``. Regions are cut where no match of the pattern
    can run across, so each region scanned alone (regions joined by " ")
    matches exactly as in place (why, per pattern: :func:`_words` and the
    comment on ``_NUMBER_NEXT``). Starting at a whitespace (not behind one)
    lets the engine skip to candidates in C.
    """

    def __init__(self, cut: str, body: str) -> None:
        self._first = re.compile(body)
        self._rest = re.compile(f"{cut}({body})")

    def find(self, text: str) -> tuple[list[int], list[str]]:
        """(start offsets, texts) of the regions of ``text``, in order."""
        origins: list[int] = []
        found: list[str] = []
        pos = 0
        first = self._first.match(text)
        if first is not None:
            origins.append(0)
            found.append(first.group(0))
            pos = first.end()
        for m in self._rest.finditer(text, pos):
            origins.append(m.start(1))
            found.append(m.group(1))
        return origins, found


def _words(gate: str) -> _Regions:
    r"""Words (maximal non-whitespace runs) holding a character of ``gate``.

    For _PATH, _STRONG_ID and _CODE_ID: they never match whitespace, and
    whitespace (like the " " between words) is non-word and outside their
    lookbehind classes, so a word matches alone as it does in its text.
    """
    return _Regions(r"\s", rf"[^\s{gate}]*+[{gate}]\S*+")


_CODE_WORDS = _words("A-Z_.")  # capitals are common: scanning for words is cheaper


# _NUMBER is cut at whitespace followed by none of _NUMBER_NEXT, that is, none
# of the characters that can follow a whitespace inside a _NUMBER match: a
# digit ("$ 5", "May 5", "Port 80", "code = 2"), the start of a multiplier,
# currency word or "am"/"pm" ("5 million", "5 USD", "5 pm"), "code"/"status"
# after "Status"/"Exit", or more of a "[ :=]*" run. No match ends with
# whitespace, so no match holds a cut; a region (a digit needed) ends where a
# cut starts, and the " " joining it to the next region is followed by what
# follows a cut, so it is a cut too.
_NUMBER_NEXT = r"[\dkKMbmUEGJCAdepaPcs :=]"


class _Around:
    """:class:`_Regions` found from the characters they need, outward.

    A region is the stretch between two cuts (whitespace matching ``cut``)
    that holds a match of ``need``. Scanning a whole text for regions costs
    tens of nanoseconds per character; when ``need`` is rare, jumping to each
    hit (in C) and searching for the cut on either side (backwards: in the
    reversed text, where ``cut_reversed`` matches the same whitespace) costs
    a few regex calls per region instead. Same regions, same order.
    """

    def __init__(self, need: str, cut: str, cut_reversed: str) -> None:
        self._need = re.compile(need)
        self._cut = re.compile(cut)
        self._cut_back = re.compile(cut_reversed)  # a cut, as read in the reversed text

    def find(self, text: str) -> tuple[list[int], list[str]]:
        """(start offsets, texts) of the regions of ``text``, in order."""
        origins: list[int] = []
        found: list[str] = []
        n, pos = len(text), 0
        backwards = ""
        while (hit := self._need.search(text, pos)) is not None:
            at = hit.start()
            backwards = backwards or text[::-1]
            before = self._cut_back.search(backwards, n - 1 - at)
            start = 0 if before is None else n - before.start()
            after = self._cut.search(text, at)
            pos = n if after is None else after.start()
            origins.append(start)
            found.append(text[start:pos])
        return origins, found


# Words (see _words) holding a path's or an identifier's characters, which are rare.
_PATH_WORDS = _Around(r"/|\.[cghijklmprstxy]", r"\s", r"\s")


_ID_WORDS = _Around(r"[\d@-]", r"\s", r"\s")


_NUMBER_SPANS = _Around(r"\d", rf"\s(?!{_NUMBER_NEXT})", rf"\s(?<!{_NUMBER_NEXT}\s)")


def _drop_lead_boundaries(pattern: re.Pattern[str], head: str) -> re.Pattern[str]:
    r"""``pattern`` (``head`` then top-level alternatives) without each alternative's ``\b``.

    _NUMBER and _STRONG_ID start with ``(?:\b|(?=<sign>))`` and most of their
    alternatives repeat the ``\b``. Where the head's ``\b`` holds, the repeat
    is true; where only the sign lookahead holds, an alternative that started
    with ``\b`` cannot match anyway (its first character class excludes the
    sign). Without the repeat, the engine skips an alternative on its first
    character, which makes these scans about a third cheaper.
    """
    source = pattern.pattern
    if not (source.startswith(head) and source.endswith(")")):
        raise ValueError("pattern does not have the expected head")
    parts, depth, in_class, current, i = [], 0, False, "", len(head)
    while i < len(source) - 1:
        c = source[i]
        if c == "\\":
            current += source[i:i + 2]
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c in "()":
            depth += 1 if c == "(" else -1
        elif c == "|" and depth == 0:
            parts.append(current)
            current, i = "", i + 1
            continue
        current += c
        i += 1
    parts.append(current)
    return re.compile(head + "|".join(p.removeprefix(r"\b") for p in parts) + ")")


_NUMBER_FAST = _drop_lead_boundaries(_NUMBER, r"(?:\b|(?=[$€£¥]))(?:")


_STRONG_ID_FAST = _drop_lead_boundaries(_STRONG_ID, r"(?:\b|(?=#))(?:")
