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

import json
import re
from bisect import bisect_right
from collections.abc import Callable, Sequence

from shared.core.errors import InvalidInput
from shared.core.fact_patterns import (
    _CODE_GATE,
    _CODE_ID,
    _CODE_WORDS,
    _FENCE,
    _ID_WORDS,
    _JOINT,
    _NUMBER_FAST,
    _NUMBER_SPANS,
    _PATH,
    _PATH_WORDS,
    _STRONG_ID_FAST,
    _TAG,
    _URL,
    _Around,
    _constraints,
    _Found,
    _id_key,
    _Regions,
    _shell_commands,
    _short_strings,
)
from shared.core.fileops import (
    file_ops,
    looks_like_path,
    runs_something,
    shell_command,
    strip_heredocs,
)
from shared.core.ledger import (
    MAX_FACT_CHARS,
    Fact,
    FileOp,
    Ledger,
    _sorted_facts,
    _sorted_files,
)
from shared.core.messages import Message, validate_message


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
