"""Wire-format adapters: provider message formats <-> neutral ``Message``.

Each module converts one provider's request format in both directions and
documents the normalisations it applies in its own docstring:

- :mod:`shared.core.wire.openai` — Chat Completions ``messages``;
- :mod:`shared.core.wire.anthropic` — Messages API ``system`` + ``messages``;
- :mod:`shared.core.wire.gemini` — ``system_instruction`` + ``contents``.

For canonical input of a format F, ``to_F(from_F(x)) == x``. Bad input
raises :class:`shared.core.errors.InvalidInput` naming the wire field, e.g.
``messages[3].tool_call_id: required``. Dicts are expected; the SDKs'
pydantic objects (an OpenAI ``ChatCompletionMessage``, a google-genai
``types.Content``) are accepted too.

What the neutral fields cannot hold travels in ``Message.metadata`` (JSON
values only, so a stored log stays plain JSON):

- ``is_error`` (bool): the tool result reports a failure (Anthropic
  ``is_error``, Gemini ``{"error": ...}``; OpenAI has no such flag);
- ``usage`` (dict): token counts some logs keep on assistant messages;
  read in, never sent;
- ``openai_*``, ``anthropic_*``, ``gemini_*``: what only that provider
  needs to get its own message back unchanged (developer role, thinking
  signatures, made-up call ids...), described in each module.
"""

from __future__ import annotations

from shared.core.wire.anthropic import from_anthropic, to_anthropic
from shared.core.wire.gemini import from_gemini, to_gemini
from shared.core.wire.openai import from_openai, to_openai

__all__ = [
    "from_anthropic",
    "from_gemini",
    "from_openai",
    "to_anthropic",
    "to_gemini",
    "to_openai",
]
