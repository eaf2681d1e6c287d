"""The demo's simulated provider: counts a request as the fake OpenAI server would and
accepts or rejects it, without a network round trip per turn.

Apart from the replay (``workers.cli.demo``) because it is the provider's
side of each call; the harness modules it uses load only when it is built.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["ProviderSim"]


class ProviderSim:
    """What the provider does with a request: count it with its tokenizer, accept or reject.

    Counts like the fake OpenAI server (o200k with OpenAI's chat framing;
    chars/4 where the tokenizer file is absent) and applies its rule:
    ``prompt + max_tokens > window`` is a context-length error. The framing
    is additive per message, so each distinct message is counted once.
    """

    def __init__(self, window: int, max_tokens: int, tools: list[dict[str, Any]]) -> None:
        from workers.harness.fakes.counting import REPLY_PRIMING, default_counter

        self.window = window
        self.max_tokens = max_tokens
        self.counter = default_counter()
        self.priming = REPLY_PRIMING
        self.tools_cost = self.counter([], tools) - REPLY_PRIMING
        self._cache: dict[str, int] = {}

    @property
    def name(self) -> str:
        return self.counter.name

    def message_cost(self, message: dict[str, Any]) -> int:
        key = json.dumps(message, sort_keys=True)
        cost = self._cache.get(key)
        if cost is None:
            if len(self._cache) > 20_000:
                self._cache.clear()
            cost = self._cache[key] = self.counter([message], None) - self.priming
        return cost

    def prompt_tokens(self, messages: list[dict[str, Any]]) -> int:
        return self.priming + self.tools_cost + sum(self.message_cost(m) for m in messages)

    def fits(self, prompt_tokens: int) -> bool:
        return prompt_tokens + self.max_tokens <= self.window

    def overflow_error(self, prompt_tokens: int) -> str:
        """The provider's error text (OpenAI's context_length_exceeded wording)."""
        from workers.harness.fakes.openai_server import overflow_message

        return overflow_message(self.window, prompt_tokens, self.max_tokens)
