"""Provider-reported usage, read (and checked) from any of the three wire formats."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shared.core.errors import InvalidInput

# Count fields a usage object may carry, in any of the three formats. Each one that is
# present must be a non-negative integer: a string or a negative figure is a caller bug
# that would silently switch calibration off, so it is reported naming the field.
PROMPT_FIELDS = ("prompt_tokens", "prompt_token_count", "promptTokenCount")
ANTHROPIC_FIELDS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
# Bedrock's Converse API: the same split as Anthropic's, in camelCase
BEDROCK_FIELDS = ("inputTokens", "cacheWriteInputTokens", "cacheReadInputTokens")
OTHER_FIELDS = ("completion_tokens", "total_tokens", "output_tokens", "candidates_token_count",
                "candidatesTokenCount", "total_token_count", "totalTokenCount", "outputTokens",
                "totalTokens")
COUNT_FIELDS = PROMPT_FIELDS + ANTHROPIC_FIELDS + BEDROCK_FIELDS + OTHER_FIELDS


def _get(obj: Any, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    try:
        return getattr(obj, name, None)
    except Exception:  # a property of an SDK object that raises: treat as absent
        return None


def _count(value: Any, field: str) -> int | None:
    """A token count: None when absent, else a non-negative int (integral floats accepted)."""
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"expected a non-negative integer token count, got {value!r:.60}",
                           field=field)
    if value < 0:
        raise InvalidInput(f"expected a non-negative integer token count, got {value}",
                           field=field)
    return value


def validate_usage(usage: Any, field: str = "usage") -> None:
    """Raise InvalidInput naming ``usage.<field>`` when a count field holds a non-count.

    ``None`` and objects without any known field pass (usage is optional and
    its format is open); an int must be >= 0; a string, a list or a bool is
    not a usage at all.
    """
    if usage is None:
        return
    if isinstance(usage, (bool, str, bytes, list, tuple, set, float)):
        raise InvalidInput(
            f"expected a provider usage object or dict (or an int), got {type(usage).__name__}",
            field=field)
    if isinstance(usage, int):
        _count(usage, field)
        return
    for name in COUNT_FIELDS:
        _count(_get(usage, name), f"{field}.{name}")


def reported_prompt_tokens(usage: Any) -> int | None:
    """Prompt (input) tokens a provider reported for one request, or None.

    Takes an int, an OpenAI ``usage`` (``prompt_tokens``), an Anthropic one
    (``input_tokens`` plus cache creation and cache reads, which Anthropic
    reports separately although they were all sent), a Bedrock Converse one
    (``inputTokens`` plus ``cacheWriteInputTokens`` and ``cacheReadInputTokens``,
    the same split), a Gemini
    ``usage_metadata`` (``prompt_token_count`` / ``promptTokenCount``), as
    dicts or SDK objects. None when there is no usage or no prompt figure
    (or it is 0); InvalidInput naming the field (``usage.prompt_tokens``)
    when a count field holds something that is not a non-negative integer.
    """
    validate_usage(usage)
    if usage is None:
        return None
    if isinstance(usage, int):
        return usage if usage > 0 else None
    value = next((v for v in (_count(_get(usage, n), f"usage.{n}") for n in PROMPT_FIELDS)
                  if v is not None), None)
    for fields in (ANTHROPIC_FIELDS, BEDROCK_FIELDS):
        if value is not None:
            break
        base = _count(_get(usage, fields[0]), f"usage.{fields[0]}")
        if base is not None:
            value = base + sum(_count(_get(usage, n), f"usage.{n}") or 0 for n in fields[1:])
    return value if value else None


__all__ = ["COUNT_FIELDS", "reported_prompt_tokens", "validate_usage"]
