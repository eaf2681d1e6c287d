"""The ``recall`` tool as the model sees it: its definition for each provider,
the notice a summary carries, and the hits rendered as the tool's result.

Apart from :mod:`shared.core.recall` (tokenizing, passages, ranking,
validation) because this is presentation: what changes when a provider's
tool format does, not when the search does.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from shared.core.errors import InvalidInput

MAX_LIMIT = 50
DEFAULT_LIMIT = 5

Provider = Literal["openai", "anthropic", "gemini"]

__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "NOTICE", "TOOL_DESCRIPTION", "TOOL_NAME", "Provider",
           "RecallHit", "notice", "offers_recall", "recall_tool", "render_hits"]

TOOL_NAME = "recall"
TOOL_DESCRIPTION = (
    "Search the earlier part of this conversation that was summarized away and get the "
    "original messages back, verbatim. Use exact words: file paths, identifiers, error "
    "codes, numbers, commands. Returns the best-matching passages with their message index.")
_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"type": "string",
                  "description": "words to look for, e.g. 'src/app/main.py ERR_CONN_RESET'"},
        "limit": {"type": "integer", "description": f"passages to return (1-{MAX_LIMIT}, "
                                                    f"default {DEFAULT_LIMIT})"},
        "start": {"type": "integer", "description": "first message index to search"},
        "end": {"type": "integer", "description": "search messages before this index"},
    },
    "required": ["query"],
}


def recall_tool(provider: Provider = "openai") -> dict[str, Any]:
    """The ``recall`` tool in ``provider``'s format (OpenAI Chat Completions function
    tool, Anthropic Messages tool, Gemini function declaration)."""
    params = copy.deepcopy(_PARAMETERS)
    if provider == "openai":
        return {"type": "function", "function": {
            "name": TOOL_NAME, "description": TOOL_DESCRIPTION,
            "parameters": {**params, "additionalProperties": False}}}
    if provider == "anthropic":
        return {"name": TOOL_NAME, "description": TOOL_DESCRIPTION, "input_schema": params}
    if provider == "gemini":
        return {"name": TOOL_NAME, "description": TOOL_DESCRIPTION, "parameters": params}
    raise InvalidInput("must be 'openai', 'anthropic' or 'gemini'", field="provider")


NOTICE = ("Earlier details can be recalled with the `recall` tool: call it with exact words "
          "(file paths, identifiers, error codes, numbers, commands) to get the original "
          "messages back verbatim, instead of guessing.")


def notice(watermark: int) -> str:
    """The line a summary carries so the model knows it can recall messages ``[0, w)``."""
    if isinstance(watermark, bool) or not isinstance(watermark, int) or watermark < 0:
        raise InvalidInput("must be a non-negative integer", field="watermark")
    return f"{NOTICE} Messages 0-{max(watermark - 1, 0)} are searchable."


def _tool_names(tool: Any) -> list[str]:
    if not isinstance(tool, dict):
        return []
    names = [tool.get("name")]
    function = tool.get("function")
    if isinstance(function, dict):  # OpenAI Chat Completions
        names.append(function.get("name"))
    for key in ("function_declarations", "functionDeclarations"):  # Gemini's Tool object
        declared = tool.get(key)
        if isinstance(declared, list):
            names.extend(d.get("name") for d in declared if isinstance(d, dict))
    return [n for n in names if isinstance(n, str)]


def offers_recall(tools: Sequence[Any] | None) -> bool:
    """True when the request's tools include ``recall``, in any provider's format.

    The summary mentions recall only then: telling a model about a tool it
    was not given invites calls that fail.
    """
    return bool(tools) and any(TOOL_NAME in _tool_names(t) for t in tools or ())


class RecallHit(BaseModel):
    """One recalled passage: its message's log index and role, the text, the score."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int
    role: str
    text: str
    score: float


def render_hits(hits: Sequence[RecallHit]) -> str:
    """A tool result text for the model: one block per hit, newest context marked."""
    if not hits:
        return "No earlier message matches. Try other exact words (a path, an identifier)."
    return "\n\n".join(f"[message {h.index}, {h.role}, score {h.score:.2f}]\n{h.text}"
                       for h in hits)
