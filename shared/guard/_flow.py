"""The guard's calls, written once for both shells as sans-I/O steps.

Every call a guard makes on the store or on its own-writes connection is
yielded as an :class:`Io`; the shell sends the reply back in (or throws the
call's exception in, where the flow handles it). :mod:`shared.guard.sync`
performs each step with a blocking call, :mod:`shared.guard.aio` awaits it:
that is all that differs between them, as :func:`shared.store.commands.drive`
and :func:`~shared.store.commands.drive_async` run the store's own steps.

A flow that needs no I/O (a warm ``prepare`` whose view the change feed
vouches for) runs to its end without yielding.

``prepare`` reads what changed in the session since the cached view (one
atomic script), lets the core (:func:`shared.core.guard_state.plan_view`)
decide, performs the plan's writes (figures, cheap decisions, a truncation
through the compare-and-swap, the job) and returns the view. ``record_turn``
appends and enqueues, coalesced. ``recover`` handles a context-overflow
error: learn the stated limit, compact hard, return a view for one retry.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import Any, NamedTuple, TypeVar

from shared.core.errors import SessionDamaged, SessionNotFound, StoreUnavailable
from shared.core.guard_state import Plan, plan_view
from shared.core.messages import Message, check_tool_results, validate_messages
from shared.core.prepared import PreparedView
from shared.core.records import AppendResult, RawView
from shared.core.viewcache import CachedView, decode_view
from shared.core.wireview import carry
from shared.enqueue import Enqueuer
from shared.guard._again import QuietAgain
from shared.guard._shell import (
    check_min_length,
    check_request,
    plain_writes,
    settle_garbage,
)
from shared.store import commands
from shared.store.changes import CHANGED
from shared.store.commands import Command
from shared.store.keys import validate_session_id
from shared.store.own_writes import OwnMark, vouch
from shared.telemetry import get_metrics
from shared.telemetry.publish_log import log_republished, publish_failures

log = logging.getLogger("shared.guard")
T = TypeVar("T")


_NO_KWARGS: Mapping[str, Any] = MappingProxyType({})


DECODE_OFF_LOOP_BYTES = 256 * 1024
"""A read whose messages hold more JSON than this is decoded as a step of its own (an
``Io`` marked ``local``), which the async shell runs on a worker thread: decoding costs
~5-10 ns a byte (a cold 10k-message read, 11.7 MB, held the event loop 50-130 ms, every
other request of the server waiting), a thread hop ~0.1 ms. Smaller reads (a turn's few
messages) are decoded in line: a warm prepare never hops."""


class Io(NamedTuple):
    """One call for the shell to make: ``method`` of the store (or, ``own``, of the
    own-writes connection; ``local``, of the guard itself: CPU work, no I/O, that the
    async shell makes off its event loop) with these arguments. (A tuple: a quiet
    prepare makes one, and a frozen dataclass costs a microsecond to build.)"""

    method: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = _NO_KWARGS
    own: bool = False
    local: bool = False


Steps = Generator[Io, Any, T]
Accept = Callable[[PreparedView, CachedView], str]


def _writes(plan: Plan, snap: CachedView, wanted: bool, force: bool) -> bool:
    """Whether a plan has anything to write (a quiet call writes nothing)."""
    return bool(plan.figures or plan.cheap or plan.truncation is not None
                or plan.clear_recover_next or wanted)


def _decoding(cached: CachedView | None) -> CachedView | None:
    """The entry a decode off the event loop extends: a shallow copy, its wire forms' dict
    copied too (a request on the loop may add a format to the cached entry's meanwhile,
    :func:`shared.core.wireview.history_wire`; its planning sets ``cheap_scan`` and
    ``repaired``). The rest is shared, never changed in place."""
    if cached is None:
        return None
    return dataclasses.replace(cached, wire=dict(cached.wire))


def abandon(steps: Steps[Any], exc: BaseException) -> None:
    """A flow whose call was cancelled (``asyncio.wait_for``, ``task.cancel()``) or
    interrupted (KeyboardInterrupt): ``exc`` thrown into it at its step, so that its
    cleanups (a cached view of writes that may not have been made, an unanswered append's
    request id) run now, before the caller's next call. Left suspended, the flow ran them
    when the garbage collector got to it: after that next call, which then used the
    cached view Redis never got. The caller raises ``exc``."""
    with contextlib.suppress(BaseException):  # exc itself, as a rule
        steps.throw(exc)
    steps.close()


class NotSent(Exception):
    """A recovery's view that would be refused again (the reason): raised before any of
    its plan's writes, so that a recovery that gives up leaves the session as it was."""


def _published(session_id: str = "", republished: bool = False) -> None:
    """A job got to the broker: counted, and the end of a publish outage if one was on.
    ``republished``: its pending flag was a stale one re-armed (the first job was lost):
    counted apart and logged."""
    get_metrics().enqueue("republished" if republished else "published")
    if republished:
        log_republished(session_id)
    publish_failures.published()


def _sent_at(plan: Plan, version: int | None) -> None:
    """The request was sent at the version its own truncation made: the usage report of
    it is learned from (the append checks the version), where it was dropped on every turn
    the guard truncated, and a session truncated turn after turn never calibrated."""
    if version is not None:
        plan.sent = dataclasses.replace(plan.sent, version=version)


class GuardFlow(QuietAgain):
    """What both guards do, as steps. A shell sets ``store``, ``enqueuer``, the store and
    own-writes classes it writes through, and runs steps with :meth:`drive`."""

    store: Any
    enqueuer: Enqueuer
    store_class: type
    own_class: type

    def drive(self, steps: Steps[T]) -> Any:
        """Run ``steps`` to their end (blocking, or as a coroutine to await)."""
        raise NotImplementedError

    def perform(self, io: Io) -> Any:
        """The call ``io`` names (its reply, or an awaitable of it)."""
        target = self if io.local else self.own if io.own else self.store
        return getattr(target, io.method)(*io.args, **io.kwargs)

    @staticmethod
    def decoded(raw: RawView, cached: CachedView | None) -> CachedView:
        """A large read decoded (a ``local`` step: the async shell's worker thread runs
        it). It touches only its arguments, which nothing else changes meanwhile: the
        read is this call's, the entry a copy (:func:`_decoding`)."""
        return decode_view(raw, cached, carry)

    def _own_free(self) -> bool:
        return isinstance(self.own, self.own_class)

    # -- reading -------------------------------------------------------------------
    def snapshot_steps(self, session_id: str, min_length: int | None = None,
                       ) -> Steps[CachedView]:
        """The session's view, read incrementally against the cached one (one round trip,
        none while Redis reports nothing of the session written since the cached read and
        the log is known to be no longer than it: ``min_length``)."""
        validate_session_id(session_id)  # before it is used as a cache key
        if not self.behind(session_id, min_length):
            fresh = self.fresh(session_id)
            if fresh is not None:
                return fresh
        return (yield from self._read_steps(session_id, min_length))

    def _read_steps(self, session_id: str, min_length: int | None) -> Steps[CachedView]:
        """:meth:`snapshot_steps` where the change feed alone does not vouch for the
        cached view: the own writes' count may, else a read."""
        if not self.behind(session_id, min_length):
            own = self.own_vouched(session_id)
            if own is not None and self._own_free():
                seen = yield Io("since", (self.session_base(session_id), own[1]), own=True)
                if seen != CHANGED:
                    return self.settled(session_id, own[0], max(seen, own[2]))
        cached = self.views.get(session_id)
        mark = self.mark()
        try:
            raw = yield Io("read_view", (session_id, cached.cursor if cached is not None
                                         else None), {"with_counts": True})
        except SessionDamaged as exc:
            yield from self._mend_damaged(session_id, exc)
            cached = None
            raw = yield Io("read_view", (session_id, None), {"with_counts": True})
        snap: CachedView
        if sum(map(len, raw.messages)) > DECODE_OFF_LOOP_BYTES:  # <1% of what it decides on
            snap = yield Io("decoded", (raw, _decoding(cached)), local=True)
        else:
            snap = decode_view(raw, cached, carry)
        settle_garbage(raw)
        snap.mark = mark
        if raw.epoch:
            self.views.put(session_id, snap)
        return snap

    def _mend_damaged(self, session_id: str, exc: SessionDamaged) -> Steps[None]:
        """Some of the session's keys were evicted: its running totals are counted again
        from its log when that is whole (its history kept), else the rest of its keys are
        removed and it starts afresh, as an expired one would (:mod:`shared.store.damage`:
        checked again in the same script as each write)."""
        self.views.discard(session_id)
        done = yield Io("mend_damaged", (session_id,))
        if done == "retotaled":
            log.warning("session %s: %s; its running totals were counted again from its "
                        "log, its history kept", session_id, exc)
        elif done == "reset":
            log.warning("session %s: %s; its other keys were removed and it starts afresh",
                        session_id, exc)

    # -- prepare -------------------------------------------------------------------
    def prepare_steps(self, session_id: str, system_prompt: str,
                      tools: Sequence[Mapping[str, Any]] | None, max_tokens: int | None,
                      model: str | None, pending: Sequence[Message | Mapping[str, Any]],
                      fallback_messages: Sequence[Message | Mapping[str, Any]] | None,
                      min_length: int | None) -> Steps[PreparedView]:
        started = time.perf_counter()
        model = self.given_model(model)
        with self.traced_prepare(session_id, model) as trace:
            validate_session_id(session_id)  # before it is used as a cache key
            check_request(system_prompt, tools)
            check_min_length(min_length)
            extra, extra_tokens = self.pending(session_id, pending)
            try:
                snap = self.fresh(session_id) if not self.behind(session_id, min_length) \
                    else None
                if snap is None:
                    snap = yield from self._read_steps(session_id, min_length)
            except StoreUnavailable:
                if fallback_messages is None:
                    raise
                return trace.view(self.degraded(session_id, system_prompt, tools, max_tokens,
                                                model, validate_messages(fallback_messages)
                                                + extra, started))
            force = self.policy.recovery_ratio if snap.state.recover_next else None
            planned = self._plan(session_id, snap, system_prompt, tools, max_tokens, model,
                                 extra, extra_tokens, force)
            if not _writes(*planned):  # a quiet call: no step at all
                return trace.view(self._quiet(session_id, planned[0], started))
            try:
                view = yield from self._write(session_id, *planned, system_prompt, tools,
                                              max_tokens, model, extra, extra_tokens, started,
                                              force)
            except StoreUnavailable as exc:
                if fallback_messages is None:
                    raise
                # The read answered, its writes did not (Redis went away in between): the
                # view planned from that read is still the one to send; the next call
                # plans its writes again.
                log.warning("session %s: the view's writes failed, sent unrecorded (%s)",
                            session_id, exc)
                return trace.view(self.finish(planned[0], False, started))
            return trace.view(view)

    def _build(self, session_id: str, snap: CachedView, system_prompt: str,
               tools: Sequence[Mapping[str, Any]] | None, max_tokens: int | None, model: str,
               extra: list[Message], extra_tokens: list[int], started: float,
               force_ratio: float | None, retry_lost_swap: bool = True, *,
               exact: bool = False, accept: Accept | None = None) -> Steps[PreparedView]:
        """The view from ``snap``: planned, its writes performed (``exact``: ``max_tokens``
        was made to fit this view, :meth:`request`). ``accept``: why the view planned from
        ``snap`` would not be sent ("" when it would), asked before any write;
        :class:`NotSent` when it would not, nothing written."""
        planned = self._plan(session_id, snap, system_prompt, tools, max_tokens, model, extra,
                             extra_tokens, force_ratio, exact=exact)
        if accept is not None:
            why = accept(planned[0].view, snap)
            if why:
                if planned[0].cheap:  # the cached entry holds decisions never stored
                    self.views.discard(session_id)
                raise NotSent(why)
        if not _writes(*planned):
            return self._quiet(session_id, planned[0], started)
        return (yield from self._write(session_id, *planned, system_prompt, tools, max_tokens,
                                       model, extra, extra_tokens, started, force_ratio,
                                       retry_lost_swap, exact=exact, accept=accept))

    def _plan(self, session_id: str, snap: CachedView, system_prompt: str,
              tools: Sequence[Mapping[str, Any]] | None, max_tokens: int | None, model: str,
              extra: list[Message], extra_tokens: list[int], force_ratio: float | None,
              *, exact: bool = False) -> tuple[Plan, CachedView, bool, bool]:
        """The core's plan for this request, the cached entry it leaves, and whether a job
        is wanted (and forced)."""
        if force_ratio is None and not exact:  # a tool chain's next quiet call: the delta
            again = self.planned_again(session_id, snap, system_prompt, tools, max_tokens,
                                       model, extra, extra_tokens)
            if again is not None:  # nothing to write, no job: the cached entry stays
                return again, snap, False, False
        state = snap.state
        req = self.request(session_id, system_prompt, tools, max_tokens, model, state,
                           extra, extra_tokens, force_ratio, scan=snap.scan, exact=exact)
        base = snap.scan
        plan, snap = plan_view(snap, req, self.policy, self.counter)
        if plan.truncation is not None and self.squeezed(req, max_tokens, state):
            plan = replace(plan, truncation=None, force=False)  # this call's, not stored
        self.scanned(session_id, req, plan, base)
        self.keep_quiet(session_id, snap, req, plan, system_prompt, tools, max_tokens, model,
                        extra, exact)
        if snap.epoch:
            self.views.put(session_id, snap)
        # a job already queued (the flag in this view) needs no second request
        wanted, force = self.job_wanted(plan, snap)
        return plan, snap, wanted, force

    def _quiet(self, session_id: str, plan: Plan, started: float) -> PreparedView:
        """The view of a plan that writes nothing."""
        self.performed(plan, True)
        self.remember(session_id, plan.sent)
        return self.finish(plan, False, started)

    def _write(self, session_id: str, plan: Plan, snap: CachedView, wanted: bool, force: bool,
               system_prompt: str, tools: Sequence[Mapping[str, Any]] | None,
               max_tokens: int | None, model: str, extra: list[Message],
               extra_tokens: list[int], started: float, force_ratio: float | None,
               retry_lost_swap: bool = True, *, exact: bool = False,
               accept: Accept | None = None) -> Steps[PreparedView]:
        """The plan's writes and job performed, then its view; after a lost swap, built
        once more from what won (and judged by ``accept`` again)."""
        try:
            done = yield from self._perform_own(session_id, plan, snap, wanted, force)
            won = (yield from self._perform(session_id, plan)) if done is None else done[0]
        except BaseException:  # failed, cancelled: the writes may not have reached Redis
            if plan.cheap:  # the cached entry holds them, and would never plan them again
                self.views.discard(session_id)
            raise
        if not self.performed(plan, won) and retry_lost_swap:
            # A worker's summary (or an edit) landed since the read: build from it
            # instead (it may fit without truncating), once.
            fresh = yield from self.snapshot_steps(session_id)
            return (yield from self._build(session_id, fresh, system_prompt, tools, max_tokens,
                                           model, extra, extra_tokens, started, force_ratio,
                                           retry_lost_swap=False, exact=exact, accept=accept))
        self.remember(session_id, plan.sent)
        if done is not None:
            enqueued = done[1]
        elif wanted:
            enqueued = yield from self._enqueue(session_id, force=force)
        else:
            enqueued = False
        return self.finish(plan, enqueued, started)

    def _perform_own(self, session_id: str, plan: Plan, snap: CachedView, wanted: bool,
                     force: bool) -> Steps[tuple[bool, bool] | None]:
        """The plan's writes and the job's flags, then a read of the view, in one round
        trip on the own-writes connection (the next call need not read); None when they
        cannot go that way. Returns (the truncation won, a job was published)."""
        if not self._own_free() or not plain_writes(self.store, self.store_class):
            return None
        job = self.inline_job(self.enqueuer, self.store.tenant, session_id, snap) \
            if wanted else None
        built = self.own_steps(self.store, session_id, plan, snap.cursor, wanted, force,
                               job)
        before = self.own_tally(session_id)
        if built is None or before is None:
            return None
        self.touched(session_id)
        done: tuple[list[Any], OwnMark | None] | None = yield Io(
            "run_many", (self.session_base(session_id), built[0]), own=True)
        if done is None:
            return None
        won, marked, version = self.own_written(session_id, snap, built[0], built[1],
                                                done[0], done[1], before)
        _sent_at(plan, version)
        again = commands.rearmed(marked)
        if marked and commands.pushed(marked):
            _published(session_id, again)  # pushed by the write's own script
        published = bool(marked) and (commands.pushed(marked)
                                      or (yield from self._publish(session_id, again)))
        return won, published

    def _perform(self, session_id: str, plan: Plan) -> Steps[bool]:
        """The plan's writes, in order; False when its truncation lost the swap."""
        if plan.figures or plan.cheap or plan.truncation is not None or plan.clear_recover_next:
            self.touched(session_id)
        if plan.figures:
            yield Io("update_state", (session_id,), plan.figures)
        if plan.cheap:
            yield Io("record_cheap", (session_id, plan.cheap, plan.version))
        if plan.truncation is not None:
            result = yield Io("commit_summary", (session_id, plan.truncation, plan.version))
            if not result.ok:
                log.info("truncation summary for %s lost its swap (%s)", session_id,
                         result.reason)
                return False
            _sent_at(plan, result.version)
        if plan.clear_recover_next:  # an HDEL: never makes the state of a session deleted since
            yield Io("clear_state_flags", (session_id, "recover_next"))
        return True

    def _enqueue(self, session_id: str, *, force: bool = False) -> Steps[bool]:
        """Ask for a job unless one is pending (``force``: a forced compaction)."""
        if force:
            self.touched(session_id)
            yield Io("update_state", (session_id,), {"force_requested": 1})
        marked = yield Io("mark_pending", (session_id,))
        if not marked:
            return False
        return (yield from self._publish(session_id, commands.rearmed(marked)))

    def _publish(self, session_id: str, republished: bool = False) -> Steps[bool]:
        """Publish the job whose pending flag this call set (the enqueuer is synchronous in
        both shells: a broker publish, ~1 ms); on failure the flag is cleared again, so
        that the next turn asks again instead of waiting for it to expire. ``republished``:
        the flag was a stale one this call re-armed."""
        try:
            self.enqueuer.enqueue(self.store.tenant, session_id)
        except Exception as exc:
            with contextlib.suppress(StoreUnavailable):
                yield Io("clear_pending", (session_id,))
            publish_failures.failed(session_id, exc)  # the first of an outage, then 1/min
            get_metrics().enqueue("failed")
            return False
        _published(session_id, republished)
        return True

    # -- after the call --------------------------------------------------------------
    def record_turn_steps(self, session_id: str,
                          messages: Sequence[Message | Mapping[str, Any]], usage: Any,
                          request_id: str | None) -> Steps[int]:
        with self.traced_turn(session_id) as trace:  # the publish carries its context
            validate_session_id(session_id)
            encoded = self.encode_turn(session_id, self.store, messages)
            check_tool_results(encoded.messages)  # an orphan result: InvalidInput naming its index
            fields, sent = self.turn_usage(session_id, usage)
            rid = request_id if request_id is not None else \
                self.unanswered_id(session_id, encoded.messages) or secrets.token_hex(12)
            marks: list[OwnMark | None] = []
            cached = self.views.get(session_id)
            job = self.inline_job(self.enqueuer, self.store.tenant, session_id,
                                  self.unflagged(session_id, cached))
            append = Io("append_encoded", (session_id, encoded), {
                "request_id": rid, "mark_pending": self.policy.proactive,
                "state_fields": fields, "fields_version": sent.version if sent else None,
                "with_state": cached is not None, "job": job,
                "run": self._own_runner(session_id, marks)})
            self.touched(session_id)
            try:
                try:
                    result: AppendResult = yield append
                except StoreUnavailable as exc:
                    log.info("session %s: append %s unanswered (%s); retrying once",
                             session_id, rid, exc)
                    result = yield append
                except SessionDamaged as exc:  # refused, nothing written: mended, or a fresh one
                    yield from self._mend_damaged(session_id, exc)
                    cached = None
                    result = yield Io("append_encoded", (session_id, encoded), {
                        "request_id": rid, "mark_pending": self.policy.proactive,
                        "job": self.inline_job(self.enqueuer, self.store.tenant, session_id,
                                               None),
                        "run": self._own_runner(session_id, marks)})
            except BaseException:  # failed or cancelled, perhaps applied: a retry of the
                if request_id is None:  # same messages re-uses the id (stored at most once)
                    self.unanswered(session_id, encoded.messages, rid)
                self.unsent(session_id, sent)  # and its usage report is learned from
                raise
            self.unanswered(session_id, None, "")
            self.appended(session_id, cached, result, marks[-1] if marks else None)
            if result.marked and not result.published:
                yield from self._publish(session_id, result.republished)
            elif result.marked:
                _published(session_id, result.republished)  # pushed by the append's script
            return trace.turn(result.length)

    def _own_runner(self, session_id: str, marks: list[OwnMark | None],
                    ) -> Callable[[Command[AppendResult]], Any]:
        """How the store runs the append: :meth:`_run_own`, driven by this shell."""
        return lambda cmd: self.drive(self._run_own(session_id, marks, cmd))

    def _run_own(self, session_id: str, marks: list[OwnMark | None],
                 cmd: Command[AppendResult]) -> Steps[AppendResult]:
        """The append on the own-writes connection when it is free (its mark vouches for
        the view it extends), else through the store (no mark: the next call reads)."""
        done = None
        before = self.own_tally(session_id) if self._own_free() else None
        if before is not None:
            done = yield Io("run", (self.session_base(session_id), cmd.script, cmd.keys,
                                    cmd.args), own=True)
        if done is None:
            marks.append(None)
            executed: AppendResult = yield Io("execute", (cmd,))
            return executed
        reply, mark = done
        marks.append(vouch(mark, before, self.own_tally(session_id)))
        return cmd.parse(reply)

    def stats_steps(self, session_id: str) -> Steps[dict[str, Any]]:
        """The meter; :class:`SessionNotFound` for a session with neither messages nor
        summaries (its figures would be the defaults, read as a real session's)."""
        snap = yield from self.snapshot_steps(session_id)
        summaries = yield Io("summaries", (session_id,))
        if snap.end == 0 and not summaries:
            raise SessionNotFound(f"no session {session_id!r} in tenant {self.store.tenant!r}")
        return self.stats_from(session_id, self.store.tenant, snap, summaries)


__all__ = ["DECODE_OFF_LOOP_BYTES", "GuardFlow", "Io", "NotSent", "Steps", "abandon"]
