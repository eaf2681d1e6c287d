"""The dev sessions and neutral text the token benchmarks measure on.

Shared by bench_tokens.py and bench_calibration.py.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import _timing  # noqa: F401  (puts this checkout first on sys.path)

from shared.core.errors import ConfigError
from shared.core.messages import Message
from shared.core.tokens import REQUEST_OVERHEAD
from shared.core.tokens_exact import TiktokenCounter
from workers.harness.transcripts import (
    TRANSCRIPTS,
    reported_prompt_tokens,
    to_message,
    transcript_records,
)

TARGET_UNDER = -0.05


TARGET_MEDIAN_OVER = 0.15


@dataclass
class Session:
    id: str
    index: int
    messages: list[Message]
    usage: list[int | None]  # prompt_tokens reported for the call that produced message i
    held_out: bool = field(init=False)

    def __post_init__(self) -> None:
        self.held_out = self.index % 2 == 1


def load_sessions(path: Path) -> list[Session]:
    sessions = []
    for index, raw in enumerate(transcript_records(path)):
        messages = [to_message(m) for m in raw["messages"]]
        usage = [reported_prompt_tokens(m) for m in messages]
        sessions.append(Session(raw["id"], index, messages, usage))
    return sessions


def open_data(data: Path, *encodings: str) -> tuple[list[Session], list[TiktokenCounter]]:
    """The dev sessions and the exact counters of ``encodings`` (the truth) under ``data``.

    Exits with status 2 and the reason when the transcripts or a tokenizer file is missing.
    """
    transcripts = data / TRANSCRIPTS
    if not transcripts.is_file():
        print(f"no transcripts at {transcripts}: pass --data", file=sys.stderr)
        raise SystemExit(2)
    try:
        counters = [TiktokenCounter(name, data / "tokenizers") for name in encodings]
    except ConfigError as exc:
        print(f"exact counter unavailable: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    return load_sessions(transcripts), counters


# -- text that is not in the sessions ---------------------------------------------------
CORPUS_KINDS: dict[str, tuple[str, ...]] = {
    "python": (".py",),
    "prose": (".md", ".rst", ".txt"),
    "json": (".json",),
}


SESSION_REPOSITORIES = frozenset(
    {"django", "sympy", "sphinx", "pytest", "_pytest", "matplotlib", "sklearn", "astropy",
     "requests", "pylint", "__pycache__"}
)
"""Directories skipped: the coding sessions' own repositories (their vocabulary is
what the sessions measure) and bytecode caches."""


@dataclass(frozen=True)
class Doc:
    """One file of the neutral corpus; ``half`` splits it by a hash of its relative path."""

    path: str
    kind: str
    text: str

    @property
    def half(self) -> str:
        return "fit" if hashlib.sha1(self.path.encode()).digest()[0] % 2 == 0 else "test"


def default_corpus_roots() -> list[Path]:
    return [Path(sysconfig.get_paths()["stdlib"])]


def load_corpus(
    roots: Sequence[Path], per_kind: int = 400, max_chars: int = 40_000, min_chars: int = 800
) -> list[Doc]:
    """Up to ``per_kind`` UTF-8 files of each kind under ``roots``, picked by a hash of
    their relative path (deterministic, spread over the whole tree), truncated to
    ``max_chars``."""
    found: dict[str, list[tuple[str, Path]]] = {kind: [] for kind in CORPUS_KINDS}
    for root in roots:
        for directory, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d not in SESSION_REPOSITORIES)
            for name in files:
                for kind, suffixes in CORPUS_KINDS.items():
                    if name.endswith(suffixes):
                        full = Path(directory, name)
                        found[kind].append((f"{root.name}/{full.relative_to(root)}", full))
    docs: list[Doc] = []
    for kind, entries in found.items():
        entries.sort(key=lambda e: hashlib.sha1(e[0].encode()).hexdigest())
        taken = 0
        for rel, full in entries:
            if taken == per_kind:
                break
            try:
                text = full.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if len(text) >= min_chars:
                docs.append(Doc(rel, kind, text[:max_chars]))
                taken += 1
    return docs


def prefix_sums(per_message: Sequence[int]) -> list[int]:
    """Request tokens of every prefix: ``out[k]`` counts messages ``[0, k)``."""
    out = [REQUEST_OVERHEAD]
    for n in per_message:
        out.append(out[-1] + n)
    return out


def anchor_index(messages: Sequence[Message], after_assistant: int) -> int:
    """Prefix length right after the ``after_assistant``-th assistant message."""
    seen = 0
    for i, m in enumerate(messages):
        if m.role == "assistant":
            seen += 1
            if seen == after_assistant:
                return i + 1
    return len(messages)


def pct(x: float) -> str:
    return f"{100 * x:+.1f}%"
