"""A guard shell's cached views and the reads they save: the change feed says whether a
session changed since its view was read (:mod:`shared.store.changes`), the own-writes
connection vouches for the guard's own appends (:mod:`shared.store.own_writes`), and a
prepare's writes come back with the view they leave. Shared by the sync and async shells
(:class:`shared.guard._shell.GuardShell` is one of these)."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
from typing import Any

from shared.core.appended import appended_read
from shared.core.callids import KnownIds
from shared.core.config import CompactionPolicy
from shared.core.errors import InvalidInput
from shared.core.guard_state import Plan
from shared.core.records import AppendResult, InlineJob, RawView
from shared.core.view import ViewCache
from shared.core.viewcache import CachedView, decode_view
from shared.core.wireview import carry
from shared.store import commands
from shared.store.changes import CHANGED, FLAG, NOTHING, ChangeFeed, feed_for
from shared.store.commands import EncodedBatch
from shared.store.keys import watched_prefix
from shared.store.own_writes import OwnMark, is_async_client, own_writes_for, vouch
from shared.store.own_writes_aio import AsyncOwnWrites
from shared.store.own_writes_sync import OwnWrites
from shared.store.sessions import typed_failure

log = logging.getLogger("shared.guard")


def _after_own_cheap(cursor: Any, plan: Plan) -> Any:
    """The cursor to read the view with after this call records its cheap decisions: at
    the decisions' next generation, so that the read does not send back every decision
    of the view (O(decisions) per batch) when exactly ours landed on the one we read
    (:meth:`FreshViews.own_written` checks that all of them did)."""
    if not plan.cheap or cursor is None:
        return cursor
    try:
        after = str(int(cursor.cheap_gen or 0) + 1)  # cheap.lua: one HINCRBY per batch
    except ValueError:
        return cursor
    return dataclasses.replace(cursor, cheap_gen=after)


class FreshViews:
    """The cached views of a shell and the reads skipped while nothing changed."""

    policy: CompactionPolicy
    views: ViewCache
    known_ids: KnownIds
    feed: ChangeFeed | None
    own: OwnWrites | AsyncOwnWrites | None
    _own_shared: bool
    _base: str
    server: tuple[Any, ...] | None

    def watch(self, client: Any, prefix: str, tenant: str, enabled: bool | ChangeFeed) -> None:
        """Set up the change feed for ``tenant``'s sessions (None where unavailable), or
        use the one given (several guards may share a feed whose prefix covers theirs)."""
        self._base = watched_prefix(prefix, tenant)
        if isinstance(enabled, ChangeFeed):
            if not self._base.startswith(enabled.prefix):
                raise InvalidInput(f"the feed watches {enabled.prefix!r}, not this guard's "
                                   f"sessions ({self._base!r})", field="watch_changes")
            self.feed = enabled
        else:  # a guard that caches no view has no read to skip
            caching = self.views.max_sessions > 0
            self.feed = feed_for(client, self._base) if enabled and caching else None
        if enabled and self.views.max_sessions > 0:
            shared = isinstance(enabled, ChangeFeed) and not is_async_client(client)
            self.own = (enabled.shared_own_writes() if shared  # type: ignore[union-attr]
                        else own_writes_for(client, f"{prefix}:"))
            self._own_shared = shared

    def session_base(self, session_id: str) -> str:
        return f"{self._base}{session_id}}}"


    def behind(self, session_id: str, min_length: int | None) -> bool:
        """True when the caller knows of a longer log than the cached view holds
        (``min_length``: what ``record_turn`` returned in another process). The feed's push
        of that append may still be in flight: Redis queues it before the writer's
        reply, but the two travel on different connections, so the reply can arrive first
        (over TCP on one host with another client writing: 6 in 60,000 writes, 28-171 µs
        late, ``scripts/bench_feed_order.py``; across a network a lost packet delays the
        push by a retransmission). The read is then not
        skipped."""
        if min_length is None:
            return False
        cached = self.views.get(session_id)
        return cached is None or cached.end < min_length

    def fresh(self, session_id: str) -> CachedView | None:
        """The cached view when the feed vouches that nothing of the session changed since
        it was read: this call needs no read."""
        cached = self.views.get(session_id)
        mark = cached.mark if cached is not None else None  # once: another thread may drop it
        if cached is None or mark is None or self.feed is None:
            return None
        if isinstance(mark, OwnMark):  # vouched by the own-writes connection instead
            return None
        seen = self.feed.since(self.session_base(session_id), mark)
        return None if seen == CHANGED else self.settled(session_id, cached, seen)

    def own_vouched(self, session_id: str) -> tuple[CachedView, OwnMark, int] | None:
        """The cached view, its mark and what the change feed saw since (NOTHING or FLAG)
        when it came from the guard's own append and the feed saw no other write to the
        session since (the shell then asks the own-writes connection:
        :func:`shared.store.own_writes.vouch`)."""
        cached = self.views.get(session_id)
        mark = cached.mark if cached is not None else None  # once: another thread may drop it
        if cached is None or not isinstance(mark, OwnMark) or self.own is None \
                or self.feed is None or mark.feed is None:
            return None
        seen = self.feed.since(self.session_base(session_id), mark.feed)
        return None if seen == CHANGED else (cached, mark, seen)

    def settled(self, session_id: str, cached: CachedView, seen: int) -> CachedView:
        """``cached`` as a fresh read would show it when only its job flag was written
        since (``seen`` FLAG: a worker claimed the job, or the flag expired): the flag
        unknown, taken as clear. A request made on it sets the flag only if absent, so a
        job queued meanwhile by another process is not queued twice."""
        if seen != FLAG or not cached.pending:
            return cached
        settled = dataclasses.replace(cached, pending=False)
        self.views.put(session_id, settled)
        return settled

    def unflagged(self, session_id: str, cached: CachedView | None) -> CachedView | None:
        """``cached`` for a turn's append: its job flag taken as clear when the change
        feed cannot vouch that nothing wrote to the session since it was read (the append
        then carries the job, pushed only if the flag turns out clear)."""
        if cached is None or not cached.pending:
            return cached
        mark = cached.mark
        if self.feed is not None and self.feed.since(
                self.session_base(session_id),
                mark.feed if isinstance(mark, OwnMark) else mark) == NOTHING:
            return cached
        return dataclasses.replace(cached, pending=False)

    def own_steps(self, store: Any, session_id: str, plan: Plan, cursor: Any, wanted: bool,
                  force: bool, job: InlineJob | None = None,
                  ) -> tuple[list[Any], dict[str, int]] | None:
        """The plan's writes (and the job's flags) followed by a read of the view, as one
        round trip on the own-writes connection; where each reply is. None when they
        cannot go that way (a truncation whose recovery flag is cleared only if it wins)."""
        if plan.truncation is not None and plan.clear_recover_next:
            return None
        k, config = store.keys(session_id), store.config
        steps: list[Any] = []
        at: dict[str, int] = {}
        if plan.figures:
            fields = commands.state_fields(plan.figures)
            steps.append(("HSET", k.state, *itertools.chain.from_iterable(fields.items())))
        if wanted and force:
            steps.append(("HSET", k.state, "force_requested", 1))
        if (plan.figures or (wanted and force)) and config.ttl_seconds:
            # the session's TTL refreshed, as every write does; after every HSET: one that
            # makes the state (a session deleted since its read) must not leave it for ever
            steps.append(("EXPIRE", k.state, config.ttl_seconds))
        if plan.cheap:
            at["cheap"] = len(steps)
            steps.append(commands.cheap_command(k, config, plan.cheap, plan.version))
        if plan.truncation is not None:
            at["commit"] = len(steps)
            steps.append(commands.commit_command(k, config, plan.truncation, plan.version))
        if plan.clear_recover_next:  # HDEL (absent: 0) never makes a state
            steps.append(("HDEL", k.state, "recover_next"))
        if wanted:
            at["pending"] = len(steps)  # set if absent, or a stale flag re-armed
            steps.append(commands.pending_command(k, config, job))
        at["view"] = len(steps)
        steps.append(commands.view_command(k, _after_own_cheap(cursor, plan), True,
                                           (commands.BULK_MESSAGES, commands.BULK_TOKENS)))
        return steps, at

    def own_written(self, session_id: str, snap: CachedView, steps: list[Any],
                    at: dict[str, int], replies: list[Any], mark: OwnMark | None,
                    before: tuple[int, int, int] | None,
                    ) -> tuple[bool, int, int | None]:
        """Read the replies of :meth:`own_steps`: (the truncation won its swap, what its
        pending flag step did: ``pending.lua``'s reply, 0 without one; the version its
        commit made). The view read after the writes
        becomes the cached view, vouched for like an own append
        (:func:`shared.store.own_writes.vouch`)."""
        for reply in replies:
            if isinstance(reply, Exception):  # Redis refusing writes (OOM) is an outage
                raise typed_failure("a guard's writes", reply) or reply
        raw = steps[at["view"]].parse(replies[at["view"]])
        if "cheap" in at and isinstance(raw, RawView) and not raw.cheap_included \
                and replies[at["cheap"]] != len(steps[at["cheap"]].args[2:]) // 2:
            raw = None  # not all of ours landed: the decisions read as ours were not
        won, version = True, None
        if "commit" in at:
            result = commands.parse_commit(replies[at["commit"]])
            if not result.ok:
                log.info("truncation summary for %s lost its swap (%s)", session_id,
                         result.reason)
                won = False
            else:
                version = result.version
        marked = int(replies[at["pending"]]) if "pending" in at else 0
        if isinstance(raw, RawView):  # a large range (deferred) is left to the next read
            fresh = decode_view(raw, snap, carry)
            fresh.mark = vouch(mark, before, self.own_tally(session_id))
            if raw.epoch:
                self.views.put(session_id, fresh)
        return won, marked, version

    def own_tally(self, session_id: str) -> tuple[int, int, int] | None:
        """The change feed's tally for the session, around an own append."""
        return self.feed.tally(self.session_base(session_id)) if self.feed is not None else None

    def mark(self) -> Any:
        return self.feed.mark() if self.feed is not None else None

    def touched(self, session_id: str) -> None:
        """This guard wrote to the session: its next call reads (not waiting for the push)."""
        cached = self.views.get(session_id)
        if cached is not None:
            cached.mark = None

    def inline_job(self, enqueuer: Any, tenant: str, session_id: str,
                   cached: CachedView | None) -> InlineJob | None:
        """The job for the append script to push if it sets the pending flag, when the
        broker is the store's own Redis (one round trip for the turn instead of two). None
        when the cached view shows a job already pending (the append marks only if that
        flag went stale, and its caller then publishes) or the enqueuer cannot (then a
        marking append publishes as before)."""
        if not self.policy.proactive or self.server is None \
                or (cached is not None and cached.pending):
            return None
        make = getattr(enqueuer, "inline_job", None)
        job: InlineJob | None = make(tenant, session_id, self.server) if make else None
        return job

    def appended(self, session_id: str, cached: CachedView | None,
                 result: AppendResult, mark: OwnMark | None = None) -> None:
        """After the guard's own append: the cached view extended with the batch it wrote,
        when the append's reply shows nothing else changed (:mod:`shared.core.appended`).
        ``mark``: the own-writes connection vouches for it from now on
        (:mod:`shared.store.own_writes`), so the next call does not read; without one,
        that call reads (and finds nothing to decode)."""
        if isinstance(result.batch, EncodedBatch) and not result.duplicate:
            self.known_ids.learn(session_id, result.batch.claims)
        raw = appended_read(cached, result.batch, result) if cached is not None else None
        if raw is not None:
            batch = result.batch
            if isinstance(batch, EncodedBatch):  # ours: the models and wire forms it holds
                slots, owners = batch.slots, batch.slots_for
                kept: list[dict[str, Any]] = [  # a message renamed since is converted anew
                    slots[i] if i < len(slots) and message is owners[i] else {}
                    for i, message in enumerate(batch.unique)]
                snap = decode_view(raw, cached, functools.partial(carry, kept=kept),
                                   decoded=batch.unique)
            else:
                snap = decode_view(raw, cached, carry)
            snap.mark = mark
            self.views.put(session_id, snap)

    def close(self) -> None:
        """Close the change feed's connection (the guard keeps working, reading every call)."""
        feed, self.feed = self.feed, None
        if feed is not None:
            feed.close()
        own, self.own = self.own, None
        if own is not None and not self._own_shared:  # a shared one is its feed's to close
            own.close()


__all__ = ["FreshViews"]
