"""LangChain messages <-> the session log's neutral messages (no hooks: the mapping).

Apart from :mod:`shared.integrations.langchain` (the middleware's hooks) as
:mod:`~shared.integrations.agents_items` is apart from the Agents SDK session:
what changes when LangChain's message types do, not when the hooks do. Each
state message becomes one neutral message tagged with its state index (and
its LangChain id, ``ID_KEY``); a view message compaction left untouched goes
back as the state's own object.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from langchain_core.messages import (
    AnyMessage,
    BaseMessage,
    SystemMessage,
    convert_to_messages,
    convert_to_openai_messages,
)

from shared.core.errors import InvalidInput
from shared.core.messages import Message
from shared.core.prepared import PreparedView
from shared.core.wire import from_openai, to_openai
from shared.integrations._common import origin, tag

ID_KEY = "lc_id"


def to_neutral(messages: Sequence[Any], start: int = 0) -> list[Message]:
    """LangChain messages as tagged neutral ones; InvalidInput names ``state.messages[i]``."""
    out: list[Message] = []
    for offset, message in enumerate(messages):
        index = start + offset
        where = f"state.messages[{index}]"
        if not isinstance(message, BaseMessage):
            raise InvalidInput(f"expected a LangChain message, got {type(message).__name__}",
                               field=where, index=index)
        try:
            wire = convert_to_openai_messages(message)
        except (ValueError, TypeError, KeyError) as exc:
            raise InvalidInput(f"cannot map {type(message).__name__}: {str(exc)[:200]}",
                               field=where, index=index) from None
        try:
            (neutral,) = from_openai([wire])
        except InvalidInput as exc:
            inner = exc.field or ""
            reason = str(exc).removeprefix(f"{inner}: ")
            raise InvalidInput(f"cannot map {type(message).__name__}: {reason}",
                               field=where + inner.removeprefix("messages[0]"),
                               index=index) from None
        extra = {ID_KEY: message.id} if message.id else {}
        out.append(tag(neutral, index, extra=extra))
    return out


def from_view(view: PreparedView, state: Sequence[AnyMessage],
              system: SystemMessage | None) -> tuple[SystemMessage | None, list[AnyMessage]]:
    """The view as LangChain messages: untouched ones are the state's own objects."""
    messages = list(view.messages)
    new_system = system
    if messages and messages[0].role == "system":
        text = messages.pop(0).text()
        if system is not None and text != system.text and text.startswith(system.text):
            # The summary follows the caller's system prompt: keep its blocks as they were
            # (cache_control and the like), the summary as one more text block.
            blocks = (list(system.content) if isinstance(system.content, list)
                      else [{"type": "text", "text": system.content}])
            new_system = SystemMessage(content=[
                *blocks, {"type": "text", "text": text[len(system.text):].lstrip("\n")}])
        elif system is None or text != system.text:
            new_system = SystemMessage(content=text)
    out: list[AnyMessage] = []
    for message in messages:
        found = origin(message)
        if found is not None and found[0] < len(state):
            original = state[found[0]]
            if original.id is None or original.id == message.metadata.get(ID_KEY):
                out.append(original)
                continue
        out.extend(cast("list[AnyMessage]",
                        convert_to_messages(to_openai([message], include_reasoning=False))))
    return new_system, out


__all__ = ["ID_KEY", "from_view", "to_neutral"]
