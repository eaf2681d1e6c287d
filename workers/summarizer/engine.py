"""Incremental summarization: merge new messages into the previous summary.

Only the messages since the watermark are sent, with the previous summary
and an update prompt (never a summary from scratch). When the range is
larger than the summarizer model's own window, it is split at message
boundaries and folded chunk by chunk; so is a split turn's prefix (the summary
of its beginning, under its own heading: a job whose range lies inside that same
turn updates it, within what the rest of the summary leaves of the cap). When
the summarizer itself answers
that a request overflowed its window (its real window is smaller than
configured, or its tokenizer counts more than ours), what is left of the
range is split again into smaller chunks and folding goes on; the window the
error states (or, when it states none, the size that then passed) is kept
for later jobs. Every reply passes the quality check
before it can become a summary; failures raise (the Celery task retries a
``SummarizerUnavailable`` with backoff and falls back to the offline
summarizer for anything else, or on the last attempt).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from shared.core.errors import (
    InvalidInput,
    LimitExceeded,
    SummarizerError,
    SummarizerUnavailable,
)
from shared.core.ledger import Ledger
from shared.core.messages import Message
from shared.core.tokens import DEFAULT_COUNTER, TokenCounter
from shared.telemetry.genai import model_call
from workers.summarizer.chunking import chunk_for_window, clip_to_fit
from workers.summarizer.cooldown import ProviderCooldown
from workers.summarizer.counting import job_counter
from workers.summarizer.offline import OfflineSummarizer
from workers.summarizer.prompts import (
    build_summary_request,
    build_turn_prefix_request,
    render_messages,
    request_tokens,
)
from workers.summarizer.quality import check_summary

log = logging.getLogger("compaction.summarizer")
PREFIX_HEADING = "## Current turn so far"
_PREFIX_LINE = re.compile(rf"^{re.escape(PREFIX_HEADING)}[ \t]*$\n?", re.M)
MAX_REFOLDS = 4  # smaller chunks tried after the summarizer said a request overflowed
OVERFLOW_SAFETY = 0.9  # of the room the stated window leaves, after our count's error


def split_turn_part(summary: str | None) -> tuple[str | None, str | None]:
    """``summary`` without its "Current turn so far" part, and that part (None without one).

    A job whose range lies inside that turn updates the part instead of adding another
    (one long turn stacked a part per job, past the summary's cap). Parts stacked before
    are joined, so the update merges them into one.
    """
    if not summary:
        return summary, None
    pieces = _PREFIX_LINE.split(summary)
    if len(pieces) == 1:
        return summary, None
    parts = [p.strip() for p in pieces[1:] if p.strip()]
    return pieces[0].strip() or None, "\n\n".join(parts) or None


class SummarizerOverflow(SummarizerError):
    """The summarizer rejected a request as longer than its own context window.

    Not worth retrying as is (the same request overflows again): the engine
    splits the range into smaller chunks. ``limit`` is the window the error
    stated and ``requested`` the prompt tokens it counted, when it said them.
    """

    def __init__(self, message: str, *, limit: int | None = None,
                 requested: int | None = None) -> None:
        self.limit = limit
        self.requested = requested
        super().__init__(message)


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
    covered: int | None = None
    """When the fold was interrupted: how many of the range's messages ``text`` covers."""
    interrupted: SummarizerError | None = None
    """What interrupted the fold after some chunks were folded (the caller commits what
    they cover, then raises it: a retry goes on from there instead of from the start)."""


@dataclass(slots=True)
class _Fold:
    """What the chunks of one job's folds share: the client, the draft they add to, the
    facts they carry, the deadline, and the input budget (smaller after an overflow)."""

    client: LLMClient
    draft: SummaryDraft
    ledger: Ledger
    deadline: float | None
    counter: TokenCounter
    budget: int
    part_tokens: int = 0
    """The size asked of a split turn's summary (:meth:`SummaryEngine._part_tokens`)."""
    folded: list[tuple[int, str]] = field(default_factory=list)
    """(messages of the range covered, summary) after each chunk of the range's body: a
    chunk ends between tool units, where a split turn's watermark may be too."""


class SummaryEngine:
    """Runs the summarization of one range with an LLM client or offline."""

    def __init__(self, client: LLMClient | None, *, counter: TokenCounter | None = None,
                 max_summary_tokens: int = 2000, max_input_tokens: int | None = None,
                 offline: OfflineSummarizer | None = None,
                 cooldown: ProviderCooldown | None = None,
                 interruptions: tuple[type[BaseException], ...] = ()) -> None:
        self.client = client
        self.interruptions = interruptions
        """Exceptions a time limit raises into a call (Celery's ``SoftTimeLimitExceeded`` under
        prefork, wired in :mod:`workers.runtime`): taken as the deadline passing, so the chunks
        folded so far are kept and the job is retried or falls back, as after a timeout."""
        self.cooldown = cooldown
        """The provider's cooldown shared by the workers (:mod:`workers.summarizer.cooldown`):
        checked before each call, set by a call that failed with a stated wait."""
        self.counter = counter or DEFAULT_COUNTER
        self.max_summary_tokens = max_summary_tokens
        window = client.context_window if client is not None else 128_000
        self.max_input_tokens = max_input_tokens or max(4096, window - max_summary_tokens - 1024)
        self.offline = offline or OfflineSummarizer(max_chars=max_summary_tokens * 4,
                                                    max_tokens=max_summary_tokens,
                                                    counter=self.counter)

    @property
    def is_llm(self) -> bool:
        return self.client is not None

    def summarize(self, messages: Sequence[Message], previous: str | None, ledger: Ledger, *,
                  prefix: Sequence[Message] = (), use_llm: bool = True,
                  deadline: float | None = None, start: int = 0,
                  counter: TokenCounter | None = None,
                  keep_partial: bool = False) -> SummaryDraft:
        """Summary of ``previous`` + ``messages`` (+ a split turn's ``prefix``).

        ``start`` is the log index of ``messages[0]`` (the transcript shows
        absolute message numbers, which the ledger uses too). ``counter``:
        the job's own counter (:func:`workers.summarizer.counting.job_counter`
        over this engine's), so messages the job already counted are not
        estimated again; by default a fresh one. ``keep_partial``: a failure after
        some chunks were folded returns the draft of those (``covered``,
        ``interrupted`` set) for the caller to commit, instead of raising.
        """
        if self.client is None or not use_llm:
            return self._offline(messages, previous, ledger, prefix, start)
        return self._llm(self.client, messages, previous, ledger, prefix, deadline, start,
                         counter or job_counter(self.counter), keep_partial)

    def _offline(self, messages: Sequence[Message], previous: str | None, ledger: Ledger,
                 prefix: Sequence[Message], start: int) -> SummaryDraft:
        text = self.offline.summarize(list(messages) + list(prefix), previous, ledger,
                                      start=start)
        return SummaryDraft(text=text, kind="offline", model=None, stages=["offline_summary"])

    def _llm(self, client: LLMClient, messages: Sequence[Message], previous: str | None,
             ledger: Ledger, prefix: Sequence[Message], deadline: float | None,
             start: int, counter: TokenCounter, keep_partial: bool = False) -> SummaryDraft:
        draft = SummaryDraft(text=previous or "", kind="llm", model=client.model)
        draft.stages.append("incremental_merge" if previous else "fresh_summary")
        fold = _Fold(client, draft, ledger, deadline, counter, self.max_input_tokens)
        try:
            return self._fold_range(fold, messages, previous, prefix, start)
        except SummarizerError as exc:
            if not fold.folded or not keep_partial:
                raise
            covered, text = fold.folded[-1]
            log.warning("summarization interrupted after %d of %d messages; what was folded "
                        "is kept: %s", covered, len(messages) + len(prefix), exc)
            draft.text, draft.covered, draft.interrupted = text, covered, exc
            draft.stages.append(f"interrupted_after_{draft.calls}_calls")
            return draft

    def _fold_range(self, fold: _Fold, messages: Sequence[Message], previous: str | None,
                    prefix: Sequence[Message], start: int) -> SummaryDraft:
        draft = fold.draft
        running = self._fold(fold, messages, previous, start, prefix=False)
        calls = draft.calls
        if calls > 1:
            draft.stages.append(f"folded_{calls}_chunks")
        if prefix:
            # The facts block goes out once per compaction: the merge call above carried
            # it, and the ledger is injected beside the summary whatever either reply
            # keeps. Sending it again cost about 1k tokens on most compactions of agent
            # sessions (the cut usually splits a long turn).
            fold.ledger = Ledger() if calls else fold.ledger
            turn: str | None = None
            if not messages:  # the whole range is inside the turn the summary ends in
                running, turn = split_turn_part(running)
            fold.part_tokens = self._part_tokens(running)
            part = self._fold(fold, prefix, turn, start + len(messages), prefix=True)
            running = f"{running or ''}\n\n{PREFIX_HEADING}\n{part or ''}".strip()
            draft.stages.append("turn_prefix_update" if turn else "turn_prefix_summary")
            if draft.calls - calls > 1:
                draft.stages.append(f"turn_prefix_folded_{draft.calls - calls}_chunks")
        draft.text = running or ""
        return draft

    def _part_tokens(self, running: str | None) -> int:
        """The size asked of a turn's summary: what the summary of the turns before it
        leaves of the cap, and at least a quarter of the cap."""
        used = self.counter.text(f"{running}\n\n{PREFIX_HEADING}\n") if running else 0
        return max(self.max_summary_tokens // 4, self.max_summary_tokens - used)

    def _fold(self, fold: _Fold, messages: Sequence[Message], running: str | None,
              start: int, *, prefix: bool) -> str | None:
        """``running`` updated with ``messages``, in chunks that fit the window.

        On an overflow the rest is split again smaller (:meth:`_smaller_budget`);
        the budget learned stays with ``fold`` for the rest of the job, and once
        a request of that size passed, with the engine for later jobs. A split
        turn's prefix (``prefix``) is folded with the turn-prefix prompt, at the
        size the rest of the summary leaves (``fold.part_tokens``).
        """
        remaining = list(messages)
        rendered = render_messages(remaining, start=start)  # once; chunks take slices
        chunks, rendered = self._chunks(fold, remaining, rendered, start)
        offset = start
        refolds = 0
        while chunks:
            chunk = chunks[0]
            self._check_deadline(fold.deadline)
            cap = fold.part_tokens if prefix else self.max_summary_tokens
            if prefix:
                request = build_turn_prefix_request(
                    chunk, ledger=fold.ledger, start=offset, previous=running,
                    max_summary_tokens=cap, rendered=rendered[:len(chunk)])
            else:
                request = build_summary_request(chunk, running, ledger=fold.ledger,
                                                start=offset, max_summary_tokens=cap,
                                                rendered=rendered[:len(chunk)])
            try:
                running = self._call(fold.client, request, chunk, running, fold.draft,
                                     fold.counter, cap)
            except SummarizerOverflow as exc:
                refolds += 1
                fold.budget = self._smaller_budget(fold.budget, exc, request, refolds)
                chunks, rendered = self._chunks(fold, remaining, rendered, offset)
                fold.draft.stages.append(f"summarizer_overflow_refold_{fold.budget}")
                log.warning("summarizer overflow, the rest of the range goes in requests of "
                            "%d tokens (%d chunks): %s", fold.budget, len(chunks), exc)
                continue
            if refolds and fold.budget < self.max_input_tokens:
                self.max_input_tokens = fold.budget  # passed after an overflow: later jobs too
            remaining = remaining[len(chunk):]
            rendered = rendered[len(chunk):]
            offset += len(chunk)
            chunks = chunks[1:]
            if not prefix and running:
                fold.folded.append((offset - start, running))
        return running

    def _chunks(self, fold: _Fold, messages: list[Message], rendered: list[str],
                start: int) -> tuple[list[list[Message]], list[str]]:
        """Chunks whose whole request (prompt, previous summary at its cap, ledger,
        transcript) fits ``fold.budget``, and the messages rendered for them: a unit too
        large for any request is clipped harder (:func:`clip_to_fit`). A range that cannot
        be split that finely is a summarizer failure (the offline fallback takes it), not
        bad input."""
        def chunk(texts: list[str]) -> list[list[Message]]:
            return chunk_for_window(messages, fold.budget, self.counter,
                                    previous_summary_tokens=self.max_summary_tokens,
                                    ledger=fold.ledger, start=start, rendered=texts,
                                    max_summary_tokens=self.max_summary_tokens)

        try:
            try:
                return chunk(rendered), rendered
            except LimitExceeded:
                rendered, clipped = clip_to_fit(
                    messages, rendered, fold.budget, self.counter,
                    previous_summary_tokens=self.max_summary_tokens, ledger=fold.ledger,
                    max_summary_tokens=self.max_summary_tokens, start=start)
                if "clipped_oversized_units" not in fold.draft.stages:
                    fold.draft.stages.append("clipped_oversized_units")
                log.warning("%d units too large for a request of %d tokens were clipped",
                            clipped, fold.budget)
                return chunk(rendered), rendered
        except InvalidInput as exc:
            raise SummarizerError(f"the range cannot be split into requests of {fold.budget} "
                                  f"tokens: {exc}") from exc

    def _smaller_budget(self, budget: int, exc: SummarizerOverflow,
                        request: list[dict[str, Any]], refolds: int) -> int:
        """The input budget to try after an overflow, or SummarizerError when out of tries.

        With the window stated: the room it leaves beside the reply, scaled by
        how much more the provider counted than we did, with a safety margin;
        this becomes the engine's budget for later jobs too. Without: half of
        the request that failed (half the budget can still hold it whole).
        Always at most three quarters of the budget that overflowed.
        """
        if refolds > MAX_REFOLDS:
            raise SummarizerError(f"still overflowing after {MAX_REFOLDS} smaller splits: "
                                  f"{exc}") from exc
        ours = request_tokens(request, self.counter)
        smaller = min(budget, ours) // 2
        if exc.limit is not None:
            ratio = max(1.0, exc.requested / ours) if exc.requested and ours else 1.0
            room = exc.limit - self.max_summary_tokens
            smaller = int(room / ratio * OVERFLOW_SAFETY)
            if 0 < smaller < self.max_input_tokens:
                self.max_input_tokens = smaller  # learned: later jobs start there
        return max(1, min(smaller, budget * 3 // 4))

    def _call(self, client: LLMClient, request: list[dict[str, Any]],
              chunk: Sequence[Message], previous: str | None, draft: SummaryDraft,
              counter: TokenCounter, cap: int) -> str:
        """The checked reply to ``request``; ``cap``: the size the request asked for (a
        turn's summary is asked for less than the whole summary's cap)."""
        if self.cooldown is not None:
            self.cooldown.before_call()  # not called while the provider cools down
        # GenAI span + summarizer metrics (shared.telemetry.genai); the quality check runs
        # inside it, so a rejected reply is a failed call (error.type bad_summary).
        with model_call(client.name, client.model, self.max_summary_tokens) as call:
            try:
                completion = client.complete(request, self.max_summary_tokens)
            except SummarizerUnavailable as exc:
                if self.cooldown is not None:
                    self.cooldown.after_failure(exc)  # a stated wait holds every worker
                raise
            except self.interruptions as exc:
                raise SummarizerUnavailable(f"the job's time limit interrupted the summarizer "
                                            f"call ({type(exc).__name__})") from exc
            call.done(completion.input_tokens, completion.output_tokens, completion.model)
            draft.calls += 1
            draft.input_tokens += completion.input_tokens
            draft.output_tokens += completion.output_tokens
            input_tokens = counter.messages(list(chunk)) + (
                counter.text(previous) if previous else 0)
            return check_summary(completion.text, input_tokens=input_tokens, counter=counter,
                                 previous=previous, max_tokens=cap)

    @staticmethod
    def _check_deadline(deadline: float | None) -> None:
        """The threads pool enforces no time limit: the job checks its own between calls."""
        if deadline is not None and time.monotonic() > deadline:
            raise SummarizerUnavailable("summarization ran past its deadline")


__all__ = ["MAX_REFOLDS", "PREFIX_HEADING", "Completion", "LLMClient", "SummarizerOverflow",
           "SummaryDraft", "SummaryEngine", "split_turn_part"]
