"""Emergency truncation: make a view fit without an LLM, as a last resort.

The guard uses this when a request would not fit and no summary is ready. It
works on a *view* (the log is never touched) and a worker heals the loss
later with a real summary. Steps, each only while the view is still over
budget:

1. repair the tool pairs (:mod:`shared.core.repair`), so units are well formed;
2. drop the oldest ``drop_fraction`` of the turns (at least one), repeatedly,
   always keeping the newest turn;
3. inside that last turn keep its user message and drop whole units (a call
   with all its results) from the oldest side, keeping the newest unit;
4. clip the largest remaining message: its text keeps head and tail around a
   marker saying how many characters were removed (:data:`CLIP_MARKER`); where that
   cannot fit a message that carries hosted tool parts (web search results, code
   interpreter output the adapters send back with it: its ``extra_tokens``), their notes
   leave its reasoning and the figure goes with them (the adapters stop sending the
   parts), then its text is clipped as far as still needed;
5. replace the media of the kept tool results and assistant messages, oldest first, with
   a line of text saying what is not sent (:data:`MEDIA_OMITTED`): a step of screenshots
   that does not fit keeps its calls and their texts, where dropping it made the model
   call again and meet the same cut;
6. drop the newest unit too and clip again, leaving the user message alone.

Budget: ``budget_tokens`` bounds the per-message token counts of the returned
list (``counter.message`` summed, leading system messages included, request
overhead and tool definitions excluded: the caller counts those once). The
leading system messages are never dropped or clipped, and neither are tool-call
arguments nor the media of user messages, so the result fits whenever the system
messages plus the newest user message clipped down to its marker fit;
otherwise ``within_budget`` is False and ``tokens_after`` says by how much (not the note:
it is read by the model, to which the cut's internal budget means nothing).

The result's ``note`` is meant for the view (or a truncation summary); it is
not inserted and not counted here.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from shared.core.cheap import without_notes
from shared.core.errors import InvalidInput
from shared.core.messages import FilePart, ImagePart, Message, TextPart
from shared.core.pairs import PairScan, scan_pairs, scan_rest
from shared.core.repair import RepairReport, repair_tool_pairs_with_report
from shared.core.tokens import DEFAULT_COUNTER, EXTRA_TOKENS, TokenCounter, extra_tokens
from shared.core.turns import Unit, leading_system_count, tool_units
from shared.core.wire._common import omitted_text

CLIP_MARKER = "[... {removed} characters removed by emergency truncation ...]"
MEDIA_OMITTED = "emergency truncation removed it to fit the context window"
PATH_KEYS: tuple[str, ...] = ("path", "file_path", "filepath", "filename", "paths", "files")
COMMAND_KEYS: tuple[str, ...] = ("command", "cmd")
MAX_NOTE_FILES = 20
KNOWN_EXTENSIONS = frozenset({
    "py", "pyi", "ipynb", "js", "jsx", "ts", "tsx", "mjs", "cjs", "json", "jsonl", "md", "rst",
    "txt", "yaml", "yml", "toml", "cfg", "ini", "conf", "env", "html", "htm", "css", "scss",
    "xml", "csv", "tsv", "sql", "sh", "bash", "zsh", "c", "h", "cc", "cpp", "hpp", "go", "rs",
    "java", "kt", "rb", "php", "swift", "cs", "lua", "r", "pl", "tex", "lock", "log", "diff",
    "patch", "proto", "graphql", "vue", "svelte"
})
_FILE_NAME = re.compile(r"(?:[\w.-]*/)*[\w-][\w.-]*\.([A-Za-z][A-Za-z0-9]{0,7})")
_HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")


@dataclass(frozen=True, slots=True)
class TruncationResult:
    """The truncated view and an account of what it lost.

    ``dropped`` counts messages removed by truncation (repair changes are in
    ``repair``); ``dropped_prefix`` is how many input messages right after the
    leading system messages are all gone (a watermark may advance by this much;
    units dropped inside the last turn are not part of it). ``truncated`` holds
    indexes into ``messages`` of clipped messages (text clipped or media replaced:
    ``media_removed`` counts the media parts replaced). ``tokens_before`` counts the
    repaired input, ``tokens_after`` the result, both as ``budget_tokens`` does.
    """

    messages: list[Message]
    dropped: int
    dropped_prefix: int
    dropped_by_role: dict[str, int]
    files_touched: tuple[str, ...]
    truncated: tuple[int, ...]
    chars_removed: int
    tokens_before: int
    tokens_after: int
    budget_tokens: int
    within_budget: bool
    repair: RepairReport
    note: str
    media_removed: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.dropped or self.truncated or self.repair.changed)


def _paths_in_command(command: str) -> list[str]:
    """File names in a shell command: ``cat a/b.py`` -> a/b.py.

    A word counts when it has an extension and either a slash or a common
    extension (:data:`KNOWN_EXTENSIONS`), so ``np.linalg`` does not; heredoc
    bodies are skipped. A heuristic: a rare false positive is harmless in a note.
    """
    found: list[str] = []
    ending: str | None = None
    for line in command.splitlines():
        if ending is not None:
            ending = None if line.strip() == ending else ending
            continue
        for word in re.split(r"[\s;|&<>()]+", line):
            word = word.strip("'\"`,")
            match = _FILE_NAME.fullmatch(word) if "://" not in word else None
            if match and ("/" in word or match.group(1).lower() in KNOWN_EXTENSIONS):
                found.append(word)
        heredoc = _HEREDOC.search(line)
        ending = heredoc.group(1) if heredoc else None
    return found


def files_in_calls(messages: Sequence[Message]) -> list[str]:
    """Paths named by the tool calls of ``messages``, in first-seen order.

    Simple on purpose: string (or list of strings) values of :data:`PATH_KEYS`,
    and file names found in :data:`COMMAND_KEYS` strings (see ``_paths_in_command``).
    Arguments that are not a JSON object are skipped.
    """
    seen: dict[str, None] = {}
    for message in messages:
        for call in message.tool_calls:
            seen.update(dict.fromkeys(_files_of_arguments(call.arguments)))
    return list(seen)


@functools.lru_cache(maxsize=4096)
def _files_of_arguments(arguments: str) -> tuple[str, ...]:
    """The paths one call's arguments name, parsed once: a tool chain that outgrows the
    window is cut again on every call, and each cut lists the files of every call it
    drops (without this, a chain's calls cost the square of its length)."""
    try:
        args = json.loads(arguments)
    except ValueError:  # validated JSON at construction; a model_construct'ed call may not be
        return ()
    if not isinstance(args, dict):
        return ()
    seen: dict[str, None] = {}
    for key in PATH_KEYS:
        value = args.get(key)
        values = value if isinstance(value, list) else [value]
        seen.update((v, None) for v in values if isinstance(v, str) and v)
    for key in COMMAND_KEYS:
        if isinstance(args.get(key), str):
            seen.update((p, None) for p in _paths_in_command(args[key]))
    return tuple(seen)


def _clip(original: Message, limit: int, count: TokenCounter) -> tuple[Message, int, int]:
    """:func:`_clip_text`, and the number of hosted notes dropped: where the text clipped
    does not fit and the message carries hosted parts (:data:`EXTRA_TOKENS`), their notes
    leave its reasoning with the figure (a part is sent only while its note is there: the
    two go together), and only then is its text clipped, as far as still needed."""
    clipped, removed = _clip_text(original, limit, count)
    if not extra_tokens(original) or not original.reasoning \
            or count.message(clipped) <= limit:
        return clipped, removed, 0
    kept, kinds = without_notes(original.reasoning)
    if not kinds:  # its notes are not in its reasoning: its parts cannot be told apart
        return clipped, removed, 0
    metadata = {k: v for k, v in original.metadata.items() if k != EXTRA_TOKENS}
    bare = original.model_copy(update={"reasoning": kept or None, "metadata": metadata})
    if count.message(bare) <= limit:
        return bare, 0, len(kinds)
    clipped, removed = _clip_text(bare, limit, count)
    return clipped, removed, len(kinds)


def _clip_text(original: Message, limit: int, count: TokenCounter) -> tuple[Message, int]:
    """``original`` with its longest text cut head and tail to fit ``limit`` tokens if it can
    (else cut to the marker alone), and the number of characters removed."""
    parts = original.content if isinstance(original.content, list) else None
    texts = [p.text for p in parts if isinstance(p, TextPart)] if parts else [original.text()]
    longest = max(texts, key=len, default="")
    if not longest:
        return original, 0

    def build(keep: int) -> Message:
        marker = CLIP_MARKER.format(removed=len(longest) - keep)
        text = f"{longest[:keep - keep // 2]}\n{marker}\n{longest[len(longest) - keep // 2:]}"
        if parts is None:
            return original.model_copy(update={"content": text})
        index = next(i for i, p in enumerate(parts)
                     if isinstance(p, TextPart) and p.text == longest)
        content = [*parts[:index], TextPart(text=text), *parts[index + 1:]]
        return original.model_copy(update={"content": content})

    low, high = 0, len(longest) - 1
    while low < high:
        middle = (low + high + 1) // 2
        if count.message(build(middle)) <= limit:
            low = middle
        else:
            high = middle - 1
    return build(low), len(longest) - low


def _validate(budget_tokens: int, drop_fraction: float) -> None:
    if isinstance(budget_tokens, bool) or not isinstance(budget_tokens, int):
        raise InvalidInput(f"expected an int, got {budget_tokens!r}", field="budget_tokens")
    if budget_tokens < 0:
        raise InvalidInput(f"must be >= 0, got {budget_tokens}", field="budget_tokens")
    if not (isinstance(drop_fraction, int | float) and 0.0 < drop_fraction <= 1.0):
        raise InvalidInput(f"must be in (0, 1], got {drop_fraction!r}", field="drop_fraction")


def _units_and_starts(body: Sequence[Message], offset: int = 0,
                      ) -> tuple[list[Unit], list[int]]:
    """The body's tool units and turn starts, shifted by ``offset``."""
    units = tool_units(body)
    starts = [u.start + offset for u in units if body[u.start].role == "user"]
    return ([Unit(u.start + offset, u.end + offset) for u in units] if offset else units), starts


@dataclass(frozen=True, slots=True)
class TruncationInput:
    """A truncation's input, repaired, counted and split into turns and units once.

    :meth:`cut` truncates it to a budget in time proportional to what is kept
    (prefix sums, not per-message walks), and :meth:`extend` adds messages at
    the end in time proportional to them (and a copy of the lists) while the
    whole stays intact: the calls of one turn that overflows truncate the
    turn so far without walking the history again. Built fresh or extended,
    the same input cuts the same way (a property test holds them equal).
    """

    messages: list[Message]  # the input
    repaired: list[Message]
    repair: RepairReport
    head: int  # leading system messages of ``repaired`` (never dropped)
    fixed: int  # their tokens
    sizes: list[int]  # tokens of each body message (``repaired[head:]``)
    cum: list[int]  # cum[i]: tokens of body[:i]
    units: list[Unit]  # tool units of the body, oldest first
    unit_starts: list[int]
    starts: list[int]  # turn starts of the body
    # id of an input message -> its first index after the leading system messages, where
    # repair made ``repaired`` (intact, ``repaired is messages``: a body message's place
    # is its origin, and an agent that sends one message object every turn does not
    # confuse it)
    origin: dict[int, int]
    scan: PairScan  # of the input from the start: intact means ``repaired is messages``
    memo: dict[int, tuple[dict[str, int], list[str]]] = field(default_factory=dict)
    # gap -> (resume, roles, files) of body[gap:resume], the units a cut last dropped inside
    # the first kept turn: a chain's next cut drops a few more and adds only those
    inside: dict[int, tuple[int, dict[str, int], dict[str, None]]] = field(
        default_factory=dict)

    @property
    def body(self) -> list[Message]:
        return self.repaired[self.head:]

    @classmethod
    def build(cls, messages: Sequence[Message], count: TokenCounter) -> TruncationInput:
        """The input as a fresh truncation sees it (repair, counts, units, turns)."""
        messages = list(messages)
        scan = scan_pairs(messages)
        # intact: repair would hand back the same messages (a property test holds it), so
        # a turn's first cut does not walk the view twice more to learn that
        repaired, repair = ((messages, RepairReport()) if scan.intact
                            else repair_tool_pairs_with_report(messages))
        head = leading_system_count(repaired)
        body = repaired[head:]
        sizes = [count.message(m) for m in body]
        units, starts = _units_and_starts(body)
        origin: dict[int, int] = {}
        if repaired is not messages:  # intact, a body message's place says where it came from
            start = leading_system_count(messages)
            for index, message in enumerate(messages[start:], start):
                origin.setdefault(id(message), index)
        return cls(messages, repaired, repair, head, sum(count.message(m) for m in repaired[:head]),
                   sizes, list(itertools.accumulate(sizes, initial=0)), units,
                   [u.start for u in units], starts, origin, scan)

    def extend(self, new: Sequence[Message], sizes: Sequence[int]) -> TruncationInput | None:
        """The input with ``new`` (counted: ``sizes``) appended, without a walk of what it
        held; None when that cannot be done exactly (the input or the whole needs repair,
        or the head could change): build the whole then."""
        if not new:
            return self
        scan = scan_pairs(new, self.scan) if self.scan.intact else self.scan
        if (not scan.intact or len(self.repaired) == self.head or new[0].role == "system"
                or len(sizes) != len(new)):
            return None
        n = len(self.sizes)
        units, starts = _units_and_starts(new, n)
        messages = [*self.messages, *new]
        cum = self.cum + list(itertools.accumulate(sizes, initial=self.cum[-1]))[1:]
        return TruncationInput(messages, messages, self.repair, self.head, self.fixed,
                               [*self.sizes, *sizes], cum, [*self.units, *units],
                               [*self.unit_starts, *(u.start for u in units)],
                               [*self.starts, *starts], {}, scan,
                               dict(self.memo), dict(self.inside))

    def drop(self, count: int) -> TruncationInput | None:
        """The input without its first ``count`` messages (a watermark moved past them),
        without counting or splitting the rest again; None when that cannot be done
        exactly (the input needs repair or has a head, ``count`` is not a unit's start,
        the rest would need repair): build the rest then."""
        n = len(self.sizes)
        if count == 0:
            return self
        if self.head or not self.scan.intact or not 0 < count < n:
            return None
        at = bisect.bisect_left(self.unit_starts, count)
        if at == len(self.unit_starts) or self.unit_starts[at] != count:
            return None
        messages = self.messages[count:]
        scan = scan_rest(self.scan, messages)  # intact: the rest's ids alone are read
        if scan is None:
            scan = scan_pairs(messages)
        if not scan.intact or messages[0].role == "system":
            return None
        base = self.cum[count]
        units = [Unit(u.start - count, u.end - count) for u in self.units[at:]]
        return TruncationInput(messages, messages, RepairReport(), 0, 0, self.sizes[count:],
                               [c - base for c in self.cum[count:]], units,
                               [u.start for u in units],
                               [s - count for s in self.starts if s >= count], {}, scan)

    def lost_before(self, begin: int) -> tuple[dict[str, int], list[str]]:
        """Roles and files of ``body[:begin]`` (kept: a turn's calls often cut there again)."""
        found = self.memo.get(begin)
        if found is None:
            lost = self.repaired[self.head:self.head + begin]
            found = self.memo[begin] = (dict(Counter(m.role for m in lost)),
                                        files_in_calls(lost))
        return found

    def dropped_inside(self, gap: int, resume: int) -> tuple[dict[str, int], list[str]]:
        """Roles and files of ``body[gap:resume]``, from the last range with this ``gap``
        extended by the messages after it (the input only grows at its end)."""
        found = self.inside.get(gap)
        at, roles, files = (found if found is not None and found[0] <= resume
                            else (gap, {}, {}))
        if at < resume:
            part = self.repaired[self.head + at:self.head + resume]
            roles, files = dict(roles), dict(files)
            for message in part:
                roles[message.role] = roles.get(message.role, 0) + 1
            files.update(dict.fromkeys(files_in_calls(part)))
            if len(self.inside) >= 64:
                self.inside.clear()
            self.inside[gap] = (resume, roles, files)
        return roles, list(files)

    def cut(self, budget_tokens: int, counter: TokenCounter | None = None, *,
            drop_fraction: float = 0.5) -> TruncationResult:
        """Fit the input into ``budget_tokens`` (the module docstring's steps)."""
        _validate(budget_tokens, drop_fraction)
        view = _Cut(self, budget_tokens - self.fixed, counter or DEFAULT_COUNTER)
        view.drop_turns(drop_fraction)
        view.drop_units(keep_newest=True)
        view.clip()
        if view.over():
            view.omit_media()
        if view.over():
            view.drop_units(keep_newest=False)
            view.clip()
        return view.result(budget_tokens)


_FAST_DROP = True  # tests compare the bisection with the walk it replaces


class _Cut:
    """One cut's working state. Kept body messages: ``[begin, gap) + [resume, n)``
    (whole turns before ``begin`` dropped, then units ``[gap, resume)`` inside the
    first kept turn), some of them clipped."""

    def __init__(self, src: TruncationInput, room: int, count: TokenCounter) -> None:
        self.src, self.room, self.count = src, room, count
        self.n = len(src.sizes)
        self.begin, self.gap, self.resume = 0, self.n, self.n
        self.used = src.cum[-1]
        self.clipped: dict[int, tuple[Message, int, int]] = {}  # i -> clipped, removed, size
        self.media: dict[int, int] = {}  # i -> media parts replaced by a line of text
        self.hosted: dict[int, int] = {}  # i -> hosted notes dropped with its figure

    def over(self) -> bool:
        return self.used > self.room

    def kept(self) -> list[int]:
        if self.n == 0:
            return []
        return [*range(self.begin, self.gap), *range(self.resume, self.n)]

    def size(self, i: int) -> int:
        found = self.clipped.get(i)
        return found[2] if found is not None else self.src.sizes[i]

    def span(self, start: int, end: int) -> int:
        """Tokens of body[start:end] as it stands (clipped sizes included)."""
        cum = self.src.cum
        return cum[end] - cum[start] - sum(self.src.sizes[i] - c[2]
                                           for i, c in self.clipped.items() if start <= i < end)

    def drop_turns(self, fraction: float) -> None:
        starts = self.src.starts
        first = 0
        while len(starts) - first > 1 and self.over():
            remaining = len(starts) - first
            first += min(remaining - 1, max(1, math.floor(remaining * fraction)))
            self.begin = starts[first]
            self.used = self.span(self.begin, self.n)

    def drop_units(self, keep_newest: bool) -> None:
        if self.n == 0:
            return
        src = self.src
        at = (bisect.bisect_left(src.unit_starts, self.resume) if self.resume > self.gap
              else bisect.bisect_right(src.unit_starts, self.begin))
        first, last = at, len(src.units)
        limit = last - 1 if keep_newest else last
        if not self.clipped and at < limit and _FAST_DROP:
            # Units partition the body, and nothing is clipped yet: the tokens of units
            # [at, f) are a difference of prefix sums, so the first f that fits is found by
            # bisection, not by a walk over every unit the turn drops.
            cum, units = src.cum, src.units
            base = cum[units[at].start]
            first = bisect.bisect_left(units, self.used - self.room + base, lo=at, hi=limit,
                                       key=lambda u: cum[u.start])
            self.used -= (cum[units[first].start] if first < last else cum[self.n]) - base
        while first < last and (last - first > 1 or not keep_newest) and self.over():
            gone = src.units[first]
            first += 1
            self.used -= self.span(gone.start, gone.end)
        if first > at:
            if self.resume == self.gap:
                self.gap = src.units[at].start
            self.resume = src.units[first].start if first < last else self.n

    def clip(self) -> None:
        body = self.src.body
        done: set[int] = set()
        kept = self.kept()
        while self.over():
            candidates = [i for i in kept if i not in done]
            if not candidates:
                return
            i = max(candidates, key=self.size)
            done.add(i)
            before = self.size(i)
            clipped, removed, hosted = _clip(body[i], before - (self.used - self.room),
                                             self.count)
            size = self.count.message(clipped)
            if size < before:
                self.used -= before - size
                self.clipped[i] = (clipped, removed, size)
                if hosted:
                    self.hosted[i] = hosted

    def omit_media(self) -> None:
        """Replace the media of kept tool results and assistant messages, oldest first,
        while over budget (the user's own media stay): each message is counted once with
        all of its media replaced, and part by part only where that would be more than
        enough."""
        body = self.src.body
        for i in self.kept():
            if not self.over():
                return
            if body[i].role == "user":
                continue
            current = self.clipped[i][0] if i in self.clipped else body[i]
            media = _media_at(current)
            if not media:
                continue
            before = self.size(i)
            take = len(media)
            whole = _omit(current, media)
            size = self.count.message(whole)
            if self.used - before + size <= self.room:
                for take in range(1, len(media)):
                    size = self.count.message(_omit(current, media[:take]))
                    if self.used - before + size <= self.room:
                        break
                else:
                    take = len(media)
                    size = self.count.message(whole)
            omitted = whole if take == len(media) else _omit(current, media[:take])
            removed = self.clipped[i][1] if i in self.clipped else 0
            self.clipped[i] = (omitted, removed, size)
            self.used += size - before
            self.media[i] = take

    def result(self, budget: int) -> TruncationResult:
        src, kept = self.src, self.kept()
        body, head = src.body, src.head
        roles, files = src.lost_before(self.begin)
        roles_inside, files_inside = src.dropped_inside(self.gap, self.resume)
        by_role: Counter[str] = Counter(roles)
        by_role.update(roles_inside)
        files = list(dict.fromkeys([*files, *files_inside]))
        out = [*src.repaired[:head], *(self.clipped[i][0] if i in self.clipped else body[i]
                                       for i in kept)]
        clipped_at = tuple(head + k for k, i in enumerate(kept) if i in self.clipped)
        removed = sum(self.clipped[i][1] for i in kept if i in self.clipped)
        clips = sum(1 for i in kept if i in self.clipped and self.clipped[i][1])
        media = sum(self.media.get(i, 0) for i in kept)
        hosted = sum(self.hosted.get(i, 0) for i in kept)
        if src.repaired is src.messages:
            prefix = kept[0] if kept else len(src.messages) - head
        else:  # a lower bound of the first input place shown after the input's leading
            # system messages (the head's too: repair may move a system message there; a
            # repeated object: its first place there). One repair made (a filled text, a
            # renamed call, an inserted result) stands for nothing or for an input message
            # after those shown before it, where repair kept the order (no result moved)
            start = leading_system_count(src.messages)
            ordered = not src.repair.moved_results
            places: list[int] = []
            for m in (*src.repaired[start:head], *(body[i] for i in kept)):
                place = src.origin.get(id(m))
                if place is None:
                    place = max(start, places[-1] + 1) if places and ordered else start
                places.append(max(place, places[-1]) if places and ordered else place)
            prefix = min(places, default=len(src.messages)) - start
        after = src.fixed + self.used
        return TruncationResult(
            messages=out, dropped=self.n - len(kept), dropped_prefix=max(0, prefix),
            dropped_by_role=dict(by_role), files_touched=tuple(files), truncated=clipped_at,
            chars_removed=removed, tokens_before=src.fixed + src.cum[-1],
            tokens_after=after, budget_tokens=budget, within_budget=after <= budget,
            repair=src.repair,
            note=_note(by_role, files, clips, removed, media, hosted),
            media_removed=media,
        )


def _media_at(message: Message) -> list[int]:
    """Indexes of ``message``'s image and file parts."""
    if isinstance(message.content, str):
        return []
    return [j for j, p in enumerate(message.content) if isinstance(p, ImagePart | FilePart)]


def _omit(message: Message, at: Sequence[int]) -> Message:
    """``message`` with the media parts at ``at`` replaced by a line saying they are not sent
    (the wording the OpenAI view uses for media it cannot carry)."""
    assert isinstance(message.content, list)  # _media_at found parts
    content = list(message.content)
    for j in at:
        part = content[j]
        assert isinstance(part, ImagePart | FilePart)
        content[j] = TextPart(text=omitted_text(part, MEDIA_OMITTED))
    return message.model_copy(update={"content": content})


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _note(dropped: Counter[str], files: list[str], clips: int, removed: int,
          media: int, hosted: int = 0) -> str:
    """What the cut lost, for the model to read; "" when it lost nothing (a view the cut
    left whole is the same conversation: a note would read as a compaction that never
    happened). Whether the result fits is the caller's (``within_budget``,
    ``tokens_after``), never the note's: the cut's budget is an internal figure (a
    recovery's can be scaled down to a few tokens), and a note saying "still over budget:
    8 > 1 tokens" was sent to the model in the summary block."""
    if not (dropped or clips or media or hosted):
        return ""
    parts = []
    if dropped:
        ranked = sorted(dropped.items(), key=lambda item: (-item[1], item[0]))
        roles = ", ".join(f"{n} {role}" for role, n in ranked)
        parts.append(f"{_plural(sum(dropped.values()), 'earlier message')} dropped ({roles})")
    if files:
        more = f" (+{len(files) - MAX_NOTE_FILES} more)" if len(files) > MAX_NOTE_FILES else ""
        parts.append("files touched: " + ", ".join(files[:MAX_NOTE_FILES]) + more)
    if clips:
        parts.append(f"{_plural(clips, 'message')} clipped ({removed} characters removed)")
    if media:
        parts.append(f"{_plural(media, 'media part')} of tool steps replaced by a note")
    if hosted:
        parts.append(f"{_plural(hosted, 'hosted tool part')} (provider-run calls and their "
                     "results) removed")
    return "[context truncated: " + "; ".join(parts) + "]"


def emergency_truncate(
    messages: Sequence[Message],
    budget_tokens: int,
    counter: TokenCounter | None = None,
    *,
    drop_fraction: float = 0.5,
) -> TruncationResult:
    """Fit ``messages`` into ``budget_tokens`` (see the module docstring). Never mutates input."""
    _validate(budget_tokens, drop_fraction)
    count = counter or DEFAULT_COUNTER
    return TruncationInput.build(messages, count).cut(budget_tokens, count,
                                                      drop_fraction=drop_fraction)


__all__ = [
    "CLIP_MARKER",
    "COMMAND_KEYS",
    "MEDIA_OMITTED",
    "PATH_KEYS",
    "TruncationInput",
    "TruncationResult",
    "emergency_truncate",
    "files_in_calls",
]
