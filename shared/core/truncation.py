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
   marker saying how many characters were removed (:data:`CLIP_MARKER`);
5. drop the newest unit too and clip again, leaving the user message alone.

Budget: ``budget_tokens`` bounds the per-message token counts of the returned
list (``counter.message`` summed, leading system messages included, request
overhead and tool definitions excluded: the caller counts those once). The
leading system messages are never dropped or clipped, and neither are media
parts or tool-call arguments, so the result fits whenever the system
messages plus the newest user message clipped down to its marker fit;
otherwise ``within_budget`` is False and the note says by how much.

The result's ``note`` is meant for the view (or a truncation summary); it is
not inserted and not counted here.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from shared.core.errors import InvalidInput
from shared.core.messages import Message, TextPart
from shared.core.repair import RepairReport, repair_tool_pairs_with_report
from shared.core.tokens import DEFAULT_COUNTER, TokenCounter
from shared.core.turns import leading_system_count, tool_units, turn_starts

CLIP_MARKER = "[... {removed} characters removed by emergency truncation ...]"
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
    indexes into ``messages`` of clipped messages. ``tokens_before`` counts the
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
            args = call.args()
            if not isinstance(args, dict):
                continue
            for key in PATH_KEYS:
                value = args.get(key)
                values = value if isinstance(value, list) else [value]
                seen.update((v, None) for v in values if isinstance(v, str) and v)
            for key in COMMAND_KEYS:
                if isinstance(args.get(key), str):
                    seen.update((p, None) for p in _paths_in_command(args[key]))
    return list(seen)


def _clip(original: Message, limit: int, count: TokenCounter) -> tuple[Message, int]:
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


class _View:
    """Mutable working state: which body messages are kept, and their clipped forms."""

    def __init__(self, body: list[Message], room: int, count: TokenCounter) -> None:
        self.body, self.room, self.count = body, room, count
        self.sizes = [count.message(m) for m in body]
        self.kept = list(range(len(body)))
        self.used = self.initial = sum(self.sizes)
        self.clipped: dict[int, tuple[Message, int]] = {}

    def over(self) -> bool:
        return self.used > self.room

    def keep(self, kept: list[int]) -> None:
        self.kept = kept
        self.used = sum(self.sizes[i] for i in kept)

    def drop_turns(self, fraction: float) -> None:
        starts = turn_starts(self.body)
        first = 0
        while len(starts) - first > 1 and self.over():
            remaining = len(starts) - first
            first += min(remaining - 1, max(1, math.floor(remaining * fraction)))
            self.keep(list(range(starts[first], len(self.body))))

    def drop_units(self, keep_newest: bool) -> None:
        if not self.kept:
            return
        start, kept = self.kept[0], set(self.kept)
        units = [u for u in tool_units(self.body) if u.start > start and u.start in kept]
        while units[:1] and (len(units) > 1 or not keep_newest) and self.over():
            gone = units.pop(0)
            kept.difference_update(range(gone.start, gone.end))
            self.used -= sum(self.sizes[gone.start:gone.end])
        self.kept = sorted(kept)

    def clip(self, originals: list[Message]) -> None:
        done: set[int] = set()
        while self.over():
            candidates = [i for i in self.kept if i not in done]
            if not candidates:
                return
            i = max(candidates, key=lambda k: self.sizes[k])
            done.add(i)
            clipped, removed = _clip(originals[i], self.sizes[i] - (self.used - self.room),
                                     self.count)
            size = self.count.message(clipped)
            if size < self.sizes[i]:
                self.used -= self.sizes[i] - size
                self.clipped[i], self.sizes[i] = (clipped, removed), size


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _note(dropped: Counter[str], files: list[str], clips: int, removed: int,
          over: int, after: int, budget: int) -> str:
    if not (dropped or clips or over):
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
    if over:
        parts.append(f"still over budget: {after} > {budget} tokens")
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
    repaired, repair = repair_tool_pairs_with_report(messages)
    head = leading_system_count(repaired)
    body = repaired[head:]
    fixed = sum(count.message(m) for m in repaired[:head])
    view = _View(body, budget_tokens - fixed, count)
    view.drop_turns(drop_fraction)
    view.drop_units(keep_newest=True)
    view.clip(body)
    if view.over():
        view.drop_units(keep_newest=False)
        view.clip(body)

    kept = set(view.kept)
    lost = [m for i, m in enumerate(body) if i not in kept]
    out = [*repaired[:head], *(view.clipped[i][0] if i in view.clipped else body[i]
                               for i in view.kept)]
    clipped_at = tuple(head + k for k, i in enumerate(view.kept) if i in view.clipped)
    removed = sum(view.clipped[i][1] for i in view.kept if i in view.clipped)
    origin: dict[int, int] = {}
    for index, message in enumerate(messages):
        origin.setdefault(id(message), index)
    input_head = leading_system_count(messages)
    kept_origins = [origin[id(body[i])] for i in view.kept if id(body[i]) in origin]
    prefix = (min(kept_origins) if kept_origins else len(messages)) - input_head
    after = fixed + view.used
    files = files_in_calls(lost)
    by_role: Counter[str] = Counter(m.role for m in lost)
    return TruncationResult(
        messages=out, dropped=len(lost), dropped_prefix=max(0, prefix),
        dropped_by_role=dict(by_role), files_touched=tuple(files), truncated=clipped_at,
        chars_removed=removed, tokens_before=fixed + view.initial,
        tokens_after=after, budget_tokens=budget_tokens, within_budget=after <= budget_tokens,
        repair=repair,
        note=_note(by_role, files, len(clipped_at), removed, max(0, after - budget_tokens),
                   after, budget_tokens),
    )


__all__ = [
    "CLIP_MARKER",
    "COMMAND_KEYS",
    "PATH_KEYS",
    "TruncationResult",
    "emergency_truncate",
    "files_in_calls",
]
