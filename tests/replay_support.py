"""Helpers of the replay tests (tests/test_replay*.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workers.harness.demo_session import TOOLS, generate_session
from workers.harness.replay.run import resolve_counter
from workers.harness.transcripts import DATA_DIR, TRANSCRIPTS

DATA = DATA_DIR / TRANSCRIPTS
CI_SESSIONS = ("sphinx-doc__sphinx-9229", "django__django-14349", "pytest-dev__pytest-5787")


def write_jsonl(path: Path, items: list[Any]) -> Path:
    path.write_text("\n".join(i if isinstance(i, str) else json.dumps(i) for i in items) + "\n")
    return path


def synthetic_session(turns: int, seed: int) -> dict[str, Any]:
    """A long coding session from the demo generator, in the transcripts' format."""
    messages = generate_session(turns, seed=seed)
    return {"id": f"synthetic-{seed}", "messages": messages, "tools": TOOLS}


def counter() -> Any:
    return resolve_counter()[0]
