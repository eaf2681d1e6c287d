"""Anthropic and Gemini views maintained incrementally (pure, no I/O).

OpenAI's format is one wire message per message (:mod:`shared.core.wireview`).
Anthropic's joins neighbours of one role into one message (tool results into
the user message after the calls), Gemini's too into one content (function
responses apart from other parts): a message's wire form can depend on the
messages after it, but only within its group, the run of messages that join.
A history is kept as the wire forms of its groups, finished, except the last
group, whose messages are kept instead and joined again with what follows
(the next append, or a prepare's pending messages); for Anthropic the first
group too, which the view's head (system prompt, a summary leading as a user
message) may join. Gemini's fold keeps its groups as contents instead: the
head's last content, or the end's first, joined to a finished one where they
meet is a new content in a copy of its chunk (the fold's, and the contents an
earlier view holds, are never changed).

Per prepare the work is the head, the first group and the pending messages a
turn's last call had not seen (the end of the view is kept in the newest pending
message's memo, :class:`End`), plus a pointer copy of the finished forms; per
append, the last group and the new messages (their conversions from the turn's
memos); a summary drops the first groups (:meth:`AnthropicFold.drop`), a
cheap-stage placeholder joins its group again (``replace``); where neither can say,
the fold is made again (once) at the next request. What this cannot do exactly (a conversion
error, wrong tool pairs, leading system messages reaching into the history)
goes to the whole conversion, ``to_anthropic`` / ``to_gemini``, which gives
the same result or raises the same error; a property test holds the two equal.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from shared.core.messages import Message
from shared.core.wirefold._base import ANTHROPIC_END, FOLDED, GEMINI_END, Memo
from shared.core.wirefold.anthropic import AnthropicFold, anthropic_view
from shared.core.wirefold.gemini import GeminiFold, gemini_view

Fold = AnthropicFold | GeminiFold


def fold_of(fmt: str, history: Sequence[Message]) -> Fold:
    return AnthropicFold.of(history) if fmt == "anthropic" else GeminiFold.of(history)


def fold_of_stored(fmt: str, raw: Sequence[Any], load: Callable[[int], Any],
                   decode: Callable[[tuple[Any, ...]], tuple[Message, ...]]) -> Fold:
    """:func:`fold_of` a history of stored items (stored JSON, or messages already
    decoded), made from their JSON as plain data: ``load(i)``, None for a message, made
    when the fold asks for it, so that it is garbage as soon as the fold read it
    (:meth:`AnthropicFold.of_stored`, :meth:`GeminiFold.of_stored`)."""
    if fmt == "anthropic":
        return AnthropicFold.of_stored(raw, load, decode)
    return GeminiFold.of_stored(raw, load, decode)

__all__ = ["ANTHROPIC_END", "FOLDED", "GEMINI_END", "AnthropicFold", "Fold", "GeminiFold",
           "Memo", "anthropic_view", "fold_of", "fold_of_stored", "gemini_view"]
