"""What the guard learns from a provider's context-overflow error, for ``recover``: whether
it is one (and how hard to compact), the window it states or implies, and how far the
refused request was from the guard's estimate of it. Mixed into
:class:`shared.guard._shell.GuardShell`; no store calls here."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from shared.core.boundedlru import BoundedLRU
from shared.core.config import CompactionPolicy
from shared.core.limits import (
    LimitBook,
    ModelLimits,
    output_reserve,
    refused_bound,
    stated_limit,
)
from shared.core.limits import model_limits as unlearned_limits
from shared.core.messages import Message
from shared.core.model_registry import positive_int
from shared.core.overflow import OverflowInfo, is_context_overflow, parse_overflow, unrecognised
from shared.core.records import SessionState
from shared.core.tokens import TokenCounter
from shared.core.usage_learning import Sent
from shared.telemetry import get_metrics

if TYPE_CHECKING:
    from shared.guard._tracing import Traced

COUNTED_OVER = 1.25
"""A provider's stated prompt this much above the guard's estimate of it scales the
recovery down (:meth:`Recovery.counted_ratio`); less is the estimate's usual error, or
the output reserve a total may include."""
MIN_RECOVERY_RATIO = 0.001
"""The least share of the window a recovery compacts to, however far off the estimate."""
MIN_ANSWER_SHARE = 0.5
"""The least share of the answer asked for that a retry of an output-reserve overflow keeps
by lowering the reserve (:meth:`Recovery.answer_room`); with less room, the history is
compacted to make room for the answer instead."""


ANSWER_HEADROOM = 0.9
"""The share of what the answer leaves of the window that an output-reserve overflow's
retry fills (counts differ: the guard's estimate against the provider's tokenizer)."""


def _stated_prompt(error: object) -> int | None:
    """The refused prompt's size an overflow error states (None where it states none)."""
    info = parse_overflow(error)
    if info is None:
        return None
    stated = info.prompt_tokens
    if stated is None and info.requested is not None:
        stated = info.requested - (info.output_tokens or 0)
    return stated or None


def counted_over(stated: int | None, estimate: int | None, over: float = COUNTED_OVER) -> bool:
    """Whether the provider counted the refused prompt (``stated``) far (``over`` times)
    above the guard's ``estimate`` of it: media it decodes, a tokenizer the estimate does
    not know, content the guard never saw. The guard's estimates then do not measure what
    the provider counts."""
    return bool(stated and estimate and stated > estimate * over)


def counted_far_over(error: object, estimate: int | None) -> bool:
    """:func:`counted_over` for the prompt size ``error`` states."""
    return counted_over(_stated_prompt(error), estimate)


def estimate_unsure(message: Message) -> bool:
    """Whether the guard's estimate of ``message`` may be far from a provider's count: a
    tool's output or a tool call (JSON, rendered by each provider its own way), media or
    a file (counted by what the provider decodes: pages, tiles, frames), or text that is
    JSON. Plain prose the estimate measures to its usual error (:data:`COUNTED_OVER`)."""
    if message.role == "tool" or message.tool_calls:
        return True
    if not isinstance(message.content, str):
        return any(part.type != "text" or _json_like(part.text)
                   for part in message.content)
    return _json_like(message.content)


def _json_like(text: str) -> bool:
    return text.lstrip()[:1] in ("{", "[")


class Recovery:
    """The overflow figures of a guard shell (its policy, limits and last prepares)."""

    policy: CompactionPolicy
    limits: LimitBook
    overrides: dict[str, ModelLimits | int]
    counter: TokenCounter
    _lock: threading.Lock
    _sent: BoundedLRU[Sent]

    def model_limits(self, model: str, state: SessionState | None = None) -> ModelLimits:
        raise NotImplementedError  # GuardShell's

    def overflow_ratio(self, session_id: str, error: object, model: str,
                       max_tokens: int | None,
                       prepared_tokens: int | None) -> tuple[float, bool] | None:
        """The share of the window to compact to after ``error``, and whether the error was
        recognised: the recovery ratio for a context overflow; the target ratio for an
        error nothing recognises that refused a request nearly as large as the window (an
        overflow worded in a way no pattern knows: :func:`shared.core.overflow.unrecognised`,
        ``CompactionPolicy.unrecognised_overflow_at``); None for anything else (counted as
        ``not_overflow``)."""
        if is_context_overflow(error):
            share = self.answer_share(error, max_tokens)
            if share is not None:
                # what the answer leaves, filled to ANSWER_HEADROOM: that close to the
                # edge, any over-count stated is scaled out (the retry of a 10% over-count
                # left unscaled was refused again), not only a far one
                return self.counted_ratio(share, session_id, error, model, prepared_tokens,
                                          over=1.0), True
            return self.counted_ratio(self.policy.recovery_ratio, session_id, error, model,
                                      prepared_tokens), True
        threshold = self.policy.unrecognised_overflow_at
        if threshold is not None and unrecognised(error):
            fill = self.refused_fill(session_id, model, max_tokens, prepared_tokens)
            if fill is not None and fill >= threshold:
                get_metrics().recovery("unrecognised_overflow")
                return self.policy.target_ratio, False
        get_metrics().recovery("not_overflow")
        return None

    def refused_estimate(self, session_id: str, model: str,
                         prepared_tokens: int | None) -> int | None:
        """The guard's estimate of the refused request's prompt: ``prepared_tokens`` when
        the caller gives it, else this process's last prepare for the session."""
        if prepared_tokens is not None:
            return positive_int(prepared_tokens, "prepared_tokens")
        with self._lock:
            sent = self._sent.get(session_id)
        return sent.estimate if sent is not None and sent.model == model else None

    def counted_ratio(self, ratio: float, session_id: str, error: object, model: str,
                      prepared_tokens: int | None, over: float = COUNTED_OVER) -> float:
        """``ratio`` of the window, scaled down by how much more the provider counted than
        the guard estimated, when the error states the refused prompt's size (media the
        provider counts by what it decodes, a tokenizer the estimate does not know) and
        that is more than ``over`` times the estimate: compacting a fifth of the window by
        the guard's count could otherwise leave the very request that was refused."""
        estimate = self.refused_estimate(session_id, model, prepared_tokens)
        stated = _stated_prompt(error)
        if not counted_over(stated, estimate, over):
            return ratio
        assert stated is not None and estimate is not None
        return max(ratio * estimate / stated, MIN_RECOVERY_RATIO)

    def refused_ratio(self, ratio: float, error: object, window: int,
                      refused: int | None) -> float:
        """``ratio`` of ``window``, or less: for a context overflow (not an output-reserve
        or body-size one), no more than the recovery ratio of the refused request
        (``refused``, the guard's estimate of it) where that was smaller than the window.
        The provider refused it, so the window it has (or its count of the request) is
        not the one the guard knows: a fifth of ``window`` can be more than the whole
        refused request, and compacting to it dropped nothing (no retry) wherever the
        window the guard knew was larger than the request: a window another session's
        error taught, one the error restates ("maximum context length is 128000 tokens"),
        an overshoot larger than the estimate (Ollama's "exceeded ... by N tokens")."""
        if not refused or not window or refused >= window:
            return ratio
        info = parse_overflow(error)
        if info is None or info.kind != "context_overflow":
            return ratio
        return min(ratio, max(self.policy.recovery_ratio * refused / window,
                              MIN_RECOVERY_RATIO))

    def answer_share(self, error: object, max_tokens: int | None) -> float | None:
        """The share of the window to compact to after an output-reserve overflow that
        states the window: what the answer asked for leaves of it (with
        :data:`ANSWER_HEADROOM`), not the recovery ratio's fifth, which would clip the
        newest messages to make room the answer does not need. None for any other error,
        and where the answer leaves less than the recovery ratio would."""
        info = parse_overflow(error)
        if info is None or info.kind != "output_reserve_overflow" or not info.limit:
            return None
        asked = info.output_tokens or max_tokens
        if not asked:
            return None
        share = (info.limit - asked) / info.limit * ANSWER_HEADROOM
        return share if share > self.policy.recovery_ratio else None

    def answer_room(self, error: object, max_tokens: int | None,
                    refused: int | None) -> int | None:
        """The ``max_tokens`` a retry of an output-reserve overflow sends: what the window
        the error states leaves after the refused prompt (the provider's count of it, or
        the guard's estimate ``refused`` where that is larger, so that the view fits by
        both). None when the error is no such overflow, does not state both figures, or
        leaves less than :data:`MIN_ANSWER_SHARE` of the answer asked for."""
        info = parse_overflow(error)
        if info is None or info.kind != "output_reserve_overflow" or not info.limit \
                or not info.prompt_tokens:
            return None
        asked = info.output_tokens or max_tokens
        room = info.limit - max(info.prompt_tokens, refused or 0)
        if not asked or room < asked * MIN_ANSWER_SHARE:
            return None
        return min(room, asked)

    def payload_ratio(self, error: object, history: Sequence[Message], fixed: int,
                      window: int, share: float) -> float | None:
        """The share of the window to compact to after a refusal of the body's bytes (HTTP
        413, "payload size exceeds"): a share of the window in tokens misses them (a few
        inline images are megabytes and a few thousand tokens), so the newest messages
        are kept while they hold at most ``share`` of the refused body's bytes (``history``
        as sent), and the window's share is what they and the ``fixed`` part of the
        request take. The cut drops older turns, with their media and bulky outputs, never
        the newest turn. None for any other error."""
        info = parse_overflow(error)
        if info is None or info.kind != "payload_size" or not history:
            return None
        sizes = [len(m.model_dump_json()) for m in history]
        room, kept = share * sum(sizes), 0
        for size in reversed(sizes):
            if size > room:
                break
            room -= size
            kept += 1
        tokens = sum(self.counter.message(m) for m in history[len(history) - kept:])
        return max((fixed + tokens) / window, MIN_RECOVERY_RATIO)

    def refused_fill(self, session_id: str, model: str, max_tokens: int | None,
                     prepared_tokens: int | None) -> float | None:
        """How full the refused request was: (its prompt + output reserve) / window, for
        ``prepared_tokens`` (the refused view's estimate, as the caller knows it), else
        for the request this guard prepared last for the session."""
        limits = self.model_limits(model)
        with self._lock:
            sent = self._sent.get(session_id)
        if prepared_tokens is not None:
            estimate, window = positive_int(prepared_tokens, "prepared_tokens"), \
                limits.context_window
        elif sent is not None and sent.model == model:
            estimate, window = sent.estimate, sent.window
        else:
            return None
        return (estimate + output_reserve(limits, max_tokens)) / window if window else None

    def learn_overflow(self, session_id: str, error: object, model: str, trace: Traced,
                       prepared_tokens: int | None = None,
                       state: SessionState | None = None) -> int | None:
        """The limit an overflow error states (set on the span), or when it states none the
        bound the refused request sets (:meth:`refused_bound`), below the window the
        session ``state`` knows: returned for the caller to store in the session's state,
        which every process and the workers read. Learned for every session of ``model``
        in this process (:attr:`limits`) only where the window is a guess
        (:meth:`shares_bound`): where the registry, a family default or the caller knows
        it, one misconfigured endpoint (a llama.cpp server started with a 2k context) must
        not shrink the window of the model's other sessions, and only in the processes
        that happened to see its error."""
        if prepared_tokens is not None:
            positive_int(prepared_tokens, "prepared_tokens")
        info = parse_overflow(error)
        if info is None:
            return None
        known = self.model_limits(model, state)
        window = known.context_window
        stated = stated_limit(info.limit, window)
        if stated is not None:
            limit, attribute = stated, "compaction.stated_limit"
        elif info.limit == window:
            # the window it knew: the count was short, not the window wrong (nothing learned)
            trace.current.set_attribute("compaction.stated_limit", window)
            # ... though a window this process learned is written to the session again: the
            # write that followed the learning may have failed (Redis down, the call
            # cancelled), and other processes and the workers only know it from there
            return window if known.source == "learned" else None
        else:
            bound = self.refused_bound(session_id, info, model, prepared_tokens, state)
            if bound is None:
                return None
            limit, attribute = bound, "compaction.inferred_limit"
        if self.shares_bound(model):
            self.limits.learn(model, limit)
        trace.current.set_attribute(attribute, limit)
        return limit

    def shares_bound(self, model: str) -> bool:
        """Whether a limit learned from one refused request (stated or inferred) becomes
        the window of every session of ``model`` in this process: only where the window is
        a guess (``fallback``, before anything learned). Where the registry, a family
        default or the caller knows it, the refusal more likely came from an undercount
        (files, media the provider decodes) or one endpoint serving the model with less
        context than it has, which must not shrink the window of every other session on
        the model."""
        return unlearned_limits(model, overrides=self.overrides or None).source == "fallback"

    def refused_bound(self, session_id: str, info: OverflowInfo, model: str,
                      prepared_tokens: int | None = None,
                      state: SessionState | None = None) -> int | None:
        """The window an overflow that states none implies for the refused request
        (:func:`shared.core.limits.refused_bound`): ``prepared_tokens`` when the caller
        gives it (the refused view's ``report.estimated_prompt_tokens``, against the window
        known here for the session ``state``), else the request this guard prepared last
        for the session. The
        caller's figure wins: where several processes serve a session, this one's last
        prepare may be turns old, and a stale, smaller prompt would be learned as the
        window. None without either, or for a body-size refusal (bytes)."""
        if info.kind != "context_overflow":
            return None
        if prepared_tokens is not None:
            return refused_bound(prepared_tokens,
                                 self.model_limits(model, state).context_window, info.excess)
        with self._lock:
            sent = self._sent.get(session_id)
        if sent is not None and sent.model == model:
            return refused_bound(sent.estimate, sent.window, info.excess)
        return None


__all__ = ["COUNTED_OVER", "MIN_ANSWER_SHARE", "MIN_RECOVERY_RATIO", "Recovery",
           "estimate_unsure"]
