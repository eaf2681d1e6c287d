"""A token counter that counts each message once per job.

One compaction job asks for the tokens of the same messages several times:
the cut point walks the newest ones, the plan counts what the cut frees, the
quality gate counts the summarized range again. Estimating a message is the
costliest CPU the job spends outside rendering, and the job holds the GIL
while it does it, so 32 job threads in one worker process queue behind it.
:class:`JobCounter` wraps the configured counter for the length of one job:
a message is estimated the first time it is seen and looked up after that.

The lookup is by object identity, and the entry keeps the message alive, so
an identity is never reused for another message while the counter lives.
Create one per job and drop it with the job; never share it between jobs or
threads (the messages of a finished job would pile up).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shared.core.errors import InvalidInput
from shared.core.messages import Message
from shared.core.tokens import REQUEST_OVERHEAD, HeuristicCounter, TokenCounter


class JobCounter:
    """``TokenCounter`` that memoizes :meth:`message` for one job's messages.

    :meth:`messages` is the per-request overhead plus the memoized sum when
    the wrapped counter is the project's :class:`HeuristicCounter` (its
    request count is exactly that sum); any other counter is asked as is,
    since its request count need not decompose per message.
    """

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self._decomposes = type(counter) is HeuristicCounter
        self._seen: dict[int, tuple[Message, int]] = {}

    def __repr__(self) -> str:
        return f"JobCounter({self.counter!r}, {len(self._seen)} messages counted)"

    def seed(self, messages: Sequence[Message], tokens: Sequence[int]) -> None:
        """Take ``tokens[i]`` as the count of ``messages[i]`` (counted before, by the
        same counter: the store's per-message counts), so they are never estimated."""
        if len(messages) != len(tokens):
            raise InvalidInput(f"{len(tokens)} counts for {len(messages)} messages",
                               field="tokens")
        for message, count in zip(messages, tokens, strict=True):
            self._seen[id(message)] = (message, count)

    def text(self, text: str) -> int:
        return self.counter.text(text)

    def message(self, message: Message) -> int:
        hit = self._seen.get(id(message))
        if hit is not None and hit[0] is message:
            return hit[1]
        tokens = self.counter.message(message)
        self._seen[id(message)] = (message, tokens)
        return tokens

    def messages(self, messages: Sequence[Message]) -> int:
        if not self._decomposes or isinstance(messages, (str, bytes, Mapping)) \
                or not isinstance(messages, Sequence) \
                or not all(isinstance(m, Message) for m in messages):
            return self.counter.messages(messages)  # it names the bad input
        return REQUEST_OVERHEAD + sum(self.message(m) for m in messages)

    def tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        return self.counter.tools(tools)


def job_counter(counter: TokenCounter) -> JobCounter:
    """A fresh per-job counter over ``counter`` (never wraps a JobCounter twice)."""
    return JobCounter(counter.counter if isinstance(counter, JobCounter) else counter)


__all__ = ["JobCounter", "job_counter"]
