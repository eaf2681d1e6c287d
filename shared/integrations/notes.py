"""Notes for what a provider ran itself (hosted / server-side tool calls and results).

A model turn can carry a tool the provider executed on its side (web search, code
execution, image generation, hosted MCP): the call and its result come back in the
response, and the provider wants them back, as they were, on the next request. The
adapters keep the framework's original for that and record a short note of it as the
message's reasoning, so the log and its summaries say what happened. Nothing here
imports a framework.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

FIELD_CHARS = 200  # the most of one text field of the call a note keeps
LIST_ITEMS = 20  # the most items of one list field a note keeps
SKIPPED = frozenset({"type", "id", "status", "index", "extras"})


def clip(value: Any) -> Any:
    """``value`` with long texts (search results, a generated image's base64) shortened
    to their head and length, and long lists to their first items."""
    if isinstance(value, str):
        return value if len(value) <= FIELD_CHARS \
            else f"{value[:FIELD_CHARS]}... [{len(value)} chars]"
    if isinstance(value, Mapping):
        return {str(k): clip(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        head = [clip(v) for v in value[:LIST_ITEMS]]
        return head if len(value) <= LIST_ITEMS else [*head, f"... [{len(value)} items]"]
    return value


def provider_note(kind: str, item: Mapping[str, Any]) -> str:
    """``[kind: {fields}]``: a hosted call or result, its bookkeeping keys left out."""
    fields = {k: v for k, v in item.items() if k not in SKIPPED}
    return f"[{kind}: {json.dumps(clip(fields), default=str, ensure_ascii=False)}]"


__all__ = ["clip", "provider_note"]
