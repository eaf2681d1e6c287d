"""A tool chain's quiet prepares planned from the last one (:mod:`shared.core.quiet`).

A shell plans a prepare in full (:func:`shared.core.guard_state.plan_view`) and, when
the plan is quiet and incremental, keeps what it leaves with the pending turn
(:meth:`shared.guard._pending.PendingTurns.keep_again`), under a key of what the
request's fixed part was made from. The turn's next call with the same key, the same
cached view and the pending turn continued is planned from that
(:func:`shared.core.quiet.plan_again`): a quiet call then costs what its new messages
cost, not a request and a plan rebuilt. Shared by the sync and async shells.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shared.core.guard_state import Plan, Request
from shared.core.messages import Message
from shared.core.quiet import again_of, plan_again
from shared.core.viewcache import CachedView
from shared.guard._shell import GuardShell


class QuietAgain(GuardShell):
    """Plans a quiet call of a tool chain from the turn's last quiet plan."""

    def request_key(self, system_prompt: str, tools: Sequence[Mapping[str, Any]] | None,
                    max_tokens: int | None, model: str, snap: CachedView) -> tuple[Any, ...]:
        """Everything :meth:`request` makes the request's fixed part from, but the pending
        turn (the snapshot, whose state it reads, is checked apart): equal keys, equal
        fixed parts."""
        return (system_prompt, self._tool_figures(tools), self.model_limits(model, snap.state),
                max_tokens, model, self.counter, self.policy, self._request_overhead())

    def planned_again(self, session_id: str, snap: CachedView, system_prompt: str,
                      tools: Sequence[Mapping[str, Any]] | None, max_tokens: int | None,
                      model: str, extra: list[Message], extra_tokens: list[int]) -> Plan | None:
        """The quiet plan of this call from the turn's last one, when it applies (None:
        plan in full). It leaves the scan and the plan for the next call, as a full one."""
        found = self.turns.again(session_id, extra)
        if found is None:
            return None
        base, key, wire = found
        if key != self.request_key(system_prompt, tools, max_tokens, model, snap):
            return None
        done = plan_again(base, snap, extra, extra_tokens, wire, self.policy)
        if done is None:
            return None
        plan, again = done
        req = base.req
        if max_tokens is not None and req.reserve < max_tokens:  # said once, as request() does
            self._capped(key[2], max_tokens, req.reserve)
        self.turns.keep_again(session_id, extra, again, key)
        return plan

    def keep_quiet(self, session_id: str, snap: CachedView, req: Request, plan: Plan,
                   system_prompt: str, tools: Sequence[Mapping[str, Any]] | None,
                   max_tokens: int | None, model: str, extra: list[Message],
                   exact: bool) -> None:
        """After a full plan of a prepare: what it leaves for the turn's next quiet call
        (none for a plan that is not quiet, or a request made to fit, ``exact``). Not made
        while the newest pending message is the user's: it sizes the reserve, so the turn's
        next call (a tool call and its result after it) could not use it, and an agent's
        first call of every turn would pay for it."""
        if exact or not extra or extra[-1].role == "user":
            return
        again = again_of(snap, req, plan, self.policy, self.counter)
        key = (self.request_key(system_prompt, tools, max_tokens, model, snap)
               if again is not None else None)
        self.turns.keep_again(session_id, extra, again, key)


__all__ = ["QuietAgain"]
