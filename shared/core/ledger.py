"""Deterministic fact ledger carried verbatim beside every summary.

LLM summaries keep the gist and lose the details an agent needs to carry on:
file paths, commands, identifiers, amounts, and the user's exact
constraints. The ledger keeps those without an LLM, so they survive any
number of compactions word for word. Workers build it with
:func:`shared.core.facts.extract_facts` and :meth:`Ledger.merge`; the guard
injects ``ledger.missing_from(summary).capped(n).render()`` beside the
summary. This module holds the ledger itself (facts, file operations,
merging, capping, rendering); :mod:`shared.core.facts` extracts them.

Indexes are absolute (``start`` + position), so ledgers of consecutive
ranges merge exactly: ``extract(m[:k]).merge(extract(m[k:], start=k)) ==
extract(m)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from shared.core.errors import InvalidInput

FactKind = Literal["identifier", "path", "url", "command", "number", "constraint"]
FileStatus = Literal["read", "modified"]

MAX_FACT_CHARS = 240
MAX_CONSTRAINT_CHARS = 400
_LABELS = {"identifier": "id", "path": "path", "url": "url", "command": "cmd", "number": "num"}
HEADERS = ("## Facts (verbatim)", "## Constraints", "## Files read", "## Files modified")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Fact(_Frozen):
    """One verbatim fact; ``count`` is the number of messages it was seen in."""

    kind: FactKind
    text: str = Field(min_length=1, max_length=2000)
    first_seen: int = Field(ge=0)
    last_seen: int = Field(ge=0)
    count: int = Field(default=1, ge=1)

    @field_validator("text")
    @classmethod
    def _one_line(cls, value: str) -> str:
        if "\n" in value or "\r" in value or not value.strip():
            raise ValueError("a fact is one non-blank line")
        return value

    @model_validator(mode="after")
    def _ordered(self) -> Fact:
        if self.last_seen < self.first_seen:
            raise ValueError("last_seen comes before first_seen")
        return self


class FileOp(_Frozen):
    """A file the agent touched; ``modified`` wins over ``read`` for good."""

    path: str = Field(min_length=1, max_length=1000)
    status: FileStatus
    first_seen: int = Field(ge=0)
    last_seen: int = Field(ge=0)
    count: int = Field(default=1, ge=1)


def _combine_counts(a: int, b: int, overlap: bool) -> int:
    # Disjoint ranges saw different messages: counts add up. Overlapping ranges
    # (a retry, a re-extraction) may have seen the same ones: take the larger.
    return max(a, b) if overlap else a + b


class Ledger(_Frozen):
    """Facts and file operations for messages ``[start, end)``; JSON-serializable."""

    start: int = Field(default=0, ge=0)
    end: int = Field(default=0, ge=0)
    facts: tuple[Fact, ...] = ()
    files: tuple[FileOp, ...] = ()

    @model_validator(mode="after")
    def _range(self) -> Ledger:
        if self.end < self.start:
            raise ValueError("end comes before start")
        return self

    # -- views -------------------------------------------------------------
    @property
    def constraints(self) -> tuple[Fact, ...]:
        return tuple(f for f in self.facts if f.kind == "constraint")

    @property
    def files_read(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files if f.status == "read")

    @property
    def files_modified(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files if f.status == "modified")

    def is_empty(self) -> bool:
        return not self.facts and not self.files

    def to_json(self) -> str:
        return self.model_dump_json(exclude_defaults=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> Ledger:
        return cls.model_validate_json(raw)

    # -- combination -------------------------------------------------------
    def merge(self, newer: Ledger) -> Ledger:
        """Union of both ledgers: first-seen kept, duplicates folded, modified wins.

        Idempotent (``a.merge(a) == a``) and, for ledgers of consecutive
        ranges, associative and order-independent.
        """
        overlap = max(self.start, newer.start) < min(self.end, newer.end) or (
            (self.start, self.end) == (newer.start, newer.end)
        )
        # Fold the older range first whatever the call order, so ties in first_seen keep
        # the order of appearance and a.merge(b) == b.merge(a) for disjoint ranges.
        older, later = sorted((self, newer), key=lambda ledger: (ledger.start, ledger.end))
        facts: dict[tuple[str, str], Fact] = {}
        for f in (*older.facts, *later.facts):
            old = facts.get((f.kind, f.text))
            facts[(f.kind, f.text)] = f if old is None else old.model_copy(update={
                "first_seen": min(old.first_seen, f.first_seen),
                "last_seen": max(old.last_seen, f.last_seen),
                "count": _combine_counts(old.count, f.count, overlap),
            })
        files: dict[str, FileOp] = {}
        for op in (*older.files, *later.files):
            prev = files.get(op.path)
            files[op.path] = op if prev is None else prev.model_copy(update={
                "status": "modified" if "modified" in (prev.status, op.status) else "read",
                "first_seen": min(prev.first_seen, op.first_seen),
                "last_seen": max(prev.last_seen, op.last_seen),
                "count": _combine_counts(prev.count, op.count, overlap),
            })
        has_range = self.end > self.start, newer.end > newer.start
        if all(has_range) or not any(has_range):
            start, end = min(self.start, newer.start), max(self.end, newer.end)
        else:
            start, end = (self.start, self.end) if has_range[0] else (newer.start, newer.end)
        return Ledger(start=start, end=end, facts=_sorted_facts(facts.values()),
                      files=_sorted_files(files.values()))

    def missing_from(self, text: str) -> Ledger:
        """The facts and files that ``text`` does not contain verbatim (to inject)."""
        return self.model_copy(update={
            "facts": tuple(f for f in self.facts if f.text not in text),
            "files": tuple(f for f in self.files if f.path not in text),
        })

    def capped(self, max_chars: int) -> Ledger:
        """A sub-ledger whose :meth:`render` is at most ``max_chars`` characters.

        Priority, so that summary plus ledger never grow without bound while
        the most useful lines survive: (1) constraints, (2) modified files,
        (3) other facts, (4) files read. Within each group, items are taken
        alternately from the most recent (``last_seen``) and the most frequent
        (``count``) not yet taken; an item that does not fit is skipped and
        smaller ones after it may still be taken. A path fact that repeats a
        tracked file costs nothing (it is not rendered) and stays with its file.
        """
        if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 0:
            raise InvalidInput("must be a non-negative integer", field="max_chars")
        facts = self._shown_facts()
        groups: list[list[Fact | FileOp]] = [
            [f for f in facts if f.kind == "constraint"],
            [f for f in self.files if f.status == "modified"],
            [f for f in facts if f.kind != "constraint"],
            [f for f in self.files if f.status == "read"],
        ]
        used, opened = 0, set[int]()
        keep_facts: list[Fact] = []
        keep_files: list[FileOp] = []
        for group in groups:
            for item in _interleave(group):
                section = _section_of(item)
                cost = 1 + len(_line(item))
                if section not in opened:
                    cost += len(HEADERS[section]) + (2 if opened else 0)
                if used + cost > max_chars:
                    continue
                used += cost
                opened.add(section)
                if isinstance(item, Fact):
                    keep_facts.append(item)
                else:
                    keep_files.append(item)
        kept_paths = {f.path for f in keep_files}
        kept = {id(f) for f in (*keep_facts, *keep_files)}
        return self.model_copy(update={
            "facts": tuple(f for f in self.facts if id(f) in kept
                           or (f.kind == "path" and f.text in kept_paths)),
            "files": tuple(f for f in self.files if id(f) in kept),
        })

    def _shown_facts(self) -> tuple[Fact, ...]:
        """Facts worth a line: a path already listed under the files is not repeated."""
        tracked = {f.path for f in self.files}
        return tuple(f for f in self.facts if not (f.kind == "path" and f.text in tracked))

    def render(self) -> str:
        """Compact markdown: the four sections that have content, in fixed order."""
        sections: list[list[str]] = [[], [], [], []]
        items: tuple[Fact | FileOp, ...] = (*self._shown_facts(), *self.files)
        for item in items:
            sections[_section_of(item)].append(_line(item))
        blocks = [HEADERS[i] + "".join("\n" + line for line in lines)
                  for i, lines in enumerate(sections) if lines]
        return "\n\n".join(blocks)


def _section_of(item: Fact | FileOp) -> int:
    if isinstance(item, Fact):
        return 1 if item.kind == "constraint" else 0
    return 3 if item.status == "modified" else 2


def _line(item: Fact | FileOp) -> str:
    if isinstance(item, FileOp):
        return f"- {item.path}"
    if item.kind == "constraint":
        return f"- {item.text}"
    return f"- {_LABELS[item.kind]}: {item.text}"


def _interleave(items: list[Fact | FileOp]) -> Iterable[Fact | FileOp]:
    """Alternate between most recent and most frequent, each item once."""
    recent = sorted(items, key=lambda f: (-f.last_seen, -f.count, f.first_seen))
    frequent = sorted(items, key=lambda f: (-f.count, -f.last_seen, f.first_seen))
    seen: set[int] = set()
    for pair in zip(recent, frequent, strict=True):
        for item in pair:
            if id(item) not in seen:
                seen.add(id(item))
                yield item


_KIND_ORDER = {"constraint": 0, "identifier": 1, "path": 2, "url": 3, "command": 4, "number": 5}


def _sorted_facts(facts: Iterable[Fact]) -> tuple[Fact, ...]:
    # Stable: facts first seen in the same message keep their order of appearance.
    return tuple(sorted(facts, key=lambda f: (f.first_seen, _KIND_ORDER[f.kind])))


def _sorted_files(files: Iterable[FileOp]) -> tuple[FileOp, ...]:
    return tuple(sorted(files, key=lambda f: f.first_seen))


# -- extraction ------------------------------------------------------------


__all__ = [
    "HEADERS", "MAX_CONSTRAINT_CHARS", "MAX_FACT_CHARS", "Fact", "FactKind", "FileOp",
    "FileStatus", "Ledger",
]
