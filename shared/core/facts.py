"""Deterministic extraction of a range's facts and file operations (no LLM).

What is extracted, and from where (system messages are never summarized,
tool results are bulky and left to the summarizer):

- user text: URLs, paths, identifiers, meaningful numbers, shell commands
  in backticks or shell code fences, and constraint sentences;
- assistant text: URLs, paths, strong identifiers (ids, hashes, tickets),
  numbers;
- tool calls: identifiers, numbers and URLs in short arguments, commands
  that run something (pure inspection such as ``cat`` or ``grep`` is
  recorded only as a file read), and file operations: paths read or
  modified, from file tools' arguments and from bash commands split as
  :mod:`shlex` splits them (tolerant of garbage: a command that does not
  parse yields what its words suggest, never an exception).

Workers extract a range per job, so the cost is per call: every message is
planned first and the texts of the whole range are then scanned in one batch
per pattern, restricted to the regions that can hold a match (see
``_ScanBatch``), which gives exactly what scanning text by text gives. The
result is a :class:`shared.core.ledger.Ledger`.
"""

from __future__ import annotations

import functools
import json
import re
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from shared.core.errors import InvalidInput
from shared.core.fileops import (
    file_ops,
    is_program,
    looks_like_path,
    runs_something,
    shell_command,
    strip_heredocs,
)
from shared.core.ledger import (
    MAX_CONSTRAINT_CHARS,
    MAX_FACT_CHARS,
    Fact,
    FileOp,
    Ledger,
    _sorted_facts,
    _sorted_files,
)
from shared.core.messages import Message, validate_message

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
    r"|\bv\d+(?:\.\d+){1,3}\b|\b\d+\.\d+\.\d+(?:[-.]?(?:rc|a|b|dev|post)\d*)?\b"
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
    r"|\b(?!(?:UTF|ISO|SHA|MD|AES|GMT|UTC)-)[A-Z][A-Z0-9]{1,9}-\d{1,7}\b|(?<![\w&])#\d{2,}\b"
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
_CONSTRAINT = re.compile(
    r"\b(?:must|mustn't|never|always|ensure|without|required?|mandatory|forbidden|not allowed|"
    r"avoid|should not|shouldn't|no more than|at most|at least|from now on|going forward|"
    r"remember to|keep in mind|I (?:do not|don't) want)\b"
    r"|\bprefer(?:red|ably)?\b"
    r"|(?:^|\b(?:please|you|and|but|so|just)\s+)(?:do not|don't|make sure|only|keep|use|stick to)\b"
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
    """The facts of one text, pass by pass: the definition :class:`_ScanBatch` equals.

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


class _ScanBatch:
    """All texts of a range scanned together, one pass per pattern.

    :func:`_scan` runs its five patterns over every text, though most texts of
    a range hold nothing for most patterns, whose many alternatives cost
    100-200 ns per character. Here each pass keeps the texts its gate admits
    (a character test in C), joins them with :data:`_JOINT`, keeps only the
    regions that can hold a match (:class:`_Regions`), runs its pattern once
    over those and gives each match to its text by offset. Masking keeps
    lengths, so offsets hold across passes. Each text's list gets its facts
    in :func:`_scan`'s order (pass by pass, by position within a pass).
    """

    def __init__(self) -> None:
        self._texts: list[str] = []
        self._outs: list[_Found] = []
        self._paths: list[bool] = []
        self._coded: list[bool] = []
        self._known: dict[tuple[str, bool, bool], _Found] = {}

    def add(self, text: str, *, code_ids: bool, paths: bool = True) -> _Found:
        """The list :meth:`run` fills with ``_scan(text, _STRONG_ID, ...)``.

        A text seen before in the batch (same flags) gets the same list, read-only
        for the callers: ranges repeat commands, paths and stock phrases.
        """
        known = self._known.get((text, code_ids, paths))
        if known is not None:
            return known
        out: _Found = []
        if text:  # an empty text has no facts
            self._known[(text, code_ids, paths)] = out
            self._texts.append(text)
            self._outs.append(out)
            self._paths.append(paths)
            self._coded.append(code_ids)
        return out

    def run(self) -> None:
        """Fill every list :meth:`add` returned: :func:`_scan`'s passes, in its order."""
        texts, outs = self._texts, self._outs
        self._pass(_TAG, "", [], [i for i, t in enumerate(texts) if "<" in t])
        self._pass(_URL, "url", outs, [i for i, t in enumerate(texts) if "://" in t])
        discard: _Found = []  # paths in shell bodies: blanked, never recorded
        path_outs = [o if p else discard for o, p in zip(outs, self._paths, strict=True)]
        # Path, number and identifier regions are found from their rare
        # characters in one search over all texts: no text-by-text gate.
        every = list(range(len(texts)))
        self._pass(_PATH, "path", path_outs, every, words=_PATH_WORDS, keep=looks_like_path)
        self._pass(_NUMBER_FAST, "number", outs, every, words=_NUMBER_SPANS)
        self._pass(_STRONG_ID_FAST, "identifier", outs, every, words=_ID_WORDS)
        self._pass(_CODE_ID, "identifier", outs,
                   [i for i, (t, c) in enumerate(zip(texts, self._coded, strict=True))
                    if c and _CODE_GATE.search(t)], words=_CODE_WORDS, mask=False)

    def _pass(self, pattern: re.Pattern[str], kind: str, outs: list[_Found], chosen: list[int],
              *, words: _Regions | _Around | None = None, keep: Callable[[str], bool] | None = None,
              mask: bool = True) -> None:
        """Run ``pattern`` once over the ``chosen`` texts, recording and blanking its matches.

        ``kind`` "" blanks without recording (markup tags); ``words``: scan
        only the words it finds.
        """
        if not chosen:
            return
        texts = self._texts
        starts: list[int] = []
        pos = 0
        for i in chosen:
            starts.append(pos)
            pos += len(texts[i]) + len(_JOINT)
        joined = _JOINT.join([texts[i] for i in chosen])
        if words is None:
            scanned, origins, offsets = joined, [0], [0]
        else:
            origins, found = words.find(joined)
            if not found:
                return
            offsets, pos = [], 0
            for word in found:
                offsets.append(pos)
                pos += len(word) + 1
            scanned = " ".join(found)
        hits: list[tuple[int, int]] = []
        for m in pattern.finditer(scanned):
            k = bisect_right(offsets, m.start()) - 1
            at = origins[k] + m.start() - offsets[k]
            match = m.group(0)
            hits.append((at, at + len(match)))
            value = match.rstrip(".,;:!?")
            if kind and value and len(value) <= MAX_FACT_CHARS and (keep is None or keep(value)):
                outs[chosen[bisect_right(starts, at) - 1]].append((kind, value))
        if mask and hits:
            pieces: list[str] = []
            done = 0
            for a, b in hits:
                pieces += (joined[done:a], " " * (b - a))
                done = b
            pieces.append(joined[done:])
            masked = "".join(pieces)
            for i, at in zip(chosen, starts, strict=True):
                texts[i] = masked[at:at + len(texts[i])]


def _tool_call_facts(name: str, arguments: str, batch: _ScanBatch) -> tuple[list[_Found], _Found]:
    """The facts of one tool call, in order, as lists (some filled later by ``batch``)."""
    parts: list[_Found] = []
    try:
        args = json.loads(arguments)
    except ValueError:
        args = {}
    command = shell_command(name, args)
    if command is not None:
        body = strip_heredocs(command)
        parts.append(batch.add(body, code_ids=True, paths=False))  # paths: see file_ops
        first = command.strip().split("\n", 1)[0].strip()
        if first and len(first) <= MAX_FACT_CHARS and runs_something(first):
            parts.append([("command", first)])
    else:
        for key, value in _short_strings(args):
            stripped = value.strip()
            if stripped and " " not in stripped and _id_key(key):
                parts.append([("identifier", stripped)])
            else:
                parts.append(batch.add(value, code_ids=True))
    return parts, file_ops(name, args)


class _Planner:
    """What one :func:`extract_facts` call has planned so far.

    Agents repeat themselves within a range (the same test command, the same
    file read, "Continue."); the facts of a tool call or a user text depend on
    nothing else, so a repeat reuses the first plan (its lists are read-only).
    """

    def __init__(self) -> None:
        self.batch = _ScanBatch()
        self._calls: dict[tuple[str, str], tuple[list[_Found], _Found]] = {}
        self._users: dict[str, list[_Found]] = {}

    def message(self, m: Message) -> tuple[list[_Found], _Found]:
        """(facts in order of appearance, as lists; file operations) of one message."""
        if m.role == "user":
            return self._user(m.text()), []
        if m.role != "assistant":
            return [], []
        parts = [self.batch.add(m.text(), code_ids=False)]
        files: list[tuple[str, str]] = []
        for tc in m.tool_calls:
            planned = self._calls.get((tc.name, tc.arguments))
            if planned is None:
                planned = _tool_call_facts(tc.name, tc.arguments, self.batch)
                self._calls[(tc.name, tc.arguments)] = planned
            parts += planned[0]
            files += planned[1]
        return parts, files

    def _user(self, text: str) -> list[_Found]:
        planned = self._users.get(text)
        if planned is None:
            prose = _FENCE.sub(" ", text) if "```" in text else text
            planned = [self.batch.add(prose, code_ids=True), _shell_commands(text, prose),
                       _constraints(prose)]
            self._users[text] = planned
        return planned


def extract_facts(messages: Sequence[Message], *, start: int = 0) -> Ledger:
    """The ledger of ``messages``, whose first element has absolute index ``start``.

    Every message is planned first (its facts as lists in order of appearance,
    the regex ones left to a batch), then the batch scans the whole range's
    texts at once and fills them in (see :class:`_ScanBatch`).
    """
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise InvalidInput("must be a non-negative integer", field="start")
    planner = _Planner()
    planned = [planner.message(validate_message(raw, offset))
               for offset, raw in enumerate(messages)]
    planner.batch.run()
    # Plain [first, last, count] lists while counting (a frozen model copied per
    # repeat cost more than the scan of short messages); models once at the end.
    facts: dict[tuple[str, str], list[int]] = {}
    files: dict[str, tuple[list[int], list[str]]] = {}
    for i, (parts, ops) in enumerate(planned, start):
        if not parts and not ops:  # tool results, system messages
            continue
        for key in dict.fromkeys([fact for part in parts for fact in part]):
            seen = facts.get(key)
            if seen is None:
                facts[key] = [i, i, 1]
            else:
                seen[1] = i
                seen[2] += 1
        touched: dict[str, str] = {}
        for path, status in ops:
            touched[path] = "modified" if "modified" in (touched.get(path), status) else status
        for path, status in touched.items():
            prev = files.get(path)
            if prev is None:
                files[path] = ([i, i, 1], [status])
            else:
                prev[0][1] = i
                prev[0][2] += 1
                if status == "modified":
                    prev[1][0] = "modified"
    fact_models = [Fact(kind=kind, text=text, first_seen=a, last_seen=b, count=n)
                   for (kind, text), (a, b, n) in facts.items()]
    file_models = [FileOp(path=path, status=status, first_seen=a, last_seen=b, count=n)
                   for path, ((a, b, n), [status]) in files.items()]
    return Ledger(start=start, end=start + len(messages), facts=_sorted_facts(fact_models),
                  files=_sorted_files(file_models))


__all__ = ["extract_facts", "file_ops"]
