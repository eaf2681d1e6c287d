"""The guard's reactive recovery, as sans-I/O steps shared by both shells.

After a provider refused a request for its size, ``recover`` learns the stated limit,
compacts the view hard without an LLM and returns it for one retry, or None when no
view would fare better than the refused one. Every view is judged before its plan
writes anything (:meth:`GuardFlow._build`'s ``accept``): a recovery that gives up
leaves the session as it was, but for the window the error taught.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from shared.core.chunks import concat
from shared.core.errors import IrreducibleOverflow
from shared.core.guard_state import plan_view
from shared.core.messages import Message
from shared.core.model_registry import positive_int
from shared.core.overflow import is_context_overflow
from shared.core.prepared import PreparedView, ViewReport
from shared.core.viewcache import CachedView
from shared.guard._flow import GuardFlow, Io, NotSent, Steps
from shared.guard._recovery import counted_far_over, estimate_unsure
from shared.guard._shell import check_min_length
from shared.guard._tracing import Traced
from shared.store.keys import validate_session_id
from shared.telemetry import get_metrics

log = logging.getLogger("shared.guard")


def _unsendable(report: ViewReport, refused: int | None,
                unseen: Callable[[], bool] = lambda: False) -> str:
    """Why a recovery's view would be refused like the one before it ("" when it would
    not): it does not fit, or it is no smaller than the refused one (``refused`` tokens;
    None where the retry lowers the reserve instead: the view holds only what must
    stay). ``unseen`` (asked only then): whether the provider's count of the refused
    prompt is no measure of this one, so that a view that dropped messages is sent
    although the guard counts it no smaller (:meth:`RecoveringFlow._miscounted`)."""
    if not report.budget.within_budget:
        return "the view does not fit"
    if refused is None or report.estimated_prompt_tokens < refused:
        return ""
    if not (report.dropped_messages or report.note):
        return "nothing left to drop"
    if unseen():
        return ""
    # as large as the refused one by the guard's count, and what it cut is counted well
    # (or the notice of the cut outweighs what it dropped: the provider counts it too)
    return "the compacted view is no smaller than the refused one"


def _user_kept(view: Sequence[Message], pending: Sequence[Message]) -> bool:
    """Whether the newest user message of ``pending`` is in ``view`` as given (a cut may
    clip it down to its marker when nothing else is left to drop)."""
    newest = next((m for m in reversed(pending) if m.role == "user"), None)
    return newest is None or any(m == newest for m in view[-len(pending):])


def _not_retried(trace: Traced, session_id: str, refused: int | None, why: str) -> None:
    """No retry after an overflow: no view smaller than the refused one (``refused``
    tokens, when known) fits, so the same request would be refused again."""
    trace.current.set_attribute("compaction.no_smaller_view", True)
    get_metrics().recovery("no_smaller_view")
    log.warning("session %s: overflow, but no smaller view than the refused one (~%s "
                "tokens) can be made (%s); not retried", session_id,
                refused if refused is not None else "?", why)



class RecoveringFlow(GuardFlow):
    """The guard's flows with ``recover``: what both shells run."""

    def recover_steps(self, session_id: str, error: object, system_prompt: str,
                      tools: Sequence[Mapping[str, Any]] | None, max_tokens: int | None,
                      model: str | None, pending: Sequence[Message | Mapping[str, Any]],
                      prepared_tokens: int | None,
                      min_length: int | None) -> Steps[PreparedView | None]:
        check_min_length(min_length)
        model = self.given_model(model)
        recognised = is_context_overflow(error)
        ratio = 0.0
        if not recognised:  # an overflow in wording no pattern knows, or none
            decided = self.overflow_ratio(session_id, error, model, max_tokens,
                                          prepared_tokens)
            if decided is None:
                return None
            ratio = decided[0]
        elif prepared_tokens is not None:
            positive_int(prepared_tokens, "prepared_tokens")
        with self.traced_recover(session_id, model, error) as trace:
            if not recognised:
                trace.current.set_attribute("compaction.unrecognised_error", True)
            validate_session_id(session_id)
            snap = yield from self.snapshot_steps(session_id, min_length)
            extra, extra_tokens = self.pending(session_id, pending)
            # the refused request's size, in whichever process prepared it: measured
            # against the window it was prepared for, before anything is learned
            refused = self._refused(session_id, snap, system_prompt, tools, max_tokens, model,
                                    extra, extra_tokens, prepared_tokens)
            if recognised:
                decided = self.overflow_ratio(session_id, error, model, max_tokens, refused)
                assert decided is not None  # a context overflow always has one
                ratio = decided[0]
            # learned against the window the session knows (a limit it learned before
            # included: an overflow never raises it), and stored in its state, which every
            # process and the workers read: kept whether or not a view is sent
            limit = self.learn_overflow(session_id, error, model, trace, refused, snap.state)
            if limit:
                self.touched(session_id)
                yield Io("update_state", (session_id,), {
                    "learned_window": limit, "learned_model": model, "model": model,
                    "last_overflow_at": time.time()})
                snap = yield from self.snapshot_steps(session_id, min_length)
            started = time.perf_counter()
            if recognised:
                ratio = self.refused_ratio(
                    ratio, error, self.model_limits(model, snap.state).context_window, refused)
            ratio = self._payload_ratio(session_id, error, snap, system_prompt, tools,
                                        max_tokens, model, extra, extra_tokens, ratio)
            room = self.answer_room(error, max_tokens, refused)
            over = counted_far_over(error, refused)

            def sendable(view: PreparedView, base: CachedView) -> str:
                why = _unsendable(view.report, refused,
                                  lambda: over and self._miscounted(base, extra, view))
                if not why and room is not None and not _user_kept(view.messages, extra):
                    why = "the newest user message was clipped"
                return why

            # Each view is judged before its plan writes anything: a truncation committed
            # for a view that is not sent would cost the session its history for nothing.
            view: PreparedView | None = None
            try:
                view = yield from self._build(session_id, snap, system_prompt, tools,
                                              max_tokens, model, extra, extra_tokens, started,
                                              ratio, accept=sendable)
                why = ""
            except NotSent as exc:
                why = str(exc)
            except IrreducibleOverflow as exc:  # not even the floor fits the window now known
                why = str(exc)
            if why and room is not None:
                # The prompt alone fitted, and compacting it makes no room for the answer
                # without clipping the user's newest message: the same view with a reserve
                # that fits (sent as view.report.budget.reserve). Only then: callers that
                # send their own max_tokens (the README's loops) retry a compacted view.
                try:
                    view = yield from self._build(
                        session_id, snap, system_prompt, tools, room, model, extra,
                        extra_tokens, started, None, exact=True,
                        accept=lambda v, _: _unsendable(v.report, None))
                    why = ""
                except NotSent as exc:
                    why = str(exc)
            if why or view is None:
                _not_retried(trace, session_id, refused, why)
                return None
            if max_tokens is not None and view.report.budget.reserve < max_tokens:
                log.warning("session %s: the retry leaves room for %d tokens of answer, not "
                            "the max_tokens %d asked for: send view.report.budget.reserve "
                            "as max_tokens", session_id, view.report.budget.reserve,
                            max_tokens)
            return trace.recovered(view)

    def _refused(self, session_id: str, snap: CachedView, system_prompt: str,
                 tools: Sequence[Mapping[str, Any]] | None, max_tokens: int | None,
                 model: str, extra: list[Message], extra_tokens: list[int],
                 prepared_tokens: int | None) -> int | None:
        """The guard's estimate of the refused request's prompt: ``prepared_tokens`` when
        the caller gives it; else this process's prepare of the same turn (same model, same
        log and pending length); else the view a prepare of ``snap`` with these arguments
        makes, planned here and written nowhere (:meth:`_as_prepared`).

        Planned rather than stored: the prepare that made the refused view (in this process
        or another, an HTTP server's) read the same session with the same arguments, and
        recording its size for other processes would cost a write on every quiet prepare,
        the hot path. A summary that landed in between makes the planned view smaller than
        the refused one: the retry must then be smaller than that, which errs toward not
        retrying, never toward sending the refused request again."""
        if prepared_tokens is not None:
            return positive_int(prepared_tokens, "prepared_tokens")
        with self._lock:
            sent = self._sent.get(session_id)
        if sent is not None and sent.model == model and sent.end == snap.end + len(extra):
            return sent.estimate
        return self._as_prepared(session_id, snap, system_prompt, tools, max_tokens, model,
                                 extra, extra_tokens)

    def _as_prepared(self, session_id: str, snap: CachedView, system_prompt: str,
                     tools: Sequence[Mapping[str, Any]] | None, max_tokens: int | None,
                     model: str, extra: list[Message], extra_tokens: list[int]) -> int | None:
        """The estimate of the view :meth:`prepare_steps` makes of ``snap`` (None where it
        would raise): planned on a copy of the entry, cached nowhere, written nowhere."""
        force = self.policy.recovery_ratio if snap.state.recover_next else None
        req = self.request(session_id, system_prompt, tools, max_tokens, model, snap.state,
                           extra, extra_tokens, force, scan=snap.scan, said=False)
        try:
            plan, _ = plan_view(replace(snap), req, self.policy, self.counter)
        except IrreducibleOverflow:
            return None
        return plan.view.report.estimated_prompt_tokens

    @staticmethod
    def _miscounted(snap: CachedView, extra: Sequence[Message], view: PreparedView) -> bool:
        """Whether what ``view`` cut from the stored view and the pending turn could hold
        what the provider counted beyond the guard's estimate (:func:`counted_far_over`):
        a message it dropped or changed whose estimate is unsure
        (:func:`shared.guard._recovery.estimate_unsure`).

        The rule, and not "smaller than the refused size scaled by the provider's
        over-count": that scale assumes the provider counts every token alike, and then
        a view the guard counts no smaller than the refused one is no smaller to the
        provider either: the exception would never apply. What makes a larger estimate
        worth a retry is that the excess lay in what was cut, and only content whose
        count the estimate cannot vouch for can hide it; dropped plain text is measured
        (to the estimate's usual error), so the excess is still in the retry and it would
        be refused again."""
        kept = {id(m) for m in view.messages}
        return any(id(m) not in kept and estimate_unsure(m)
                   for m in concat(snap.applied, extra))

    def _payload_ratio(self, session_id: str, error: object, snap: CachedView,
                       system_prompt: str, tools: Sequence[Mapping[str, Any]] | None,
                       max_tokens: int | None, model: str, extra: list[Message],
                       extra_tokens: list[int], ratio: float) -> float:
        """``ratio``, or for a refusal of the body's bytes the share of the window that
        keeps ``ratio`` of the view's bytes (:meth:`payload_ratio`)."""
        req = self.request(session_id, system_prompt, tools, max_tokens, model, snap.state,
                           extra, extra_tokens, None, scan=snap.scan, said=False)
        found = self.payload_ratio(error, [*snap.applied, *extra],
                                   req.system_tokens + req.tool_tokens + req.overhead,
                                   req.window, ratio)
        return ratio if found is None else found


__all__ = ["RecoveringFlow"]
