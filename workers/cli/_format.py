"""Small formatting helpers of the ``compaction`` commands (stdlib only).

Kept here, not in the harness, so that the operations commands never
import the demo and replay machinery (or its optional dependencies).
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Any

DISTRIBUTION = "context-compaction"

# Top-level module of an optional dependency -> the extra that installs it.
EXTRAS = {
    "openai": "openai",
    "google": "vertex",
    "tiktoken": "tiktoken",
    "tiktoken_ext": "tiktoken",
    "flower": "flower",
    "fakeredis": "embedded",
    "lupa": "embedded",
    "mcp": "mcp",
    "fastapi": "server",
    "uvicorn": "server",
    "langchain": "langchain",
    "langchain_core": "langchain",
    "agents": "openai-agents",
    "pydantic_ai": "pydantic-ai",
    "prometheus_client": "metrics",
    "opentelemetry": "otel",
}


def extra_for(exc: ModuleNotFoundError) -> str | None:
    """The extra that installs the module ``exc`` could not find (None: not an extra's)."""
    name = exc.name or str(exc).partition("No module named ")[2].split()[0].strip("'\"")
    return EXTRAS.get(name.split(".")[0]) if name else None


def needs_extra(what: str, extra: str) -> str:
    """``replay needs the 'openai' extra: pip install 'context-compaction[openai]'``."""
    return f"{what} needs the '{extra}' extra: pip install '{DISTRIBUTION}[{extra}]'"


def unreadable(exc: Any) -> str:
    """A pydantic ``ValidationError`` in one line: in these commands it is a record read
    from Redis that this version cannot read (another version's, or edited by hand)."""
    errors = exc.errors(include_url=False)
    first = errors[0] if errors else {}
    where = ".".join(str(part) for part in first.get("loc", ()))
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    names = re.findall(r"\b[A-Z]\w*", exc.title)  # "list[function-after[..., Message]]"
    return (f"cannot read a {names[-1] if names else exc.title} from Redis: "
            f"{where + ': ' if where else ''}{first.get('msg', exc)}{more} (written by "
            "another version, or edited by hand?)")


def human(tokens: float) -> str:
    """12345 -> '12.3k' (never '-0')."""
    if abs(tokens) >= 1_000_000:
        return _no_negative_zero(f"{tokens / 1_000_000:.1f}") + "M"
    if abs(tokens) >= 1000:
        return _no_negative_zero(f"{tokens / 1000:.1f}") + "k"
    return f"{int(tokens)}"


def pct(ratio: float, digits: int = 0) -> str:
    """A ratio as a percentage, ``0.1234 -> '12%'``; never ``-0%`` or ``-0.0%``."""
    return _no_negative_zero(f"{ratio * 100:.{digits}f}") + "%"


def _no_negative_zero(text: str) -> str:
    if text.startswith("-") and not text.strip("-0.").strip():
        return text[1:]
    return text


def clip(text: str, width: int) -> str:
    """``text`` on one line of at most ``width`` characters (``…`` when cut)."""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: max(0, width - 1)] + "…"


def terminal_width(default: int = 80) -> int:
    """Columns of the terminal (``COLUMNS`` first), at least 40."""
    columns = os.environ.get("COLUMNS", "")
    width = int(columns) if columns.isdigit() else shutil.get_terminal_size((default, 24)).columns
    return max(40, width)


__all__ = ["DISTRIBUTION", "EXTRAS", "clip", "extra_for", "human", "needs_extra", "pct",
           "terminal_width", "unreadable"]
