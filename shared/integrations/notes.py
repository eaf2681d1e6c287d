"""Notes for what a provider ran itself (hosted / server-side tool calls and results).

A model turn can carry a tool the provider executed on its side (web search, code
execution, image generation, hosted MCP): the call and its result come back in the
response, and the provider wants them back, as they were, on the next request. The
adapters keep the framework's original for that and record a short note of it as the
message's reasoning, so the log and its summaries say what happened. Nothing here
imports a framework.

A note is short; what goes back is not (twenty search results, a hosted MCP tool's
30k-character output). The message is counted as sent through its
:data:`~shared.core.tokens.EXTRA_TOKENS` figure (:func:`with_sent`): the tokens of the
hosted parts as the provider returned them, less the notes counted as its reasoning.
OpenAI re-reads a replayed item's results server-side from its id, Anthropic gets them
inline: either way the model reads them again. A generated image's base64 is counted as
one image (:data:`IMAGE_TOKENS`), not as text. And a hosted part goes back only while
its note is in the view message's reasoning (:func:`kept_notes`): a stage that cleared a
note drops what it stood for. The stages find notes by their first line
(:func:`shared.core.cheap.without_notes`): a new note form starts ``[kind: `` too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from shared.core.messages import Message
from shared.core.tokens import EXTRA_TOKENS, baseline_tokens

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


IMAGE_TOKENS = 765
"""A generated image sent back (an ``image_generation_call``'s base64 result): one image
of 1024x1024 at high detail, as OpenAI counts an input image (85 + 4 tiles x 170), not
its ~1.5M characters of base64 as text."""
_IMAGE_HEADS = ("iVBORw0KGg", "/9j/", "R0lGO", "UklGR")  # PNG, JPEG, GIF, WebP in base64
_IMAGE_MIN = 1024  # shorter strings are counted as text whatever they hold


def _is_image(value: str) -> bool:
    if len(value) < _IMAGE_MIN:
        return False
    if value.startswith("data:image/") and ";base64," in value[:64]:
        return True
    return value.startswith(_IMAGE_HEADS)


_LONG = 64  # a string this long is counted as the model reads it, not JSON-escaped


def _skeleton(value: Any, texts: list[str], images: list[int]) -> Any:
    """``value`` with its long strings taken out into ``texts`` (a JSON text inside a JSON
    value would be counted with an escape before every quote) and its base64 images
    counted in ``images``: each left as an empty string."""
    if isinstance(value, str):
        if _is_image(value):
            images.append(1)
            return ""
        if len(value) >= _LONG:
            texts.append(value)
            return ""
        return value
    if isinstance(value, Mapping):
        return {str(k): _skeleton(v, texts, images) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_skeleton(v, texts, images) for v in value]
    return value


def sent_tokens(parts: Iterable[Any], counted: str = "") -> int:
    """Tokens (o200k baseline) of hosted ``parts`` as the model reads them again (each a
    JSON value or a text: its structure as JSON, its long strings as they are), beyond
    ``counted`` (their notes, counted already as the reasoning)."""
    texts: list[str] = []
    images: list[int] = []
    for part in parts:
        plain = _skeleton(part, texts, images)
        if plain != "":
            texts.append(json.dumps(plain, default=str, ensure_ascii=False))
    total = sum(baseline_tokens(t) for t in texts) + IMAGE_TOKENS * len(images)
    return max(0, math.ceil(total - baseline_tokens(counted)))


def with_sent(message: Message, parts: Iterable[Any], counted: str = "") -> Message:
    """``message`` with its :data:`EXTRA_TOKENS` figure for hosted ``parts`` (none: as is)."""
    extra = sent_tokens(parts, counted)
    if not extra:
        return message
    return message.model_copy(update={"metadata": {**message.metadata, EXTRA_TOKENS: extra}})


def kept_notes(notes: Iterable[str], reasoning: str | None) -> list[bool]:
    """Which of a recorded message's ``notes`` its view message's ``reasoning`` still holds
    (a part whose note a stage cleared or clipped is not sent: its tokens are not counted)."""
    return [bool(reasoning) and note in (reasoning or "") for note in notes]


__all__ = ["IMAGE_TOKENS", "clip", "kept_notes", "provider_note", "sent_tokens",
           "with_sent"]
