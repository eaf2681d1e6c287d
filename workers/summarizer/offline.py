"""Extractive summary without an LLM: the default when none is configured, and the fallback.

It cannot understand a conversation, so it reports what can be read off it
mechanically, in the same sections an LLM summary has (so either can update
the other): the goal (first user request), the user's constraints (from the
ledger, verbatim), tool activity, errors seen, the latest requests, key
statements of the agent, facts and file operations. With a previous summary
it merges: earlier items are kept, new ones appended, duplicates dropped,
and the oldest items of the bulkiest sections are trimmed first so the
result never exceeds ``max_chars``. Pure: same input, same text.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from shared.core.errors import InvalidInput
from shared.core.ledger import Ledger
from shared.core.messages import Message, validate_message
from shared.core.tokens import DEFAULT_COUNTER, TokenCounter

SECTIONS = ("Goal", "Constraints", "Done", "In progress", "Key decisions", "Next steps",
            "Critical context", "Read files", "Modified files")
_REPLACED = {"In progress"}  # state, not history: the newest value replaces the old one
_TRIM_LAST = ("Goal", "Constraints", "Modified files")  # trimmed only when nothing else is left
_HEADING = re.compile(r"^\s*(#{1,4})\s*\**\s*(.+?)\s*\**\s*:?\s*$")
_RETURN_CODE = re.compile(
    r"<returncode>\s*(-?\d+)\s*</returncode>|\b(?:exit code|returncode)\W+(\d+)", re.I)
_ERROR_LINE = re.compile(
    r"^\s*(?:[\w.]*(?:Error|Exception|Exit)\b[^\n]*|error(?:\[\w+\])?:.*|fatal:.*|ERROR\b.*|"
    r"FAILED\b.*|.*\b(?:command not found|No such file or directory|Permission denied|"
    r"Internal Server Error|Segmentation fault)\b.*)$",
    re.M,
)
_DECISION = re.compile(
    r"\b(?:I will|I'll|I decided|decided to|instead|the (?:root )?cause|the fix|the issue is|"
    r"the problem is|I am going to|I'm going to|the plan is|approach)\b", re.I)
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_FENCE = re.compile(r"```.*?(?:```|\Z)", re.S)


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: max(0, limit - 1)].rstrip() + "…"


def _shell_or_call(name: str, arguments: str, limit: int) -> str:
    try:
        args = json.loads(arguments)
    except ValueError:
        args = None
    if isinstance(args, dict) and isinstance(args.get("command"), str):
        first = args["command"].strip().split("\n", 1)[0]
        return f"`{_one_line(first, limit)}`"
    return f"{name}({_one_line(arguments, limit - len(name) - 2)})"


def error_signature(text: str) -> str | None:
    """The telling line of a tool result that reports a failure, or None if it looks fine.

    A traceback (or an "Exception occurred:" header) is told by its last
    error line, where Python puts the exception; anything else by its first.
    """
    body = text.strip()
    if not body:
        return None
    if body.startswith("{"):
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        if isinstance(data, dict) and data.get("error"):
            return f"error: {json.dumps(data['error'], ensure_ascii=False)}"
    code = _RETURN_CODE.search(body)
    rc = int(code.group(1) or code.group(2)) if code else 0
    output = re.sub(r"<returncode>.*?</returncode>|</?output>", "", body, flags=re.S).strip()
    lines = [m.group(0).strip() for m in _ERROR_LINE.finditer(output)]
    if lines:
        if "Traceback (most recent call last)" in body or lines[0].endswith(":"):
            telling = [ln for ln in lines if not ln.endswith(":")]
            return telling[-1] if telling else lines[0]
        return lines[0]
    if "Traceback (most recent call last)" in body:
        return "Traceback"
    if rc != 0 and output:  # grep finding nothing exits 1 with no output: not an error
        first = next((ln for ln in output.splitlines() if ln.strip()), "")
        return f"exit code {rc}: {first.strip()}"
    return None


@dataclass(frozen=True, slots=True)
class OfflineSummarizer:
    """Deterministic summarizer; every limit is configurable and ``max_chars`` is a hard cap."""

    max_chars: int = 8000
    max_requests: int = 3
    max_commands: int = 5
    max_errors: int = 5
    max_decisions: int = 4
    goal_chars: int = 600
    item_chars: int = 240
    ledger_chars: int = 2500
    max_tokens: int | None = None
    """A cap in tokens as ``counter`` counts them, on top of ``max_chars`` (a character
    cap alone overshoots on paths and JSON, at about two characters a token)."""
    counter: TokenCounter | None = None

    def __post_init__(self) -> None:
        for name in ("max_chars", "max_requests", "max_commands", "max_errors", "max_decisions",
                     "goal_chars", "item_chars", "ledger_chars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInput("must be a positive integer", field=name)
        if self.max_chars < 200:
            raise InvalidInput("must be at least 200 characters", field="max_chars")
        if self.max_tokens is not None and (isinstance(self.max_tokens, bool) or not isinstance(
                self.max_tokens, int) or self.max_tokens < 1):
            raise InvalidInput("must be a positive integer", field="max_tokens")

    def summarize(self, messages: Sequence[Message], previous: str | None, ledger: Ledger, *,
                  start: int = 0) -> str:
        """Summary of ``previous`` plus ``messages`` (first one at absolute index ``start``)."""
        msgs = [validate_message(m, i) for i, m in enumerate(messages)]
        old = _parse(previous) if previous and previous.strip() else {}
        fresh = self._sections(msgs, ledger, start, has_goal=bool(old.get("Goal")))
        merged = _merge(old, fresh)
        # Requests already answered are history, not next steps: keep the latest few.
        merged["Next steps"] = merged["Next steps"][-(self.max_requests + 2):]
        text = self._bounded(merged, self.max_chars)
        if self.max_tokens is None:
            return text
        counter = self.counter or DEFAULT_COUNTER
        # Trim again to the characters the token cap allows at this text's own density;
        # each pass is shorter by at least 5%, so this ends (at 200 characters at worst).
        while (tokens := counter.text(text)) > self.max_tokens and len(text) > 200:
            text = self._bounded(merged, max(200, int(len(text) * self.max_tokens / tokens
                                                      * 0.95)))
        return text

    # -- extraction --------------------------------------------------------
    def _sections(self, msgs: list[Message], ledger: Ledger, start: int,
                  has_goal: bool) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {name: [] for name in SECTIONS}
        users = [(start + i, m) for i, m in enumerate(msgs)
                 if m.role == "user" and m.text().strip()]
        if users and not has_goal:  # a leading "#" would read as a heading when merged
            goal = _one_line(users[0][1].text(), self.goal_chars)
            out["Goal"].append("\\" + goal if goal.startswith("#") else goal)
            users = users[1:]
        out["Constraints"] = [f"- {f.text}" for f in ledger.constraints]
        names: Counter[str] = Counter()
        commands: list[str] = []
        calls: dict[str, str] = {}
        errors: list[str] = []
        decisions: list[str] = []
        for offset, m in enumerate(msgs):
            i = start + offset
            for tc in m.tool_calls:
                names[tc.name] += 1
                calls[tc.id] = _shell_or_call(tc.name, tc.arguments, self.item_chars // 2)
                commands.append(calls[tc.id])
            if m.role == "tool":
                sig = error_signature(m.text())
                if sig:
                    what = calls.get(m.tool_call_id or "", "tool")
                    errors.append(f"- Error (#{i}, {what}): {_one_line(sig, self.item_chars)}")
            if m.role == "assistant":
                for sentence in _SENTENCE.split(_FENCE.sub(" ", m.text())):
                    if _DECISION.search(sentence) and len(sentence.split()) >= 4:
                        decisions.append(f"- (#{i}) {_one_line(sentence, self.item_chars)}")
        if msgs:
            span = f"#{start}-#{start + len(msgs) - 1}"
            tools = ", ".join(f"{n} x{c}" for n, c in names.most_common(8)) or "none"
            out["Done"].append(f"- Messages {span}: {sum(names.values())} tool calls ({tools}); "
                               f"{len(errors)} errors.")
            recent = list(dict.fromkeys(reversed(commands)))[: self.max_commands]
            if recent:
                out["Done"].append("- Last commands: " + "; ".join(reversed(recent)))
        last = next(((start + i, m) for i, m in reversed(list(enumerate(msgs)))
                     if m.role == "assistant" and m.text().strip()), None)
        if last:
            out["In progress"].append(
                f"- Last agent message (#{last[0]}): {_one_line(last[1].text(), self.item_chars)}")
        out["Key decisions"] = decisions[-self.max_decisions:]
        out["Next steps"] = [f"- Latest user request (#{i}): {_one_line(m.text(), self.item_chars)}"
                             for i, m in users[-self.max_requests:]]
        facts = ledger.model_copy(update={
            "facts": tuple(f for f in ledger.facts if f.kind != "constraint"), "files": ()})
        out["Critical context"] = errors[-self.max_errors:] + facts.capped(
            self.ledger_chars).render().splitlines()[1:]
        out["Read files"] = [f"- {p}" for p in ledger.files_read]
        out["Modified files"] = [f"- {p}" for p in ledger.files_modified]
        return out

    # -- size --------------------------------------------------------------
    def _bounded(self, sections: dict[str, list[str]], max_chars: int) -> str:
        sections = {k: list(v) for k, v in sections.items()}
        text = _render(sections)
        while len(text) > max_chars:
            order = [k for k in sections if k not in _TRIM_LAST and sections[k]] or [
                k for k in _TRIM_LAST[::-1] if sections[k]]
            if not order:
                break
            bulkiest = max(order, key=lambda k: sum(len(x) + 1 for x in sections[k]))
            excess = len(text) - max_chars
            last_long_item = len(sections[bulkiest]) == 1 and \
                len(sections[bulkiest][0]) > excess + 40
            item = sections[bulkiest][0]
            keep = len(item) - excess - 1
            if (bulkiest == "Goal" or last_long_item) and keep >= 20:
                sections[bulkiest][0] = item[:keep].rstrip() + "…"
            else:
                sections[bulkiest].pop(0)  # oldest first
            text = _render(sections)
        return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


def _render(sections: dict[str, list[str]]) -> str:
    def block(name: str) -> str:
        return "\n".join(sections.get(name) or ["- none"])
    return (
        f"## Goal\n{block('Goal')}\n\n## Constraints\n{block('Constraints')}\n\n"
        f"## Progress\n### Done\n{block('Done')}\n### In progress\n{block('In progress')}\n\n"
        f"## Key decisions\n{block('Key decisions')}\n\n## Next steps\n{block('Next steps')}\n\n"
        f"## Critical context\n{block('Critical context')}\n\n"
        f"## Read files\n{block('Read files')}\n\n## Modified files\n{block('Modified files')}"
    )


def _parse(text: str) -> dict[str, list[str]]:
    """Sections of a previous summary (ours or an LLM's); unknown sections become context."""
    out: dict[str, list[str]] = {name: [] for name in SECTIONS}
    current = "Critical context"
    for raw in text.splitlines():
        heading = _HEADING.match(raw)
        if heading:
            title = heading.group(2).strip().rstrip(":")
            known = next((s for s in SECTIONS if s.lower() == title.lower()), None)
            if title.lower() != "progress":
                current = known or "Critical context"
            continue
        line = raw.rstrip()
        if line.strip() and line.strip().lower() not in ("- none", "none", "(none)"):
            out[current].append(line if current == "Goal" or line.lstrip().startswith(("-", "*"))
                                else f"- {line.strip()}")
    return out


def _merge(old: dict[str, list[str]], new: dict[str, list[str]]) -> dict[str, list[str]]:
    if not old:
        return new
    out: dict[str, list[str]] = {}
    for name in SECTIONS:
        before, after = old.get(name, []), new.get(name, [])
        if name == "Goal":
            out[name] = before or after
        elif name in _REPLACED:
            out[name] = after or before
        elif name in ("Read files", "Modified files"):  # an LLM may have annotated the path
            out[name] = before + [x for x in after if not any(_mentions(b, x[2:]) for b in before)]
        else:
            out[name] = list(dict.fromkeys(before + after))
    modified = [line[2:].strip() for line in new["Modified files"]]
    out["Read files"] = [line for line in out["Read files"]
                         if not any(_mentions(line, path) for path in modified)]  # modified wins
    return out


def _mentions(line: str, path: str) -> bool:
    """Whether ``line`` names ``path`` as a whole path (``a.py`` is not in ``data.py``)."""
    return bool(path) and re.search(rf"(?<![\w./-]){re.escape(path)}(?![\w/-])", line) is not None


__all__ = ["SECTIONS", "OfflineSummarizer", "error_signature"]
