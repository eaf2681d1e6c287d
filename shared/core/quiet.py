"""A tool chain's next quiet prepare from the last one's plan: only what the turn added.

Between two recorded turns an agent prepares once per model call, each time with the
turn so far as pending. When the last plan of the turn was *quiet* (nothing to
write: the view is the cached history with the pending turn after it) and
nothing changed since but one or a few appended pending messages, most of what
:func:`shared.core.guard_state.plan_view` works out is what it worked out last time: the
request's fixed figures, the summary's framing and notice, the calibration prior, the
view's head. :func:`plan_again` keeps those (:class:`Again`) and does only the delta:
the pair scan resumed over the new messages (or, in a turn whose call ids repeat, its
renaming: :mod:`shared.core.renamed`), the one estimate, the budget check, the report.
Over the trigger it applies while the cheap stages were planned for the snapshot and the
summary job is queued (as the worker catches up, a chain's calls write nothing).
Anything else (a new snapshot, another request, a pending turn that is not a
continuation, a scan that needs repair, a view over its budget)
answers None and the caller plans in full, so the plan is the one
:func:`~shared.core.guard_state.plan_view` makes (a differential test holds it:
``tests/test_guard_quiet_delta.py``). Pure: no I/O.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple

from shared.core.calibration import model_family, prior_ratio
from shared.core.chunks import concat
from shared.core.config import CompactionPolicy
from shared.core.guard_state import Plan, Request, _notice, check, newest_tokens
from shared.core.messages import Message
from shared.core.pairs import PairScan, scan_pairs
from shared.core.prepared import PreparedView, ViewReport
from shared.core.renamed import RenamedTurn, known_renamed
from shared.core.tokens import TokenCounter
from shared.core.usage_learning import Sent
from shared.core.view import summary_framing, view_estimate
from shared.core.viewcache import CachedView


class Again(NamedTuple):
    """What a quiet incremental plan of ``snap`` for ``req`` leaves for the turn's next
    call: the pending messages it covered (``extra``, by identity), their pair scan, and
    the figures that depend only on the snapshot and the request's fixed part (a tuple:
    one is made per call)."""

    snap: weakref.ref[CachedView]  # weakly: a turn kept longer must not keep the view
    req: Request  # read for its fixed part (what else it holds, the pending turn keeps too)
    extra: tuple[Message, ...]
    scan: PairScan
    newest: int
    notice_tokens: int
    prior: float
    family: str
    framing: int
    head: Sequence[Message]
    head_wire: dict[str, Any] | None
    log_fixed: int  # system + tools + overhead + the stored log's tokens
    # the pending turn renamed (its call ids repeat): continued call by call, as a full plan
    # continues it, so that such a turn's calls cost what theirs do
    renamed: RenamedTurn | None = None


def again_of(snap: CachedView, req: Request, plan: Plan, policy: CompactionPolicy,
             counter: TokenCounter) -> Again | None:
    """The :class:`Again` of a plan :func:`plan_view` made for a prepare, when it is quiet
    and incremental (else None: the next call plans in full)."""
    view, renamed = plan.view, plan.extra_renamed
    scan = plan.extra_scan if renamed is None else renamed.scan
    report = view.report
    if (plan.figures or plan.cheap or plan.truncation is not None or plan.force
            or (plan.enqueue and not _job_asked(snap)) or plan.clear_recover_next
            or scan is None or not scan.intact or req.force_ratio is not None
            or report.truncated or not report.budget.within_budget):
        return None
    private = view.__pydantic_private__
    assert private is not None
    extra = private["_extra"]
    if private["_applied"] is not snap.applied or private["_wire"] is not snap.wire \
            or len(extra) != len(req.extra):
        return None  # not the incremental view (a repaired one, say)
    first = (snap.applied[0],) if len(snap.applied) else tuple(extra[:1])
    head = private["_head"]
    return Again(
        snap=weakref.ref(snap), req=req,
        extra=tuple(extra) if renamed is None else tuple(req.extra), scan=scan,
        newest=newest_tokens(extra, req.extra_tokens),
        notice_tokens=_notice(snap.summary, req, counter)[1],
        prior=prior_ratio(req.model, counter), family=model_family(req.model),
        framing=summary_framing(req.summary_join, req.system_prompt, first,
                                policy.summary_placement),
        head=head, head_wire=private["_head_wire"],
        log_fixed=req.system_tokens + req.tool_tokens + req.overhead + snap.total,
        renamed=renamed)


def _job_asked(snap: CachedView) -> bool:
    """Whether a plan that wants the summary job asks for nothing (the shell's
    ``job_wanted``): the view shows it queued, or nothing is stored for it to compact."""
    return snap.pending or not snap.end


def plan_again(base: Again, snap: CachedView, extra: list[Message], extra_tokens: list[int],
               extra_wire: Sequence[dict[str, Any]],
               policy: CompactionPolicy) -> tuple[Plan, Again] | None:
    """The plan :func:`plan_view` makes for ``snap`` and the same request's fixed part with
    the pending turn ``extra`` (``base.extra`` and what was appended since), and the
    :class:`Again` it leaves; None where it may differ from a quiet incremental one."""
    k = len(base.extra)
    if snap is not base.snap() or len(extra) < k or not all(map(operator.is_, base.extra, extra)):
        return None
    renamed = base.renamed
    sent: list[Message]
    if renamed is not None:  # as plan_view continues the turn's renaming
        renamed = known_renamed(extra, snap, renamed)
        if renamed is None:
            return None
        scan, sent, extra_wire = renamed.scan, list(renamed.renamed), renamed.slots
    else:
        scan = scan_pairs(extra[k:], base.scan) if len(extra) > k else base.scan
        sent = list(extra)
    if not scan.intact:  # renaming or repair: planned in full
        return None
    newest = newest_tokens(sent, extra_tokens)
    if newest != base.newest:  # the reserve was sized with it
        return None
    req, state = base.req, snap.state
    added = sum(extra_tokens)
    regions, estimated = view_estimate(
        state, snap.summary, snap.history_tokens, snap.saved, snap.end, overhead=req.overhead,
        system=req.system_tokens, tools=req.tool_tokens, extra=added,
        notice=base.notice_tokens, prior=base.prior, family=base.family, framing=base.framing)
    report = check(req.window, req.reserve, regions, estimated, newest, policy)
    if not report.within_budget:
        return None
    # Over the trigger, a proactive plan plans the cheap stages (planned already for this
    # snapshot: none) and wants the job (queued already: not asked again): nothing to write.
    enqueue = report.should_compact and policy.proactive
    if enqueue and not (snap.planned_end == snap.end and _job_asked(snap)):
        return None
    memo = snap.quiet  # head + history, made once per cached view and head
    found = memo.get("messages")
    if found is None or found[0] is not snap.applied or found[1] is not base.head:
        found = memo["messages"] = (snap.applied, base.head, concat(base.head, snap.applied))
    view = PreparedView.built(
        found[2].plus(sent),  # concat(head, applied, sent), the prefix's walk kept
        ViewReport.built(req.session_id, req.model, req.limits_source, report, estimated,
                         snap.start, state.version, snap.end, state.summary_kind,
                         len(snap.cheap), False, 0, "", False, snap.pending, False, False,
                         0.0),
        head=base.head, head_wire=base.head_wire, wire=snap.wire, applied=snap.applied,
        extra=sent, extra_wire=extra_wire if len(extra_wire) == len(sent) else (),
        memo=memo)
    plan = Plan(view=view, sent=Sent(regions.total, estimated, snap.end + len(sent), req.window,
                                     state.version, state, req.model),
                version=state.version, enqueue=enqueue, log_tokens=base.log_fixed + added,
                extra_scan=scan if renamed is None else None, extra_renamed=renamed)
    return plan, base._replace(extra=tuple(extra), scan=scan, renamed=renamed)


__all__ = ["Again", "again_of", "plan_again"]
