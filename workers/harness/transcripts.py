"""The real-data kit's transcripts (``../shared/data/transcripts.dev.jsonl``) as messages.

One loader for the tests, the benchmarks and the calibration scripts: a
transcript line is ``{"id", "messages": [...]}``; each message's provider
``usage`` (not a Message field) goes to ``metadata["usage"]``. (The replay
has its own, tolerant loader: it repairs and reports what it reads from
any agent's logs; this one reads the kit, which is known to be valid.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from shared.core.messages import Message

DATA_DIR = Path(__file__).resolve().parents[3] / "shared" / "data"
TRANSCRIPTS = "transcripts.dev.jsonl"


def to_message(raw: Mapping[str, Any]) -> Message:
    """One transcript message; provider ``usage`` (not a Message field) goes to metadata."""
    data = dict(raw)
    usage = data.pop("usage", None)
    if usage is not None:
        data["metadata"] = {"usage": usage}
    return Message.model_validate(data)


def transcript_records(path: Path) -> Iterator[dict[str, Any]]:
    """The raw JSON object of every non-blank line of a transcripts file."""
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                record: dict[str, Any] = json.loads(line)
                yield record


def load_transcripts(data_dir: Path = DATA_DIR) -> list[tuple[str, list[Message]]]:
    """(session id, messages) of every session in ``transcripts.dev.jsonl``."""
    return [(raw["id"], [to_message(m) for m in raw["messages"]])
            for raw in transcript_records(data_dir / TRANSCRIPTS)]


def reported_prompt_tokens(message: Message) -> int | None:
    """The ``prompt_tokens`` the provider reported for the call that produced ``message``."""
    usage = message.metadata.get("usage") or {}
    value = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return int(value) if value is not None else None


__all__ = ["DATA_DIR", "TRANSCRIPTS", "load_transcripts", "reported_prompt_tokens", "to_message",
           "transcript_records"]
