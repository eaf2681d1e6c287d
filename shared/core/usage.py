"""Provider-reported usage, read from any of the three wire formats."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _get(obj: Any, *names: str) -> Any:
    for name in names:
        if isinstance(obj, Mapping):
            if name in obj and obj[name] is not None:
                return obj[name]
        elif getattr(obj, name, None) is not None:
            return getattr(obj, name)
    return None


def reported_prompt_tokens(usage: Any) -> int | None:
    """Prompt (input) tokens a provider reported for one request, or None.

    Takes an int, an OpenAI ``usage`` (``prompt_tokens``), an Anthropic one
    (``input_tokens`` plus cache creation and cache reads, which Anthropic
    reports separately although they were all sent), a Gemini
    ``usage_metadata`` (``prompt_token_count`` / ``promptTokenCount``), as
    dicts or SDK objects. Absurd values (negative, non-numbers) give None.
    """
    if usage is None or isinstance(usage, bool):
        return None
    if isinstance(usage, int):
        return usage if usage > 0 else None
    value = _get(usage, "prompt_tokens", "prompt_token_count", "promptTokenCount")
    if value is None:
        base = _get(usage, "input_tokens")
        if base is None:
            return None
        extra = [_get(usage, "cache_creation_input_tokens"), _get(usage, "cache_read_input_tokens")]
        value = base + sum(int(x) for x in extra if isinstance(x, int))
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


__all__ = ["reported_prompt_tokens"]
