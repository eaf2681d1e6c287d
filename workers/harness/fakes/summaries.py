"""A fake summarizer model for the fake servers: sectioned, bounded, lossy on purpose.

It answers a summarization request (our prompts) the way a cheap model
would: the required sections, a merge of the previous summary when the
request is an update, a line about the new messages, and only a fraction of
the facts it was shown (``keep_facts``), so tests can check that the fact
ledger, not the model, carries identifiers through many compactions.
Agent turns (no summarizer system prompt) get a short echo.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from workers.harness.fakes.behaviour import request_texts

_PREVIOUS = re.compile(r"<previous_summary>\n(.*?)\n</previous_summary>", re.S)
_FACTS = re.compile(r"<facts>\n(.*?)\n</facts>", re.S)
_MESSAGE = re.compile(r'<message index="(\d+)"')
SECTIONS = ("Goal", "Constraints", "Progress", "Key decisions", "Next steps",
            "Critical context", "Read files", "Modified files")


@dataclass(frozen=True)
class SummarizerResponder:
    """Callable responder for FakeOpenAIServer / FakeGeminiServer."""

    keep_facts: float = 1.0
    max_lines_per_section: int = 12
    marker: str = "summar"

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        system, user, _ = request_texts(request)
        if self.marker not in system.lower():
            return {"role": "assistant", "content": "OK, continuing."}
        return {"role": "assistant", "content": self.summarize(user)}

    def summarize(self, prompt: str) -> str:
        sections: dict[str, list[str]] = {name: [] for name in SECTIONS}
        previous = _PREVIOUS.search(prompt)
        if previous:
            current = "Goal"
            for line in previous.group(1).splitlines():
                heading = line.lstrip("#").strip()
                if line.startswith("## ") and heading in sections:
                    current = heading
                elif line.strip() and not line.startswith("#"):
                    sections[current].append(line.strip())
        indexes = [int(i) for i in _MESSAGE.findall(prompt)]
        if indexes:
            sections["Progress"].append(
                f"- Done: worked through messages #{min(indexes)}-#{max(indexes)}.")
        facts = _FACTS.search(prompt)
        if facts:
            lines = [ln.strip() for ln in facts.group(1).splitlines()
                     if ln.strip().startswith("- ")]
            keep = lines[: int(len(lines) * self.keep_facts)]
            sections["Critical context"].extend(keep[::1])
        if not sections["Goal"]:
            sections["Goal"].append("- Continue the user's task.")
        out: list[str] = []
        for name in SECTIONS:
            out.append(f"## {name}")
            items = list(dict.fromkeys(sections[name]))[-self.max_lines_per_section:]
            out.extend(items or ["- (none)"])
            out.append("")
        return "\n".join(out).strip()


__all__ = ["SummarizerResponder"]
