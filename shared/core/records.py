"""Typed records the store reads and writes (pydantic at the Redis boundary)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_serializer

from shared.core.limits import known_window, model_limits, plausible_unowned
from shared.core.messages import Message
from shared.core.tokens import EXTRA_TOKENS

SummaryKind = Literal["llm", "offline", "truncation"]


class SummaryRecord(BaseModel):
    """One summary, covering messages ``[0, watermark)`` of the log."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    watermark: int = Field(ge=0)
    kind: SummaryKind
    text: str
    ledger: str = Field(default="", description="rendered fact ledger injected beside the text")
    ledger_json: str | None = Field(default=None, description="the Ledger model, for merging")
    tokens: int = Field(ge=0, description="estimated tokens of text + ledger as injected")
    covers_from: int = Field(default=0, ge=0, description="watermark of the summary it merged")
    source_version: int = Field(default=0, ge=0)
    model: str | None = None
    input_tokens: int = Field(default=0, ge=0, description="summarizer input spent")
    output_tokens: int = Field(default=0, ge=0)
    stages: list[str] = Field(default_factory=list)
    created_at: float = Field(default_factory=time.time)

    def injected_text(self) -> str:
        """What the guard injects: the summary, then the ledger of facts it must keep."""
        return f"{self.text}\n\n{self.ledger}".strip() if self.ledger else self.text


DEDUPE_RULE = 2
"""The rule of ``dedupe_read`` decisions planned now: a later read stands for an earlier
one only when it holds all the earlier held (:func:`shared.core.fileops.read_scope`)."""


class CheapDecision(BaseModel):
    """A cheap-stage replacement of one message's content (or, with ``reasoning``, of its
    hosted parts' notes and figure), decided once and kept; :meth:`apply` shows it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    index: int = Field(ge=0)
    stage: Literal["clear_tool_output", "dedupe_read"]
    placeholder: str
    saved_tokens: int = Field(ge=0)
    refers_to: int | None = Field(
        default=None, ge=0, description="log index the placeholder points at (dedupe_read: "
                                        "the later read); an edit that removes it drops this")
    rule: int = Field(
        default=DEDUPE_RULE, ge=1,
        description="the planning rule that made it (stored JSON without it: 1, see "
                    ":func:`stored_decision`); see :attr:`current`")
    reasoning: str | None = Field(
        default=None,
        description="clear_tool_output of a message's hosted tool parts: the reasoning the "
                    "view message gets (its notes replaced by one that says what was "
                    "cleared), and its extra_tokens figure is dropped, so the adapters stop "
                    "sending the parts; None: reasoning and metadata kept")
    hosted_tokens: int = Field(
        default=0, ge=0,
        description="of saved_tokens, what clearing the hosted parts saves. Stored apart: "
                    "the stored saved_tokens leaves it out, since a version before this "
                    "field replaces the content only (with itself: ``placeholder`` is the "
                    "message's content) and keeps sending the parts; "
                    ":func:`stored_decision` adds it back")

    @field_serializer("saved_tokens")
    def _stored_saved(self, saved: int) -> int:
        return saved - self.hosted_tokens

    def apply(self, message: Message) -> Message:
        """``message`` as the view shows it under this decision."""
        if self.reasoning is None:
            return message.model_copy(update={"content": self.placeholder})
        metadata = {k: v for k, v in message.metadata.items() if k != EXTRA_TOKENS}
        return message.model_copy(update={"content": self.placeholder,
                                          "reasoning": self.reasoning, "metadata": metadata})

    @property
    def current(self) -> bool:
        """Whether the view applies it. A ``dedupe_read`` of rule 1 may point a whole read
        at a far smaller or failed later one (any grep, range or empty read of the file
        counted as a read of it): such decisions, stored by older versions, are not
        applied (the message is shown whole) and may be replaced (``cheap.lua``)."""
        return self.stage != "dedupe_read" or self.rule >= DEDUPE_RULE


def stored_decision(raw: str | bytes) -> CheapDecision:
    """A decision from its stored JSON; one stored without ``rule`` (by a version before
    it existed) is of rule 1. Its ``saved_tokens`` is what the view saves (with
    ``hosted_tokens``: the stored figure leaves them out)."""
    decision = CheapDecision.model_validate_json(raw)
    if decision.hosted_tokens:  # stored without it (see CheapDecision.hosted_tokens)
        decision = decision.model_copy(
            update={"saved_tokens": decision.saved_tokens + decision.hosted_tokens})
    if "rule" not in decision.model_fields_set:
        return decision.model_copy(update={"rule": 1})
    return decision


def current_decisions(raw: Mapping[int, str | bytes],
                      known: Mapping[int, CheapDecision] | None = None,
                      known_raw: Mapping[int, Any] | None = None) -> dict[int, CheapDecision]:
    """The stored decisions a view applies (:attr:`CheapDecision.current`), each decoded
    once: one ``known`` holds under the same stored JSON (``known_raw``) is reused."""
    out: dict[int, CheapDecision] = {}
    for i, v in raw.items():
        found = known.get(i) if known is not None and known_raw is not None \
            and known_raw.get(i) == v else None
        decision = found if found is not None else stored_decision(v)
        if decision.current:
            out[i] = decision
    return out


class UsageAnchor(BaseModel):
    """The provider's reported prompt tokens for one earlier request of this view."""

    model_config = ConfigDict(frozen=True)

    reported: int
    estimated: int
    end: int = Field(description="log length the request covered")
    version: int


class SessionState(BaseModel):
    """The ``state`` hash, typed. Figures the worker needs for the full budget formula."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    version: int = 0
    watermark: int = 0
    summary_tokens: int = 0
    summary_kind: str = ""
    system_tokens: int = 0
    tool_tokens: int = 0
    max_tokens: int = 0
    model: str = ""
    window: int = 0
    learned_window: int = 0
    learned_model: str = Field(default="", description="the model ``learned_window`` was "
                               "learned for (empty in states written before this field: "
                               "``model``); see :meth:`learned_for`")
    calibration_ratio: float = 1.0
    calibration_samples: int = 0
    calibration_family: str = Field(default="", description="the tokenizer family the ratio "
                                    "was learned for (openai, anthropic, gemini, generic)")
    anchor_reported: int | None = None
    anchor_estimated: int | None = None
    anchor_end: int | None = None
    anchor_version: int | None = None
    last_overflow_at: float | None = None
    silent_truncation_flags: int = 0
    ceiling_seen: int = Field(default=0, description="1: the last report sat at a ceiling "
                              "(silent truncation is flagged when the next one does too)")
    recover_next: int = Field(default=0, description="1: next prepare compacts to recovery ratio")
    force_requested: int = Field(default=0, description="1: next job compacts even below trigger")
    requests_failed: int = Field(default=0, description="compaction requests given up on")
    last_request_failure: str = Field(default="", description="JSON: when, why, which")

    @classmethod
    def from_hash(cls, raw: dict[str, str]) -> SessionState:
        return cls.model_validate({k: v for k, v in raw.items() if v != ""})

    def anchor(self) -> UsageAnchor | None:
        if None in (self.anchor_reported, self.anchor_estimated, self.anchor_end,
                    self.anchor_version):
            return None
        assert self.anchor_reported is not None and self.anchor_estimated is not None
        assert self.anchor_end is not None and self.anchor_version is not None
        return UsageAnchor(reported=self.anchor_reported, estimated=self.anchor_estimated,
                           end=self.anchor_end, version=self.anchor_version)

    def learned_for(self, model: str, known: Callable[[], int | None]) -> int:
        """The window the session learned for ``model`` (0: none): a limit one endpoint
        stated belongs to the model it was learned for, not to the session's next one.

        One stored without its owner (``learned_model`` empty: an older version wrote it)
        is taken for ``model`` only when the state names ``model`` and the window is
        plausible for it (:func:`shared.core.limits.plausible_unowned`) against
        ``known()``, the model's window as the caller knows it without learned limits
        (None: a guess); called only for such a window."""
        if not self.learned_window:
            return 0
        if self.learned_model:
            return self.learned_window if self.learned_model == model else 0
        if self.model != model:
            return 0
        return self.learned_window if plausible_unowned(self.learned_window, known()) else 0

    def unowned_learned(self) -> bool:
        """Whether the state holds a learned window with no recorded owner (written by a
        version before ``learned_model``)."""
        return bool(self.learned_window) and not self.learned_model

    def stored_learned(self) -> int:
        """:meth:`learned_for` the state's own ``model`` as a process without the guard's
        overrides (a worker, the CLI) judges it: against ``window``, the window the last
        guard budgeted that model with (it reflects the caller's override, or the learned
        window itself where a guard took it), else the registry's."""
        return self.learned_for(self.model, self._known_here)

    def _known_here(self) -> int | None:
        if self.window:
            return self.window
        if not self.model.strip():
            return None
        return known_window(model_limits(self.model))


class CommitResult(BaseModel):
    """Outcome of the compare-and-swap: losing a race is a result, not an exception."""

    model_config = ConfigDict(frozen=True)

    ok: bool
    version: int
    watermark: int
    reason: Literal["", "lease", "gone", "version", "backwards", "beyond_log"] = ""
    """``gone``: the session was deleted (or expired) since the writer read it."""


class ViewData(BaseModel):
    """One atomic read of everything prepare() needs, decoded.

    ``history`` is ``log[watermark:length]``: the messages the view is built
    from (before cheap-stage placeholders and pending messages).
    """

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    state: SessionState
    history: list[Message]
    tokens_before_watermark: int
    tokens_total: int
    length: int
    summary: SummaryRecord | None
    cheap: dict[int, CheapDecision]
    pending: bool
    epoch: str = Field(default="", description="changes when the session is re-created")
    history_counts: list[int] | None = Field(
        default=None, description="the store's token count of each history message, "
                                  "when the reader asked for them (read with the view)")

    @property
    def history_tokens(self) -> int:
        """Estimated tokens of log[watermark:], before cheap-stage savings."""
        return self.tokens_total - self.tokens_before_watermark

    def messages(self) -> list[Message]:
        """A copy of ``history`` (callers may extend it)."""
        return list(self.history)


@dataclass(frozen=True, slots=True)
class ViewCursor:
    """What a reader already holds of a session, for an incremental read.

    The reader holds ``log[start:end]`` of log generation ``gen`` in session
    ``epoch``, and the summary current at ``version``. ``total`` is the
    running token total at ``end``, checked by the store as a guard against
    a log replaced behind the generation (a restored backup, a hand edit).
    ``tail`` (the state's ``tail`` that named this end) and ``digest`` (sha1 of
    the stored ``log[end - 1]`` the reader holds) tell the store which entry
    ends it: a failover can lose an acknowledged append and another writer put
    a batch of the same token count in its place ('' = not known, none held).
    """

    epoch: str
    gen: int
    version: int
    start: int
    end: int
    total: int
    cheap_gen: str = ""
    tail: str = ""
    digest: str = ""


@dataclass(frozen=True, slots=True)
class RawView:
    """The store's undecoded view read: JSON as Redis returned it.

    Decoding is left to the caller so that a reader with a cache (the guard)
    decodes only what is new. ``messages`` are the JSON of ``log[start:length]``:
    ``start`` is the watermark for a full read, the cursor's end for an
    ``incremental`` one. ``summary_included`` is False when the reader's
    summary is still the current one (same version) and was not sent again.
    """

    state_raw: dict[str, str]
    messages: list[bytes]
    start: int
    tokens_before_watermark: int
    tokens_total: int
    length: int
    summary_json: bytes | None
    summary_included: bool
    cheap_raw: dict[int, str]
    pending: bool
    incremental: bool
    totals: list[int] = field(default_factory=list)
    cheap_included: bool = True
    """Running token totals ``cum[start - 1:length]`` (from ``cum[0]`` when start
    is 0), when they were asked for; else empty."""

    @property
    def epoch(self) -> str:
        return self.state_raw.get("epoch", "")

    @property
    def gen(self) -> int:
        return int(self.state_raw.get("gen") or 0)

    @property
    def watermark(self) -> int:
        return int(self.state_raw.get("watermark") or 0)

    def state(self) -> SessionState:
        return SessionState.from_hash(self.state_raw)

    def decode_messages(self) -> list[Message]:
        return decode_messages(b"[" + b",".join(self.messages) + b"]") if self.messages else []

    def message_counts(self) -> list[int] | None:
        """The store's token count of each message read, from ``totals``; None when
        they were not read or do not match the messages."""
        if not self.messages:
            return [] if not self.totals else None
        totals = ([0] if self.start == 0 else []) + self.totals
        if len(totals) != len(self.messages) + 1 or totals[-1] != self.tokens_total:
            return None
        return [b - a for a, b in itertools.pairwise(totals)]


@dataclass(frozen=True, slots=True)
class InlineJob:
    """A broker message the append script pushes itself when it sets the pending flag.

    When the Celery broker is the store's own Redis server (any database),
    the job rides in the append: one round trip instead of two, and the flag
    and the job are set together or not at all. ``key`` is the queue's list
    in database ``db`` (the store's is ``store_db``), ``message`` the bytes
    kombu's Redis channel would push (:class:`shared.enqueue.RedisTaskPublisher`).
    """

    key: str
    message: bytes
    db: int = 0
    store_db: int = 0


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Outcome of one append.

    ``duplicate``: the request id had been seen, nothing was written, and
    ``length`` / ``tokens_before`` are those of the first append. ``marked``:
    this append set the session's pending flag, so its caller publishes the
    summary job (coalescing: one job per burst), unless ``published``: the
    script pushed the :class:`InlineJob` it was given. ``republished``: the flag
    it set had stood past the store's stale age with no worker claiming its job
    (lost): re-armed, and the job is asked for again. ``state`` is the session
    state after the append, when it was asked for.
    """

    length: int
    watermark: int
    version: int
    tokens_before: int
    duplicate: bool = False
    marked: bool = False
    state: SessionState | None = None
    state_raw: Mapping[str, str] | None = None  # the same hash as the store holds it
    batch: Sequence[tuple[str | bytes, int]] = ()  # what was sent: (stored JSON, token count) each
    pending: bool | None = None  # the pending flag right after the append (None: not told)
    published: bool = False  # the script pushed the job it carried (InlineJob)
    republished: bool = False  # marked by re-arming a stale flag: its job is asked for again
    tail_before: str | None = None  # the state's ``tail`` before the append (None: not told)


@dataclass(frozen=True, slots=True)
class HistoryEdit:
    """Outcome of a history edit (truncate_after, rewind): the session as the edit left it.

    Read atomically with the edit, so ``version`` is the one the edit
    created (a separate read could already see a later writer's).
    """

    version: int
    watermark: int
    length: int


_MESSAGE_LIST: TypeAdapter[list[Message]] = TypeAdapter(list[Message])


def decode_messages(raw: bytes | str) -> list[Message]:
    """A JSON array of stored messages, decoded in one pass."""
    return _MESSAGE_LIST.validate_json(raw)


__all__ = [
    "DEDUPE_RULE",
    "AppendResult",
    "CheapDecision",
    "CommitResult",
    "HistoryEdit",
    "RawView",
    "SessionState",
    "SummaryKind",
    "SummaryRecord",
    "UsageAnchor",
    "ViewCursor",
    "ViewData",
    "current_decisions",
    "decode_messages",
    "stored_decision",
]
