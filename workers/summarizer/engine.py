"""Incremental summarization: merge new messages into the previous summary.

Only the messages since the watermark are sent, with the previous summary
and an update prompt (never a summary from scratch). When the range is
larger than the summarizer model's own window, it is split at message
boundaries and folded chunk by chunk. Every reply passes the quality check
before it can become a summary; failures raise (the Celery task retries with
backoff, then falls back to the offline summarizer).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from shared.errors import SummarizerUnavailable
from shared.ledger import Ledger
from shared.messages import Message
from shared.tokens import DEFAULT_COUNTER, TokenCounter
from workers.summarizer.offline import OfflineSummarizer
from workers.summarizer.prompts import (
    build_summary_request,
    build_turn_prefix_request,
    chunk_for_window,
)
from workers.summarizer.quality import check_summary

PREFIX_HEADING = "## Current turn so far"


@dataclass(frozen=True, slots=True)
class Completion:
    """One LLM reply with the usage the provider reported."""

    text: str
    input_tokens: int
    output_tokens: int
    model: str


class LLMClient(Protocol):
    """A summarizer model behind any provider (OpenAI-compatible, Vertex AI, ...)."""

    name: str
    model: str
    context_window: int

    def complete(self, messages: list[dict[str, Any]], max_output_tokens: int) -> Completion: ...


@dataclass(slots=True)
class SummaryDraft:
    """A checked summary, ready to be stored, with what it cost."""

    text: str
    kind: str
    model: str | None
    input_tokens: int = 0
    output_tokens: int = 0
    calls: int = 0
    stages: list[str] = field(default_factory=list)


class SummaryEngine:
    """Runs the summarization of one range with an LLM client or offline."""

    def __init__(self, client: LLMClient | None, *, counter: TokenCounter | None = None,
                 max_summary_tokens: int = 2000, max_input_tokens: int | None = None,
                 offline: OfflineSummarizer | None = None) -> None:
        self.client = client
        self.counter = counter or DEFAULT_COUNTER
        self.max_summary_tokens = max_summary_tokens
        window = client.context_window if client is not None else 128_000
        self.max_input_tokens = max_input_tokens or max(4096, window - max_summary_tokens - 1024)
        self.offline = offline or OfflineSummarizer(max_chars=max_summary_tokens * 4)

    @property
    def is_llm(self) -> bool:
        return self.client is not None

    def summarize(self, messages: Sequence[Message], previous: str | None, ledger: Ledger, *,
                  prefix: Sequence[Message] = (), use_llm: bool = True,
                  deadline: float | None = None, start: int = 0) -> SummaryDraft:
        """Summary of ``previous`` + ``messages`` (+ a split turn's ``prefix``).

        ``start`` is the log index of ``messages[0]`` (the transcript shows
        absolute message numbers, which the ledger uses too).
        """
        if self.client is None or not use_llm:
            return self._offline(messages, previous, ledger, prefix, start)
        return self._llm(self.client, messages, previous, ledger, prefix, deadline, start)

    def _offline(self, messages: Sequence[Message], previous: str | None, ledger: Ledger,
                 prefix: Sequence[Message], start: int) -> SummaryDraft:
        text = self.offline.summarize(list(messages) + list(prefix), previous, ledger,
                                      start=start)
        return SummaryDraft(text=text, kind="offline", model=None, stages=["offline_summary"])

    def _llm(self, client: LLMClient, messages: Sequence[Message], previous: str | None,
             ledger: Ledger, prefix: Sequence[Message], deadline: float | None,
             start: int) -> SummaryDraft:
        draft = SummaryDraft(text=previous or "", kind="llm", model=client.model)
        # Each chunk's whole request (prompt, previous summary at its cap, ledger,
        # transcript, reply) fits the summarizer's own window.
        chunks = chunk_for_window(list(messages), self.max_input_tokens, self.counter,
                                  previous_summary_tokens=self.max_summary_tokens,
                                  ledger=ledger, max_summary_tokens=self.max_summary_tokens,
                                  start=start)
        draft.stages.append("incremental_merge" if previous else "fresh_summary")
        if len(chunks) > 1:
            draft.stages.append(f"folded_{len(chunks)}_chunks")
        running = previous
        offset = start
        for chunk in chunks:
            self._check_deadline(deadline)
            request = build_summary_request(chunk, running, ledger=ledger, start=offset,
                                            max_summary_tokens=self.max_summary_tokens)
            running = self._call(client, request, chunk, running, draft)
            offset += len(chunk)
        if prefix:
            self._check_deadline(deadline)
            request = build_turn_prefix_request(list(prefix), ledger=ledger, start=offset,
                                                max_summary_tokens=self.max_summary_tokens // 2)
            part = self._call(client, request, prefix, None, draft)
            running = f"{running or ''}\n\n{PREFIX_HEADING}\n{part}".strip()
            draft.stages.append("turn_prefix_summary")
        draft.text = running or ""
        return draft

    def _call(self, client: LLMClient, request: list[dict[str, Any]],
              chunk: Sequence[Message], previous: str | None, draft: SummaryDraft) -> str:
        completion = client.complete(request, self.max_summary_tokens)
        draft.calls += 1
        draft.input_tokens += completion.input_tokens
        draft.output_tokens += completion.output_tokens
        input_tokens = self.counter.messages(list(chunk)) + (
            self.counter.text(previous) if previous else 0)
        return check_summary(completion.text, input_tokens=input_tokens, counter=self.counter)

    @staticmethod
    def _check_deadline(deadline: float | None) -> None:
        """The threads pool enforces no time limit: the job checks its own between calls."""
        if deadline is not None and time.monotonic() > deadline:
            raise SummarizerUnavailable("summarization ran past its deadline")


__all__ = ["PREFIX_HEADING", "Completion", "LLMClient", "SummaryDraft", "SummaryEngine"]
